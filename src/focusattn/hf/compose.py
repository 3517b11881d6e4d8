"""Attach Focus routers to a Hugging Face causal LM (and take them off again) through public extension points only:
``add_module``, a forward pre-hook, and ``set_attn_implementation("focus")``."""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field

import torch

from ..focus.cache import RoutingCache
from ..focus.config import FocusConfig
from ..focus.key_router import KeyRouter
from ..focus.router import FocusRouter, Routing
from . import attention_fn
from .specs import attention_modules

ROUTER = "focus_router"
CACHE = "focus_cache"  # the layer's focus.cache.RoutingCache (a plain attribute: no parameters, not saved)
LAYER = "focus_layer"  # the layer's index (a plain attribute): which of FocusConfig.dense_heads are its own


@dataclass
class FocusState:
    cfg: FocusConfig
    original_impl: str
    requires_grad: dict[str, bool]
    hooks: list = field(default_factory=list)
    generation_modes: object = None  # the model's own ``_supported_generation_modes`` (restored by unload)


_MISSING = object()


class _GenerationModes(tuple):
    """The ``generate`` modes whose KV cache only grows, which the routing cache follows token for token. Beam search
    reorders the cache's rows and assisted generation (speculative, prompt lookup) crops it: the routing of cached
    tokens would silently belong to other rows or rejected tokens. transformers reads the model's
    ``_supported_generation_modes`` in ``generate`` before any forward and prints this in its error."""

    def __str__(self) -> str:
        return ("greedy search and sampling while Focus routers are attached (their routing cache does not follow "
                "beam-search reorders or assisted-generation crops of the KV cache; focusattn.unload(model) first)")

    __repr__ = __str__


def _generation_modes() -> _GenerationModes:
    from transformers.generation.configuration_utils import GenerationMode

    return _GenerationModes((GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE))


def _stash_hidden(module, args, kwargs):
    getattr(module, CACHE).set_hidden(kwargs.get("hidden_states", args[0] if args else None))


def is_composed(model) -> bool:
    return isinstance(getattr(model, "_focus_state", None), FocusState)


def _state(model) -> FocusState:
    if not is_composed(model):
        raise ValueError("model has no Focus routers: call focusattn.compose(model, cfg) first")
    return model._focus_state


def routers(model) -> list[FocusRouter]:
    _state(model)
    return [getattr(m, ROUTER) for m in attention_modules(model)]


def routing_caches(model) -> list[RoutingCache]:
    """Every layer's :class:`~focusattn.focus.cache.RoutingCache`, in layer order."""
    _state(model)
    return [getattr(m, CACHE) for m in attention_modules(model)]


def last_routing(model) -> list[Routing | None]:
    """Per layer, the routing of the last full forward run without gradients, extended by the decode steps that
    followed it: soft ``groups`` [B, T, K] and, with hard top-k, ``membership`` [B, T, K] (else None). None for a
    layer that has not run such a forward (training forwards are not kept)."""
    return [c.last() for c in routing_caches(model)]


def check_bare(model) -> None:
    """A model carries one adapter at a time (Focus routers or Lazy thresholds): composing onto either is refused."""
    from .lazy import is_lazy

    if is_composed(model) or is_lazy(model):
        have = "Focus routers" if is_composed(model) else "a Lazy (Elastic-Softmax) adapter"
        raise ValueError(f"model already has {have} (Focus and Lazy adapters cannot be combined, nor stacked): call "
                         "focusattn.unload(model) first")


