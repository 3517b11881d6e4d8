"""Exact sub-quadratic Focus attention for prefill (``Tq == Tk``): sort by group, attend inside groups, add the window.

Files: :mod:`.plan` (the :class:`~.plan.Problem`, per-group plans, chunk sizes), :mod:`.same_group` (part A),
:mod:`.band` (part B), :mod:`.chunk` (generic chunk kernels), :mod:`.fused` (the fused CPU op), this driver (the
merge and the ``autograd.Function``).

The allowed set ``M = {j <= i and (i - j <= w or S_i ∩ S_j != ∅)}`` (``S_i`` = token i's groups) is split into
same-group pairs (A) and cross-group local pairs (B), whose partial softmaxes are merged by log-sum-exp (:mod:`.lse`):

* **A, same-group, by inclusion–exclusion** (default, ``plan.IE_MAX_SET`` >= every token's group count): for every
  non-empty group set ``X`` held by some token, causal attention over the tokens whose set contains ``X``, with
  sign ``(-1)^(|X|+1)``. A pair sharing ``c`` groups is counted ``sum_m (-1)^(m+1) C(c, m) = 1`` time, so the
  signed sum of the parts' ``exp(LSE)`` (and of their ``exp(LSE) * out``) is exactly A's. Every part is plain causal
  attention over a stable-sorted token list: the fused op's fastest case, no per-pair mask. With top-2 the
  subtracted parts are the tokens whose two groups are equal (``~2/K^2`` of a group's cost each); top-1 has none.
  Merging is stable: positive parts come first and a subtracted part's keys are a subset of what is already held
  at least twice over, so each subtraction loses at most a factor 2 of relative precision.
* **A, lowest shared group** (fallback for tokens with more groups): in group g's sub-problem, key j is allowed
  for query i iff ``j <= i``, both are in g, and they share no group ``< g`` (``(m_i[:g] · m_j[:g]) == 0``): a
  per-pair mask, so row chunks on the masked path.
* **B, cross-group local**: ``1 <= i - j <= w`` and ``S_i ∩ S_j = ∅`` (distance 0 always shares a group: A's). A
  covers every pair sharing a group, B only pairs sharing none: disjoint, whatever A's decomposition.
* **Query and key roles** (``query_membership``: query i's groups ``Q_i`` and key j's ``S_j`` may differ; the
  allowed set is ``j <= i and (i - j <= w or Q_i ∩ S_j != ∅)``): the same plan with two memberships, not a second
  engine. A's part for group g is g's queries against g's keys, causal by *position* (masked parts, ``kidx`` the
  keys, :func:`.plan._plan_roles`): a query of one group (query top-1) meets each pair once, so nothing is
  subtracted (more query groups: the lowest shared group). B is ``0 <= i - j <= w`` and ``Q_i ∩ S_j = ∅`` (the
  diagonal is A's only where a token's query and key groups meet). Cost: A is ``sum_g |Q_g| |K_g| / 2`` pairs plus
  each row chunk's staircase (query top-1 / key top-2: ``2/K`` of causal attention, twice top-1's and half
  top-2's); always part by part (no packed varlen call: its causal rule is by list index).

Cost: A is ``sum_g n_g^2 / 2`` pairs (``k^2/K`` of causal attention for balanced groups) plus inclusion–exclusion's
intersections, B is ``T (w + C)`` pairs (query blocks of ``C`` rows see ``C + w`` keys). No ``[T, T]`` tensor
exists, and no ``[B, Hq, T, D]`` buffer besides the output: parts longer than ``plan.whole_rows(T)`` are cut into
causal tiles (rows ``r0:r1`` against keys ``r0:r1`` causally plus keys ``0:r0`` in key blocks), and each tile and band
chunk is merged into the output in place at once (peak extra memory: the output plus a few tile-sized buffers).

Engines for part A: ``cpu-flash`` (``aten._scaled_dot_product_flash_attention_for_cpu``: fused, returns LSE, one
call per group, so groups are packed with no padding waste — the CPU analogue of varlen), ``cuda-mem-efficient``
(``aten._efficient_attention_forward/backward``, the same calls on CUDA), ``varlen`` (CUDA forward only: all groups
in one packed call, flash-attn's or the memory-efficient op's), and ``generic`` (chunked matmul/softmax in float32; used for
softcap, which the fused CPU op lacks, and for dtypes/devices without a fused op).

Gradients: the fused op's LSE carries no autograd graph, so the whole computation is one ``autograd.Function``.
Its backward uses the standard ring-attention identity: given the *merged* output ``O`` and LSE ``L``, each part's
contribution to ``dS`` is ``P_ij (dP_ij - Δ_i)`` with ``P_ij = exp(s_ij - L_i)`` and ``Δ_i = dO_i · O_i``, so every
part can be back-propagated independently with the fused backward op (fed ``O`` and ``L``); a subtracted part's
gradients are added with the opposite sign (its ``dS`` negated). A gradient flowing into
the returned LSE adds ``g_i P_ij`` to ``dS``; for the fused op this is injected by appending a ones-column to ``v``
(``dP`` gains ``g_i``) and a zero-column to ``O`` (``Δ`` unchanged).
"""
from __future__ import annotations

