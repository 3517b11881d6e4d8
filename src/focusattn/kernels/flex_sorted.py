"""A Focus prefill in two FlexAttention calls over layouts where the mask is block-sparse: no host sync, a fixed
number of launches whatever K, top-k and T (the GPU path of issue 24, measured by ``scripts/gpu_bench.py``).

In the original token order the same-group pairs are scattered: almost every 128 x 128 block holds some, so a block
mask over :func:`.flex.focus_mask_mod` skips little. After a *stable sort by group* they are block-diagonal and
causal by position, so the split is:

* **part A, group-sorted layout**: each token appears once per group it belongs to (``top_k`` copies, a static bound
  the caller passes, so no length is read back from the device); a copy ``(token, g)`` attends the copies of group
  ``g`` at earlier positions beyond the window, sinks excluded. With top-k > 1 a pair sharing several groups is kept
  only in the *lowest* shared one (``lowest set bit of bits_q & bits_k == 1 << g``), so the copies' key sets are
  disjoint and need no inclusion-exclusion.
* **part B, original layout**: the window band and the sinks / global keys (causal), a banded block mask.

The parts are disjoint and their union is :func:`.reference.focus_allowed`, so merging the ``top_k`` copies of part A
and part B by log-sum-exp gives the exact result. Device work only: top-k of the memberships, one ``argsort``,
gathers, two ``create_block_mask`` builds, two flex calls and the merges; nothing reads a value back (tested on the
CPU by counting ``aten._local_scalar_dense`` and data-dependent ops under a dispatch mode, ``tests/kernels``).

On the CPU, FlexAttention runs eagerly here (its compiled CPU kernel has neither LSE nor gradients): exact, and it
materialises the scores, so it is the test oracle of this path there, not a fast path. Symmetric routing only: query
and key roles take the decomposed engine.
"""
from __future__ import annotations

import warnings

import torch

from .common import apply_softcap, default_scale, group_bits, sink_key_mask
from .flex import _compiled_flex
from .lse import acc, finite_or_zero
from .validation import empty_focus_result, validate_focus_inputs


def sorted_layout(membership: torch.Tensor, top_k: int):
    """``(src, grp, inv)``: the group-sorted copies of every token, ``top_k`` per token (its groups, lowest first;
    a token in fewer groups has invalid copies, group ``K``, sorted last). ``src`` / ``grp`` ``[B, T * top_k]``: the
    source position and group of each sorted copy; ``inv`` ``[B, T, top_k]``: where each token's copies went."""
    b, t, kk = membership.shape
    dev = membership.device
    rank = torch.arange(kk, 0, -1, device=dev, dtype=torch.float32)  # member groups score K .. 1, lowest highest
    score, gid = torch.topk(membership.float() * rank, top_k, dim=-1)  # [B, T, top_k]
    gid = torch.where(score > 0, gid, torch.full_like(gid, kk))
    pos = torch.arange(t, device=dev).view(1, t, 1)
    order = torch.argsort((gid * t + pos).view(b, -1), dim=-1, stable=True)  # by group, then by position
    src = torch.div(order, top_k, rounding_mode="floor")
    grp = gid.view(b, -1).gather(1, order)
    inv = torch.empty_like(order).scatter_(1, order, torch.arange(order.shape[1], device=dev).expand(b, -1))
    return src, grp, inv.view(b, t, top_k)


