"""Soft-gated Focus attention used while training routers (dense O(T^2), differentiable in the group weights).

Local pairs (``0 <= i - j <= window``) are untouched; distant causal pairs are gated by the group affinity
``a_ij = g_i . g_j`` in [0, 1]. Two gate forms (see README "Design decisions"):

* ``"multiplicative"`` (paper Eq. 2): ``s_ij * sigmoid(lam * (a_ij - offset))``. With ``offset=0`` two tokens in
  different groups get sigmoid(0) = 0.5: their logit is halved, not removed.
* ``"log"``: ``s_ij + log sigmoid(lam * (a_ij - offset))``. As ``lam`` grows this tends to the hard mask used at
  inference (0 for shared groups, -inf otherwise), so training and inference agree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .common import apply_softcap, default_scale, relative_distance
from .reference import expand_kv

GATES = ("multiplicative", "log")


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
) -> torch.Tensor:
    """``groups``: float ``[B, Tk, K]`` soft assignments (rows sum to 1). ``allowed``: optional bool mask broadcastable
    to ``[B, Hq, Tq, Tk]`` (the model's causal/padding/sliding mask); causality is always enforced here too.
    ``sink_keys``: bool [B|1, Tk] keys exempt from gating (see ``reference.sink_key_mask``)."""
    if gate not in GATES:
        raise ValueError(f"gate must be one of {GATES}, got {gate!r}")
    hq, tq, d = q.shape[1], q.shape[2], q.shape[-1]
    tk = k.shape[2]
    k, v = expand_kv(k, hq), expand_kv(v, hq)
    s = apply_softcap(torch.matmul(q, k.transpose(-1, -2)) * default_scale(d, scale), softcap)
    dist = relative_distance(tq, tk, q.device)
    distant = dist > window  # [Tq, Tk]: beyond the window (common.in_window), so gated
    if sink_keys is not None:  # sinks are never gated, like local pairs
        distant = distant & ~sink_keys[:, None, None, :]
    affinity = torch.einsum("bik,bjk->bij", groups[:, tk - tq:], groups).unsqueeze(1).to(s.dtype)
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
