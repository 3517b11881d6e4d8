"""Adapters: ``adapter_config.json`` (Focus config, base model, library version) + ``adapter.safetensors`` (router
tensors only). Loading is strict: any missing, unexpected or mis-shaped key is an error naming it."""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .. import __version__
from .._io import atomic_path, write_json
from ..focus.config import FocusConfig
from .compose import compose, focus_config, is_composed, routers

CONFIG = "adapter_config.json"
WEIGHTS = "adapter.safetensors"


def _base_id(model) -> str:
    return str(getattr(model.config, "_name_or_path", "") or "")


def _router_tensors(model):
    """``("layers.{i}.{name}", tensor)`` for every router parameter and buffer: the adapter's key scheme."""
    for i, r in enumerate(routers(model)):
        r.flush_offsets()  # saved state includes the last training batch
        for name, t in list(r.named_parameters()) + list(r.named_buffers()):
            yield f"layers.{i}.{name}", t


def adapter_state(model) -> dict[str, torch.Tensor]:
    return {key: t.detach().cpu().contiguous() for key, t in _router_tensors(model)}


def load_adapter_state(model, tensors: dict[str, torch.Tensor], *, source: str = "adapter") -> None:
    """Copy router tensors into a composed model; any missing, unexpected or mis-shaped key is an error."""
    expected = dict(_router_tensors(model))
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = sorted(k for k in set(expected) & set(tensors) if expected[k].shape != tensors[k].shape)
    if missing or unexpected or shapes:
        raise ValueError(f"{source} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                         f"mis-shaped {shapes[:3]}")
    with torch.no_grad():
        for key, t in expected.items():
            t.copy_(tensors[key].to(t.dtype))


def save_adapter(model, path: str | os.PathLike) -> Path:
    """Write the adapter folder; each file appears whole (temp + rename)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = focus_config(model)
    state = adapter_state(model)
    with atomic_path(path / WEIGHTS) as tmp:
        save_file({k: (v.float() if v.is_floating_point() else v.to(torch.uint8)) for k, v in state.items()}, str(tmp))
    write_json(path / CONFIG, {
        "focus_config": cfg.to_dict(),
        "base_model": _base_id(model),
        "model_type": model.config.model_type,
        "hidden_size": model.config.hidden_size,
        "num_layers": len(routers(model)),
        "trainable_parameters": sum(v.numel() for k, v in state.items() if not k.split(".")[-1].startswith("offsets")),
        "focusattn_version": __version__,
    })
    return path


class _NotFocus(ValueError):
    pass


def read_adapter_config(path: str | os.PathLike) -> dict:
    p = Path(path) / CONFIG
    if not p.is_file():
        raise ValueError(f"adapter {path}: missing {CONFIG} (not a Focus adapter folder)")
    try:
        meta = json.loads(p.read_text())
        if "peft_type" in meta:
            raise _NotFocus(f"adapter {path} is a {meta['peft_type']} adapter in peft's format (`focusattn retrofit "
                            "--method lora`), not a Focus adapter: this command needs one from `focusattn retrofit` "
                            "(only `focusattn eval` also takes LoRA)")
        FocusConfig.from_dict(meta["focus_config"])
    except _NotFocus:
        raise
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"adapter {path}: corrupt {CONFIG} ({e})") from e
    return meta


def load_adapter(model, path: str | os.PathLike, *, check_base: bool = True):
    """Compose ``model`` with the saved config (unless already composed) and load the router tensors strictly.

    ``path``: an adapter folder or the name of a shipped adapter (``focusattn.adapters.shipped()``). Routers take the
    model's current train/eval mode. An already composed model must have the adapter's number of groups."""
    from ..adapters import resolve

    path = resolve(path)
    meta = read_adapter_config(path)
    cfg = FocusConfig.from_dict(meta["focus_config"])
    if meta["model_type"] != model.config.model_type or meta["hidden_size"] != model.config.hidden_size:
        raise ValueError(f"adapter {path} was made for a {meta['model_type']} with hidden size {meta['hidden_size']}, "
                         f"not this {model.config.model_type} with hidden size {model.config.hidden_size}")
    if check_base and meta.get("base_model") and _base_id(model) and meta["base_model"] != _base_id(model):
        raise ValueError(f"adapter {path} was trained on base model {meta['base_model']!r}, not {_base_id(model)!r}; "
                         "pass check_base=False to load it anyway")
    try:
        tensors = load_file(str(path / WEIGHTS))
    except (FileNotFoundError, SafetensorError, OSError) as e:
        raise ValueError(f"adapter {path}: cannot read {WEIGHTS} ({e})") from e
    if not is_composed(model):
        compose(model, cfg)
    elif (focus_config(model).num_groups, focus_config(model).group_dim) != (cfg.num_groups, cfg.group_dim):
        have = focus_config(model)
        raise ValueError(f"adapter {path} has K={cfg.num_groups}, d_g={cfg.group_dim} but the model is composed with "
                         f"K={have.num_groups}, d_g={have.group_dim}")
    load_adapter_state(model, tensors, source=f"adapter {path}")
    return model
