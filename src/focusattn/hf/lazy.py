"""Elastic-Softmax on a pretrained Hugging Face model (Lazy Attention's retrofit), through public extension points
only: ``add_module`` (one :class:`~focusattn.lazy.ElasticParams` per attention layer) and
``set_attn_implementation("lazy")`` with the function registered here under ``AttentionInterface``.

The model keeps computing q/k/v, its positions (RoPE or learned), its cache and its mask; the registered function
replaces ``softmax(s)`` by ``ReLU(softmax(s + b) - tau_h / n_i)`` (``kernels.elastic``). Every pretrained weight is
frozen; ``tau`` (and the optional distance table) train, and optionally LoRA on the query/key projections through
``peft`` beside them (frozen weights may keep producing a sink that a threshold ``tau / n`` cannot remove).

A Lazy adapter folder holds ``adapter_config.json`` (``adapter_type: "lazy"``, the :class:`ElasticConfig`, the LoRA
settings, base model, the tensor file's sha256) and ``adapter.safetensors`` (``layers.{i}.tau_raw`` /
``layers.{i}.table`` and, with LoRA, peft's tensors under ``lora.``); written and read as strictly as a Focus adapter.
Focus and Lazy never share a model: each refuses the other with a one-line error.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_safetensors
from safetensors.torch import save_file

from .. import __version__
from .._io import atomic_path, sha256_file, write_json
from ..kernels.elastic import elastic_weights, lazy_attention
from ..kernels.reference import relative_distance
from ..lazy.attention import ElasticParams
from ..lazy.config import ElasticConfig
from .attention_fn import _allowed_from_mask
from .specs import attention_modules, spec_for

log = logging.getLogger("focusattn")

NAME = "lazy"
PARAMS = "lazy_params"
RECORD = "_lazy_record"  # set on a module while `recording` asks the function to return the dense weights
ADAPTER_TYPE = "lazy"
CONFIG = "adapter_config.json"
WEIGHTS = "adapter.safetensors"
FIELDS = {"adapter_type": str, "elastic_config": dict, "lora": (dict, type(None)), "base_model": str,
          "model_type": str, "hidden_size": int, "num_layers": int, "num_heads": int, "trainable_parameters": int,
          "focusattn_version": str, "weights_sha256": str}
_warned: set[str] = set()


@dataclass
class LazyState:
    cfg: ElasticConfig
    original_impl: str
    requires_grad: dict[str, bool]
    lora: dict | None = None  # {"rank", "alpha", "projections"} when LoRA sits beside the thresholds
    peft_model: object = None  # the PeftModel wrapping the model (its LoRA layers live in the model itself)
    extra: dict = field(default_factory=dict)


def is_lazy(model) -> bool:
    return isinstance(getattr(model, "_lazy_state", None), LazyState)


def _state(model) -> LazyState:
    if not is_lazy(model):
        raise ValueError("model has no Elastic-Softmax thresholds: call focusattn.hf.lazy.compose_lazy(model, cfg) "
                         "or load a Lazy adapter first")
    return model._lazy_state


def elastic_config(model) -> ElasticConfig:
    return _state(model).cfg


def lazy_params(model) -> list[ElasticParams]:
    _state(model)
    return [getattr(m, PARAMS) for m in attention_modules(model)]


def taus(model) -> list[list[float]]:
    """Per layer, per query head, the threshold ``tau`` now in use."""
    return [p.tau.detach().float().tolist() for p in lazy_params(model)]


def _plain_causal(allowed: torch.Tensor, tq: int, tk: int) -> bool:
    return bool((allowed == (relative_distance(tq, tk, allowed.device) >= 0)).all())


def lazy_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    params = getattr(module, PARAMS, None)
    if params is None:
        raise RuntimeError("attention implementation 'lazy' is set but this layer has no thresholds: use compose_lazy()")
    if dropout and "dropout" not in _warned:
        _warned.add("dropout")
        log.warning("attention dropout %.2f is ignored by Elastic-Softmax attention", dropout)
    tq, tk = query.shape[2], key.shape[2]
    allowed = _allowed_from_mask(attention_mask, tq, tk, kwargs.get("sliding_window"), query.device)
    if allowed is not None and _plain_causal(allowed, tq, tk):
        allowed = None  # causality is the kernel's own; only a real padding / window mask takes the reference path
    cfg = params.cfg
    tau, table = params.tau.to(query.dtype), params.table.to(query.dtype)
    common = dict(scale=scaling, bias_beyond=cfg.bias_beyond, n_cap=cfg.threshold_len, allowed=allowed,
                  softcap=kwargs.get("softcap"))
    out = lazy_attention(query, key, value, tau, table, impl=cfg.impl, block=cfg.block, **common)
    weights, record = None, getattr(module, RECORD, None)
    if record is not None:
        with torch.no_grad():
            weights = elastic_weights(query, key, tau, table, **common)
        if callable(record):  # hand them over and keep nothing: one layer's T x T at a time
            record(module, weights)
            weights = None
    return out.transpose(1, 2).contiguous(), weights


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, lazy_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def compose_lazy(model, cfg: ElasticConfig | None = None, *, lora_rank: int | None = None,
                 lora_alpha: float | None = None):
    """Add thresholds to every attention layer, freeze every original weight, switch attention to Elastic-Softmax;
    with ``lora_rank``, LoRA (peft) on the query/key projections trains beside them. In place; returns ``model``
    (the LoRA layers, if any, live inside it)."""
    from .compose import check_bare, freeze

    cfg = cfg or ElasticConfig()
    check_bare(model)
    modules = attention_modules(model)  # raises naming the supported architectures
    register()
    frozen = freeze(model)
    ref = next(model.parameters())
    heads = model.config.num_attention_heads
    state = LazyState(cfg=cfg, original_impl=model.config._attn_implementation, requires_grad=frozen)
    for m in modules:
        m.add_module(PARAMS, ElasticParams(heads, cfg).to(device=ref.device, dtype=torch.float32))
    if lora_rank is not None:
        from .lora import add_lora

        projections = spec_for(model).query_key
        state.peft_model = add_lora(model, lora_rank, lora_alpha, projections=projections)
        state.lora = {"rank": int(lora_rank), "alpha": float(2 * lora_rank if lora_alpha is None else lora_alpha),
                      "projections": list(projections)}
        for m in modules:  # peft froze every non-LoRA parameter, the thresholds included
            p = getattr(m, PARAMS)
            p.tau_raw.requires_grad_(cfg.train_tau)
            if cfg.use_bias:
                p.table.requires_grad_(True)
    model._lazy_state = state
    model.set_attn_implementation(NAME)
    return model


def unload_lazy(model):
    """Remove every threshold (and LoRA layer) and restore the original attention and trainability. In place."""
    state = _state(model)
    for m in attention_modules(model):
        delattr(m, PARAMS)
    if state.peft_model is not None:
        state.peft_model.unload()  # peft puts the original projections back into the same model object
    model.set_attn_implementation(state.original_impl)
    for n, p in model.named_parameters():
        p.requires_grad_(state.requires_grad.get(n, True))
    del model._lazy_state
    return model


def lazy_parameters(model) -> list[torch.nn.Parameter]:
    """What trains: the thresholds (unless frozen), the distance tables, the LoRA matrices."""
    _state(model)
    return [p for p in model.parameters() if p.requires_grad]


def lazy_state(model) -> dict[str, torch.Tensor]:
    """The adapter's tensors: ``layers.{i}.tau_raw`` (and ``.table``), LoRA under ``lora.`` (peft's keys)."""
    state = _state(model)
    out = {}
    for i, p in enumerate(lazy_params(model)):
        out[f"layers.{i}.tau_raw"] = p.tau_raw.detach().cpu().float().contiguous()
        if state.cfg.use_bias:
            out[f"layers.{i}.table"] = p.table.detach().cpu().float().contiguous()
    if state.peft_model is not None:
        from .lora import lora_state

        out.update({f"lora.{k}": v for k, v in lora_state(state.peft_model).items()})
    return out


def load_lazy_state(model, tensors: dict[str, torch.Tensor], *, source: str = "Lazy adapter") -> None:
    """Copy tensors into a Lazy-composed model; missing, unexpected, mis-shaped or non-finite ones are an error."""
    from .io import check_state_fits

    state = _state(model)
    expected = lazy_state(model)
    check_state_fits(expected, tensors, source)
    bad = sorted(k for k, t in tensors.items() if not bool(torch.isfinite(t).all()))
    if bad:
        raise ValueError(f"{source}: NaN/Inf values in {bad[:3]}")
    with torch.no_grad():
        for i, p in enumerate(lazy_params(model)):
            p.tau_raw.copy_(tensors[f"layers.{i}.tau_raw"])
            if state.cfg.use_bias:
                p.table.copy_(tensors[f"layers.{i}.table"])
    if state.peft_model is not None:
        from .lora import load_lora_state

        load_lora_state(state.peft_model, {k[5:]: v for k, v in tensors.items() if k.startswith("lora.")},
                        source=source)


def save_lazy_adapter(model, path: str | os.PathLike) -> Path:
    """Write the adapter folder: tensors first, then the config holding their sha256; each file appears whole."""
    state = _state(model)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tensors = lazy_state(model)
    with atomic_path(path / WEIGHTS) as tmp:
        save_file(tensors, str(tmp))
        digest = sha256_file(tmp)
    write_json(path / CONFIG, {
        "adapter_type": ADAPTER_TYPE,
        "elastic_config": state.cfg.to_dict(),
        "lora": state.lora,
        "base_model": str(getattr(model.config, "_name_or_path", "") or ""),
        "model_type": model.config.model_type,
        "hidden_size": model.config.hidden_size,
        "num_layers": len(attention_modules(model)),
        "num_heads": model.config.num_attention_heads,
        "trainable_parameters": sum(p.numel() for p in lazy_parameters(model)),
        "focusattn_version": __version__,
        "weights_sha256": digest,
    })
    return path


def is_lazy_adapter(path: str | os.PathLike) -> bool:
    p = Path(path) / CONFIG
    try:
        return p.is_file() and json.loads(p.read_text()).get("adapter_type") == ADAPTER_TYPE
    except (json.JSONDecodeError, OSError, AttributeError):
        return False


def read_lazy_config(path: str | os.PathLike) -> dict:
    """The validated ``adapter_config.json`` of a Lazy adapter folder; ValueError naming the file otherwise."""
    p = Path(path) / CONFIG
    try:
        meta = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{p}: cannot read a Lazy adapter config ({' '.join(str(e).split())})") from e
    if not isinstance(meta, dict) or meta.get("adapter_type") != ADAPTER_TYPE:
        raise ValueError(f"{p}: not a Lazy adapter (no adapter_type {ADAPTER_TYPE!r}); Focus adapters load with "
                         "focusattn.load_adapter")
    unknown, missing = sorted(set(meta) - set(FIELDS)), sorted(set(FIELDS) - set(meta))
    if unknown or missing:
        raise ValueError(f"{p}: corrupt: missing {missing}, unknown {unknown} (fields: {sorted(FIELDS)})")
    for key, typ in FIELDS.items():
        if not isinstance(meta[key], typ) or isinstance(meta[key], bool):
            raise ValueError(f"{p}: corrupt: field {key!r} has type {type(meta[key]).__name__}")
    try:
        ElasticConfig.from_dict(meta["elastic_config"])
    except (TypeError, ValueError) as e:
        raise ValueError(f"{p}: corrupt elastic_config ({' '.join(str(e).split())})") from e
    lora = meta["lora"]
    if lora is not None and (set(lora) != {"rank", "alpha", "projections"} or not isinstance(lora["rank"], int)
                             or lora["rank"] < 1):
        raise ValueError(f"{p}: corrupt: field 'lora' must be null or {{rank >= 1, alpha, projections}}")
    return meta


def read_lazy_tensors(path: str | os.PathLike, meta: dict) -> dict[str, torch.Tensor]:
    """The adapter's tensors, after checking the file against the config's sha256 (read once)."""
    f = Path(path) / WEIGHTS
    try:
        data = f.read_bytes()
    except OSError as e:
        raise ValueError(f"{f}: cannot read ({e.strerror})") from e
    if hashlib.sha256(data).hexdigest() != meta["weights_sha256"]:
        raise ValueError(f"{f}: sha256 differs from {CONFIG}'s (truncated or corrupted file, or an interrupted save)")
    try:
        return load_safetensors(data)
    except (SafetensorError, ValueError, RuntimeError) as e:
        raise ValueError(f"{f}: cannot read ({' '.join(str(e).split())})") from e


def load_lazy_adapter(model, path: str | os.PathLike, *, check_base: bool = True):
    """Compose ``model`` with a Lazy adapter's config and load its tensors strictly (checksum first). A model that
    already carries Focus routers or thresholds is refused; on any error the model is left as it came."""
    from ..adapters import resolve
    from .compose import check_bare

    path = resolve(path)
    meta = read_lazy_config(path)
    try:
        check_bare(model)
    except ValueError as e:
        raise ValueError(f"adapter {path} is a Lazy (Elastic-Softmax) adapter and the {e}") from None
    if meta["model_type"] != model.config.model_type or meta["hidden_size"] != model.config.hidden_size \
            or meta["num_heads"] != model.config.num_attention_heads:
        raise ValueError(f"adapter {path} was made for a {meta['model_type']} with hidden size {meta['hidden_size']} "
                         f"and {meta['num_heads']} heads, not this {model.config.model_type} with hidden size "
                         f"{model.config.hidden_size} and {model.config.num_attention_heads} heads")
    base = str(getattr(model.config, "_name_or_path", "") or "")
    if check_base and meta["base_model"] and base and meta["base_model"] != base:
        raise ValueError(f"adapter {path} was trained on base model {meta['base_model']!r}, not {base!r}; pass "
                         "check_base=False to load it anyway")
    tensors = read_lazy_tensors(path, meta)
    lora = meta["lora"]
    compose_lazy(model, ElasticConfig.from_dict(meta["elastic_config"]),
                 lora_rank=lora["rank"] if lora else None, lora_alpha=lora["alpha"] if lora else None)
    try:
        load_lazy_state(model, tensors, source=str(path / WEIGHTS))
    except ValueError:
        unload_lazy(model)
        raise
    return model


@contextlib.contextmanager
def recording(model, fn=None):
    """Inside the block, each layer's call computes its dense Elastic-Softmax weights ``[B, H, Tq, Tk]``: without
    ``fn`` it returns them (what ``output_attentions=True`` collects); with ``fn`` it calls ``fn(module, weights)``
    and keeps nothing, so long inputs need one layer's ``T x T`` at a time."""
    modules = attention_modules(model)
    _state(model)
    for m in modules:
        setattr(m, RECORD, fn if fn is not None else True)
    try:
        yield model
    finally:
        for m in modules:
            setattr(m, RECORD, None)
