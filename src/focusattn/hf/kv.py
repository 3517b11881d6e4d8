"""transformers' KV cache under its current name, in one place: the forward argument and output field are ``cache``
in recent 5.x (``past_key_values`` there is deprecated, with a FutureWarning) and ``past_key_values`` in earlier 5.x,
which we still support (no minor version is pinned)."""
from __future__ import annotations

import functools
import inspect


@functools.lru_cache(maxsize=None)
def _takes_cache(forward_type) -> bool:
    return "cache" in inspect.signature(forward_type.forward).parameters


def cache_kwargs(model, cache) -> dict:
    """The keyword that hands ``cache`` (a transformers ``Cache``) to ``model(...)``: ``{"cache": cache}`` where the
    model's forward takes it, else ``{"past_key_values": cache}``."""
    return {"cache" if _takes_cache(type(model)) else "past_key_values": cache}


def output_cache(out):
    """The KV cache a forward with ``use_cache=True`` returned (``out.cache``, or ``out.past_key_values`` before the
    rename; reading the old name on a new output logs a deprecation)."""
    if "cache" in getattr(out, "__dataclass_fields__", {}):
        return out.cache
    return out.past_key_values