import torch

from ..backends import flash_attn_varlen
from ..common import default_scale
from ..lse import merge_signed_
from ..validation import empty_focus_result, validate_focus_inputs
from . import band, keyed, packed, same_group
from .chunk import NEG_INF
from .fused import (cuda_flash_varlen_bwd, cuda_flash_varlen_fwd, cuda_flash_varlen_status, cuda_varlen_bwd,
                    cuda_varlen_fwd, flash_attn_forward)
from .packed import Varlen
from .plan import Grads, Problem, plan_groups, put_rows_, take_rows, token_major_zeros

# Rows per in-place signed merge of a tile into the accumulator: at least MERGE_ROWS, else T / MERGE_FRACTION (the
# gathered slice is ~3% of the output; each slice is ~20 small ops, so at 32K tokens fixed 128-row slices cost
# ~0.4 s of a top-2 call).
MERGE_ROWS = 256
MERGE_FRACTION = 32
# Part A packed on CUDA, variable-length forms of PyTorch's ops (forward and backward): FlashAttention-2 for
# fp16/bf16 when its probe passes (measured on an H200: its memory-efficient counterpart took 5.3 ms for the parts
# of a 32K top-2 call), the memory-efficient op otherwise (float32 too).
CUDA_VARLEN = Varlen("cuda-mem-efficient", cuda_varlen_fwd, cuda_varlen_bwd)
CUDA_FLASH_VARLEN = Varlen("cuda-flash", cuda_flash_varlen_fwd, cuda_flash_varlen_bwd)


def _forward(p: Problem, plans, varlen: Varlen | None = None, pk: packed.Packing | None = None):
    """Merge every part into one ``[B, Hq, T, D]`` accumulator, in place; ``varlen``: part A packed as ``pk``
    (:mod:`.packed`); ``plans`` None: blocks of queries over A and B at once (:mod:`.keyed`, keys of one group,
    forward only: no band left to merge); else one part at a time (:func:`_forward_parts`). Then the window band,
    chunk by chunk."""
    bsz, hq, t, d = p.q.shape
    if plans is None:  # every key in one group, several query groups, no gradient
        return keyed.forward(p)
    if varlen is not None:
        o_acc, l_acc = packed.forward(p, pk, varlen, rows_per_merge=max(1, bsz * t))
    else:
        o_acc, l_acc = _forward_parts(p, plans)
    if _has_band(p):
        for r0, r1, o_b, l_b in band.forward_chunks(p):
            o_r, l_r = o_acc[:, :, r0:r1], l_acc[:, :, r0:r1]
            if o_b.dim() == 5:  # whole blocks [B, Hq, n, C, D]: merge into the same view of the accumulator
                o_r, l_r = o_r.unflatten(2, o_b.shape[2:4]), l_r.unflatten(2, o_b.shape[2:4])
            merge_signed_(o_r, l_r, o_b, l_b)
    return o_acc, l_acc


