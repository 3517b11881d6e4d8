"""Log-domain Sinkhorn normalisation of token-to-group scores.

``Q <- exp(S);  repeat N: Q <- Q / sum_tokens Q;  Q <- Q / sum_groups Q``. Because the last step normalises rows,
the result is exactly ``softmax_k(S + b_k)`` where ``b`` is the accumulated column (per-group) potential. That
identity is what makes causal routing possible: freeze ``b`` and each token's assignment depends on itself alone.
"""
from __future__ import annotations

import torch


def sinkhorn_potentials(logits: torch.Tensor, iters: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-group column potentials ``b`` [B, K] for ``logits`` [B, T, K] (already divided by tau).

    ``mask`` [B, T] (True = real token) keeps padding out of the column sums. Potentials are centred (mean 0 over
    groups), which removes the gauge freedom ``b + c`` that leaves the softmax unchanged.
    """
    b = logits.new_zeros(logits.shape[0], logits.shape[-1])
    neg = torch.finfo(logits.dtype).min
    for it in range(iters):
        rows = logits + b[:, None, :]
        if it:  # the paper's first column step sees exp(S) itself; later ones see the row-normalised Q
            rows = torch.log_softmax(rows, dim=-1)
        if mask is not None:
            rows = rows.masked_fill(~mask[..., None], neg)
        b = b - torch.logsumexp(rows, dim=1)  # divide each column by its sum over tokens
    return b - b.mean(dim=-1, keepdim=True)


def sinkhorn(logits: torch.Tensor, iters: int, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Row-stochastic, approximately column-balanced assignment ``[B, T, K]``."""
    return torch.softmax(logits + sinkhorn_potentials(logits, iters, mask)[:, None, :], dim=-1)
