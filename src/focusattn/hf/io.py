"""Adapters: ``adapter_config.json`` (Focus config, base model, library version, the tensor file's sha256) +
``adapter.safetensors`` (router tensors only).

Writing is atomic file by file (temp + rename), tensors first, then the config that carries their checksum: an
interrupted save leaves either the old adapter or a config/tensor pair whose checksum disagrees, never a silent mix.
Loading is strict, and every error is one line naming the file: a malformed config (bad JSON, missing or unknown
fields, wrong types), a tensor file whose sha256 differs from the config's (truncated, corrupted, half-replaced),
and any missing, unexpected, mis-shaped, wrongly typed or non-finite tensor. Adapters saved before checksums existed
(no ``weights_sha256``) still load, with a warning.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from .. import __version__
from .._io import atomic_path, sha256_file, write_json
from ..focus.config import FocusConfig
from .compose import compose, focus_config, is_composed, routers, unload

log = logging.getLogger("focusattn")

CONFIG = "adapter_config.json"
WEIGHTS = "adapter.safetensors"
# adapter_config.json: field -> type. Unknown fields are refused (a typo must not be ignored).
FIELDS = {"focus_config": dict, "base_model": str, "model_type": str, "hidden_size": int, "num_layers": int,
          "trainable_parameters": int, "focusattn_version": str, "weights_sha256": str}
OPTIONAL = {"weights_sha256"}  # absent in adapters saved by focusattn before checksums were written


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())




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


def check_state_fits(expected: dict, tensors: dict, source: str) -> None:
    """The same keys and shapes as ``expected``, or a ValueError naming ``source`` and the first offenders."""
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    shapes = sorted(k for k in set(expected) & set(tensors) if expected[k].shape != tensors[k].shape)
    if missing or unexpected or shapes:
        raise ValueError(f"{source} does not fit this model: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                         f"mis-shaped {shapes[:3]}")


def load_adapter_state(model, tensors: dict[str, torch.Tensor], *, source: str = "adapter") -> None:
    """Copy router tensors into a composed model; any missing, unexpected, mis-shaped or wrongly typed key (a float
    where an integer/bool belongs or the reverse), and any non-finite value, is an error naming ``source``."""
    expected = dict(_router_tensors(model))
    check_state_fits(expected, tensors, source)
    dtypes = sorted(k for k, t in expected.items() if t.is_floating_point() != tensors[k].is_floating_point())
    if dtypes:
        raise ValueError(f"{source}: wrong dtype for {dtypes[:3]} (e.g. {tensors[dtypes[0]].dtype} where the model "
                         f"has {expected[dtypes[0]].dtype})")
    bad = sorted(k for k, t in tensors.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))
    if bad:
        raise ValueError(f"{source}: NaN/Inf values in {bad[:3]}")
    with torch.no_grad():
        for key, t in expected.items():
            t.copy_(tensors[key].to(t.dtype))


def _symmetric_start(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A symmetric adapter's tensors for a router with ``query_proj``: the query projection and offsets start as
    copies of the key ones, so it serves the adapter's groups (query top-1 of the same scores) until trained."""
    out = dict(tensors)
    for key, t in tensors.items():
        head, _, name = key.rpartition(".")
        if name == "offsets":
            out[f"{head}.q_offsets"] = t
        elif key.endswith(".proj.weight"):
            out[key[:-len("proj.weight")] + "proj_q.weight"] = t
    return out


