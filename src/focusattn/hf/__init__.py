"""Hugging Face integration: the only package that imports transformers."""
import warnings

from .compose import (compose, focus_config, is_composed, last_routing, router_parameters, routers, routing_caches,
                      set_top_k, unload, update_config)
from .io import load_adapter, save_adapter
from .loading import load_model


def decompose(model):
    """Deprecated alias of :func:`unload` (easily confused with the ``decomposed`` kernel)."""
    warnings.warn("focusattn.decompose is deprecated: use focusattn.unload", DeprecationWarning, stacklevel=2)
    return unload(model)


__all__ = ["compose", "decompose", "focus_config", "is_composed", "last_routing", "load_adapter", "load_model",
           "router_parameters", "routers", "routing_caches", "save_adapter", "set_top_k", "unload", "update_config"]
