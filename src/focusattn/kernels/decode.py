"""Focus attention for cached decoding (``Tq < Tk``): gather each query's keys instead of scanning all of them.

A query at absolute position ``p`` may only see the window ``[p - w, p]`` plus earlier keys sharing one of its
groups, i.e. about ``w + Tk * k / K`` keys for balanced top-k routing. We build those index lists from the
membership (a ``[Tq, Tk]`` boolean "shares a group" test costing ``O(Tk * K)`` byte/bit operations per query, no
``D``-sized work), gather just those K/V rows and attend to them. The attention work per query is therefore
``O((w + Tk k / K) * H * D)`` instead of ``O(Tk * H * D)``; gathering copies those rows once, like a paged KV cache.

With a :class:`~focusattn.kernels.group_index.GroupIndex` (kept up to date by the caller, one ``append`` per step)
the lists come from the index instead, and nothing in the step is proportional to ``Tk``: ``O(w + Tk * k / K)``.

When a query's list would hold more than 3/8 of the keys (``DENSE_DECODE_FRACTION``; top-2 of 8 keeps about
half), the step reads every key once in a masked pass instead: on CPU, two matrix products streaming K and V beat
copying most of their rows out of a cache that no longer sits in the processor's caches.

Attention sinks (``sink=n``) are gathered with the window and group keys, so a step is one pass. At inference the
gathered rows go into a reused per-thread workspace (a fresh multi-MiB tensor per layer and step costs more in page
faults than the copy). Plain autograd through gather + softmax gives exact gradients (memory is the gathered keys,
``O(Tq * L)``).
"""
from __future__ import annotations

import functools
import threading

import torch

from .common import apply_softcap, default_scale, in_window, sink_count, sink_key_mask, sink_positions
from .decomposed.fused import fused_fwd
from .dispatch import _fused_ok
from .lse import acc, acc_dtype, finite_or_zero
from .validation import empty_focus_result, validate_focus_inputs

# Gathered K/V elements per query chunk (~64 MiB fp32 for K and V together): bounds memory when Tq is large.
GATHER_ELEMS = 1 << 23

# The reused gather buffers hold at most this many elements each (32 MiB fp32): a decode step at 32K tokens needs
# ~3M for K=8 top-2; bigger gathers allocate as usual, so no thread holds more than 2 x 32 MiB per dtype.
WORKSPACE_ELEMS = 1 << 23
# A query whose list holds more than this share of the cache reads every key in one masked pass instead
# of gathering its keys (see _masked_pass). Measured at 32K tokens (kernel bench, decode step, SDPA ~11.5 ms): the
# masked pass costs ~6.5-6.9 ms whatever the share; gathering 25% of the keys (K=16 top-2) 5.2-5.5 ms, 13% (K=8
# top-1) 3.2-3.4 ms: the crossing is near a third of the keys.
DENSE_DECODE_FRACTION = 3 / 8
_workspace = threading.local()


def _gather_rows(src: torch.Tensor, rows: torch.Tensor, slot: int) -> torch.Tensor:
    """``src.index_select(0, rows)`` written into a reused per-thread buffer (``slot`` 0: keys, 1: values).

    A decode step gathers a few MiB per layer; a fresh tensor each time is a fresh ``mmap`` and its page faults
    (measured: 3x the copy itself at 8K tokens), so one buffer per thread and dtype is grown and reused. Valid until
    the next call with the same slot: the caller consumes it before the next layer runs."""
    n = rows.numel() * src.shape[1]
    if n > WORKSPACE_ELEMS:  # a rare huge gather (many queries at once): not worth holding on to
        return src.index_select(0, rows)
    key = (slot, src.dtype, src.device)
    buf = getattr(_workspace, "bufs", None)
    if buf is None:
        buf = _workspace.bufs = {}
    b = buf.get(key)
    if b is None or b.numel() < n:
        b = buf[key] = torch.empty(min(WORKSPACE_ELEMS, max(n, 2 * (0 if b is None else b.numel()))), dtype=src.dtype,
                                   device=src.device)
    out = b[:n].view(rows.numel(), src.shape[1])
    return torch.index_select(src, 0, rows, out=out)


@functools.lru_cache(maxsize=16)
def _heads(hkv: int, device: torch.device) -> torch.Tensor:
    """``[Hkv, 1]`` int32 ``0 .. Hkv - 1``: head ``h``'s rows start at ``h * Tk`` in a ``[Hkv * Tk, D]`` view."""
    return torch.arange(hkv, dtype=torch.int32, device=device).view(hkv, 1)