def _forward_parts(p: Problem, plans):
    """Part A tile by tile (:mod:`.same_group`), each tile merged into the accumulator at once: the only buffers
    that outlive a tile are the output and its LSE."""
    bsz, hq, t, d = p.q.shape
    o_acc = token_major_zeros(p, bsz, hq, t, d)
    l_acc = token_major_zeros(p, bsz, hq, t).fill_(NEG_INF)
    # top-1 (one part per token, all positive): each tile is copied in, no merge. With roles a query is in the
    # parts of its query groups only.
    overlap = bool((p.query_membership.sum(-1) > 1).any()) or any(x.sign < 0 for x in plans)
    ws = same_group.workspace(p, plans, overlap)
    merge_rows = max(MERGE_ROWS, t // MERGE_FRACTION)
    for x in plans:
        for r0, r1, o_p, l_p in same_group.forward_tiles(p, x, ws, overlap):
            if not overlap:
                idx = x.idx[r0:r1]
                put_rows_(o_acc, x.b, idx, o_p[0].to(o_acc.dtype))
                put_rows_(l_acc, x.b, idx, l_p[0].to(l_acc.dtype))
                del o_p, l_p  # not alive during the next part or the band (peak memory)
                continue
            for s0 in range(0, r1 - r0, merge_rows):  # gathered rows: a fraction of a tile, not a tile
                s1 = min(r1 - r0, s0 + merge_rows)
                idx = x.idx[r0 + s0:r0 + s1]
                o_m, l_m = merge_signed_(take_rows(o_acc, x.b, idx), take_rows(l_acc, x.b, idx),
                                         o_p[0, :, s0:s1], l_p[0, :, s0:s1], x.sign)
                put_rows_(o_acc, x.b, idx, o_m)
                put_rows_(l_acc, x.b, idx, l_m)
            del o_p, l_p
    ws.clear()
    return o_acc, l_acc


def _has_band(p: Problem) -> bool:
    """Part B has pairs: a window, or (query and key roles) a token whose query and key groups do not meet (its
    diagonal pair is then B's)."""
    if p.window > 0:
        return True
    return p.qmembership is not None and not bool((p.qmembership & p.membership).any(-1).all())


def _packed_varlen(p: Problem, plans, varlen_fn) -> Varlen | None:
    """The packed kernel for part A, or None for the per-part path: ``varlen_fn`` resolved (see
    :func:`decomposed_focus_attention`); packing needs unmasked parts and no softcap."""
    if varlen_fn is None or p.softcap is not None or not plans or any(x.masked for x in plans):
        return None  # roles parts (p.qmembership) are always masked: part by part, explicitly
    if isinstance(varlen_fn, Varlen):
        return varlen_fn
    cuda_bwd = cuda_varlen_bwd if p.engine == "cuda-mem-efficient" else None
    if isinstance(varlen_fn, str):  # "auto"
        if p.engine != "cuda-mem-efficient":
            return None
        if p.q.dtype in (torch.float16, torch.bfloat16):
            fa = flash_attn_varlen()
            if fa is not None:
                return Varlen("flash-attn", flash_attn_forward(fa), cuda_bwd)
            if cuda_flash_varlen_status()[0]:
                return CUDA_FLASH_VARLEN
        return CUDA_VARLEN
    return Varlen("custom", flash_attn_forward(varlen_fn), cuda_bwd)


class _DecomposedFocus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, membership, kpm, window, scale, softcap, varlen_fn, decomposition, qmembership,
                sink=0):
        p = Problem(q, k, v, membership, kpm, window, scale, softcap, qmembership, sink)
        # no plans: the batched engine, forward only (sinks: the caller checked keyed.folds_sinks, so not again)
        if sink or keyed.applies(p, any(ctx.needs_input_grad[:3])):
            plans = varlen = pk = None
        else:
            plans = plan_groups(membership, kpm, decomposition, qmembership)
            varlen = _packed_varlen(p, plans, varlen_fn)
            pk = None if varlen is None else packed.pack(plans, q.shape[2])
        o, lse = _forward(p, plans, varlen, pk)
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, membership, kpm, out, lse, qmembership)
        ctx.plans, ctx.window, ctx.scale, ctx.softcap = plans, window, scale, softcap
        ctx.varlen = varlen if varlen is not None and varlen.bwd is not None else None
        ctx.packing = pk  # reused by the packed backward
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, membership, kpm, out, lse, qmembership = ctx.saved_tensors
        # a query with no allowed key (LSE -inf, output 0) has no gradient: +inf makes every P = exp(s - L) exactly 0
        # instead of exp(+inf) in the parts' backward (NaN)
        empty = lse == float("-inf")
        has_empty = bool(empty.any())
        lse = lse.masked_fill(empty, float("inf"))
        p = Problem(q, k, v, membership, kpm, ctx.window, ctx.scale, ctx.softcap, qmembership)
        if dout is None:
            dout = torch.zeros_like(out)
        if dlse is not None and has_empty:  # an empty row's LSE is a constant -inf: no gradient reaches it
            dlse = dlse.masked_fill(empty, 0.0)
        if ctx.varlen is not None:  # part A packed: token-major accumulators, whole packed rows added in place
            dq, dk, dv = (token_major_zeros(p, *x.shape) for x in (q, k, v))
        else:
            dq, dk, dv = p.zeros(q.shape), p.zeros(k.shape), p.zeros(v.shape)
        g = Grads(do=dout.to(q.dtype).contiguous(), o=out, lse=lse, dlse=dlse, dq=dq, dk=dk, dv=dv)
        if ctx.varlen is not None:
            packed.backward(p, ctx.packing, g, ctx.varlen)
        else:
            for x in ctx.plans:
                same_group.backward(p, x, g)
        if _has_band(p):
            band.backward(p, g)
        if has_empty:  # such a row has no gradient; its dq from the fused op can be NaN (P is 0 anyway)
            g.dq.masked_fill_(empty[..., None], 0.0)
        return (g.dq.to(q.dtype), g.dk.to(k.dtype), g.dv.to(v.dtype), None, None, None, None, None, None, None, None,
                None)


