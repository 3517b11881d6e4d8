"""Focus attention given a layer's routing: soft gate while training routers, hard top-k mask at inference."""
from __future__ import annotations

import dataclasses

import torch

from ..kernels.api import focus_attention
from ..kernels.common import default_scale, sink_key_mask
from ..kernels.decode import gathered_step, masked_step
from ..kernels.decomposed.fused import fused_fwd
from ..kernels.dispatch import PICKS, _fused_ok, choose
from ..kernels.soft import soft_focus_attention
from .config import FocusConfig
from .router import Routing


def dense_query_heads(cfg: FocusConfig, layer: int, hq: int, hkv: int, device=None) -> torch.Tensor | None:
    """bool [Hq]: the query heads of ``layer``'s dense key/value heads (``FocusConfig.dense_heads``), or None."""
    kv = cfg.dense_kv_heads(layer)
    if not kv:
        return None
    dense = torch.zeros(hkv, dtype=torch.bool, device=device)
    dense[list(kv)] = True
    return dense.repeat_interleave(hq // hkv)


def served_sinks(routing: Routing, cfg: FocusConfig, tk: int, key_padding_mask=None, device=None):
    """The kernels' ``sink`` argument for this routing: the first ``cfg.sink_tokens`` real tokens (an int), or, when
    the router chose global keys, those and the first tokens as one key mask [B, Tk]."""
    if routing.global_keys is None:
        return cfg.sink_tokens
    first = sink_key_mask(tk, cfg.sink_tokens, key_padding_mask, device)
    return routing.global_keys if first is None else routing.global_keys | first


def attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    routing: Routing,
    cfg: FocusConfig,
    *,
    scale: float | None = None,
    softcap: float | None = None,
    allowed: torch.Tensor | None = None,
    key_padding_mask: torch.Tensor | None = None,
    group_index=None,
    dense_kv: tuple[int, ...] = (),
) -> torch.Tensor:
    """Returns ``[B, Hq, Tq, D]``. ``routing`` covers all ``Tk`` keys (queries are the last ``Tq`` of them).

    ``allowed``: the host model's own bool mask (causal/padding/sliding window) broadcastable to [B, H, Tq, Tk], or
    None when it is plain causal (hard routing then runs the sparse kernels); ``key_padding_mask`` [B, Tk] lets the
    sparse kernels handle padding without one; ``group_index`` (a ``kernels.GroupIndex`` over the keys) lets a
    decode step skip scanning every key's groups. ``dense_kv``: key/value heads served with full causal attention
    (``FocusConfig.dense_heads`` of this layer): their query heads get a window covering every key, one kernel call
    beside the routed heads' one.
    """
    if dense_kv:
        return _split_heads(q, k, v, routing, cfg, dense_kv, scale=scale, softcap=softcap, allowed=allowed,
                            key_padding_mask=key_padding_mask, group_index=group_index)
    sink = served_sinks(routing, cfg, k.shape[2], key_padding_mask, q.device)
    if routing.membership is None:  # soft: every pair kept, distant ones gated by group affinity
        if key_padding_mask is not None and allowed is None:
            allowed = key_padding_mask[:, None, None, :]
        sinks = sink_key_mask(k.shape[2], sink, key_padding_mask, q.device)
        return soft_focus_attention(q, k, v, routing.groups, cfg.window, lam=cfg.lam, offset=cfg.gate_offset,
                                    gate=cfg.gate, scale=scale, softcap=softcap, allowed=allowed, sink_keys=sinks,
                                    query_groups=routing.query_groups)
    if cfg.roles and routing.query_membership is None:  # never serve a roles adapter's keys symmetrically
        raise ValueError(f"FocusConfig.key_top_k={cfg.key_top_k}, query_proj={cfg.query_proj} (query and key roles) "
                         "but the routing has no query membership")
    return focus_attention(q, k, v, routing.membership, cfg.window, sink=sink, scale=scale,  # hard
                           softcap=softcap, key_padding_mask=key_padding_mask, allowed=allowed, backend=cfg.backend,
                           group_index=group_index, query_membership=routing.query_membership)


