"""Dense O(T^2) reference kernels: the simplest possible statement of each attention rule.

Every fast path in :mod:`focusattn.kernels` is tested against these. Shapes follow transformers:
``q`` is ``[B, Hq, Tq, D]``, ``k``/``v`` are ``[B, Hkv, Tk, D]`` with ``Hq % Hkv == 0`` (GQA). Queries are aligned
to the *end* of the keys (query ``i`` sits at absolute position ``Tk - Tq + i``), which covers both prefill
(``Tq == Tk``) and cached decoding (``Tq < Tk``).
"""
from __future__ import annotations

import torch

from .common import apply_softcap, default_scale, relative_distance, sink_key_mask


def expand_kv(x: torch.Tensor, hq: int) -> torch.Tensor:
    """Repeat KV heads so that they line up with ``hq`` query heads (reference only; fast paths avoid the copy)."""
    hkv = x.shape[1]
    if hq % hkv:
        raise ValueError(f"q heads ({hq}) must be a multiple of kv heads ({hkv})")
    return x if hq == hkv else x.repeat_interleave(hq // hkv, dim=1)


def focus_allowed(membership: torch.Tensor, window: int, tq: int | None = None,
                  sink_keys: torch.Tensor | None = None, query_membership: torch.Tensor | None = None) -> torch.Tensor:
    """Hard Focus mask ``[B, Tq, Tk]``: ``j <= i`` and (``i - j <= window`` or query ``i``'s groups meet key ``j``'s,
    or key ``j`` is a sink: ``sink_keys`` [B|1, Tk], see :func:`.common.sink_key_mask`).

    ``membership`` is bool ``[B, Tk, K]`` over *all* keys (their groups as keys). ``query_membership``: the queries'
    groups ``[B, Tq, K]`` when query and key roles differ; None = the last ``tq`` rows of ``membership``.
    """
    b, tk, _ = membership.shape
    tq = (tk if query_membership is None else query_membership.shape[1]) if tq is None else tq
    dist = relative_distance(tq, tk, membership.device)
    m = membership.float()
    mq = m[:, tk - tq:] if query_membership is None else query_membership.float()
    shared = torch.einsum("bik,bjk->bij", mq, m) > 0
    ok = (dist <= window) | shared  # the window convention of common.in_window
    if sink_keys is not None:
        ok = ok | sink_keys[:, None, :]
    return (dist >= 0) & ok


def masked_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    allowed: torch.Tensor,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    return_lse: bool = False,
):
    """Softmax attention restricted to ``allowed`` (bool, broadcastable to ``[B, Hq, Tq, Tk]``).

    A query row with no allowed key returns zeros (and LSE ``-inf``).
    """
    hq, d = q.shape[1], q.shape[-1]
    k, v = expand_kv(k, hq), expand_kv(v, hq)
    s = apply_softcap(torch.matmul(q, k.transpose(-1, -2)) * default_scale(d, scale), softcap)
    s = s.masked_fill(~allowed, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1).clamp_min(torch.finfo(s.dtype).min))
    p = p.masked_fill(~allowed, 0.0)
    out = torch.matmul(p, v)
    return (out, lse) if return_lse else out


def dense_focus_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    membership: torch.Tensor,
    window: int,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
    sink: int = 0,
    allowed: torch.Tensor | None = None,
    return_lse: bool = False,
    query_membership: torch.Tensor | None = None,
):
    """Reference hard-mask Focus attention (explicit ``[B, 1, Tq, Tk]`` mask).

    ``key_padding_mask``: optional bool ``[B, Tk]``, True for real tokens. ``sink``: the first ``sink`` real tokens
    are visible to every later query (attention sinks; 0 = the paper's mask). ``allowed``: an extra bool mask
    broadcastable to ``[B, Hq, Tq, Tk]`` (e.g. a host model's own sliding window) that the result must also obey.
    ``query_membership``: the queries' groups ``[B, Tq, K]`` with query and key roles (see :func:`focus_allowed`).
    """
    sinks = sink_key_mask(k.shape[2], sink, key_padding_mask, q.device)
    mask = focus_allowed(membership, window, q.shape[2], sinks, query_membership)[:, None]
    if allowed is not None:
        mask = mask & allowed
    if key_padding_mask is not None:
        mask = mask & key_padding_mask[:, None, None, :]
    return masked_attention(q, k, v, mask, scale=scale, softcap=softcap, return_lse=return_lse)
