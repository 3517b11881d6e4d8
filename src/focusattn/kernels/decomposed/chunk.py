"""Generic chunk kernels of the decomposed path: any device/dtype, float32 math (float64 for float64).

``q`` ``[..., H, G, M, D]``, ``k``/``v`` ``[..., H, N, D]``, ``mask`` bool broadcastable to ``[..., H, G, M, N]``;
``G`` = query heads per KV head, so GQA never copies K/V.
"""
from __future__ import annotations

import torch

from ..lse import acc, finite_or_zero

NEG_INF = float("-inf")


def _scores(q, k, scale, softcap):
    """Scaled (and softcapped) scores and, with a softcap, the ``tanh`` the backward needs."""
    *lead, h, g, m, d = q.shape
    n = k.shape[-2]
    raw = torch.matmul(acc(q).reshape(*lead, h, g * m, d), acc(k).transpose(-1, -2)).view(*lead, h, g, m, n)
    raw = raw * scale
    t = torch.tanh(raw / softcap) if softcap is not None else None
    return (softcap * t if t is not None else raw), t


def block_attn_fwd(q, k, v, mask, scale, softcap):
    """Masked softmax attention on one chunk; returns float32 ``(out [..., H, G, M, D], lse [..., H, G, M])``."""
    *lead, h, g, m, d = q.shape
    s, _ = _scores(q, k, scale, softcap)
    s = s.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
    out = torch.matmul(p.view(*lead, h, g * m, -1), acc(v)).view(*lead, h, g, m, d)
    return out, lse


def block_attn_bwd(q, k, v, mask, scale, softcap, do, o, lse, dlse):
    """Backward of one chunk given the *global* ``o``/``lse`` (see :mod:`.driver`). Returns float32 dq, dk, dv."""
    *lead, h, g, m, d = q.shape
    n = k.shape[-2]
    s, t = _scores(q, k, scale, softcap)
    p = torch.exp(s.masked_fill(~mask, NEG_INF) - finite_or_zero(acc(lse)).unsqueeze(-1))
    do2 = acc(do).reshape(*lead, h, g * m, d)
    dp = torch.matmul(do2, acc(v).transpose(-1, -2)).view(*lead, h, g, m, n)
    delta = (acc(do) * acc(o)).sum(-1)
    if dlse is not None:
        delta = delta - acc(dlse)
    ds = p * (dp - delta.unsqueeze(-1))
    if t is not None:
        ds = ds * (1.0 - t * t)
    ds = (ds * scale).view(*lead, h, g * m, n)
    dq = torch.matmul(ds, acc(k)).view(*lead, h, g, m, d)
    dk = torch.matmul(ds.transpose(-1, -2), acc(q).reshape(*lead, h, g * m, d))
    dv = torch.matmul(p.view(*lead, h, g * m, n).transpose(-1, -2), do2)
    return dq, dk, dv
