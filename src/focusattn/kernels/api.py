"""``focus_attention``: one entry point, one contract, several interchangeable backends.

Contract (all backends): q ``[B, Hq, Tq, D]``, k/v ``[B, Hkv, Tk, D]``, ``Hq % Hkv == 0``, ``Tq <= Tk`` with queries
aligned to the end of the keys. Query i (absolute position ``p = Tk - Tq + i``) attends key j iff ``j <= p`` and
(``p - j <= window`` or the two tokens share a group) and, if given, ``key_padding_mask[b, j]``. Returns the output
in q's dtype and, with ``return_lse``, the natural-log LSE ``[B, Hq, Tq]`` in float32 (float64 for float64 inputs);
a query with no allowed key gets a zero output and LSE ``-inf``. Gradients flow to q, k, v (and through the LSE) for
every backend, except ``"flex"`` on CPU: FlexAttention has no CPU backward, so that combination raises ValueError.

``sink=n`` also lets every query see the first ``n`` real keys (attention sinks, :mod:`.sink`: a third disjoint part
merged by log-sum-exp on the sparse prefill backends, part of the mask on ``"dense"``, and gathered with the other
keys by a decode step). ``allowed``, a bool mask broadcastable
to ``[B, Hq, Tq, Tk]`` that the result must also obey (a host model's own sliding window), makes every backend
compute the dense reference: no sparse engine takes an arbitrary mask.

Backends: ``"dense"`` (the O(T²) reference), ``"decomposed"`` (exact sub-quadratic: :mod:`.decomposed` for prefill,
:mod:`.decode` when ``Tq < Tk``), ``"flex"`` (FlexAttention with a block mask), ``"flex-sorted"`` (a prefill in two
FlexAttention calls over the group-sorted and the original layout, no host sync: :mod:`.flex_sorted`; decode steps as
``"decomposed"``), ``"auto"`` (per call, the exact engine fastest for its shape from measured break-evens: plain
causal attention when the mask keeps every causal pair, one masked fused call for a short prefill, else decomposed /
decode; :mod:`.dispatch`).

``group_index`` (a :class:`.group_index.GroupIndex` over the same ``Tk`` tokens) lets the decode path
(decomposed/auto with ``Tq < Tk``) read each query's keys from per-group lists instead of scanning ``membership``;
the result is the same. Other paths validate it and ignore it.

``query_membership`` (bool ``[B, Tq, K]``, None = symmetric): query and key roles. ``membership`` is then every
token's groups *as a key*, ``query_membership`` the queries' groups, and query i attends key j iff ``j <= p`` and
(``p - j <= window`` or ``query_membership[i]`` meets ``membership[j]``, or j is a sink). Every backend computes it
exactly: the decomposed prefill runs, per group, the group's queries against the group's keys causally by
position (a query of one group counts each pair once; more query groups: lowest shared group), the decode path
reads the queries' groups' key lists, flex and the dense branches put it in their masks.

Adversarial input (NaN/Inf, empty problems, queries with no allowed key, degenerate groups and windows): every
backend gives the reference's answer or the same ValueError; the rules are in :mod:`.validation`.
"""
from __future__ import annotations

import warnings

import torch

from .backends import check_backend
from .common import default_scale, has_sinks, sink_key_mask
from .decode import focus_decode_attention, gather_branch
from .dispatch import PICKS, choose, dense_branch
from .decomposed import decomposed_focus_attention, keyed
from .flex import flex_focus_attention
from .flex_sorted import sorted_flex_focus_attention
from .lse import acc, acc_dtype, merge_pair, merge_signed_
from .reference import dense_focus_attention
from .sink import sink_partial
from .validation import empty_focus_result, validate_focus_inputs


# Query rows per chunk of the in-place sink merge at inference (at least; T/16 for longer sequences).
SINK_ROWS = 1024


