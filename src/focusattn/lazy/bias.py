"""Per-head learnable distance-bias table ``b[h, d]`` (a lookup table, not an ALiBi slope; paper Formula 4)."""
from __future__ import annotations

import torch
from torch import nn

from .config import LazyConfig


class DistanceBias(nn.Module):
    """Holds ``table`` ``[H, W]``; the kernel adds ``table[h, i - j]`` to the scaled logits for ``0 <= i - j < W``.

    Without ``use_bias`` it holds a constant zero ``[H, 1]`` buffer, so the kernel sees one code path.
    """

    def __init__(self, cfg: LazyConfig):
        super().__init__()
        h = cfg.n_heads
        if cfg.use_bias:
            init = torch.zeros(h, cfg.bias_window)
            if cfg.bias_init == "normal":
                init.normal_(0.0, cfg.bias_init_std)
            self.table = nn.Parameter(init)
        else:
            self.register_buffer("table", torch.zeros(h, 1), persistent=False)

    def forward(self) -> torch.Tensor:
        return self.table
