"""Part A, same-group pairs: one causal sub-problem per part of the plan (:mod:`.plan`): a group, or with top-k > 1
an intersection of groups entering with a sign (inclusion–exclusion), or in the fallback a group whose pairs are
attributed to the lowest shared group (masked).

Forward engines yield tiles ``(r0, r1, out [1, Hq, r1 - r0, D], lse [1, Hq, r1 - r0])`` (LSE float32, ``-inf`` for
empty rows) so the caller merges each tile into its accumulator at once and no part-sized output outlives its tile.
An unmasked part of more than ``plan.whole_rows(T)`` tokens is cut into causal tiles of ``plan.tile_rows(T)`` rows:
rows ``r0:r1`` attend the keys ``r0:r1`` causally plus the keys ``0:r0`` in full, in key blocks of two tiles (unmasked
fused calls, merged in place), the same pairs as one causal call; the backward tiles by ``plan.bwd_tile_rows``.
Backward engines add float32 gradients, times the part's sign, into the :class:`.plan.Grads` accumulators in place.
"""
from __future__ import annotations

import torch

from ..lse import acc, acc_dtype, merge_pair, merge_signed_
from .chunk import block_attn_bwd, block_attn_fwd
from .fused import flash_rows, fused_bwd, fused_fwd, roles_rows
from .plan import (GroupPlan, Grads, Problem, Workspace, bwd_tile_rows, gather, group_mask, row_chunk, take_rows,
                   tile_rows, whole_rows)


def forward_tiles(p: Problem, plan: GroupPlan, ws: Workspace | None = None, overlap: bool = False):
    """The part's tiles; ``ws``: gather into its reused buffers (valid until the next part's gathers);
    ``overlap``: parts are merged into the accumulator (tile sizes: :func:`.plan.tile_rows`)."""
    if not p.fused:
        return _fwd_generic(p, plan)
    t = p.q.shape[2]
    return _fwd_fused(p, plan, ws, tile_rows(t, overlap), whole_rows(t, overlap))


def backward(p: Problem, plan: GroupPlan, g: Grads) -> None:
    if p.fused:
        _bwd_fused(p, plan, g)
    else:
        _bwd_generic(p, plan, g)


def workspace(p: Problem, plans: list[GroupPlan], overlap: bool) -> Workspace:
    """The forward's gather buffers, sized once for what :func:`_fwd_fused` will gather: the largest whole
    part, or a tile and its key blocks (so no part's gather grows them, which would fault in fresh pages again)."""
    ws = Workspace()
    if not plans or not p.fused:
        return ws
    t = p.q.shape[2]
    tile, whole = tile_rows(t, overlap), whole_rows(t, overlap)
    # a roles part (kidx) gathers all its keys and its queries in row chunks
    rows = max(len(x.kidx) if x.kidx is not None else len(x.idx) if len(x.idx) <= whole else tile for x in plans)
    for slot, x in (("q", p.q), ("k", p.k), ("v", p.v)):
        ws.reserve(slot, x.shape[1] * rows * x.shape[-1], x)
    if any(len(x.idx) > whole and not x.masked for x in plans):  # tiled parts' key blocks (2 tiles)
        for slot, x in (("kb", p.k), ("vb", p.v)):
            ws.reserve(slot, x.shape[1] * 2 * tile * x.shape[-1], x)
    return ws


def _fwd_fused(p: Problem, plan: GroupPlan, ws: Workspace | None, tile: int, whole: int):
    n = len(plan.idx)
    if not plan.masked and n > whole:  # a big part: query tiles against key blocks, nothing part-sized
        yield from _fwd_tiled(p, plan, ws, tile)
        return
    kg, vg = gather(p.k, plan, ws=ws, slot="k", keys=True), gather(p.v, plan, ws=ws, slot="v", keys=True)
    if not plan.masked:  # causal over the part; every row sees itself, so no empty rows
        yield 0, n, *fused_fwd(gather(p.q, plan, ws=ws, slot="q"), kg, vg, None, p.scale)
        return
    step = _masked_rows(plan)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        e = plan.key_end(r1)  # r1, or with query and key roles the part's keys up to row r1 - 1's position
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1, p.qmembership)
        o, lse = fused_fwd(gather(p.q, plan, r0, r1, ws=ws, slot="q"), kg[:, :, :e], vg[:, :, :e], allowed,
                               p.scale)
        yield r0, r1, o, lse
        del o, lse, allowed


