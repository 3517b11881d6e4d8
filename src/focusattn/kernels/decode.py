"""Focus attention for cached decoding (``Tq < Tk``): gather each query's keys instead of scanning all of them.

A query at absolute position ``p`` may only see the window ``[p - w, p]`` plus earlier keys sharing one of its
groups, i.e. about ``w + Tk * k / K`` keys for balanced top-k routing. We build those index lists from the
membership (a ``[Tq, Tk]`` boolean "shares a group" test costing ``O(Tk * K)`` byte/bit operations per query, no
``D``-sized work), gather just those K/V rows and attend to them. The attention work per query is therefore
``O((w + Tk k / K) * H * D)`` instead of ``O(Tk * H * D)``; gathering copies those rows once, like a paged KV cache.

Plain autograd through gather + softmax gives exact gradients (memory is the gathered keys, ``O(Tq * L)``).
"""
from __future__ import annotations

import math

import torch

from .lse import finite_or_zero, acc

# Gathered K/V elements per query chunk (~64 MiB fp32 for K and V together): bounds memory when Tq is large.
GATHER_ELEMS = 1 << 23


def _shares_group(membership: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
    """``[B, C, Tk]`` bool: key j shares a group with the query at absolute position ``qpos[c]``."""
    kk = membership.shape[-1]
    if kk <= 63:
        weights = torch.ones((), dtype=torch.int64, device=membership.device) << torch.arange(
            kk, device=membership.device)
        bits = (membership.long() * weights).sum(-1)  # [B, Tk]
        return (bits[:, qpos, None] & bits[:, None, :]) != 0
    m = membership.float()
    return torch.matmul(m[:, qpos], m.transpose(1, 2)) > 0


def focus_key_indices(membership, window, qpos, key_padding_mask=None):
    """Per-query key lists: ``(idx [B, C, L] long, valid [B, C, L] bool)`` in ascending position order, ``L`` the
    longest list. Padding entries point at key 0 and are invalid."""
    tk = membership.shape[1]
    kpos = torch.arange(tk, device=membership.device)
    dist = qpos[:, None] - kpos[None, :]  # [C, Tk]
    allowed = (dist >= 0) & ((dist <= window) | _shares_group(membership, qpos))
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, :]
    count = allowed.sum(-1)  # [B, C]
    length = max(1, int(count.max()))
    slot = torch.where(allowed, allowed.cumsum(-1) - 1, length)  # disallowed keys go to a dump column
    idx = torch.zeros(*allowed.shape[:2], length + 1, dtype=torch.long, device=membership.device)
    idx.scatter_(-1, slot, kpos.expand_as(slot))
    idx = idx[..., :length]
    valid = torch.arange(length, device=membership.device) < count[..., None]
    return idx.masked_fill(~valid, 0), valid


def focus_decode_attention(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None,
                           return_lse=False):
    """Exact Focus attention for queries aligned to the end of the keys, by per-query key gathering.

    Shapes as :func:`focusattn.kernels.api.focus_attention`; returns ``out`` (q's dtype) and, if asked, the float32
    LSE (``-inf`` for a query with no allowed key, whose output is zeros). Inputs are assumed validated.
    """
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    outs, lses = [], []
    c0 = 0
    while c0 < tq:
        # chunk size from the longest list of the first query of the chunk (lists grow with position, so later
        # queries may be longer; the bound is a memory heuristic, not a correctness condition)
        probe, _ = focus_key_indices(membership, window, torch.tensor([tk - tq + c0], device=q.device),
                                     key_padding_mask)
        step = max(1, GATHER_ELEMS // max(1, bsz * hkv * d * probe.shape[-1] * 2))
        c1 = min(tq, c0 + step)
        qpos = torch.arange(tk - tq + c0, tk - tq + c1, device=q.device)
        idx, valid = focus_key_indices(membership, window, qpos, key_padding_mask)  # [B, C, L]
        c, length = idx.shape[1], idx.shape[2]
        flat = idx.reshape(bsz, 1, c * length, 1)
        kg = acc(k).gather(2, flat.expand(bsz, hkv, c * length, d)).view(bsz, hkv, c, length, d)
        vg = acc(v).gather(2, flat.expand(bsz, hkv, c * length, d)).view(bsz, hkv, c, length, d)
        qc = acc(q[:, :, c0:c1]).reshape(bsz, hkv, g, c, d)
        s = torch.einsum("bhgcd,bhcld->bhgcl", qc, kg) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~valid[:, None, None], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
        o = torch.einsum("bhgcl,bhcld->bhgcd", p, vg)
        outs.append(o.reshape(bsz, hq, c, d))
        lses.append(lse.reshape(bsz, hq, c))
        c0 = c1
    out = torch.cat(outs, 2).to(q.dtype)
    lse = torch.cat(lses, 2)
    return (out, lse) if return_lse else out
