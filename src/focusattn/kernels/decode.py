"""Focus attention for cached decoding (``Tq < Tk``): gather each query's keys instead of scanning all of them.

A query at absolute position ``p`` may only see the window ``[p - w, p]`` plus earlier keys sharing one of its
groups, i.e. about ``w + Tk * k / K`` keys for balanced top-k routing. We build those index lists from the
membership (a ``[Tq, Tk]`` boolean "shares a group" test costing ``O(Tk * K)`` byte/bit operations per query, no
``D``-sized work), gather just those K/V rows and attend to them. The attention work per query is therefore
``O((w + Tk k / K) * H * D)`` instead of ``O(Tk * H * D)``; gathering copies those rows once, like a paged KV cache.

With a :class:`~focusattn.kernels.group_index.GroupIndex` (kept up to date by the caller, one ``append`` per step)
the lists come from the index instead, and nothing in the step is proportional to ``Tk``: ``O(w + Tk * k / K)``.

Plain autograd through gather + softmax gives exact gradients (memory is the gathered keys, ``O(Tq * L)``).
"""
from __future__ import annotations

import torch

from .common import apply_softcap, default_scale, in_window
from .lse import acc, finite_or_zero
from .validation import empty_focus_result, validate_focus_inputs

# Gathered K/V elements per query chunk (~64 MiB fp32 for K and V together): bounds memory when Tq is large.
GATHER_ELEMS = 1 << 23


def _shares_group(membership: torch.Tensor, qpos: torch.Tensor) -> torch.Tensor:
    """``[B, C, Tk]`` bool: key j shares a group with the query at absolute position ``qpos[c]``.

    Few queries (decoding): a byte-wise AND over ``[B, C, Tk, K]``; many: one float matmul (BLAS) instead."""
    mq = membership[:, qpos]  # [B, C, K]
    if qpos.numel() * membership.shape[1] * membership.shape[2] <= 1 << 22:
        return (membership[:, None] & mq[:, :, None]).any(-1)
    return torch.matmul(mq.float(), membership.float().transpose(1, 2)) > 0


def focus_key_indices(membership, window, qpos, key_padding_mask=None):
    """Per-query key lists: ``(idx [B, C, L] long, valid [B, C, L] bool)`` in ascending position order, ``L`` the
    longest list. Padding entries point at key 0 and are invalid."""
    tk = membership.shape[1]
    kpos = torch.arange(tk, device=membership.device)
    dist = qpos[:, None] - kpos[None, :]  # [C, Tk]
    allowed = in_window(dist, window) | ((dist >= 0) & _shares_group(membership, qpos))
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
                           return_lse=False, group_index=None, validate=True):
    """Exact Focus attention for queries aligned to the end of the keys, by per-query key gathering.

    Shapes as :func:`focusattn.kernels.api.focus_attention`; returns ``out`` (q's dtype) and, if asked, the float32
    LSE (``-inf`` for a query with no allowed key, whose output is zeros).
    ``group_index``: a :class:`~focusattn.kernels.group_index.GroupIndex` of the same ``Tk`` tokens (``membership``
    is then not read), so the step costs ``O(w + Tk k / K)`` instead of an ``O(Tk K)`` scan. ``validate=False``
    skips the input checks of :mod:`.validation` (``focus_attention`` has done them).
    """
    if validate:
        validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                              key_padding_mask=key_padding_mask, group_index=group_index)
    if q.numel() == 0:
        out, lse = empty_focus_result(q, k, v, membership, window, scale=scale, softcap=softcap,
                                      key_padding_mask=key_padding_mask)
        return (out, lse) if return_lse else out
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = default_scale(d, scale)
    outs, lses = [], []
    # chunk size from an upper bound on any query's list (window + its groups' sizes), so memory stays bounded
    if group_index is not None:
        # the queries' lists hold at most (their group count) x (largest group) entries; when that reaches Tk (dense
        # top-k, e.g. top-2 of 4) the lists are no shorter than a scan and cost more to deduplicate: scan instead
        listed = int(group_index.membership[:, tk - tq:].sum(-1).max()) * int(group_index.counts.max())
        if listed >= tk:
            membership, group_index = group_index.membership, None
        longest = window + 1 + listed
    if group_index is None:
        longest = window + 1 + int(membership.sum(-1).max()) * int(membership.sum(1).max())
    step = max(1, GATHER_ELEMS // max(1, bsz * hkv * d * min(tk, longest) * 2))
    # rows of [B * Hkv * Tk, D]: gather = row copies, converted to the accumulation dtype after gathering
    kf, vf = k.reshape(-1, d), v.reshape(-1, d)
    head_base = (torch.arange(bsz * hkv, device=q.device) * tk).view(bsz, hkv, 1)
    for c0 in range(0, tq, step):
        c1 = min(tq, c0 + step)
        qpos = torch.arange(tk - tq + c0, tk - tq + c1, device=q.device)
        if group_index is None:
            idx, valid = focus_key_indices(membership, window, qpos, key_padding_mask)  # [B, C, L]
        else:
            idx, valid = group_index.key_indices(qpos, window, key_padding_mask)
        c, length = idx.shape[1], idx.shape[2]
        rows = (head_base + idx.reshape(bsz, 1, c * length)).flatten()
        kg = acc(kf.index_select(0, rows)).view(bsz, hkv, c, length, d)
        vg = acc(vf.index_select(0, rows)).view(bsz, hkv, c, length, d)
        qc = acc(q[:, :, c0:c1]).reshape(bsz, hkv, g, c, d)
        s = torch.einsum("bhgcd,bhcld->bhgcl", qc, kg) * scale
        s = apply_softcap(s, softcap)
        s = s.masked_fill(~valid[:, None, None], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
        o = torch.einsum("bhgcl,bhcld->bhgcd", p, vg)
        outs.append(o.reshape(bsz, hq, c, d))
        lses.append(lse.reshape(bsz, hq, c))
    out = torch.cat(outs, 2).to(q.dtype)
    lse = torch.cat(lses, 2)
    return (out, lse) if return_lse else out