def _masked_rows(plan: GroupPlan) -> int:
    """Rows per masked fused call of a part (roles parts: :func:`.fused.roles_rows`)."""
    return flash_rows(len(plan.keys)) if plan.kidx is None else roles_rows(len(plan.idx), len(plan.kidx))


def _merge_into(o, lse, o2, l2):
    """``(o, lse)`` merged with a disjoint partial, in place when ``o`` is in the accumulation dtype."""
    if o.dtype == acc_dtype(o.dtype):
        return merge_signed_(o, lse, o2, l2)
    return merge_pair(o, lse, o2, l2)


def _fwd_tiled(p: Problem, plan: GroupPlan, ws: Workspace | None, tile: int):
    """Rows ``r0:r1`` of the part: causal over their own keys, then every earlier key block of ``2 * tile`` keys
    in full (unmasked fused calls), merged in place. Only tile- and block-sized rows are gathered (into ``ws``)."""
    n = len(plan.idx)
    block = 2 * tile
    for r0 in range(0, n, tile):
        r1 = min(n, r0 + tile)
        qt = gather(p.q, plan, r0, r1, ws=ws, slot="q")
        o, lse = fused_fwd(qt, gather(p.k, plan, r0, r1, ws=ws, slot="k"),
                               gather(p.v, plan, r0, r1, ws=ws, slot="v"), None, p.scale)
        for k0 in range(0, r0, block):
            k1 = min(r0, k0 + block)
            o2, l2 = fused_fwd(qt, gather(p.k, plan, k0, k1, ws=ws, slot="kb"),
                                   gather(p.v, plan, k0, k1, ws=ws, slot="vb"), None, p.scale, causal=False)
            o, lse = _merge_into(o, lse, o2, l2)
            del o2, l2
        del qt
        yield r0, r1, o, lse
        del o, lse  # the caller has merged them: not alive during the next tile's calls (peak memory)