def _linear_start(model, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A linear router's tensors for a model whose routers have an MLP (``router_hidden``): the MLP keeps the
    model's own tensors, whose output weight is zero until trained, so it serves the adapter's groups."""
    out = dict(tensors)
    for key, t in _router_tensors(model):
        if ".mlp." in key and key not in out:
            out[key] = t.detach().cpu()
    return out


def save_adapter(model, path: str | os.PathLike) -> Path:
    """Write the adapter folder: the tensors, then the config holding their sha256; each file appears whole."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = focus_config(model)
    state = adapter_state(model)
    with atomic_path(path / WEIGHTS) as tmp:
        save_file({k: (v.float() if v.is_floating_point() else v.to(torch.uint8)) for k, v in state.items()}, str(tmp))
        digest = sha256_file(tmp)
    write_json(path / CONFIG, {
        "focus_config": cfg.to_dict(),
        "base_model": _base_id(model),
        "model_type": model.config.model_type,
        "hidden_size": model.config.hidden_size,
        "num_layers": len(routers(model)),
        "trainable_parameters": sum(v.numel() for k, v in state.items()
                                    if not k.split(".")[-1].startswith(("offsets", "q_offsets"))),
        "focusattn_version": __version__,
        "weights_sha256": digest,
    })
    return path


def read_adapter_config(path: str | os.PathLike) -> dict:
    """The validated ``adapter_config.json`` of an adapter folder (see the module docstring); ValueError naming the
    file otherwise."""
    p = Path(path) / CONFIG
    if not p.is_file():
        raise ValueError(f"adapter {path}: missing {CONFIG} (not a Focus adapter folder)")
    try:
        meta = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: corrupt JSON ({_one_line(e)})") from e
    except OSError as e:
        raise ValueError(f"{p}: cannot read ({e.strerror or _one_line(e)})") from e
    if not isinstance(meta, dict):
        raise ValueError(f"{p}: corrupt: expected a JSON object, got {type(meta).__name__}")
    if "peft_type" in meta:
        raise ValueError(f"adapter {path} is a {meta['peft_type']} adapter in peft's format (`focusattn retrofit "
                        "--method lora`), not a Focus adapter: this command needs one from `focusattn retrofit` "
                        "(only `focusattn eval` also takes LoRA)")
    if meta.get("adapter_type") == "lazy":
        raise ValueError(f"adapter {path} is a Lazy (Elastic-Softmax) adapter (`focusattn retrofit --method lazy`), "
                         "not a Focus adapter: this needs one from `focusattn retrofit` (load it with "
                         "focusattn.load_adapter; `focusattn eval` and `long-eval` take both)")
    unknown = sorted(set(meta) - set(FIELDS))
    missing = sorted(set(FIELDS) - OPTIONAL - set(meta))
    if unknown or missing:
        raise ValueError(f"{p}: corrupt: " + "; ".join(
            ([f"missing field(s) {missing}"] if missing else []) + ([f"unknown field(s) {unknown}"] if unknown else []))
            + f" (fields: {sorted(FIELDS)})")
    for key, typ in FIELDS.items():
        if key in meta and (not isinstance(meta[key], typ) or isinstance(meta[key], bool)):
            raise ValueError(f"{p}: corrupt: field {key!r} must be {typ.__name__}, got {type(meta[key]).__name__} "
                             f"{meta[key]!r:.60}")
    if "weights_sha256" in meta and not re.fullmatch(r"[0-9a-f]{64}", meta["weights_sha256"]):
        raise ValueError(f"{p}: corrupt: field 'weights_sha256' must be 64 lowercase hex digits")
    try:
        FocusConfig.from_dict(meta["focus_config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{p}: corrupt focus_config ({_one_line(e)})") from e
    return meta


def read_adapter_tensors(path: str | os.PathLike, meta: dict | None = None) -> dict[str, torch.Tensor]:
    """The tensors of an adapter folder, after checking the file against the config's sha256 (read once: what is
    hashed is what is parsed)."""
    path = Path(path)
    meta = read_adapter_config(path) if meta is None else meta
    f = path / WEIGHTS
    try:
        data = f.read_bytes()
    except OSError as e:
        raise ValueError(f"{f}: cannot read ({e.strerror or _one_line(e)})") from e
    want = meta.get("weights_sha256")
    if want is None:
        log.warning("%s has no weights_sha256 (saved by an older focusattn): %s is not checksum-verified",
                    path / CONFIG, f)
    elif hashlib.sha256(data).hexdigest() != want:
        raise ValueError(f"{f}: sha256 {hashlib.sha256(data).hexdigest()[:12]}... differs from {CONFIG}'s "
                         f"{want[:12]}... (truncated or corrupted file, or an interrupted save)")
    try:
        return load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise ValueError(f"{f}: cannot read ({_one_line(e)})") from e


def verify_adapter(path: str | os.PathLike) -> dict:
    """Check an adapter folder without a model (config, checksum, tensor file); return its config."""
    from ..adapters import resolve
    from .lazy import is_lazy_adapter, read_lazy_config, read_lazy_tensors

    path = resolve(path)
    if is_lazy_adapter(path):
        meta = read_lazy_config(path)
        read_lazy_tensors(path, meta)
        return meta
    meta = read_adapter_config(path)
    read_adapter_tensors(path, meta)
    return meta


def load_adapter(model, path: str | os.PathLike, *, check_base: bool = True):
    """Compose ``model`` with the saved config (unless already composed) and load the router tensors strictly.

    ``path``: an adapter folder or the name of a shipped adapter (``focusattn.adapters.shipped()``). Routers take the
    model's current train/eval mode. An already composed model must have the adapter's number of groups. A Lazy
    (Elastic-Softmax) adapter folder is loaded by :func:`focusattn.hf.lazy.load_lazy_adapter`."""
    from ..adapters import resolve
    from .lazy import is_lazy, is_lazy_adapter, load_lazy_adapter

    path = resolve(path)
    if is_lazy_adapter(path):
        return load_lazy_adapter(model, path, check_base=check_base)
    if is_lazy(model):
        raise ValueError(f"adapter {path} is a Focus adapter and this model has a Lazy (Elastic-Softmax) adapter: "
                         "call focusattn.unload(model) first (Focus and Lazy adapters cannot be combined)")
    meta = read_adapter_config(path)
    cfg = FocusConfig.from_dict(meta["focus_config"])
    if meta["model_type"] != model.config.model_type or meta["hidden_size"] != model.config.hidden_size:
        raise ValueError(f"adapter {path} was made for a {meta['model_type']} with hidden size {meta['hidden_size']}, "
                         f"not this {model.config.model_type} with hidden size {model.config.hidden_size}")
    if check_base and meta.get("base_model") and _base_id(model) and meta["base_model"] != _base_id(model):
        raise ValueError(f"adapter {path} was trained on base model {meta['base_model']!r}, not {_base_id(model)!r}; "
                         "pass check_base=False to load it anyway")
    tensors = read_adapter_tensors(path, meta)
    composed_here = not is_composed(model)
    if composed_here:
        compose(model, cfg)
    elif focus_config(model).router_input != cfg.router_input:
        raise ValueError(f"adapter {path} routes by router_input={cfg.router_input!r} but the model is composed with "
                         f"router_input={focus_config(model).router_input!r}: load it into an uncomposed model")
    elif (focus_config(model).num_groups, focus_config(model).group_dim) != (cfg.num_groups, cfg.group_dim):
        have = focus_config(model)
        raise ValueError(f"adapter {path} has K={cfg.num_groups}, d_g={cfg.group_dim} but the model is composed with "
                         f"K={have.num_groups}, d_g={have.group_dim}")
    elif cfg.key_top_k is not None and focus_config(model).key_top_k != cfg.key_top_k:  # never served symmetrically
        raise ValueError(f"adapter {path} was saved with query and key roles (key_top_k={cfg.key_top_k}, top_k="
                         f"{cfg.top_k}) but the model is composed with key_top_k={focus_config(model).key_top_k}: "
                         f"compose with key_top_k={cfg.key_top_k} or load into an uncomposed model")
    elif cfg.query_proj and not focus_config(model).query_proj:  # its keys' groups are not its queries' groups
        raise ValueError(f"adapter {path} was saved with query_proj=True (the queries' own projection) but the model "
                         "is composed with query_proj=False: compose with query_proj=True or load into an uncomposed "
                         "model")
    elif cfg.router_hidden and focus_config(model).router_hidden != cfg.router_hidden:
        raise ValueError(f"adapter {path} was saved with router_hidden={cfg.router_hidden} (an MLP router) but the "
                         f"model is composed with router_hidden={focus_config(model).router_hidden}: compose with "
                         f"router_hidden={cfg.router_hidden} or load into an uncomposed model")
    if focus_config(model).query_proj and not cfg.query_proj:
        tensors = _symmetric_start(tensors)
    if focus_config(model).router_hidden and not cfg.router_hidden:
        tensors = _linear_start(model, tensors)
    try:
        load_adapter_state(model, tensors, source=str(path / WEIGHTS))
    except ValueError:
        if composed_here:  # leave the model as it came: no half-adapted model with random routers
            unload(model)
        raise
    return model