def freeze(model) -> dict[str, bool]:
    """Freeze every parameter; return each one's former ``requires_grad`` (what ``unload`` restores)."""
    before = {n: p.requires_grad for n, p in model.named_parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    return before


def kv_heads(model) -> int:
    c = model.config
    return getattr(c, "num_key_value_heads", None) or c.num_attention_heads


def key_width(model) -> int:
    """A layer's keys side by side: ``Hkv * head_dim`` (the key-space router's centroid width)."""
    c = model.config
    return kv_heads(model) * (getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)


def dense_share(model, layer: int) -> float:
    """The share of ``layer``'s heads served dense (``FocusConfig.dense_heads``): they keep every causal pair."""
    return len(focus_config(model).dense_kv_heads(layer)) / kv_heads(model)


def check_dense_heads(model, cfg: FocusConfig, n_layers: int) -> None:
    """Every ``cfg.dense_heads`` pair names a layer and a key/value head of this model, else a ValueError."""
    hkv = kv_heads(model)
    bad = [p for p in cfg.dense_heads if p[0] >= n_layers or p[1] >= hkv]
    if bad:
        raise ValueError(f"dense_heads {bad} out of range: allowed (layer, kv_head) with layer in 0..{n_layers - 1} "
                         f"and kv_head in 0..{hkv - 1} for this model")


def compose(model, cfg: FocusConfig | None = None):
    """Add a router to every attention layer, freeze every original weight, switch attention to Focus. In place."""
    cfg = cfg or FocusConfig()
    check_bare(model)
    modules = attention_modules(model)  # raises for unsupported architectures
    check_dense_heads(model, cfg, len(modules))
    attention_fn.register()
    frozen = freeze(model)
    ref = next(model.parameters())
    if cfg.router_input == "keys":  # the centroids live in the layer's key space: group_dim is its width
        cfg = dataclasses.replace(cfg, group_dim=key_width(model))
    state = FocusState(cfg=cfg, original_impl=model.config._attn_implementation, requires_grad=frozen)
    for i, m in enumerate(modules):
        router = (KeyRouter(cfg.group_dim, cfg) if cfg.router_input == "keys" else
                  FocusRouter(model.config.hidden_size, cfg)).to(device=ref.device, dtype=torch.float32)
        # add_module leaves a new module in training mode whatever its parent's mode: a router in training mode
        # updates its causal offsets on every forward, so it must start in the host model's mode (later
        # model.train()/model.eval() calls then reach it as a submodule).
        router.train(model.training)
        m.add_module(ROUTER, router)
        setattr(m, CACHE, RoutingCache())
        setattr(m, LAYER, i)
        state.hooks.append(m.register_forward_pre_hook(_stash_hidden, with_kwargs=True))
    state.generation_modes = model.__dict__.get("_supported_generation_modes", _MISSING)
    model._supported_generation_modes = _generation_modes()  # beam search etc.: a clear error, not a wrong answer
    model._focus_state = state
    model.set_attn_implementation(attention_fn.NAME)
    return model


def unload(model):
    """Remove Focus from a composed model (PEFT's name): every router, routing cache and hook goes, the original
    attention implementation and trainability come back. In place; returns the model. A model with a Lazy
    (Elastic-Softmax) adapter loses its thresholds (and LoRA layers) the same way."""
    from .lazy import is_lazy, unload_lazy

    if is_lazy(model):
        return unload_lazy(model)
    state = _state(model)
    for h in state.hooks:
        h.remove()
    for m in attention_modules(model):
        delattr(m, ROUTER)
        delattr(m, CACHE)
        delattr(m, LAYER)
    model.set_attn_implementation(state.original_impl)
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))
    if state.generation_modes is _MISSING:
        model.__dict__.pop("_supported_generation_modes", None)
    else:
        model._supported_generation_modes = state.generation_modes
    del model._focus_state
    return model


@contextlib.contextmanager
def original_attention(model):
    """Run the composed model as the original inside the block (its own attention implementation, routers idle):
    the teacher of distillation without a second copy of the weights."""
    state = _state(model)
    model.set_attn_implementation(state.original_impl)
    try:
        yield model
    finally:
        model.set_attn_implementation(attention_fn.NAME)
        for c in routing_caches(model):
            c.set_hidden(None)  # the pre-hook stashed the teacher's layer inputs: not for the next Focus forward


def focus_config(model) -> FocusConfig:
    return _state(model).cfg


def update_config(model, **changes) -> FocusConfig:
    """Change inference-time knobs (``top_k``, ``backend``, ``window`` ...) on every router without retraining."""
    state = _state(model)
    k = changes.get("top_k", state.cfg.top_k)
    if k is not None and (not isinstance(k, int) or not 1 <= k <= state.cfg.num_groups):
        raise ValueError(f"top_k={k!r} is invalid: allowed None or an integer in 1..{state.cfg.num_groups}")
    if state.cfg.query_proj and k not in (None, 1):
        raise ValueError(f"top_k={k!r} is invalid for routers with query_proj=True (the queries' own projection is "
                         "served exactly only at query top-1): allowed None or 1")
    fixed = {"num_groups", "group_dim", "query_proj", "router_hidden", "router_input"} & set(changes)
    if fixed:
        raise ValueError(f"{sorted(fixed)} define the router shapes and cannot change after compose")
    new = dataclasses.replace(state.cfg, **changes)
    check_dense_heads(model, new, len(routers(model)))
    state.cfg = new
    for r, c in zip(routers(model), routing_caches(model)):
        r.cfg = state.cfg
        c.reset()  # cached routing was computed under the old config
    return state.cfg


_KEEP = object()


def set_top_k(model, k: int | None, *, backend: str | None = None, key_top_k=_KEEP) -> FocusConfig:
    """Switch inference sparsity: ``None`` = soft gating, k = hard membership in the top-k groups. ``key_top_k``:
    query and key roles (``FocusConfig.key_top_k``; None = symmetric); unless given it is kept, and a ``k`` it
    cannot be served with is an error naming it (never a silent switch to symmetric routing)."""
    changes = {"top_k": k}
    if backend is not None:
        changes["backend"] = backend
    if key_top_k is not _KEEP:
        changes["key_top_k"] = key_top_k
    return update_config(model, **changes)


def router_parameters(model) -> list[torch.nn.Parameter]:
    return [p for r in routers(model) for p in r.parameters()]