def _fwd_generic(p: Problem, plan: GroupPlan):
    hq, hkv, d = p.q.shape[1], p.k.shape[1], p.q.shape[-1]
    kg, vg = gather(p.k, plan, keys=True), gather(p.v, plan, keys=True)
    n = len(plan.idx)
    step = row_chunk(len(plan.keys), hq)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        e = plan.key_end(r1)
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1, p.qmembership)
        qt = gather(p.q, plan, r0, r1).reshape(1, hkv, hq // hkv, r1 - r0, d)
        o, lse = block_attn_fwd(qt, kg[:, :, :e], vg[:, :, :e], allowed, p.scale, p.softcap)
        yield r0, r1, o.reshape(1, hq, r1 - r0, d), lse.reshape(1, hq, r1 - r0)


def _rows(g: Grads, plan: GroupPlan, r0: int, r1: int):
    """The backward's per-row inputs for rows ``r0:r1`` of the part: ``dO``, merged ``O``, ``L`` and ``dL``."""
    idx, b = plan.idx[r0:r1], plan.b
    do = take_rows(g.do, b, idx).unsqueeze(0)
    o = take_rows(g.o, b, idx).unsqueeze(0)
    lse = take_rows(g.lse, b, idx).unsqueeze(0)
    dlse = None if g.dlse is None else take_rows(g.dlse, b, idx).unsqueeze(0)
    return do, o, lse, dlse


def _add(acc_t: torch.Tensor, plan: GroupPlan, r0: int, r1: int, x: torch.Tensor, keys: bool = False) -> None:
    """``acc_t[b][:, idx[r0:r1]] += sign * x`` (``x`` ``[1 or G..., H, r1 - r0, D]`` flattened to ``[H, n, D]``);
    ``keys``: rows of the part's keys."""
    idx = (plan.keys if keys else plan.idx)[r0:r1]
    acc_t[plan.b].index_add_(1, idx, acc(x).reshape(acc_t.shape[1], r1 - r0, -1), alpha=plan.sign)


def _bwd_fused(p: Problem, plan: GroupPlan, g: Grads) -> None:
    n = len(plan.idx)
    kg, vg = gather(p.k, plan, keys=True), gather(p.v, plan, keys=True)
    if not plan.masked:
        step = bwd_tile_rows(p.q.shape[2])
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            qt = gather(p.q, plan, r0, r1)
            do, o, lse, dlse = _rows(g, plan, r0, r1)
            gq, gk, gv = fused_bwd(do, qt, kg[:, :, r0:r1], vg[:, :, r0:r1], o, lse, dlse, None, p.scale)
            _add(g.dk, plan, r0, r1, gk)
            _add(g.dv, plan, r0, r1, gv)
            if r0:
                gq2, gk, gv = fused_bwd(do, qt, kg[:, :, :r0], vg[:, :, :r0], o, lse, dlse, None, p.scale,
                                            causal=False)
                gq = gq + gq2
                del gq2
                _add(g.dk, plan, 0, r0, gk)
                _add(g.dv, plan, 0, r0, gv)
            _add(g.dq, plan, r0, r1, gq)
        return
    gk_p, gv_p = p.zeros(kg.shape), p.zeros(vg.shape)
    step = _masked_rows(plan)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        e = plan.key_end(r1)
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1, p.qmembership)
        do, o, lse, dlse = _rows(g, plan, r0, r1)
        gq, gk, gv = fused_bwd(do, gather(p.q, plan, r0, r1), kg[:, :, :e], vg[:, :, :e], o, lse, dlse,
                                   allowed, p.scale)
        _add(g.dq, plan, r0, r1, gq)
        gk_p[:, :, :e] += gk
        gv_p[:, :, :e] += gv
    _add(g.dk, plan, 0, len(plan.keys), gk_p, keys=True)
    _add(g.dv, plan, 0, len(plan.keys), gv_p, keys=True)


def _bwd_generic(p: Problem, plan: GroupPlan, g: Grads) -> None:
    hq, hkv, d = p.q.shape[1], p.k.shape[1], p.q.shape[-1]
    gs = hq // hkv
    kg, vg = gather(p.k, plan, keys=True), gather(p.v, plan, keys=True)
    n, nk = len(plan.idx), len(plan.keys)
    gk_p, gv_p = p.zeros(1, hkv, nk, d), p.zeros(1, hkv, nk, d)
    step = row_chunk(nk, hq)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        m = r1 - r0
        e = plan.key_end(r1)
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1, p.qmembership)
        do, o, lse, dlse = _rows(g, plan, r0, r1)
        qt = gather(p.q, plan, r0, r1).reshape(1, hkv, gs, m, d)
        gq, gk, gv = block_attn_bwd(qt, kg[:, :, :e], vg[:, :, :e], allowed, p.scale, p.softcap,
                                    do.reshape(1, hkv, gs, m, d), o.reshape(1, hkv, gs, m, d), lse.reshape(1, hkv, gs, m),
                                    None if dlse is None else dlse.reshape(1, hkv, gs, m))
        _add(g.dq, plan, r0, r1, gq)
        gk_p[:, :, :e] += gk
        gv_p[:, :, :e] += gv
    _add(g.dk, plan, 0, nk, gk_p, keys=True)
    _add(g.dv, plan, 0, nk, gv_p, keys=True)
