"""The attention function registered with transformers' ``AttentionInterface`` under the name ``"focus"``.

The model computes q/k/v (RoPE, QK-norm, biases, cache update) as usual and hands them here; we read the layer's
routing (its router was given the layer's input hidden state by a forward pre-hook) and call a kernel.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from ..focus.attend import attend
from ..focus.router import Routing
from ..kernels.group_index import GroupIndex
from ..kernels.reference import relative_distance

log = logging.getLogger("focusattn")
NAME = "focus"
_warned: set[str] = set()


def _allowed_from_mask(attention_mask, tq: int, tk: int, sliding_window, device):
    """The model's own mask as bool [B|1, 1|H, Tq, Tk] (True = may attend), or None for plain causal."""
    allowed = None
    if attention_mask is not None:
        m = attention_mask[..., :tk]
        allowed = m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2
    if sliding_window is not None and allowed is None and tk > sliding_window:
        dist = relative_distance(tq, tk, device)
        allowed = ((dist >= 0) & (dist < sliding_window))[None, None]
    return allowed


def _key_padding(allowed, tk: int, sliding_window):
    """Recover a [B, Tk] key-padding mask from a causal+padding mask (its last query row sees every real key), so
    the sparse kernels need no T x T mask. Returns (kpm, still_needs_mask)."""
    if allowed is None:
        return None, False
    if sliding_window is not None and tk > sliding_window:
        return None, True
    kpm = allowed[:, 0, -1, :]
    if kpm.shape[0] == 1 and bool(kpm.all()):
        return None, False
    return kpm, False


def focus_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    router = getattr(module, "focus_router", None)
    if router is None:
        raise RuntimeError("attention implementation 'focus' is set but this layer has no router: use fa.compose()")
    h = router.pending_hidden
    router.pending_hidden = None
    if h is None:
        raise RuntimeError("Focus router received no hidden state: was the forward pre-hook removed?")
    if dropout and "dropout" not in _warned:
        _warned.add("dropout")
        log.warning("attention dropout %.2f is ignored by Focus attention", dropout)
    cfg = router.cfg
    tq, tk = query.shape[2], key.shape[2]
    sliding = kwargs.get("sliding_window")
    allowed = _allowed_from_mask(attention_mask, tq, tk, sliding, query.device)
    kpm, needs_mask = _key_padding(allowed, tk, sliding)

    routing = router(h, mask=kpm[:, -tq:] if (kpm is not None and tq == tk) else None, start=tk - tq)
    index = None
    if tq == tk:
        if not torch.is_grad_enabled():  # prefill: remember every token's routing for the decode steps
            router.cache = routing
            router.group_index = None if routing.membership is None else GroupIndex(routing.membership)
    else:
        if cfg.routing == "sequence":
            raise ValueError("decoding with a KV cache needs FocusConfig.routing='causal' (sequence routing sees the "
                             "future); compose with routing='causal'")
        hard = routing.membership is not None
        cached = (len(router.group_index) if router.group_index is not None else -1) if hard else (
            router.cache.groups.shape[1] if router.cache is not None else -1)
        # A sliding-window layer's KV cache keeps only its last keys (Gemma-2): every cached key is then inside the
        # model's window, and the true first token, outside it, is masked anyway, so no sink applies to that call.
        trimmed = sliding is not None and cached + tq > tk and cached >= 0
        if cached + tq != tk and not trimmed:
            raise RuntimeError(f"Focus routing cache holds {max(cached, 0)} tokens but the KV cache has {tk - tq}: "
                               "start generation with a full prefill (beam search reorders are not followed)")
        if hard:  # per-group positions, appended in O(new tokens): the decode kernel never scans all T keys
            index = router.group_index
            index.append(routing.membership)
            routing = Routing(routing.groups, index.membership)
        else:
            routing = Routing(torch.cat([router.cache.groups, routing.groups], 1), None)
            router.cache = routing
        if trimmed:
            index = None
            routing = Routing(routing.groups[:, -tk:],
                              None if routing.membership is None else routing.membership[:, -tk:])
            cfg = dataclasses.replace(cfg, sink_tokens=0)
    out = attend(query, key, value, routing, cfg, scale=scaling, softcap=kwargs.get("softcap"),
                 allowed=allowed if (needs_mask or routing.membership is None or cfg.backend == "dense") else None,
                 key_padding_mask=kpm, group_index=index)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the function and its mask builder (the boolean SDPA mask: causal, padding, sliding windows)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, focus_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
