"""Hugging Face integration: the only package that imports transformers."""
import warnings

from .compose import compose, focus_config, is_composed, router_parameters, routers, set_top_k, update_config
from .compose import decompose as _remove_focus
from .io import load_adapter, save_adapter
from .loading import load_model


def unload(model):
    """Remove Focus from a composed model (PEFT's name): every router and hook goes, the original attention
    implementation and trainability come back. In place; returns the model."""
    return _remove_focus(model)


def decompose(model):
    """Deprecated alias of :func:`unload` (easily confused with the ``decomposed`` kernel)."""
    warnings.warn("focusattn.decompose is deprecated: use focusattn.unload", DeprecationWarning, stacklevel=2)
    return unload(model)


__all__ = ["compose", "decompose", "focus_config", "is_composed", "load_adapter", "load_model", "router_parameters",
           "routers", "save_adapter", "set_top_k", "unload", "update_config"]
