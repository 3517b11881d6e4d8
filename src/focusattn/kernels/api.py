"""``focus_attention``: one entry point, one contract, several interchangeable backends.

Contract (all backends): q ``[B, Hq, Tq, D]``, k/v ``[B, Hkv, Tk, D]``, ``Hq % Hkv == 0``, ``Tq <= Tk`` with queries
aligned to the end of the keys. Query i (absolute position ``p = Tk - Tq + i``) attends key j iff ``j <= p`` and
(``p - j <= window`` or the two tokens share a group) and, if given, ``key_padding_mask[b, j]``. Returns the output
in q's dtype and, with ``return_lse``, the natural-log LSE ``[B, Hq, Tq]`` in float32 (float64 for float64 inputs);
a query with no allowed key gets a zero output and LSE ``-inf``. Gradients flow to q, k, v (and through the LSE) for
every backend, except ``"flex"`` on CPU: FlexAttention has no CPU backward, so that combination raises ValueError.

``sink=n`` also lets every query see the first ``n`` real keys (attention sinks, :mod:`.sink`: a third disjoint part
merged by log-sum-exp on the sparse backends, part of the mask on ``"dense"``). ``allowed``, a bool mask broadcastable
to ``[B, Hq, Tq, Tk]`` that the result must also obey (a host model's own sliding window), makes every backend
compute the dense reference: no sparse engine takes an arbitrary mask.

Backends: ``"dense"`` (the O(T²) reference), ``"decomposed"`` (exact sub-quadratic: :mod:`.decomposed` for prefill,
:mod:`.decode` when ``Tq < Tk``), ``"flex"`` (FlexAttention with a block mask), ``"auto"`` (= decomposed, logged once).

``group_index`` (a :class:`.group_index.GroupIndex` over the same ``Tk`` tokens) lets the decode path
(decomposed/auto with ``Tq < Tk``) read each query's keys from per-group lists instead of scanning ``membership``;
the result is the same. Other paths validate it and ignore it.
"""
from __future__ import annotations

import warnings

import torch

from .backends import check_backend
from .decode import focus_decode_attention
from .common import sink_key_mask
from .decomposed import decomposed_focus_attention
from .flex import flex_focus_attention
from .group_index import GroupIndex
from .lse import acc, merge_pair
from .reference import dense_focus_attention
from .sink import sink_partial


def validate_focus_inputs(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None,
                          group_index=None, sink=0) -> None:
    """Raise ValueError naming the offending argument (fast paths would otherwise fail deep inside, or silently).

    With ``group_index`` only the queries' membership rows are checked here (the index checked each earlier row
    when it was added), so validation stays ``O(Tq K)`` per decode step."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, T, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"q and k batch sizes differ: {q.shape[0]} vs {k.shape[0]}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"q heads ({q.shape[1]}) must be a multiple of k/v heads ({k.shape[1]})")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q head dim D={q.shape[-1]} differs from k/v head dim D={k.shape[-1]}")
    if q.shape[2] > k.shape[2]:
        raise ValueError(f"q length Tq={q.shape[2]} exceeds k length Tk={k.shape[2]} (queries align to the end)")
    if not isinstance(membership, torch.Tensor) or membership.dtype != torch.bool:
        raise ValueError(f"membership must be a bool tensor [B, Tk, K], got "
                         f"{membership.dtype if isinstance(membership, torch.Tensor) else type(membership).__name__}")
    if membership.dim() != 3 or membership.shape[:2] != (k.shape[0], k.shape[2]) or membership.shape[2] < 1:
        raise ValueError(f"membership must have shape [B, Tk, K] = [{k.shape[0]}, {k.shape[2]}, K>=1], "
                         f"got {tuple(membership.shape)}")
    if group_index is not None:
        _validate_group_index(group_index, membership, q.shape[2])
    if not bool((membership if group_index is None else membership[:, k.shape[2] - q.shape[2]:]).any(-1).all()):
        raise ValueError("membership: every token must belong to at least one group")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0, got {window!r}")
    if isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise ValueError(f"sink must be an int >= 0, got {sink!r}")
    if scale is not None and not scale > 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be > 0, got {softcap!r}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            raise ValueError("key_padding_mask must be a bool tensor [B, Tk] (True = real token)")
        if key_padding_mask.shape != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_padding_mask must have shape [B, Tk] = [{k.shape[0]}, {k.shape[2]}], "
                             f"got {tuple(key_padding_mask.shape)}")
    for name, t in (("k", k), ("v", v), ("membership", membership), ("key_padding_mask", key_padding_mask)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")


def _validate_group_index(group_index, membership, tq: int) -> None:
    """Length, batch, groups and device must match, and so must the queries' rows (an ``O(Tq K)`` check that
    catches an index that was not appended to this step, or belongs to another layer)."""
    if not isinstance(group_index, GroupIndex):
        raise ValueError(f"group_index must be a GroupIndex or None, got {type(group_index).__name__}")
    b, tk, kk = membership.shape
    if len(group_index) != tk:
        raise ValueError(f"group_index holds {len(group_index)} tokens but the keys have Tk={tk}: append each "
                         "step's membership to the index before attending")
    if tuple(group_index.counts.shape) != (b, kk):
        raise ValueError(f"group_index has [B, K] = {list(group_index.counts.shape)} but membership has [{b}, {kk}]")
    if group_index.device != membership.device:
        raise ValueError(f"group_index is on {group_index.device} but membership is on {membership.device}")
    if not torch.equal(group_index.membership[:, tk - tq:], membership[:, tk - tq:]):
        raise ValueError("group_index: its membership of the query tokens differs from membership's (stale index, "
                         "or one from another layer)")


def focus_attention(q, k, v, membership, window, *, sink=0, scale=None, softcap=None, key_padding_mask=None,
                    allowed=None, backend="auto", return_lse=False, group_index=None):
    """Hard-mask Focus attention, plus ``sink`` attention sinks (see the module docstring for the contract)."""
    validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                          key_padding_mask=key_padding_mask, group_index=group_index, sink=sink)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if allowed is not None:
        check_backend(backend, q)  # the name must still be valid
        backend = "dense"
    backend = check_backend(backend, q, needs_grad)
    kw = dict(scale=scale, softcap=softcap, key_padding_mask=key_padding_mask)
    if backend == "dense":
        out, lse = dense_focus_attention(q, k, v, membership, window, sink=sink, allowed=allowed, return_lse=True, **kw)
        return (out, acc(lse)) if return_lse else out
    if backend == "flex":
        res = flex_focus_attention(q, k, v, membership, window, return_lse=return_lse or sink > 0, **kw)
        out, lse = res if (return_lse or sink > 0) else (res, None)
    elif q.shape[2] < k.shape[2]:
        out, lse = focus_decode_attention(q, k, v, membership, window, return_lse=True, group_index=group_index, **kw)
    else:
        out, lse = decomposed_focus_attention(q, k, v, membership, window, return_lse=True, **kw)
    if sink > 0:
        sinks = sink_key_mask(k.shape[2], sink, key_padding_mask, q.device)
        o2, l2 = sink_partial(q, k, v, membership, window, sinks, scale=scale, softcap=softcap)
        out, lse = merge_pair(out, lse, o2, l2)
        out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def focus_attention_with_sinks(q, k, v, membership, window, *, sink: int = 0, **kwargs):
    """Deprecated: use ``focus_attention(..., sink=n)``."""
    warnings.warn("focus_attention_with_sinks is deprecated: use focus_attention(..., sink=n)", DeprecationWarning,
                  stacklevel=2)
    return focus_attention(q, k, v, membership, window, sink=sink, **kwargs)
