"""Wrappers of PyTorch's fused CPU flash-attention op (forward returns the LSE; backward takes a global O and LSE).

``allowed``: bool mask broadcastable to ``[B, 1, M, N]``, or None for causal (top-left aligned) or, with
``causal=False``, every pair (the rectangle of a causal tile against the keys before it).
"""
from __future__ import annotations

import torch

from ..lse import finite_or_zero, mark_empty
from . import plan

NEG_INF = float("-inf")


def _float_mask(allowed, dtype):
    """The fused op wants an additive mask of q's dtype (it rejects bool)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), NEG_INF, dtype=dtype, device=allowed.device))


def cpu_flash_fwd(q, k, v, allowed, scale, causal=True):
    """Fused forward; LSE fixed to -inf for empty rows (the op reports 0 there)."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if allowed is None:
        return op(q, k, v, 0.0, causal, scale=scale)
    o, lse = op(q, k, v, 0.0, False, attn_mask=_float_mask(allowed, q.dtype), scale=scale)
    return o, mark_empty(lse, allowed.any(-1))


def cpu_flash_bwd(do, q, k, v, o, lse, dlse, allowed, scale, causal=True):
    """Fused backward against the *global* ``o``/``lse``; ``dlse`` is injected through an extra value column."""
    bop = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    d = q.shape[-1]
    lse = finite_or_zero(lse).contiguous()
    if dlse is not None:
        v = torch.cat([v, torch.ones_like(v[..., :1])], -1)
        o = torch.cat([o, torch.zeros_like(o[..., :1])], -1)
        do = torch.cat([do, dlse.unsqueeze(-1).to(do.dtype)], -1)
        q = torch.cat([q, torch.zeros_like(q[..., :1])], -1)  # one head size for the op; zero columns leave the
        k = torch.cat([k, torch.zeros_like(k[..., :1])], -1)  # scores unchanged because the scale is explicit
    args = (do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), lse, 0.0)
    if allowed is None:
        gq, gk, gv = bop(*args, causal, scale=scale)
    else:
        gq, gk, gv = bop(*args, False, attn_mask=_float_mask(allowed, q.dtype), scale=scale)
    return gq[..., :d], gk[..., :d], gv[..., :d]


def flash_rows(n: int) -> int:
    """Row chunk for masked fused calls: the op cannot skip the masked upper triangle of a ``[rows, r1]`` chunk,
    so small chunks keep that waste to ``rows / n`` of the causal work; 256 rows still fill the cores."""
    return max(16, min(256, plan.CHUNK_ELEMS // max(1, n)))