def gathered_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, scale: float):
    """``(out [1, Hq, 1, D], lse [1, Hq, 1] float32)`` of one query over the key positions ``keys`` (int32 ``[L]``,
    each once: :meth:`~focusattn.kernels.group_index.GroupIndex.last_keys`): the rows copied into the reused
    workspace (a row gather, ~3x faster than ``index_select`` along the time axis) and one fused attention call.

    The decode step of one sequence at inference, with the fused op (``dispatch._fused_ok``): four tensor ops
    whatever the cache length, where the general path below spends ~100 on lists, masks and bookkeeping."""
    hkv, tk, d = k.shape[1], k.shape[2], k.shape[3]
    rows = torch.add(keys, _heads(hkv, q.device), alpha=tk).flatten()  # one op: keys + h * Tk
    kg = _gather_rows(k.reshape(-1, d), rows, 0).view(1, hkv, keys.numel(), d)
    vg = _gather_rows(v.reshape(-1, d), rows, 1).view(1, hkv, keys.numel(), d)
    out, lse = fused_fwd(q, kg, vg, None, scale, causal=False)
    return out, lse.float()


def masked_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keys: torch.Tensor, scale: float):
    """``(out [1, Hq, 1, D], lse [1, Hq, 1])`` of one query over the key positions ``keys`` (int32 ``[L]``, each
    once) as one fused call over every cached key with an additive mask row: the ``decode-masked`` branch of one
    sequence's step, for caches below the gather break-even (reading every key beats copying some). The list
    always holds the query's own position, so no row is empty."""
    tk = k.shape[2]
    if q.device.type != "cpu":
        allowed = torch.zeros(1, 1, 1, tk, dtype=torch.bool, device=q.device)
        allowed[..., keys.long()] = True
        return fused_fwd(q, k, v, allowed, scale, causal=False)
    bias = torch.full((1, 1, 1, tk), float("-inf"), dtype=q.dtype)
    bias[..., keys.long()] = 0.0
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                       scale=scale)


def one_row_keys(group_index, q, window, sink, key_padding_mask=None, query_membership=None):
    """The key positions of a decode step of one sequence and one query (:func:`gathered_step`), from the group
    index's host record; None where that path does not apply (a batch, several queries, padding, no index). A key
    mask of sinks or global keys (``sink`` bool ``[1, Tk]``) joins as its positions (one ``nonzero`` over ``Tk``
    bools, beside the general path's lists and masks ~30x the time at 2K tokens)."""
    if group_index is None or q.shape[0] != 1 or q.shape[2] != 1 or key_padding_mask is not None:
        return None
    extra = None
    if isinstance(sink, torch.Tensor):
        if sink.shape[0] != 1:
            return None
        extra, sink = sink[0].nonzero()[:, 0].to(torch.int32), 0
    elif not isinstance(sink, int):
        return None
    qg = None if query_membership is None else tuple(query_membership[0, 0].nonzero()[:, 0].tolist())
    return group_index.last_keys(window, sink, qg, extra=extra)


def gather_branch(q, k, v, membership, window, *, sink=0, scale=None, softcap=None, key_padding_mask=None,
                  group_index=None, query_membership=None):
    """``(out, lse)`` of ``backend="auto"``'s ``gather`` branch (validated inputs): one sequence's step at inference
    through :func:`one_row_keys` + :func:`gathered_step` where that applies (no softcap, the fused op), else
    :func:`focus_decode_attention`. The dispatcher and its benchmark (``bench-dispatch``) both run this."""
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not grad and _fused_ok(q, softcap):
        keys = one_row_keys(group_index, q, window, sink, key_padding_mask, query_membership)
        if keys is not None:
            return gathered_step(q, k, v, keys, default_scale(q.shape[-1], scale))
    return focus_decode_attention(q, k, v, membership, window, sink=sink, scale=scale, softcap=softcap,
                                  key_padding_mask=key_padding_mask, return_lse=True, group_index=group_index,
                                  validate=False, query_membership=query_membership)


def _shares_group(membership: torch.Tensor, qpos: torch.Tensor, mq: torch.Tensor | None = None) -> torch.Tensor:
    """``[B, C, Tk]`` bool: key j shares a group with the query at absolute position ``qpos[c]`` (``mq`` [B, C, K]:
    the queries' own groups with query and key roles, else their rows of ``membership``).

    Few queries (decoding): a byte-wise AND over ``[B, C, Tk, K]``; many: one float matmul (BLAS) instead."""
    mq = membership[:, qpos] if mq is None else mq  # [B, C, K]
    if qpos.numel() * membership.shape[1] * membership.shape[2] <= 1 << 22:
        return (membership[:, None] & mq[:, :, None]).any(-1)
    return torch.matmul(mq.float(), membership.float().transpose(1, 2)) > 0


