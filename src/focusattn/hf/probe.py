"""Run a Focus-composed model with a probe in place of its attention, through ``AttentionInterface`` like Focus itself.

* :func:`capture`: the *original* attention (full causal, the frozen model's own activations), and a callback per layer
  with the layer's input and its q/k. Attention recall (``eval/recall.py``) and training routers against the model's
  own attention (``train/objectives.py``) both read a layer through it.
* :func:`masked`: dense attention under a per-layer rule for the distant pairs (local and sink pairs always kept),
  the serving path of the baselines no sparse kernel takes (the oracle at a mask's budget, k-means keys): the exact
  dense reference, not a fast kernel.

Both take prefills only (a whole sequence, queries = keys): the evaluations they serve score full forwards.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ..focus.attend import dense_query_heads
from ..focus.key_router import key_features
from ..kernels import recall
from ..kernels.common import relative_distance
from ..kernels.reference import expand_kv, masked_attention
from . import attention_fn
from .compose import _state, routing_caches
from .specs import attention_modules

CAPTURE, MASKED = "focus-capture", "focus-masked"
PROBE = "focus_probe"  # the probe of the layer while a context below is open (a plain attribute)

# fn(layer, module, h, q, k, scale, softcap): h [B, T, d] the router's input (the layer input; the key-space router's
# key features), q [B, Hq, T, D], k [B, Hkv, T, D]
CaptureFn = Callable[..., None]
# rule(layer, module, h, q, k, scale, softcap) -> KeepFn over the distant pairs of this call
RuleFn = Callable[..., recall.KeepFn]


def _model_allowed(attention_mask, t: int):
    if attention_mask is None:
        return None
    m = attention_mask[..., :t]
    return m if m.dtype == torch.bool else m > torch.finfo(m.dtype).min / 2


def _prefill_only(query, key) -> None:
    if query.shape[2] != key.shape[2]:
        raise ValueError("attention probes take whole sequences (prefill), not cached decode steps")


def _router_input(module, query, key) -> torch.Tensor:
    """What the layer's router routes by: the stored layer input, or the key-space router's key features."""
    h = module.focus_cache.take_hidden()
    return key_features(query, key) if module.focus_router.cfg.router_input == "keys" else h


def _capture_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    _prefill_only(query, key)
    layer, fn = getattr(module, PROBE)
    h = _router_input(module, query, key)
    softcap = kwargs.get("softcap")
    fn(layer, module, h, query, key, scaling, softcap)
    allowed = _model_allowed(attention_mask, key.shape[2])
    if softcap is not None or kwargs.get("sliding_window") is not None:
        d = relative_distance(query.shape[2], key.shape[2], query.device)
        sw = kwargs.get("sliding_window")
        causal = (d >= 0) if sw is None else (d >= 0) & (d < sw)
        mask = causal[None, None] if allowed is None else (causal & allowed)
        out = masked_attention(query, key, value, mask, scale=scaling, softcap=softcap)
    elif allowed is None:
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
    else:
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=allowed, scale=scaling,
                                             enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


def _masked_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    _prefill_only(query, key)
    layer, rule = getattr(module, PROBE)
    h = _router_input(module, query, key)
    softcap = kwargs.get("softcap")
    keep = rule(layer, module, h, query, key, scaling, softcap)
    cfg = module.focus_router.cfg
    b, hq, t, _ = query.shape
    dense = dense_query_heads(cfg, layer, hq, key.shape[1], query.device)  # they keep every pair
    allowed = _model_allowed(attention_mask, t)
    out = torch.empty(b, hq, t, value.shape[-1], dtype=torch.float32, device=query.device)
    vv = expand_kv(value, hq).float()
    for r0 in range(0, t, recall.ROWS):
        r1 = min(t, r0 + recall.ROWS)
        p = recall.causal_probs(query, key, r0, r1, scale=scaling, softcap=softcap)
        local, sinks, distant = recall.pair_kinds(r0, r1, t, cfg.window, cfg.sink_tokens, query.device)
        ok = (local | sinks)[None] | (keep(r0, r1, p) & distant)
        ok = ok[:, None] if dense is None else ok[:, None] | dense[None, :, None, None]
        if allowed is not None:
            ok = ok & allowed[..., r0:r1, :]
        p = p * ok  # renormalising the full softmax over the kept keys = the softmax over the kept keys
        out[:, :, r0:r1] = (p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)) @ vv
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for name, fn in ((CAPTURE, _capture_forward), (MASKED, _masked_forward)):
        AttentionInterface.register(name, fn)
        AttentionMaskInterface.register(name, sdpa_mask)


@contextlib.contextmanager
def _probing(model, name: str, fn):
    _state(model)  # raises for a model without routers
    _register()
    modules = attention_modules(model)
    for i, m in enumerate(modules):
        setattr(m, PROBE, (i, fn))
    model.set_attn_implementation(name)
    try:
        yield model
    finally:
        model.set_attn_implementation(attention_fn.NAME)
        for m in modules:
            delattr(m, PROBE)
        for c in routing_caches(model):
            c.set_hidden(None)


def capture(model, fn: CaptureFn):
    """Context: forwards of composed ``model`` run its original attention and call ``fn`` per layer."""
    return _probing(model, CAPTURE, fn)


def masked(model, rule: RuleFn):
    """Context: forwards of composed ``model`` run dense attention keeping local + sink pairs and the distant pairs
    ``rule`` keeps (see the module docstring)."""
    return _probing(model, MASKED, rule)


def served_keep(router, h: torch.Tensor, k: int, key_top_k: int | None = None) -> recall.KeepFn:
    """The distant pairs ``router`` serves at hard top-``k`` on layer input ``h`` (whatever top-k its config
    serves): a shared group, or a global key. ``key_top_k``: query and key roles (query top-``k``, key
    top-``key_top_k``: the query's groups meet the key's). A router with its own query projection
    (``cfg.query_proj``) serves its queries' top-1 only, so ``k`` must be 1."""
    if router.cfg.query_proj and k != 1:
        raise ValueError(f"top_k={k}: a router with query_proj=True serves query top-1 only; allowed top_k=1")
    routing = router.served(h, k, key_top_k)
    if routing.query_membership is not None:
        return recall.shared_group_keep(routing.query_membership, routing.membership,
                                        global_keys=routing.global_keys)
    return recall.shared_group_keep(routing.membership, global_keys=routing.global_keys)


