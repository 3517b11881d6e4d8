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
gathers, two block masks built from per-block group and position ranges (``O((T / 128)^2)``, not the ``O(T^2)`` of
``create_block_mask``), two flex calls and the merges; nothing reads a value back (tested on the
CPU by counting ``aten._local_scalar_dense`` and data-dependent ops under a dispatch mode, ``tests/kernels``).

On the CPU, FlexAttention runs eagerly here (its compiled CPU kernel has neither LSE nor gradients): exact, and it
materialises the scores, so it is the test oracle of this path there, not a fast path. Symmetric routing only: query
and key roles take the decomposed engine.
"""
from __future__ import annotations

import functools
import warnings

import torch

from .backends import logger
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


def block_aligned(src: torch.Tensor, grp: torch.Tensor, inv: torch.Tensor, kk: int):
    """The sorted layout with each group's copies starting on a ``BLOCK`` boundary (empty copies, group ``kk``, fill
    the gaps), so no block mixes two groups and the blocks inside a group can be full. Static size
    ``L + kk * BLOCK`` for ``L`` copies (each group wastes less than a block); offsets from per-group counts by a
    scatter, no read back. Returns ``(src, grp, inv)`` of the aligned layout."""
    b, n = grp.shape
    dev = grp.device
    counts = torch.zeros(b, kk + 1, dtype=torch.long, device=dev).scatter_add_(1, grp, torch.ones_like(grp))
    padded = torch.div(counts + BLOCK - 1, BLOCK, rounding_mode="floor") * BLOCK
    start = torch.cumsum(counts, 1) - counts  # where each group starts in the sorted layout
    start_p = torch.cumsum(padded, 1) - padded  # ... and in the aligned one
    at = torch.arange(n, device=dev)[None] - start.gather(1, grp) + start_p.gather(1, grp)  # [B, L]
    size = n + kk * BLOCK
    src_p = torch.zeros(b, size, dtype=src.dtype, device=dev).scatter_(1, at, src)
    grp_p = torch.full((b, size), kk, dtype=grp.dtype, device=dev).scatter_(1, at, grp)
    return src_p, grp_p, at.gather(1, inv.view(b, -1)).view_as(inv)


def _gather_time(x: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``x[b, :, idx[b]]`` for ``x`` ``[B, H, T, D]`` and ``idx`` ``[B, L]``."""
    return x.gather(2, idx[:, None, :, None].expand(-1, x.shape[1], -1, x.shape[3]))


def _flex_call(fn, q, k, v, block_mask, score_mod, scale, gqa):
    """``(out, lse)`` of one FlexAttention call (one kernel launch where compiled; tests count it as one)."""
    from torch.nn.attention.flex_attention import AuxRequest

    def call():
        return fn(q, k, v, block_mask=block_mask, score_mod=score_mod, scale=scale, enable_gqa=gqa,
                  return_aux=AuxRequest(lse=True))

    if torch.compiler.is_compiling():  # inside the whole-graph compile (warnings' filters cannot be traced)
        out, aux = call()
    else:
        with warnings.catch_warnings():  # eager use on the CPU is deliberate (module docstring)
            warnings.filterwarnings("ignore", message=".*without torch.compile.*")
            out, aux = call()
    return out, aux.lse


BLOCK = 128  # FlexAttention's sparse block size (its default)


def _per_block(x: torch.Tensor, fill, op) -> torch.Tensor:
    """``op`` (a reduction over the last dim) of ``x`` ``[B, L]`` over each run of ``BLOCK`` entries, the last run
    padded with ``fill``: ``[B, ceil(L / BLOCK)]``."""
    pad = -x.shape[1] % BLOCK
    xp = torch.nn.functional.pad(x, (0, pad), value=fill) if pad else x
    return op(xp.view(x.shape[0], -1, BLOCK))


def _block_mask(partial: torch.Tensor, full: torch.Tensor, mask_mod, length: int):
    """A FlexAttention ``BlockMask`` from block-level ``[B, nb, nb]`` bools (``full``: every pair in the block is
    allowed, so the kernel skips ``mask_mod`` there; ``partial``: some may be). Built from the block structure alone:
    ``create_block_mask`` would evaluate ``mask_mod`` on all ``length^2`` pairs (memory and time quadratic in T)."""
    from torch.nn.attention.flex_attention import BlockMask

    def ordered(m):
        idx = torch.argsort(m.to(torch.uint8), dim=-1, descending=True, stable=True).to(torch.int32)
        return m.sum(-1, dtype=torch.int32)[:, None], idx[:, None]  # [B, 1, nb], [B, 1, nb, nb] (heads broadcast)

    kv_num, kv_idx = ordered(partial & ~full)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
                                    seq_lengths=(length, length))