def decomposed_focus_attention(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None,
                               return_lse=False, varlen_fn="auto", decomposition="auto", validate=True,
                               query_membership=None, sink: int = 0):
    """Exact Focus attention for ``Tq == Tk`` without any ``[T, T]`` tensor. ``validate=False`` skips the input
    checks of :mod:`..validation` (``focus_attention`` has done them).

    ``varlen_fn``: how part A runs. ``"auto"``: on CUDA (with the memory-efficient engine) packed into one
    variable-length call (:mod:`.packed`; flash-attn's forward when installed and inputs are fp16/bf16, else
    PyTorch's memory-efficient op, whose backward serves both), elsewhere part by part; ``None``: part by part;
    a :class:`.packed.Varlen`; or a ``flash_attn_varlen_func``-compatible callable (packed forward, its
    backward PyTorch's on CUDA, part by part elsewhere). Parts needing a mask (padding) always run part by part. ``decomposition``: how pairs sharing several groups are counted
    once: ``"ie"`` (inclusion–exclusion, unmasked parts), ``"lowest"`` (lowest shared group, masked parts),
    ``"auto"`` = ie when no token has more than ``plan.IE_MAX_SET`` groups (see the module docstring).
    ``query_membership`` ``[B, T, K]``: query and key roles (``membership`` the keys' groups; see the module
    docstring); ``decomposition`` then does not apply. ``sink``: the first ``sink`` keys are every query's too,
    folded into the keyed engine's calls; only where that engine serves the call without padding
    (:func:`.keyed.folds_sinks`; checked with ``validate``, else a ValueError), :func:`..api.focus_attention`
    merges sinks elsewhere.
    """
    if validate:
        validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                              key_padding_mask=key_padding_mask, query_membership=query_membership)
        if q.shape[2] != k.shape[2]:
            raise ValueError(f"decomposed_focus_attention is for prefill (Tq == Tk), got Tq={q.shape[2]}, "
                             f"Tk={k.shape[2]}; use focus_attention, which decodes Tq < Tk")
    if q.numel() == 0:
        out, lse = empty_focus_result(q, k, v, membership, window, scale=scale, softcap=softcap,
                                      key_padding_mask=key_padding_mask)
        return (out, lse) if return_lse else out
    scale = default_scale(q.shape[-1], scale)
    if sink and validate and not keyed.folds_sinks(sink, membership, query_membership, key_padding_mask,
                                                    any(t.requires_grad for t in (q, k, v))):
        raise ValueError(f"sink={sink}: only the keyed engine folds sinks in (no gradient, key top-1 with query "
                         "roles, no padding); allowed sink=0 here (focus_attention merges them)")
    out, lse = _DecomposedFocus.apply(q, k, v, membership, key_padding_mask, int(window), scale, softcap, varlen_fn,
                                      decomposition, query_membership, int(sink))
    return (out, lse) if return_lse else out