def _allowed_rows(membership, window, qpos, key_padding_mask=None, sink_keys=None, mq=None):
    """``[B, C, Tk]`` bool: the keys each query at absolute position ``qpos[c]`` may attend (window, shared group,
    sinks, causal, padding), by a scan of every key's membership (``O(C Tk K)`` byte operations, no D-sized work).
    ``mq``: the queries' groups [B, C, K] with query and key roles."""
    tk = membership.shape[1]
    kpos = torch.arange(tk, device=membership.device)
    dist = qpos[:, None] - kpos[None, :]  # [C, Tk]
    allowed = in_window(dist, window) | ((dist >= 0) & _shares_group(membership, qpos, mq))
    if sink_keys is not None:
        allowed = allowed | (sink_keys[:, None, :] & (dist >= 0))
    if key_padding_mask is not None:
        allowed = allowed & key_padding_mask[:, None, :]
    return allowed


def _compact(allowed: torch.Tensor):
    """``[B, C, Tk]`` bool -> ``(idx [B, C, L] long, valid [B, C, L] bool)``, ascending, ``L`` the longest row;
    padding entries point at key 0 and are invalid."""
    dev = allowed.device
    if allowed.shape[0] * allowed.shape[1] == 1:  # one row: its list is its nonzero entries, nothing to pad
        idx = allowed[0, 0].nonzero()[:, 0]
        if idx.numel() == 0:
            return idx.new_zeros(1, 1, 1), torch.zeros(1, 1, 1, dtype=torch.bool, device=dev)
        return idx.view(1, 1, -1), torch.ones(1, 1, idx.numel(), dtype=torch.bool, device=dev)
    kpos = torch.arange(allowed.shape[-1], device=dev)
    count = allowed.sum(-1)  # [B, C]
    length = max(1, int(count.max()))
    slot = torch.where(allowed, allowed.cumsum(-1) - 1, length)  # disallowed keys go to a dump column
    idx = torch.zeros(*allowed.shape[:2], length + 1, dtype=torch.long, device=dev)
    idx.scatter_(-1, slot, kpos.expand_as(slot))
    idx = idx[..., :length]
    valid = torch.arange(length, device=dev) < count[..., None]
    return idx.masked_fill(~valid, 0), valid


def focus_key_indices(membership, window, qpos, key_padding_mask=None, query_membership=None):
    """Per-query key lists: ``(idx [B, C, L] long, valid [B, C, L] bool)`` in ascending position order, ``L`` the
    longest list. Padding entries point at key 0 and are invalid. ``query_membership`` [B, C, K]: the queries'
    groups (query and key roles)."""
    return _compact(_allowed_rows(membership, window, qpos, key_padding_mask, mq=query_membership))


def _add_sinks(idx, valid, membership, window, qpos, sink_keys, mq=None):
    """Append the sink keys (``sink_keys`` [B|1, Tk], the first real tokens) that the lists do not hold yet: a sink
    ``j`` is listed already when it is in the window or shares a group with the query, so each key stays counted
    once and the sinks need no separate partial and merge (the prefill path's :mod:`.sink`). ``O(C * n * K)``.
    An int ``sink_keys`` (no padding) is the number of first keys: their positions need no scan of the cache.
    ``mq``: the queries' groups [B, C, K] with query and key roles."""
    b = idx.shape[0]
    if isinstance(sink_keys, int):
        pos = torch.arange(sink_keys, device=idx.device).expand(b, sink_keys)
        ok = torch.ones(b, sink_keys, dtype=torch.bool, device=idx.device)
    else:
        pos, ok = sink_positions(sink_keys, b)
    n = pos.shape[1]
    if n == 0:
        return idx, valid
    mq = membership[:, qpos] if mq is None else mq  # [B, C, K]
    mk = membership.gather(1, pos[..., None].expand(b, n, membership.shape[-1]))  # [B, n, K]
    shared = (mq[:, :, None] & mk[:, None]).any(-1)  # [B, C, n]
    extra = ok[:, None] & ~shared & (qpos[None, :, None] - pos[:, None] > window)
    return (torch.cat([idx, pos[:, None].expand(-1, idx.shape[1], -1)], -1), torch.cat([valid, extra], -1))


def _long(listed: int, tk: int) -> bool:
    """A list this long is read as one masked pass over all ``tk`` keys rather than gathered."""
    return listed > tk * DENSE_DECODE_FRACTION


