"""The small rules every Focus kernel shares, stated once: default scale, softcap, the window, top-k membership,
the group bitmask, sink keys.

Window convention (everywhere in Focus): key ``j`` is *local* to query ``i`` iff ``0 <= i - j <= window``, so
``window = 0`` keeps only the diagonal and a query sees ``window + 1`` local keys. A sliding window "of ``n`` keys"
(transformers' ``sliding_window``, the lab's ``sliding`` baseline: ``0 <= i - j < n``) is ``in_window(d, n - 1)``.
"""
from __future__ import annotations

import math

import torch


def default_scale(head_dim: int, scale: float | None = None) -> float:
    """``scale`` as a float, or ``1 / sqrt(head_dim)`` when it is None."""
    return 1.0 / math.sqrt(head_dim) if scale is None else float(scale)


def apply_softcap(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """Gemma-2 logit softcapping ``softcap * tanh(s / softcap)`` (identity when ``softcap`` is None)."""
    return scores if softcap is None else softcap * torch.tanh(scores / softcap)


def relative_distance(tq: int, tk: int, device=None) -> torch.Tensor:
    """``[Tq, Tk]`` integer matrix of ``i - j`` in absolute positions (negative above the causal diagonal); queries
    are the last ``tq`` of the ``tk`` positions."""
    qpos = torch.arange(tk - tq, tk, device=device)
    kpos = torch.arange(tk, device=device)
    return qpos[:, None] - kpos[None, :]


def row_distance(r0: int, r1: int, tk: int, device=None) -> torch.Tensor:
    """``[r1 - r0, Tk]`` rows ``r0:r1`` of ``relative_distance(tk, tk)``, without the ``Tk x Tk`` matrix (row chunks
    of a long prefill build only their own rows)."""
    return torch.arange(r0, r1, device=device)[:, None] - torch.arange(tk, device=device)[None, :]


def in_window(dist: torch.Tensor, window: int) -> torch.Tensor:
    """Bool: ``0 <= dist <= window`` (causal and local; see the module docstring for the convention)."""
    return (dist >= 0) & (dist <= window)


def topk_membership(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Bool ``[..., K]``: True for the ``k`` highest entries of the last dimension (hard top-k group membership)."""
    idx = scores.topk(k, dim=-1).indices
    return torch.zeros(scores.shape, dtype=torch.bool, device=scores.device).scatter_(-1, idx, True)


def group_bits(membership: torch.Tensor) -> torch.Tensor:
    """``[B, T, W]`` int64 words, 63 groups per word (bit 63 unused so words stay non-negative): two tokens share a
    group iff some word of theirs has a common bit. ``W = 1`` for ``K <= 63``."""
    kk = membership.shape[-1]
    words = -(-kk // 63)
    m = torch.nn.functional.pad(membership.long(), (0, words * 63 - kk)).view(*membership.shape[:2], words, 63)
    weights = torch.ones((), dtype=torch.int64, device=membership.device) << torch.arange(63, device=m.device)
    return (m * weights).sum(-1)


def has_sinks(sink) -> bool:
    """Whether a kernel's ``sink`` argument (an int count or a key mask, see :func:`sink_key_mask`) names any key."""
    return isinstance(sink, torch.Tensor) or sink > 0


def sink_count(sink) -> int:
    """The most sink keys of any row (an upper bound for sizing gathers)."""
    if isinstance(sink, torch.Tensor):
        return int(sink.sum(-1).max()) if sink.numel() else 0
    return int(sink)


def sink_positions(sink_keys: torch.Tensor, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's sink positions from a :func:`sink_key_mask` ``[B|1, Tk]``: ``(pos [B, n] long, ok [B, n] bool)``
    with ``n`` the most sinks of any row; a row with fewer (a sequence shorter than its sinks) pads with invalid
    slots at position 0. ``O(Tk)`` by rank, no sort: this runs on every layer of every decode step."""
    sink_keys = sink_keys.expand(batch, -1)
    n = int(sink_keys.sum(-1).max())
    rank = sink_keys.long().cumsum(-1) - 1
    bi, ti = (sink_keys & (rank < n)).nonzero(as_tuple=True)
    pos = torch.zeros((batch, n), dtype=torch.long, device=sink_keys.device)
    ok = torch.zeros((batch, n), dtype=torch.bool, device=sink_keys.device)
    pos[bi, rank[bi, ti]], ok[bi, rank[bi, ti]] = ti, True
    return pos, ok


def sink_key_mask(tk: int, n, key_padding_mask: torch.Tensor | None = None, device=None) -> torch.Tensor | None:
    """Bool ``[B|1, Tk]``: the keys every later query sees, or None when there are none. ``n``: the first ``n``
    *real* tokens of each sequence (attention sinks), or a bool ``[B|1, Tk]`` mask of any keys (the first tokens
    and the *global keys* a router chose by content, ``focus.router``), padding removed."""
    if isinstance(n, torch.Tensor):
        return n if key_padding_mask is None else n & key_padding_mask
    if n <= 0:
        return None
    if key_padding_mask is None:
        return (torch.arange(tk, device=device) < n)[None]
    rank = key_padding_mask.long().cumsum(-1) - 1
    return key_padding_mask & (rank < n)