def sorted_blocks(src, grp, kk: int, window: int, far_ok, exact_full: bool):
    """``(candidate, full)`` ``[B, nb, nb]`` bools of part A's block mask in the group-sorted layout: query block
    ``i`` needs key block ``j <= i`` only where their group ranges overlap and some key is beyond the window of
    some query (copies sort by group, then position, so a group's keys never follow its queries). A block is full (one group on both sides, every key beyond every query's
    window, no sink or padding) only with ``exact_full`` (top-1: with several groups per token the lowest-shared-group
    rule can drop pairs inside a block)."""
    n, dev = src.shape[1], src.device
    gmin, gmax = _per_block(grp, kk, lambda x: x.amin(-1)), _per_block(grp, -1, lambda x: x.amax(-1))
    valid = grp < kk  # empty and invalid copies hold no position
    pmin = _per_block(torch.where(valid, src, n), n, lambda x: x.amin(-1))
    pmax = _per_block(torch.where(valid, src, -1), -1, lambda x: x.amax(-1))
    nb = gmin.shape[1]
    i = torch.arange(nb, device=dev)
    qi, kj = (lambda x: x[:, :, None]), (lambda x: x[:, None, :])
    cand = ((i[None, :, None] >= i[None, None, :]) & (kj(gmin) <= qi(gmax)) & (kj(gmax) >= qi(gmin))
            & (qi(gmin) < kk) & (kj(gmin) < kk) & (kj(pmin) + window < qi(pmax)))
    if not exact_full:
        return cand, torch.zeros_like(cand)
    keys_far = _per_block(far_ok.gather(1, src), False, lambda x: x.all(-1))  # padded blocks are never full
    one = (gmin == gmax) & (gmin < kk) & (i[None] < n // BLOCK)  # complete blocks of a single (valid) group
    full = (cand & qi(one) & kj(one) & (qi(gmin) == kj(gmin)) & (kj(pmax) + window < qi(pmin)) & kj(keys_far))
    return cand, full


def band_blocks(t: int, window: int, sinks, keys_ok):
    """``(candidate, full)`` ``[B, nb, nb]`` bools of part B's block mask in the original layout: the causal band
    of ``window`` keys behind each query, and any block
    holding a sink or global key; full where every key is causal, within the window of every query and real."""
    dev = sinks.device
    nb = -(-t // BLOCK)
    lo = torch.arange(nb, device=dev) * BLOCK
    hi = torch.clamp(lo + BLOCK, max=t) - 1
    qlo, qhi, klo, khi = lo[:, None], hi[:, None], lo[None, :], hi[None, :]
    has_sink = _per_block(sinks, False, lambda x: x.any(-1))[:, None, :]
    all_ok = _per_block(keys_ok, False, lambda x: x.all(-1))[:, None, :]
    cand = (klo <= qhi)[None] & (((qlo - khi) <= window)[None] | has_sink)
    whole = hi - lo == BLOCK - 1  # complete blocks only (a block past the end is never called full)
    full = ((khi <= qlo) & (qhi - klo <= window) & whole[:, None] & whole[None, :])[None] & all_ok
    return cand.expand(sinks.shape[0], -1, -1), full


def sorted_flex_focus_attention(q, k, v, membership, window, *, sink=0, scale=None, softcap=None,
                                key_padding_mask=None, return_lse=False, top_k: int | None = None,
                                compile: bool | None = None, whole_graph: bool = False, validate=True):
    """Focus prefill (``Tq == Tk``; the contract of :func:`focusattn.kernels.api.focus_attention`) in two
    FlexAttention calls (module docstring). ``top_k``: the most groups any token is in, a host integer so the layout
    has a static size (None: read from ``membership``, one sync; ``validate`` checks a given one, with a sync, since
    a bound below a token's groups would drop its pairs). ``compile``: None = compiled where it has the LSE (CUDA),
    eager elsewhere. ``whole_graph`` (compiled only; off by default): the whole prefill in one ``torch.compile``
    instead of the two FlexAttention calls alone. It traces as one graph and is exact through the ``aot_eager``
    backend (tests), but on an H200 with torch 2.11 its inductor build was not exact (the CUDA tests' whole-graph
    cases failed where the flex-calls-only ones passed; in bf16 at 32K it differed from the decomposed engine by up
    to 0.95): kept for that diagnosis (``scripts/flex_sorted_diag.py``), not served by default."""
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
    from torch.nn.attention.flex_attention import flex_attention

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
    scale = default_scale(q.shape[-1], scale)
    use = dev.type != "cpu" and compile is not False  # compiled flex has the LSE on CUDA, not on the CPU
    args = (q, k, v, membership, sinks, keys_ok, int(window), top, float(scale), softcap)
    if use and whole_graph and not _WHOLE_GRAPH_FAILED:
        try:
            out, lse = _whole_graph()(*args, flex_attention)
            return (out, lse) if return_lse else out
        except Exception as exc:  # noqa: BLE001 - a compiler failure must not fail the call: the flex calls alone
            _WHOLE_GRAPH_FAILED.append(f"{type(exc).__name__}: {str(exc)[:300]}")
            logger.warning("flex-sorted: compiling the whole prefill failed (%s); compiling the FlexAttention calls "
                           "only", _WHOLE_GRAPH_FAILED[0])
    out, lse = _sorted_core(*args, _compiled_flex() if use else flex_attention)
    return (out, lse) if return_lse else out


_WHOLE_GRAPH_FAILED: list = []  # the first failure to compile the whole prefill (then never tried again)


@functools.cache
def _whole_graph():
    """The whole prefill under one ``torch.compile`` (the layout, block masks and merge fused into a few kernels
    around the two FlexAttention kernels): eagerly its ~240 small ops are launched one by one. Shapes become dynamic
    after the first recompile, so a new prompt length does not recompile each time. Not exact on CUDA with torch
    2.11 (see ``whole_graph`` in :func:`sorted_flex_focus_attention`)."""
    return torch.compile(_sorted_core)


def sorted_plan(membership, sinks, keys_ok, window: int, top: int):
    """``(src, inv, mask_a, mask_b)``: the group-sorted layout (each copy's source position, each token's copies'
    rows) and the two block masks; the device work before the FlexAttention calls (timed on its own by
    ``scripts/flex_sorted_diag.py``)."""
    t, kk = membership.shape[1], membership.shape[-1]
    far_ok = keys_ok & ~sinks  # a group's keys: real, not a sink (sinks are part B's)
    bits = group_bits(membership)[..., 0]  # [B, T] int64
    src, grp, inv = block_aligned(*sorted_layout(membership, top), kk)
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
    mask_a = _block_mask(*sorted_blocks(src, grp, kk, window, far_ok, exact_full=not lowest_only), same_group, n)
    mask_b = _block_mask(*band_blocks(t, window, sinks, keys_ok), band, t)
    return src, inv, mask_a, mask_b


def _sorted_core(q, k, v, membership, sinks, keys_ok, window: int, top: int, scale: float, softcap, fn):
    """``(out, lse)`` of the prefill after validation (module docstring); ``fn``: the FlexAttention to call (the
    compiled one, or the plain one inside a whole-graph compile or eagerly on the CPU)."""
    b, hq, t, _ = q.shape
    src, inv, mask_a, mask_b = sorted_plan(membership, sinks, keys_ok, window, top)
    score_mod = None
    if softcap is not None:
        def score_mod(score, bb, h, qi, ki):
            return apply_softcap(score, softcap)
    gqa = hq != k.shape[1]
    oa, lse_a = _flex_call(fn, _gather_time(q, src), _gather_time(k, src), _gather_time(v, src), mask_a, score_mod,
                           scale, gqa)
    out, lse_b = _flex_call(fn, q, k, v, mask_b, score_mod, scale, gqa)
    # each token's copies back to its position ([B, H, T, top_k]), merged with part B in one log-sum-exp: the same
    # few ops whatever top_k
    at = inv.view(b, 1, t * top).expand(-1, hq, -1)  # [B, H, T * top_k]: each copy's row in part A
    la = acc(lse_a).gather(2, at).view(b, hq, t, top)
    parts_l = torch.cat([acc(lse_b)[..., None], la], -1)  # [B, H, T, 1 + top_k]
    parts_o = torch.cat([acc(out)[..., None, :], acc(oa).gather(2, at[..., None].expand(-1, -1, -1, oa.shape[-1]))
                         .view(b, hq, t, top, -1)], -2)  # [B, H, T, 1 + top_k, D]
    lse = torch.logsumexp(parts_l, -1)
    w = torch.exp(parts_l - finite_or_zero(lse)[..., None])  # an empty part (LSE -inf) weighs exactly 0
    return (w[..., None] * parts_o).sum(-2).to(q.dtype), lse