# A row whose kept weights sum to less than this, relative to its largest score overall, is recomputed with -inf
# masking: below it the largest kept term could be within float32's precision of the underflow limit (e^-87).
_MASKED_FLOOR = 1e-26


def _masked_pass(q, k, v, allowed, scale, softcap):
    """One sequential pass over every cached key, ``allowed`` [B, C, Tk] as a mask: ``(out [B, Hq, C, D],
    lse [B, Hq, C])``.

    When a query may see a large share of the cache (top-2 of 8 keeps about half the pairs), reading K and V in
    order through two matrix products is cheaper than copying those rows out of a cache that is no longer in CPU
    caches (measured per layer at 8K tokens, cycling over 30 layers' caches: ~4 ms against 6-6.5 ms for the gather
    and 6-7 ms for SDPA); the lists' bookkeeping (deduplicating top-k > 1) is skipped too.

    The softmax is taken relative to the row's largest score over *all* keys and the masked keys' weights are then
    zeroed, instead of filling them with ``-inf``: on CPU, ``exp`` and ``logsumexp`` over ``-inf`` take a slow path
    (measured at 32K keys: ~10x the time of finite inputs, most of the step). Exact unless the kept keys' scores are
    all ~60 nats below a masked one (their sum then nears float32's underflow), which :data:`_MASKED_FLOOR` catches
    and recomputes with ``-inf``. Under autograd the ``-inf`` form is used (in-place ops, no saved masks)."""
    bsz, hq, c, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    qh = acc(q).reshape(bsz, hkv, g * c, d)  # heads sharing a k/v head are rows of one product (no K copy)
    s = torch.matmul(qh, k.transpose(-1, -2)).view(bsz, hkv, g, c, tk) * scale
    s = apply_softcap(s, softcap)
    keep = allowed[:, None, None]
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if not grad:
        top = s.amax(-1, keepdim=True)  # >= every kept score
        p = s.sub_(top).exp_().mul_(keep)
        den = p.sum(-1, keepdim=True)
        if bool((den >= _MASKED_FLOOR).all()):
            o = torch.matmul(p.view(bsz, hkv, g * c, tk), v).view(bsz, hkv, g, c, d).div_(den)
            return o.view(bsz, hq, c, d), (top + den.log()).reshape(bsz, hq, c)
        s = torch.matmul(qh, k.transpose(-1, -2)).view(bsz, hkv, g, c, tk) * scale  # rare: recompute, -inf form
        s = apply_softcap(s, softcap)
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
    o = torch.matmul(p.view(bsz, hkv, g * c, tk), v)
    return o.view(bsz, hq, c, d), lse.reshape(bsz, hq, c)


