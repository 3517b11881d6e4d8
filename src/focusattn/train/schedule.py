"""Learning-rate schedule shared by every training loop: linear warmup, then cosine decay to ``min_ratio * lr``."""
from __future__ import annotations

import math


def cosine_lr(step: int, *, lr: float, warmup: int, total: int, min_ratio: float = 0.1) -> float:
    if step < warmup:
        return lr * (step + 1) / warmup
    if total <= warmup:
        return lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))
