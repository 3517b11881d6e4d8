"""Soft-gated Focus attention used while training routers (dense O(T^2), differentiable in the group weights).

Local pairs (``0 <= i - j <= window``) are untouched; distant causal pairs are gated by the group affinity
``a_ij = g_i . g_j`` in [0, 1] (``query_groups``: ``gq_i . g_j``, a router with its own query projection). Two gate
forms (see README "Design decisions"):

* ``"multiplicative"`` (paper Eq. 2): ``s_ij * sigmoid(lam * (a_ij - offset))``. With ``offset=0`` two tokens in
  different groups get sigmoid(0) = 0.5: their logit is halved, not removed.
* ``"log"``: ``s_ij + log sigmoid(lam * (a_ij - offset))``. As ``lam`` grows this tends to the hard mask used at
  inference (0 for shared groups, -inf otherwise), so training and inference agree.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .common import apply_softcap, default_scale, relative_distance
from .reference import expand_kv
from .validation import check_finite

GATES = ("multiplicative", "log")


def _check(q, k, v, groups, window, lam, offset, gate, allowed, sink_keys, query_groups=None) -> None:
    """ValueError naming the offending argument (the shapes of :func:`.api.focus_attention`, float groups)."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor [B, H, T, D]")
    b, hq, tq, d = q.shape
    # v may have its own head size (the lab's focus variant uses one); everything else must match k
    if k.shape[:3] != v.shape[:3] or v.shape[-1] < 1 or k.shape[0] != b or k.shape[-1] != d or d < 1 or k.shape[1] < 1 or hq % k.shape[1]:
        raise ValueError(f"k and v must be [B, Hkv, Tk, D(v)] with B={b}, D={d} >= 1 and Hkv dividing Hq={hq}; got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if tq > k.shape[2]:
        raise ValueError(f"q length Tq={tq} exceeds k length Tk={k.shape[2]} (queries align to the end)")
    if not isinstance(groups, torch.Tensor) or not groups.dtype.is_floating_point or groups.dim() != 3 \
            or groups.shape[:2] != (b, k.shape[2]) or groups.shape[2] < 1:
        raise ValueError(f"groups must be a float tensor [B, Tk, K] = [{b}, {k.shape[2]}, K>=1], got "
                         f"{(groups.dtype, tuple(groups.shape)) if isinstance(groups, torch.Tensor) else groups!r}")
    if query_groups is not None and (not isinstance(query_groups, torch.Tensor) or query_groups.dtype
                                     != groups.dtype or tuple(query_groups.shape) != (b, tq, groups.shape[2])):
        raise ValueError(f"query_groups must be None or a {groups.dtype} tensor [B, Tq, K] = [{b}, {tq}, "
                         f"{groups.shape[2]}], got {getattr(query_groups, 'shape', query_groups)!r}")
    if isinstance(window, bool) or not isinstance(window, int) or window < 0:
        raise ValueError(f"window must be an int >= 0, got {window!r}")
    for name, x in (("lam", lam), ("offset", offset)):
        if not math.isfinite(float(x)):
            raise ValueError(f"{name} must be a finite number, got {x!r}")
    for name, m in (("allowed", allowed), ("sink_keys", sink_keys)):
        if m is not None and (not isinstance(m, torch.Tensor) or m.dtype != torch.bool):
            raise ValueError(f"{name} must be a bool tensor or None")
    for name, t in (("q", q), ("k", k), ("v", v), ("groups", groups), ("query_groups", query_groups)):
        if t is not None:
            check_finite(name, t)


def soft_focus_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    groups: torch.Tensor,
    window: int,
    *,
    lam: float,
    offset: float = 0.0,
    gate: str = "log",
    scale: float | None = None,
    softcap: float | None = None,
    allowed: torch.Tensor | None = None,
    sink_keys: torch.Tensor | None = None,
    query_groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """``groups``: float ``[B, Tk, K]`` soft assignments (rows sum to 1). ``allowed``: optional bool mask broadcastable
    to ``[B, Hq, Tq, Tk]`` (the model's causal/padding/sliding mask); causality is always enforced here too.
    ``sink_keys``: bool [B|1, Tk] keys exempt from gating (see ``reference.sink_key_mask``). ``query_groups``
    ``[B, Tq, K]``: the queries' own soft assignments (``FocusConfig.query_proj``); None = their rows of ``groups``.

    A query row with no allowed key (padding) returns zeros, like the hard reference. Non-finite ``q``, ``k``, ``v``
    or ``groups`` is a ValueError naming it: the zeroing of empty rows would otherwise turn a NaN row into a silent
    zero. Empty problems (``B``, ``Tq`` or ``Tk`` = 0) return an empty output."""
    _check(q, k, v, groups, window, lam, offset, gate, allowed, sink_keys, query_groups)
    if gate == "log" and softcap is None and q.shape[2] and k.shape[2] and q.shape[0]:
        return _soft_log_sdpa(q, k, v, groups, window, lam, offset, scale, allowed, sink_keys, query_groups)
    return soft_reference(q, k, v, groups, window, lam=lam, offset=offset, gate=gate, scale=scale, softcap=softcap,
                          allowed=allowed, sink_keys=sink_keys, query_groups=query_groups)


def _gate_bias(groups, tq, tk, window, lam, offset, allowed, sink_keys, dtype, query_groups=None):
    """The log gate as an additive bias ``[B, 1|H, Tq, Tk]`` (0 local/sinks, log sigmoid(lam (a - offset)) distant,
    -inf not allowed) and the bool rows that have no allowed key at all."""
    dist = relative_distance(tq, tk, groups.device)
    distant = dist > window
    if sink_keys is not None:
        distant = distant & ~sink_keys[:, None, None, :]
    qg = groups[:, tk - tq:] if query_groups is None else query_groups
    affinity = torch.einsum("bik,bjk->bij", qg, groups).unsqueeze(1)
    bias = torch.where(distant, F.logsigmoid(lam * (affinity - offset)), 0.0).to(dtype)
    mask = dist >= 0
    if allowed is not None:
        mask = mask & allowed
    empty = ~mask.any(-1, keepdim=True)  # [.., Tq, 1]
    return bias.masked_fill(~mask & ~empty, float("-inf")), empty


def _soft_log_sdpa(q, k, v, groups, window, lam, offset, scale, allowed, sink_keys, query_groups=None):
    """The log gate is an additive bias shared by every head, so the whole thing is one SDPA call with a float mask:
    no ``[B, H, T, T]`` score, gate and probability tensors of our own (2.2x faster forward + backward at 2K tokens
    on CPU than :func:`soft_reference`, which stays the reference and handles the other gate and softcaps)."""
    tq, tk = q.shape[2], k.shape[2]
    bias, empty = _gate_bias(groups, tq, tk, window, lam, offset, allowed, sink_keys, q.dtype, query_groups)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=default_scale(q.shape[-1], scale),
                                         enable_gqa=q.shape[1] != k.shape[1])
    if bool(empty.any()):  # a row with no allowed key attended to everything (bias 0): zero it, like the reference
        out = out.masked_fill(empty, 0.0)
    return out


