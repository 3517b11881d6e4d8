"""Training-free sparse baselines at a given kept-pair budget, for comparison with a trained Focus adapter.

``sliding_sink(model, window, sinks)``: StreamingLLM-style attention (the last ``window`` keys plus the first
``sinks`` tokens), registered with transformers' ``AttentionInterface`` like Focus itself, computed densely (a
quality baseline, not a fast kernel); with ``dense_heads`` those key/value heads keep full causal attention and the
others the window + sinks (DuoAttention's retrieval and streaming heads, Xiao et al. 2024). Random groups and an
untrained router need no code of their own: they are ``compose(model, FocusConfig(routing="random"))`` and
``compose(model, FocusConfig())`` without training.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..kernels.reference import expand_kv, relative_distance

NAME = "focus-sliding-sink"
DENSE = "_focus_dense_kv"  # an attention module's dense key/value heads (a plain attribute)


def _forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    tq, tk = query.shape[2], key.shape[2]
    window, sinks = module.config._focus_sliding
    dist = relative_distance(tq, tk, query.device)
    keep = (dist >= 0) & ((dist <= window) | (torch.arange(tk, device=query.device) < sinks)[None, :])
    mask = keep[None, None]
    dense_kv = getattr(module, DENSE, ())
    if dense_kv:  # retrieval heads: every causal pair
        hq, hkv = query.shape[1], key.shape[1]
        dense = torch.zeros(hkv, dtype=torch.bool, device=query.device)
        dense[list(dense_kv)] = True
        mask = mask | (dense.repeat_interleave(hq // hkv)[None, :, None, None] & (dist >= 0)[None, None])
    if attention_mask is not None:
        m = attention_mask[..., :tk]
        mask = mask & (m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2)
    k, v = expand_kv(key, query.shape[1]), expand_kv(value, query.shape[1])
    out = F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def sliding_sink(model, window: int, sinks: int = 1, dense_heads=()):
    """Switch ``model`` (not composed with Focus) to window + sink attention, except the ``(layer, kv_head)`` pairs
    of ``dense_heads`` (full causal attention); ``restore(model)`` undoes it."""
    from .specs import attention_modules

    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    if window < 0 or sinks < 0:
        raise ValueError(f"window={window} and sinks={sinks} must be >= 0")
    AttentionInterface.register(NAME, _forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    if not hasattr(model.config, "_focus_sliding_original"):
        model.config._focus_sliding_original = model.config._attn_implementation
    model.config._focus_sliding = (int(window), int(sinks))
    for m in model.modules():  # the attention modules read the pair (window, sinks) from their config
        if hasattr(m, "config") and m is not model:
            m.config._focus_sliding = model.config._focus_sliding
    for i, m in enumerate(attention_modules(model)):
        setattr(m, DENSE, tuple(h for (layer, h) in dense_heads if layer == i))
    model.set_attn_implementation(NAME)
    return model


def restore(model):
    impl = getattr(model.config, "_focus_sliding_original", None)
    if impl is not None:
        model.set_attn_implementation(impl)
        del model.config._focus_sliding_original
    return model


def pairs_kept_sliding(t: int, window: int, sinks: int = 1) -> float:
    """Share of the T(T+1)/2 causal pairs that window + sinks keeps."""
    kept = sum(min(i + 1, window + 1) + max(0, min(sinks, i + 1 - (window + 1))) for i in range(t))
    return kept / (t * (t + 1) / 2)


def window_for_budget(t: int, share: float, sinks: int = 1, dense: float = 0.0) -> int:
    """Smallest window whose window + sinks mask keeps at least ``share`` of the causal pairs at length ``t``, with
    a share ``dense`` of the heads keeping every pair (mean over layers)."""
    if dense:
        share = (share - dense) / (1 - dense) if dense < 1 else 0.0
    lo, hi = 0, t
    while lo < hi:
        mid = (lo + hi) // 2
        if pairs_kept_sliding(t, mid, sinks) >= share:
            hi = mid
        else:
            lo = mid + 1
    return lo
