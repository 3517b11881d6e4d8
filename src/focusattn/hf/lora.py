"""LoRA on the attention projections through ``peft``: the baseline the Focus paper sets the routers against
(Tables 3-4), trained by the same retrofit path (``focusattn retrofit --method lora``).

The adapter is PEFT's own format (``adapter_config.json`` + ``adapter_model.safetensors``, ``save_pretrained``), so
``peft.PeftModel.from_pretrained(base, folder)`` reloads it without this library.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from .io import check_state_fits
from .specs import spec_for

PEFT_WEIGHTS = "adapter_model.safetensors"


def _peft():
    try:
        import peft
    except ImportError as e:
        raise RuntimeError("the LoRA baseline needs peft: pip install 'focusattn[lora]'") from e
    return peft


def lora_target_modules(model, projections: tuple[str, ...] | None = None) -> list[str]:
    """Full module names of every layer's attention projections (``projections``, default the spec's q, k, v, o;
    GPT-2's fused ``c_attn`` and its ``attn.c_proj``). Exact names, so PEFT never also adapts an MLP projection that
    shares a short name."""
    spec = spec_for(model)
    n = len(model.get_submodule(spec.layers))
    names = [f"{spec.layers}.{i}.{spec.attention}.{p}" for i in range(n) for p in projections or spec.projections]
    for name in names:
        model.get_submodule(name)  # raises AttributeError naming it if the spec is wrong for this model
    return names


def add_lora(model, rank: int, alpha: float | None = None, projections: tuple[str, ...] | None = None):
    """Wrap ``model`` in a ``peft`` LoRA model (rank ``rank``, scale ``alpha / rank``; ``alpha`` defaults to
    ``2 * rank``, no dropout) on ``projections`` (default: q, k, v, o). The base weights are frozen; only the LoRA
    matrices train."""
    peft = _peft()
    cfg = peft.LoraConfig(r=rank, lora_alpha=2 * rank if alpha is None else alpha, lora_dropout=0.0, bias="none",
                          target_modules=lora_target_modules(model, projections),
                          fan_in_fan_out=model.config.model_type == "gpt2")  # GPT-2's Conv1D stores W transposed
    return peft.get_peft_model(model, cfg)


def lora_parameters(model) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def lora_state(model) -> dict[str, torch.Tensor]:
    """The LoRA tensors under PEFT's keys (what ``save_pretrained`` writes and a checkpoint keeps)."""
    peft = _peft()
    return {k: v.detach().cpu().contiguous() for k, v in peft.get_peft_model_state_dict(model).items()}


def load_lora_state(model, tensors: dict[str, torch.Tensor], *, source: str = "LoRA state") -> None:
    """Put LoRA tensors back (a resumed run); any missing, unexpected or mis-shaped key is an error."""
    peft = _peft()
    check_state_fits(lora_state(model), tensors, source)
    peft.set_peft_model_state_dict(model, tensors)


def save_lora(model, path: str | os.PathLike) -> Path:
    """``save_pretrained`` into a temporary sibling folder, then rename: a crash never leaves half an adapter."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    if path.exists():
        shutil.rmtree(path)
    tmp.rename(path)
    return path


def is_lora_adapter(path: str | os.PathLike) -> bool:
    """True for a PEFT adapter folder (its ``adapter_config.json`` names a ``peft_type``)."""
    p = Path(path) / "adapter_config.json"
    try:
        return p.is_file() and "peft_type" in json.loads(p.read_text())
    except (json.JSONDecodeError, OSError):
        return False


def load_lora(model, path: str | os.PathLike, *, check_base: bool = True):
    """``peft.PeftModel.from_pretrained`` in eval mode, refusing an adapter made for another base model."""
    peft = _peft()
    path = Path(path)
    meta = json.loads((path / "adapter_config.json").read_text())
    base, have = meta.get("base_model_name_or_path"), str(getattr(model.config, "_name_or_path", "") or "")
    if check_base and base and have and base != have:
        raise ValueError(f"LoRA adapter {path} was trained on base model {base!r}, not {have!r}; pass "
                         "check_base=False to load it anyway")
    if not (path / PEFT_WEIGHTS).is_file():
        raise ValueError(f"LoRA adapter {path}: missing {PEFT_WEIGHTS} (written by `focusattn retrofit --method "
                         "lora`)")
    try:
        m = peft.PeftModel.from_pretrained(model, str(path))
    except (RuntimeError, ValueError, KeyError) as e:  # size mismatch / target modules not found
        raise ValueError(f"LoRA adapter {path} does not fit this model: {str(e).splitlines()[0]}") from e
    return m.eval()