def focus_attention(q, k, v, membership, window, *, sink=0, scale=None, softcap=None, key_padding_mask=None,
                    allowed=None, backend="auto", return_lse=False, group_index=None, query_membership=None):
    """Hard-mask Focus attention, plus ``sink`` attention sinks (see the module docstring for the contract)."""
    validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                          key_padding_mask=key_padding_mask, group_index=group_index, sink=sink,
                          query_membership=query_membership)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if q.numel() == 0:  # no query (B, Tq or Hq is 0): the reference's empty result, whatever the backend
        check_backend(backend, q)
        out, lse = empty_focus_result(q, k, v, membership, window, scale=scale, softcap=softcap,
                                      key_padding_mask=key_padding_mask)
        return (out, lse) if return_lse else out
    if allowed is not None:
        check_backend(backend, q)  # the name must still be valid
        backend = "dense"
    auto = backend == "auto"
    backend = check_backend(backend, q, needs_grad)
    kw = dict(scale=scale, softcap=softcap, key_padding_mask=key_padding_mask)
    branch = None
    if auto:  # the exact engine fastest for this call's shape (kernels/dispatch.py)
        branch = choose(q, k, membership, window, softcap=softcap, group_index=group_index,
                        query_membership=query_membership)
        PICKS[branch] += 1
        if branch in ("causal", "masked", "decode-masked"):
            out, lse = dense_branch(q, k, v, membership, window, sink=sink, scale=default_scale(q.shape[-1], scale),
                                    key_padding_mask=key_padding_mask, causal_only=branch == "causal",
                                    query_membership=query_membership)
        elif branch == "gather":
            out, lse = gather_branch(q, k, v, membership, window, sink=sink, group_index=group_index,
                                     query_membership=query_membership, **kw)
        if branch != "decomposed":
            return (out, lse) if return_lse else out
    if backend == "dense":
        out, lse = dense_focus_attention(q, k, v, membership, window, sink=sink, allowed=allowed, return_lse=True,
                                         query_membership=query_membership, **kw)
        return (out, acc(lse)) if return_lse else out
    if backend == "flex-sorted" and q.shape[2] == k.shape[2]:  # decode steps take the decode path below
        if query_membership is not None:
            raise ValueError("backend='flex-sorted' serves symmetric routing; query and key roles "
                             "(query_membership) take backend='decomposed' or 'flex'")
        out, lse = sorted_flex_focus_attention(q, k, v, membership, window, sink=sink, return_lse=True,
                                               validate=False, **kw)
        return (out, lse) if return_lse else out
    if backend == "flex":
        res = flex_focus_attention(q, k, v, membership, window, return_lse=return_lse or has_sinks(sink),
                                   validate=False, query_membership=query_membership, **kw)
        out, lse = res if (return_lse or has_sinks(sink)) else (res, None)
    elif q.shape[2] < k.shape[2]:  # the sinks join each query's gathered keys: no separate part to merge
        out, lse = focus_decode_attention(q, k, v, membership, window, sink=sink, return_lse=True,
                                          group_index=group_index, validate=False,
                                          query_membership=query_membership, **kw)
        return (out, lse) if return_lse else out
    else:
        folded = keyed.folds_sinks(sink, membership, query_membership, key_padding_mask,  # the driver's test
                                   any(t.requires_grad for t in (q, k, v)))
        out, lse = decomposed_focus_attention(q, k, v, membership, window, return_lse=True, validate=False,
                                              query_membership=query_membership, sink=sink if folded else 0, **kw)
        if folded:  # the engine's own calls took the sinks in: nothing to merge
            return (out, lse) if return_lse else out
    if has_sinks(sink):
        sinks = sink_key_mask(k.shape[2], sink, key_padding_mask, q.device)
        if not needs_grad and out.dtype == lse.dtype == acc_dtype(q.dtype):
            # inference: in place into the kernel's own fresh buffers, in row chunks, so no output-sized sink
            # partial ever exists (it was a whole extra output of peak memory). Rows r0:r1 of a prefill are the
            # queries aligned to the end of keys :r1.
            tq, tk = q.shape[2], k.shape[2]
            rows = max(SINK_ROWS, -(-tq // 16))
            for r0 in range(0, tq, rows):
                r1, e = min(tq, r0 + rows), tk - tq + min(tq, r0 + rows)
                o2, l2 = sink_partial(q[:, :, r0:r1], k[:, :, :e], v[:, :, :e], membership[:, :e], window,
                                      sinks[:, :e], scale=scale, softcap=softcap,
                                      query_membership=None if query_membership is None
                                      else query_membership[:, r0:r1])
                merge_signed_(out[:, :, r0:r1], lse[:, :, r0:r1], o2, l2)
        else:
            o2, l2 = sink_partial(q, k, v, membership, window, sinks, scale=scale, softcap=softcap,
                                  query_membership=query_membership)
            out, lse = merge_pair(out, lse, o2, l2)
        out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def focus_attention_with_sinks(q, k, v, membership, window, *, sink: int = 0, **kwargs):
    """Deprecated: use ``focus_attention(..., sink=n)``."""
    warnings.warn("focus_attention_with_sinks is deprecated: use focus_attention(..., sink=n)", DeprecationWarning,
                  stacklevel=2)
    return focus_attention(q, k, v, membership, window, sink=sink, **kwargs)
