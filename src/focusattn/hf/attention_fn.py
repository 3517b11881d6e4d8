"""The attention function registered with transformers' ``AttentionInterface`` under the name ``"focus"``.

The model computes q/k/v (RoPE, QK-norm, biases, cache update) as usual and hands them here; we ask the layer's
``focus.cache.RoutingCache`` (given the layer's input hidden state by a forward pre-hook) for the routing of this call
and call a kernel.
"""
from __future__ import annotations

import dataclasses
import logging

import torch

from ..focus.attend import attend, attend_one_token
from ..focus.key_router import key_features
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
    h = module.focus_cache.take_hidden()
    if router.cfg.router_input == "keys":  # the key-space router routes by the call's own keys and queries
        h = key_features(query, key)
    if dropout and "dropout" not in _warned:
        _warned.add("dropout")
        log.warning("attention dropout %.2f is ignored by Focus attention", dropout)
    tq, tk = query.shape[2], key.shape[2]
    sliding = kwargs.get("sliding_window")
    allowed = _allowed_from_mask(attention_mask, tq, tk, sliding, query.device)
    kpm, needs_mask = _key_padding(allowed, tk, sliding)
    # prefill (tq == tk; remembered for the decode steps unless building a graph) or a decode step appended to it
    module.focus_cache.follow_rows(key, tq)
    softcap = kwargs.get("softcap")
    call = module.focus_cache.route(router, h, tk, key_padding_mask=kpm if tq == tk else None,
                                    sliding_window=sliding, keep=not torch.is_grad_enabled(), defer=softcap is None)
    if call.routing is None:  # the window covers every key: Focus keeps every pair, it is the original attention
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=scaling,
                                      **kwargs)
    routing, index, cfg = call.routing, call.group_index, router.cfg
    dense_kv = cfg.dense_kv_heads(getattr(module, "focus_layer", -1))
    if call.trimmed:
        cfg = dataclasses.replace(cfg, sink_tokens=0)
    elif index is not None and allowed is None and kpm is None and softcap is None and routing.query_membership is None:
        out = attend_one_token(query, key, value, index, cfg, scale=scaling, dense_kv=dense_kv,
                               global_positions=module.focus_cache.global_positions())
        if out is not None:  # one sequence's step that gathers or masks: the lean path (same keys)
            return out.transpose(1, 2).contiguous(), None
    out = attend(query, key, value, routing, cfg, scale=scaling, softcap=softcap,
                 allowed=allowed if (needs_mask or routing.membership is None or cfg.backend == "dense") else None,
                 key_padding_mask=kpm, group_index=index, dense_kv=dense_kv)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register the function and its mask builder (the boolean SDPA mask: causal, padding, sliding windows)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, focus_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
