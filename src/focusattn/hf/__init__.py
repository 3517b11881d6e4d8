"""Hugging Face integration: the only package that imports transformers."""
from .compose import compose, decompose, focus_config, is_composed, router_parameters, routers, set_top_k, update_config
from .io import load_adapter, save_adapter
from .loading import load_model

__all__ = ["compose", "decompose", "focus_config", "is_composed", "load_adapter", "load_model", "router_parameters",
           "routers", "save_adapter", "set_top_k", "update_config"]