def soft_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    groups: torch.Tensor,
    window: int,
    *,
    lam: float,
    offset: float = 0.0,
    gate: str = "log",
    scale: float | None = None,
    softcap: float | None = None,
    allowed: torch.Tensor | None = None,
    sink_keys: torch.Tensor | None = None,
    query_groups: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dense reference of :func:`soft_focus_attention` (same arguments): scores, gate and softmax spelled out."""
    hq, tq, d = q.shape[1], q.shape[2], q.shape[-1]
    tk = k.shape[2]
    k, v = expand_kv(k, hq), expand_kv(v, hq)
    s = apply_softcap(torch.matmul(q, k.transpose(-1, -2)) * default_scale(d, scale), softcap)
    dist = relative_distance(tq, tk, q.device)
    distant = dist > window  # [Tq, Tk]: beyond the window (common.in_window), so gated
    if sink_keys is not None:  # sinks are never gated, like local pairs
        distant = distant & ~sink_keys[:, None, None, :]
    qg = groups[:, tk - tq:] if query_groups is None else query_groups
    affinity = torch.einsum("bik,bjk->bij", qg, groups).unsqueeze(1).to(s.dtype)
    z = lam * (affinity - offset)
    if gate == "multiplicative":
        s = torch.where(distant, s * torch.sigmoid(z), s)
    else:
        s = torch.where(distant, s + F.logsigmoid(z), s)
    mask = dist >= 0
    if allowed is not None:
        mask = mask & allowed
    s = s.masked_fill(~mask, float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)  # fully masked rows (padding) -> zeros
    return torch.matmul(p, v)