def focus_decode_attention(q, k, v, membership, window, *, sink=0, scale=None, softcap=None, key_padding_mask=None,
                           return_lse=False, group_index=None, validate=True, query_membership=None):
    """Exact Focus attention for queries aligned to the end of the keys: per-query key gathering, or one masked pass
    when the lists are long (see the module docstring).

    Shapes as :func:`focusattn.kernels.api.focus_attention`; returns ``out`` (q's dtype) and, if asked, the float32
    LSE (``-inf`` for a query with no allowed key, whose output is zeros).
    ``sink=n``: the first ``n`` real keys are visible to every query (attention sinks, as ``focus_attention``);
    they join the gathered lists, so a decode step makes one pass, not a sparse part plus a sink part and a merge.
    ``group_index``: a :class:`~focusattn.kernels.group_index.GroupIndex` of the same ``Tk`` tokens (``membership``
    is then not read), so the step costs ``O(w + Tk k / K)`` instead of an ``O(Tk K)`` scan. ``validate=False``
    skips the input checks of :mod:`.validation` (``focus_attention`` has done them). ``query_membership``
    ``[B, Tq, K]``: the queries' own groups (query and key roles): each query reads its groups' key lists.
    """
    if validate:
        validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                              key_padding_mask=key_padding_mask, group_index=group_index, sink=sink,
                              query_membership=query_membership)
    if q.numel() == 0:
        out, lse = empty_focus_result(q, k, v, membership, window, scale=scale, softcap=softcap,
                                      key_padding_mask=key_padding_mask)
        return (out, lse) if return_lse else out
    bsz, hq, tq, d = q.shape
    hkv, tk = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = default_scale(d, scale)
    sinks = sink_key_mask(tk, sink, key_padding_mask, q.device)
    n_sink = sink_count(sink)
    outs, lses = [], []
    # An upper bound on any query's list (window + its groups' sizes + sinks) sizes the query chunks, so memory stays
    # bounded, and picks the engine: a list holding a large share of the cache (top-2 of 8 keeps about half the
    # pairs) is read as one masked pass over every key (_masked_pass) instead of gathered.
    qm = query_membership  # None: symmetric, the queries' rows of the keys' membership
    if group_index is not None:
        membership = group_index.membership
        mq = membership[:, tk - tq:] if qm is None else qm  # [B, Tq, K]: a list holds at most its groups' members
        listed = int((mq.long() * group_index.counts[:, None, :]).sum(-1).max())
        if listed >= tk:  # no shorter than a scan (dense top-k, e.g. top-2 of 4): scan instead
            group_index = None
        longest = min(tk, window + 1 + listed + n_sink)
    else:  # one query (a decode step) is one chunk whatever its list: no bound to compute
        per_query = int((membership if qm is None else qm).sum(-1).max())  # groups a query reads
        longest = tk if tq == 1 else min(tk, window + 1 + per_query * int(membership.sum(1).max()) + n_sink)
    can_mask = k.dtype == acc_dtype(k.dtype)  # the masked pass reads K/V as they are: no whole-cache conversion
    step = max(1, GATHER_ELEMS // max(1, bsz * hkv * d * longest * 2, bsz * hq * tk))
    # rows of [B * Hkv * Tk, D]: gather = row copies, converted to the accumulation dtype after gathering
    kf, vf = k.reshape(-1, d), v.reshape(-1, d)
    head_base = (torch.arange(bsz * hkv, device=q.device) * tk).view(bsz, hkv, 1)
    for c0 in range(0, tq, step):
        c1 = min(tq, c0 + step)
        qpos = torch.arange(tk - tq + c0, tk - tq + c1, device=q.device)
        mqc = None if qm is None else qm[:, c0:c1]
        allowed = None
        if group_index is None:  # a scan: the allowed rows first, then whichever engine their count calls for
            allowed = _allowed_rows(membership, window, qpos, key_padding_mask, sinks, mqc)
            if not (can_mask and _long(int(allowed.sum(-1).max()), tk)):
                idx, valid = _compact(allowed)
                allowed = None
        elif can_mask and _long(longest, tk):
            allowed = _allowed_rows(membership, window, qpos, key_padding_mask, sinks, mqc)
        else:
            idx, valid = group_index.key_indices(qpos, window, key_padding_mask, query_membership=mqc)
            if sinks is not None:
                first = min(sink, tk) if key_padding_mask is None and isinstance(sink, int) else sinks
                idx, valid = _add_sinks(idx, valid, membership, window, qpos, first, mqc)
        if allowed is not None:
            o, lse = _masked_pass(q[:, :, c0:c1], k, v, allowed, scale, softcap)
            outs.append(o)
            lses.append(lse)
            continue
        if bool(valid.all()):  # nothing to mask (one test per chunk, reused below)
            valid = None
        elif bsz * idx.shape[1] == 1:  # one row: drop its invalid slots instead of masking them
            idx = idx[valid].view(1, 1, -1)
            valid = None
        c, length = idx.shape[1], idx.shape[2]
        rows = (head_base + idx.reshape(bsz, 1, c * length)).flatten()
        if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):  # autograd keeps them: fresh tensors
            kg, vg = kf.index_select(0, rows), vf.index_select(0, rows)
        else:
            kg, vg = _gather_rows(kf, rows, 0), _gather_rows(vf, rows, 1)
        kg, vg = acc(kg).view(bsz, hkv, c, length, d), acc(vg).view(bsz, hkv, c, length, d)
        qc = acc(q[:, :, c0:c1]).reshape(bsz, hkv, g, c, d)
        if c == 1:  # plain batched matmuls: einsum's generic path costs more than the product at one query
            s = torch.matmul(qc[:, :, :, 0], kg[:, :, 0].transpose(-1, -2))[:, :, :, None] * scale
        else:
            s = torch.einsum("bhgcd,bhcld->bhgcl", qc, kg) * scale
        s = apply_softcap(s, softcap)
        if valid is not None:
            s = s.masked_fill(~valid[:, None, None], float("-inf"))
        lse = torch.logsumexp(s, dim=-1)
        p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
        if c == 1:
            o = torch.matmul(p[:, :, :, 0], vg[:, :, 0])[:, :, :, None]
        else:
            o = torch.einsum("bhgcl,bhcld->bhgcd", p, vg)
        outs.append(o.reshape(bsz, hq, c, d))
        lses.append(lse.reshape(bsz, hq, c))
    out = (torch.cat(outs, 2) if len(outs) > 1 else outs[0]).to(q.dtype)
    lse = torch.cat(lses, 2) if len(lses) > 1 else lses[0]
    return (out, lse) if return_lse else out
