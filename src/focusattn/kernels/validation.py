"""Input checks shared by every hard Focus entry point (``focus_attention`` and the backends it dispatches to, when
called directly): bad input is a ``ValueError`` naming the argument, never a crash deep inside or a silent result.

Adversarial-input semantics (the same for every backend, tested in ``tests/kernels/test_adversarial.py``):

* **NaN / Inf** in ``q``, ``k`` or ``v``: ``ValueError`` naming the tensor. The backends visit different key sets
  (the dense reference multiplies masked ``v`` rows by 0, a sparse one never reads them), so a non-finite value
  would give backend-dependent answers; an error is the one answer they all agree on. With a ``group_index``
  (incremental decoding) only this step's rows of ``k``/``v`` (the last ``Tq``) are scanned: earlier rows were
  checked when they were this step's, so a decode step stays independent of the cache length.
* **Empty problems** (``B = 0``, ``Tq = 0``, ``Tk = 0``, no query heads): an empty output (and LSE) of the right
  shape, connected to the inputs' autograd graph like the reference's. ``D = 0`` or no k/v heads: ValueError.
* **A query with no allowed key** (all-padding rows, left padding): output zeros and LSE ``-inf``, like the reference.
* Any membership structure (one group holding every token, every token alone, groups nobody is in) and any
  ``window >= 0`` (``0`` = the diagonal only, ``>= Tk`` = plain causal attention) is computed exactly.
"""
from __future__ import annotations

import math

import torch

from .group_index import GroupIndex


def check_finite(name: str, t: torch.Tensor) -> None:
    """ValueError if ``t`` holds a NaN or an infinity. The test is one sum (a NaN or Inf anywhere makes it
    non-finite; 10x cheaper than an elementwise ``isfinite`` pass, which cost ~10% of a whole 4K-token Focus layer);
    only a non-finite sum, or an overflowing one, pays for the exact elementwise check."""
    acc = torch.float64 if t.dtype == torch.float64 else torch.float32
    if t.numel() and not math.isfinite(float(t.detach().sum(dtype=acc))) and not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name} contains {bad} NaN/Inf value(s): attention inputs must be finite (a NaN or Inf "
                         "here usually means the model's activations overflowed upstream)")


def validate_focus_inputs(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None,
                          group_index=None, sink=0, query_membership=None) -> None:
    """Raise ValueError naming the offending argument (fast paths would otherwise fail deep inside, or silently).

    With ``group_index`` only the queries' membership rows and k/v rows are checked here (the index checked each
    earlier row when it was added), so validation stays ``O(Tq K)`` per decode step. See the module docstring for
    non-finite and empty inputs."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, T, D], got "
                             f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
    if k.shape[1] < 1 or q.shape[-1] < 1:
        raise ValueError(f"k/v need at least one head and q/k/v a head dim D >= 1, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
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
    own = False
    if group_index is not None:
        own = _validate_group_index(group_index, membership, q.shape[2])
    # the index's own rows were checked as they were appended (GroupIndex.append)
    if not own and not bool((membership if group_index is None else membership[:, k.shape[2] - q.shape[2]:])
                            .any(-1).all()):
        raise ValueError("membership: every token must belong to at least one group")
    if query_membership is not None:
        validate_query_membership(query_membership, membership, q.shape[2])
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0, got {window!r}")
    if isinstance(sink, torch.Tensor):
        if sink.dtype != torch.bool or sink.dim() != 2 or sink.shape[0] not in (1, k.shape[0]) \
                or sink.shape[1] != k.shape[2]:
            raise ValueError(f"sink as a key mask must be bool [B|1, Tk] = [{k.shape[0]}, {k.shape[2]}], got "
                             f"{sink.dtype} {tuple(sink.shape)}")
    elif isinstance(sink, bool) or not isinstance(sink, int) or sink < 0:
        raise ValueError(f"sink must be an int >= 0 or a bool key mask [B|1, Tk], got {sink!r}")
    if scale is not None and not 0 < scale < math.inf:
        raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
    if softcap is not None and not 0 < softcap < math.inf:
        raise ValueError(f"softcap must be a finite number > 0, got {softcap!r}")
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            raise ValueError("key_padding_mask must be a bool tensor [B, Tk] (True = real token)")
        if key_padding_mask.shape != (k.shape[0], k.shape[2]):
            raise ValueError(f"key_padding_mask must have shape [B, Tk] = [{k.shape[0]}, {k.shape[2]}], "
                             f"got {tuple(key_padding_mask.shape)}")
    for name, t in (("k", k), ("v", v), ("membership", membership), ("key_padding_mask", key_padding_mask)):
        if t is not None and t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    new = k.shape[2] - q.shape[2] if group_index is not None else 0  # see the module docstring
    parts = (("q", q), ("k", k[:, :, new:]), ("v", v[:, :, new:]))
    if group_index is not None:  # a decode step: a sum per tensor of its few rows (in their own dtype: an overflow
        # only sends it to the exact check below), no graph, no conversions; a bad one is named below
        with torch.no_grad():
            if math.isfinite(sum(float(t.sum()) for _, t in parts)):
                return
    for name, t in parts:
        check_finite(name, t)


def validate_query_membership(query_membership, membership, tq: int) -> None:
    """The queries' groups with query and key roles: bool ``[B, Tq, K]`` (``K`` and ``B`` of ``membership``), on
    its device, every query in at least one group."""
    if not isinstance(query_membership, torch.Tensor) or query_membership.dtype != torch.bool:
        raise ValueError(f"query_membership must be None or a bool tensor [B, Tq, K], got "
                         f"{query_membership.dtype if isinstance(query_membership, torch.Tensor) else type(query_membership).__name__}")
    b, _, kk = membership.shape
    if tuple(query_membership.shape) != (b, tq, kk):
        raise ValueError(f"query_membership must have shape [B, Tq, K] = [{b}, {tq}, {kk}], got "
                         f"{tuple(query_membership.shape)}")
    if query_membership.device != membership.device:
        raise ValueError(f"query_membership is on {query_membership.device} but membership is on {membership.device}")
    if tq and b and not bool(query_membership.any(-1).all()):
        raise ValueError("query_membership: every query must belong to at least one group")


def _validate_group_index(group_index, membership, tq: int) -> bool:
    """Length, batch, groups and device must match, and so must the queries' rows (an ``O(Tq K)`` check that
    catches an index that was not appended to this step, or belongs to another layer). True when ``membership``
    is the index's own (``group_index.membership``, the one the routing cache passes): nothing to compare."""
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
    own = group_index.membership
    if membership.data_ptr() == own.data_ptr() and membership.stride() == own.stride():
        return True
    if not torch.equal(group_index.membership[:, tk - tq:], membership[:, tk - tq:]):
        raise ValueError("group_index: its membership of the query tokens differs from membership's (stale index, "
                         "or one from another layer)")
    return False


def empty_focus_result(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None):
    """``(out, lse)`` for a problem with no query (``q.numel() == 0``): the reference's empty tensors, LSE in the
    accumulation dtype, so gradients (all zeros) reach q, k and v as they do through the reference."""
    from .lse import acc
    from .reference import dense_focus_attention

    out, lse = dense_focus_attention(q, k, v, membership, window, scale=scale, softcap=softcap,
                                     key_padding_mask=key_padding_mask, return_lse=True)
    return out, acc(lse)