def _gather_time(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[b, :, idx[b]]`` for ``x`` ``[B, H, T, D]`` and ``idx`` ``[B, L]``."""
    return x.gather(2, idx[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def _flex_call(fn, q, k, v, block_mask, score_mod, scale, gqa):
    """``(out, lse)`` of one FlexAttention call (one kernel launch where compiled; tests count it as one)."""
    from torch.nn.attention.flex_attention import AuxRequest

    with warnings.catch_warnings():  # eager use on the CPU is deliberate (module docstring)
        warnings.filterwarnings("ignore", message=".*without torch.compile.*")
        out, aux = fn(q, k, v, block_mask=block_mask, score_mod=score_mod, scale=scale, enable_gqa=gqa,
                      return_aux=AuxRequest(lse=True))
    return out, aux.lse


def sorted_flex_focus_attention(q, k, v, membership, window, *, sink=0, scale=None, softcap=None,
                                key_padding_mask=None, return_lse=False, top_k: int | None = None,
                                compile: bool | None = None, validate=True):
    """Focus prefill (``Tq == Tk``; the contract of :func:`focusattn.kernels.api.focus_attention`) in two
    FlexAttention calls (module docstring). ``top_k``: the most groups any token is in, a host integer so the layout
    has a static size (None: read from ``membership``, one sync; ``validate`` checks a given one, with a sync, since
    a bound below a token's groups would drop its pairs). ``compile``: None = compiled where it has the LSE (CUDA),
    eager elsewhere."""
    if validate:
        validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                              key_padding_mask=key_padding_mask, sink=sink)
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q has {q.shape[2]} positions and k {k.shape[2]}: the group-sorted flex path is a prefill "
                         "(Tq == Tk); decode steps take backend='decomposed'")
    kk = membership.shape[-1]
    if kk > 63:
        raise ValueError(f"membership has K={kk} groups: the group-sorted flex path takes K <= 63 (one bit word)")
    if q.numel() == 0:
        out, lse = empty_focus_result(q, k, v, membership, window, scale=scale, softcap=softcap,
                                      key_padding_mask=key_padding_mask)
        return (out, lse) if return_lse else out
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, hq, t, _ = q.shape
    most = int(membership.sum(-1).max()) if top_k is None or validate else None  # the one read, if any
    top = most if top_k is None else int(top_k)
    if not 1 <= top <= kk:
        raise ValueError(f"top_k={top_k}: allowed 1 .. K={kk} (the most groups a token is in)")
    if most is not None and most > top:
        raise ValueError(f"top_k={top_k}: a token is in {most} groups; allowed at least that")
    dev = q.device
    sinks = sink_key_mask(t, sink, key_padding_mask, dev)
    sinks = torch.zeros(b, t, dtype=torch.bool, device=dev) if sinks is None else sinks.expand(b, t)
    keys_ok = torch.ones(b, t, dtype=torch.bool, device=dev) if key_padding_mask is None else key_padding_mask
    far_ok = keys_ok & ~sinks  # a group's keys: real, not a sink (sinks are part B's)
    bits = group_bits(membership)[..., 0]  # [B, T] int64
    src, grp, inv = sorted_layout(membership, top)
    lowest_only = top > 1

    def same_group(bb, h, qi, ki):
        pq, pk, g = src[bb, qi], src[bb, ki], grp[bb, qi]
        ok = (g == grp[bb, ki]) & (g < kk) & (pk <= pq) & (pq - pk > window) & far_ok[bb, pk]
        if lowest_only:  # a pair sharing several groups is kept in its lowest shared one only
            shared = bits[bb, pq] & bits[bb, pk]
            ok = ok & ((shared & -shared) == (torch.ones_like(g) << g.clamp(max=kk - 1)))
        return ok

    def band(bb, h, qi, ki):
        return (ki <= qi) & ((qi - ki <= window) | sinks[bb, ki]) & keys_ok[bb, ki]

    n = src.shape[1]
    mask_a = create_block_mask(same_group, b, None, n, n, device=dev)
    mask_b = create_block_mask(band, b, None, t, t, device=dev)
    scale = default_scale(q.shape[-1], scale)
    score_mod = None
    if softcap is not None:
        def score_mod(score, bb, h, qi, ki):
            return apply_softcap(score, softcap)
    can_compile = dev.type != "cpu"
    fn = _compiled_flex() if (can_compile if compile is None else compile and can_compile) else flex_attention
    gqa = hq != k.shape[1]
    oa, lse_a = _flex_call(fn, _gather_time(q, src), _gather_time(k, src), _gather_time(v, src), mask_a, score_mod,
                           scale, gqa)
    out, lse_b = _flex_call(fn, q, k, v, mask_b, score_mod, scale, gqa)
    # each token's copies back to its position ([B, H, T, top_k]), merged with part B in one log-sum-exp: the same
    # few ops whatever top_k
    at = inv.view(b, 1, t * top).expand(-1, hq, -1)
    la = acc(lse_a).gather(2, at).view(b, hq, t, top)
    parts_l = torch.cat([acc(lse_b)[..., None], la], -1)  # [B, H, T, 1 + top_k]
    parts_o = torch.cat([acc(out)[..., None, :], acc(oa).gather(2, at[..., None].expand(-1, -1, -1, oa.shape[-1]))
                         .view(b, hq, t, top, -1)], -2)  # [B, H, T, 1 + top_k, D]
    lse = torch.logsumexp(parts_l, -1)
    w = torch.exp(parts_l - finite_or_zero(lse)[..., None])  # an empty part (LSE -inf) weighs exactly 0
    out = (w[..., None] * parts_o).sum(-2).to(q.dtype)
    return (out, lse) if return_lse else out
