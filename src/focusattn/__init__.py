"""focusattn: sparse, sink-free attention (Focus routing and Lazy Attention) for PyTorch and Hugging Face models.

Heavy submodules (transformers integration) are imported lazily so that ``import focusattn`` stays cheap.
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {
    "FocusConfig": "focusattn.focus",
    "FocusRouter": "focusattn.focus",
    "compose": "focusattn.hf",
    "unload": "focusattn.hf",
    "decompose": "focusattn.hf",  # deprecated alias of unload
    "set_top_k": "focusattn.hf",
    "save_adapter": "focusattn.hf",
    "load_adapter": "focusattn.hf",
    "load_model": "focusattn.hf",
    "soft_focus_attention": "focusattn.kernels",
    "focus_attention": "focusattn.kernels",
    "LazyAttention": "focusattn.lazy",
    "LazyConfig": "focusattn.lazy",
    "lazy_attention": "focusattn.lazy",
    "focus_attention_with_sinks": "focusattn.kernels",  # deprecated: focus_attention(..., sink=n)
    "dense_focus_attention": "focusattn.kernels",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'focusattn' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)