# -------------------------------------------------------------------------------------------- the baselines' rules
def oracle_rule(top_k: int) -> RuleFn:
    """The oracle at top-k's budget: per query the same number of distant keys as the layer's own router keeps at
    top-k on this input (same forward, same routing), but those of highest probability (head mean)."""

    def rule(layer, module, h, q, k, scale, softcap):
        cfg = module.focus_router.cfg
        served = served_keep(module.focus_router, h, top_k)  # the cap and the global keys included
        dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1], q.device)

        def keep(r0, r1, probs=None):
            t = k.shape[2]
            _, _, distant = recall.pair_kinds(r0, r1, t, cfg.window, cfg.sink_tokens, q.device)
            if probs is None:
                probs = recall.causal_probs(q, k, r0, r1, scale=scale, softcap=softcap)
            if dense is not None and not dense.all():  # ranked by the routed heads (the dense ones keep all)
                probs = probs[:, ~dense]
            return recall.oracle_keep(probs.mean(1), distant, (served(r0, r1) & distant).sum(-1))

        return keep

    return rule


def kmeans_rule(top_k: int, centroids: dict[int, torch.Tensor] | None = None) -> RuleFn:
    """k-means keys at top-k's budget (ClusterKV's recipe: :func:`.recall.kmeans_key_clusters`,
    :func:`.recall.cluster_budget_keep`): clusters of the layer's own keys fitted per input, each query taking the
    clusters it scores highest until they hold as many distant keys as the layer's own router keeps for it at top-k
    (same forward, same routing, the cap included). ``centroids``: layer -> centroids fitted elsewhere (e.g. once,
    on training text), used as they are instead of a per-input fit."""

    def rule(layer, module, h, q, k, scale, softcap):
        cfg = module.focus_router.cfg
        served = served_keep(module.focus_router, h, top_k)
        cluster, scores = recall.kmeans_key_clusters(q, k, centroids=None if centroids is None else centroids[layer])
        return recall.cluster_budget_keep(cluster, scores, served, window=cfg.window, sink=cfg.sink_tokens)

    return rule


@functools.lru_cache(maxsize=2)
def random_clusters(b: int, t: int, k_groups: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random groups for the random baseline of a key-space adapter: each key one of ``k_groups`` groups and each
    query a ranking of them, from the key-space router's own random draws (:func:`..focus.router.position_draws`,
    fixed per position). ``(cluster [B, T] long, scores [B, T, K])`` for :func:`.recall.cluster_budget_keep`, read
    only; cached, as every layer of a forward asks for the same ones."""
    from ..focus.router import position_draws

    cluster = position_draws(0, t, k_groups, device).argmax(-1)[None].expand(b, -1)
    scores = position_draws(0, t, k_groups, device, salt=1)[None].expand(b, -1, -1)
    return cluster, scores


def random_rule(top_k: int) -> RuleFn:
    """Random groups at top-k's budget, query by query (:func:`random_clusters`): each query takes whole random
    groups in its random order until they hold as many of its distant keys as the layer's own router keeps for it.

    Why a rule and not a routed model: served with the adapter's ``union_block`` (a query keeps the groups its block's
    earlier queries joined), random routing keeps far more than the router does, because 64 queries' random groups
    are most of the groups (measured on keys256-floor at 8192: 1.5% of the distant attention dropped against the
    router's 19%, at a "budget" that was the router's, not its own). Matched per query, random is the chance level
    of the same number of keys."""

    def rule(layer, module, h, q, k, scale, softcap):
        cfg = module.focus_router.cfg
        served = served_keep(module.focus_router, h, top_k)
        cluster, scores = random_clusters(k.shape[0], k.shape[2], cfg.num_groups, k.device)
        return recall.cluster_budget_keep(cluster, scores, served, window=cfg.window, sink=cfg.sink_tokens)

    return rule
