"""Attention sinks as a third disjoint part: the first ``n`` real tokens stay visible to every later query.

Not in the paper. Pretrained LMs park attention on the first token; the Focus mask hides it from every query more
than ``window`` away unless they happen to share a group, and the model breaks (measured in README/RESULTS). The
extra pairs ``{j a sink, not local, no shared group}`` are disjoint from the Focus mask, so
:func:`focusattn.kernels.api.focus_attention` (``sink=n``) computes them here densely (O(T * n)) and merges them
exactly by log-sum-exp, leaving every backend's own kernel untouched. A decode step instead adds the sinks to the keys
it gathers (:func:`focusattn.kernels.decode.focus_decode_attention`): one pass, no merge, per layer and token.
"""
from __future__ import annotations

import torch

from .common import apply_softcap, default_scale, sink_positions
from .decomposed.fused import fused_fwd
from .reference import expand_kv

FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)  # what PyTorch's CPU flash op takes


def _fused(q, ks, vs, softcap) -> bool:
    """The CPU flash op for the sink part: no softcap (it has none), no gradient to build (the manual path is
    differentiable; this one is not), a dtype it takes. Global keys make ``n`` ~2% of the keys, so at long context
    the unfused scores were most of this part's cost."""
    grad = torch.is_grad_enabled() and (q.requires_grad or ks.requires_grad or vs.requires_grad)
    return softcap is None and not grad and q.device.type == "cpu" and q.dtype in FUSED_DTYPES \
        and q.dtype == ks.dtype == vs.dtype and q.shape[2] > 0 and ks.shape[2] > 0  # (the op divides by sizes)


def sink_partial(q, k, v, membership, window, sink_keys, *, scale=None, softcap=None, query_membership=None):
    """Partial attention of every query over the sink keys that the Focus mask does *not* already allow.

    Returns ``(out [B, Hq, Tq, D], lse [B, Hq, Tq])`` (LSE ``-inf`` and output 0 where a row has no such key).
    Requires the same number of sink keys in every row of the batch (true for ``sink_key_mask`` unless a sequence
    is shorter than ``n``, in which case its missing sinks are masked out). ``query_membership``: the queries'
    groups ``[B, Tq, K]`` with query and key roles (None: the last ``Tq`` rows of ``membership``).
    """
    b, hq, tq, d = q.shape
    tk = k.shape[2]
    order, valid = sink_positions(sink_keys, b)  # [B, n], invalid slots masked below
    n = order.shape[1]
    # gather the n sink keys first, then repeat for GQA: O(n), not a copy of all Tk keys (a decode step per layer)
    idx = order[:, None, :, None].expand(b, k.shape[1], n, d)
    ks, vs = expand_kv(k.gather(2, idx), hq), expand_kv(v.gather(2, idx), hq)
    qpos = torch.arange(tk - tq, tk, device=q.device)
    dist = qpos[None, :, None] - order[:, None, :]  # [B, Tq, n]
    mq = (membership[:, tk - tq:] if query_membership is None else query_membership).float()  # [B, Tq, K]
    mk = membership.gather(1, order[..., None].expand(b, n, membership.shape[-1])).float()  # [B, n, K]
    shared = torch.matmul(mq, mk.transpose(1, 2)) > 0  # [B, Tq, n]
    extra = (dist > window) & ~shared & valid[:, None, :]  # sink pairs the Focus mask misses (dist > window >= 0)
    if _fused(q, ks, vs, softcap):  # inference: one fused pass instead of ~8 over the [B, Hq, Tq, n] scores
        return fused_fwd(q, ks, vs, extra[:, None], default_scale(d, scale), causal=False)
    s = apply_softcap(torch.matmul(q, ks.transpose(-1, -2)).float() * default_scale(d, scale), softcap)
    s = s.masked_fill(~extra[:, None], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.nan_to_num(0.0, neginf=0.0)[..., None]).masked_fill(~extra[:, None], 0.0)
    return torch.matmul(p.to(vs.dtype), vs), lse
