"""Group statistics of a composed model: dominance (share of tokens in the largest group; 1/K is balanced), mean
assignment confidence (mean of each token's largest group probability) and group sizes, per layer."""
from __future__ import annotations

import numpy as np
import torch

from ..hf.compose import routers


@torch.no_grad()
def group_stats(model, windows: np.ndarray) -> list[dict]:
    """Run ``windows`` [N, T] through the composed model (eval mode) and summarise every layer's routing."""
    model.eval()
    device = next(model.parameters()).device
    rs = routers(model)
    counts = [None] * len(rs)
    conf = [0.0] * len(rs)
    n = 0
    for w in windows:
        model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long, device=device))
        for i, r in enumerate(rs):
            g = r.cache.groups.reshape(-1, r.cfg.num_groups).float()
            c = torch.bincount(g.argmax(-1), minlength=r.cfg.num_groups).cpu()
            counts[i] = c if counts[i] is None else counts[i] + c
            conf[i] += g.max(-1).values.sum().item()
        n += w.shape[-1]
    out = []
    for i, c in enumerate(counts):
        share = (c.float() / c.sum()).tolist()
        out.append({"layer": i, "dominance": max(share), "confidence": conf[i] / n, "group_share": share})
    return out