def attend_one_token(q, k, v, group_index, cfg: FocusConfig, *, scale: float | None = None,
                     global_positions: list[int] | None = None, dense_kv: tuple[int, ...] = ()) -> torch.Tensor | None:
    """:func:`attend` of one sequence's decode step (one new query, symmetric hard routing already appended to
    ``group_index``, no mask, padding or softcap, no gradient) where ``backend="auto"`` gathers or takes one masked
    pass; None elsewhere (the caller then runs :func:`attend`). The keys of the ``gather`` branch from the index's
    host record, then its fused call over the gathered rows or, below the gather break-even, one fused call over
    every key with those keys unmasked (``decode-masked``), without the validation, key masks and dispatch around
    them: at a few hundred cached tokens those cost more than the attention (issue 23). ``global_positions``: the
    global keys as Python ints (``RoutingCache.global_positions``)."""
    if (q.shape[0] != 1 or q.shape[2] != 1 or cfg.roles or cfg.backend != "auto" or len(set(dense_kv)) >= k.shape[1]
            or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))):
        return None
    branch = choose(q, k, None, cfg.window, group_index=group_index)
    if branch not in ("gather", "decode-masked"):
        return None
    keys = group_index.last_keys(cfg.window, cfg.sink_tokens, extra=global_positions)
    if keys is None:
        return None
    PICKS[branch] += 1
    scale = default_scale(q.shape[-1], scale)
    out = (gathered_step if branch == "gather" else masked_step)(q, k, v, keys, scale)[0]
    g = q.shape[1] // k.shape[1]
    for h0, h1 in _head_runs(dense_kv):  # a dense head sees every cached key: the fused call on views, written over
        out[:, h0 * g:h1 * g] = fused_fwd(q[:, h0 * g:h1 * g], k[:, h0:h1], v[:, h0:h1], None, scale, causal=False)[0]
    return out


def _head_runs(dense_kv) -> list[list[int]]:
    """The dense key/value heads as runs ``[h0, h1)`` of adjacent heads: one call on views per run."""
    runs: list[list[int]] = []
    for h in sorted(set(dense_kv)):
        if runs and runs[-1][1] == h:
            runs[-1][1] = h + 1
        else:
            runs.append([h, h + 1])
    return runs


def _split_heads(q, k, v, routing, cfg, dense_kv, *, allowed, **kw) -> torch.Tensor:
    """The query heads of the dense key/value heads with a window covering every key, the others routed. A prefill
    splits the heads into two calls (gathering the heads costs little beside the attention). A decode step routes
    every head and replaces the dense heads' rows by calls on *views*, one per run of adjacent dense heads: gathering
    heads would copy the KV cache every step (measured at 8192 cached tokens: 3x slower per layer)."""
    hkv, g = k.shape[1], q.shape[1] // k.shape[1]
    heads = sorted(set(dense_kv))
    # one new query of one plain causal call at inference: a dense head sees every cached key, which is the
    # `causal` branch's own fused call, made here without the routing, validation and dispatch around it
    step = q.shape[2] == 1 and allowed is None and kw.get("key_padding_mask") is None and _fused_ok(
        q, kw.get("softcap")) and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad
                                                                    or v.requires_grad))

    def call(qh, kv, dense: bool):
        if dense and step:
            return fused_fwd(q[:, qh], k[:, kv], v[:, kv], None, default_scale(q.shape[-1], kw.get("scale")),
                             causal=False)[0]
        c = dataclasses.replace(cfg, window=max(cfg.window, k.shape[2])) if dense else cfg
        a = allowed if allowed is None or allowed.shape[1] == 1 else allowed[:, qh]
        return attend(q[:, qh], k[:, kv], v[:, kv], routing, c, allowed=a, **kw)

    if q.shape[2] == k.shape[2] or len(heads) == hkv:
        dense = torch.zeros(hkv, dtype=torch.bool)
        dense[heads] = True
        out = q.new_empty(q.shape[:3] + v.shape[-1:])
        for part, is_dense in ((dense, True), (~dense, False)):
            kv = part.nonzero().flatten()
            if kv.numel():
                qh = (kv[:, None] * g + torch.arange(g)).flatten().to(q.device)
                out[:, qh] = call(qh, kv.to(q.device), is_dense)
        return out
    routed, pieces, at = attend(q, k, v, routing, cfg, allowed=allowed, **kw), [], 0
    for h0, h1 in _head_runs(heads):
        pieces += [routed[:, at:h0 * g], call(slice(h0 * g, h1 * g), slice(h0, h1), True)]
        at = h1 * g
    return torch.cat(pieces + [routed[:, at:]], 1)
