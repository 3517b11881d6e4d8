"""The from-scratch lab GPT (``gpt/model.py``) as a Hugging Face model: config, causal-LM head and byte tokenizer,
registered with the Auto classes, so ``save_pretrained`` / ``from_pretrained`` / ``generate`` and ``focusattn eval``
(lm-eval) treat a lab checkpoint like any HF model.

The wrapper holds the lab ``GPT`` unchanged (``model.gpt``) and its ``ModelConfig`` as a dict (``config.lab``), so a
converted model computes exactly what the lab trained. No KV cache: ``generate`` re-reads the prefix each step (the
lab's models are small and short). The byte tokenizer matches ``gpt/tokenizer.py``: ids 0..255 are the UTF-8 bytes,
256 is BOS, which starts every sequence as in training (it doubles as EOS and padding: the lab has neither).

Importing this module registers the classes; :func:`focusattn.hf.loading.load_model` does so before loading. A
``train-lm`` / ``compare`` run folder is itself an Auto-class folder: its ``config.json`` (the run's record) names
this model type, and ``from_pretrained`` on it reads the run's verified checkpoint::

    import focusattn.hf.lab_model  # registers the lab model type
    model = AutoModelForCausalLM.from_pretrained("runs/lab/standard")
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationMixin, PretrainedConfig,
                          PreTrainedModel, PreTrainedTokenizer)
from transformers.modeling_outputs import CausalLMOutput

from .._errors import InputError
from ..gpt.config import HF_MODEL_TYPE, ModelConfig, model_config_from_dict
from ..gpt.model import GPT
from ..gpt.tokenizer import BOS, VOCAB_SIZE
from ..lazy.bias import DistanceBias
from ..lazy.rope import RotaryEmbedding

MODEL_TYPE = HF_MODEL_TYPE
BOS_TOKEN = "<|bos|>"


class LabGPTConfig(PretrainedConfig):
    """``lab``: the lab's ``ModelConfig`` as a dict (validated when the model is built). A run folder's record
    (``config.json`` of ``train-lm``) has it as ``model``, beside its training settings (kept as attributes)."""

    model_type = MODEL_TYPE

    def __init__(self, lab: dict | None = None, **kwargs):
        if lab is None and isinstance(kwargs.get("model"), dict):  # a run record
            lab = kwargs["model"]
        self.lab = dict(lab) if lab is not None else ModelConfig().to_dict()
        mc = model_config_from_dict(self.lab)
        self.vocab_size = mc.vocab_size
        self.hidden_size, self.num_hidden_layers, self.num_attention_heads = mc.d_model, mc.n_layer, mc.n_head
        self.max_position_embeddings = mc.seq_cache  # the RoPE cache: lm-eval truncates to it
        for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
            kwargs.setdefault(k, BOS)
        kwargs.setdefault("tie_word_embeddings", True)
        super().__init__(**kwargs)


class LabGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LabGPTConfig
    base_model_prefix = "gpt"
    _tied_weights_keys = {"gpt.lm_head.weight": "gpt.tok_emb.weight"}
    _no_split_modules = ["Block"]

    def __init__(self, config: LabGPTConfig):
        super().__init__(config)
        self.gpt = GPT(model_config_from_dict(config.lab))
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        """Parameters: GPT initialises itself and loading overwrites them. Non-persistent buffers are not in a saved
        model, and ``from_pretrained`` allocates them without values: recompute them here."""
        if isinstance(module, RotaryEmbedding):
            module.reset_tables()
        elif isinstance(module, DistanceBias) and not isinstance(module.table, torch.nn.Parameter):
            module.table.zero_()

    def get_input_embeddings(self):
        return self.gpt.tok_emb

    def set_input_embeddings(self, value):
        self.gpt.tok_emb = value

    def get_output_embeddings(self):
        return self.gpt.lm_head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **kwargs) -> CausalLMOutput:
        """Causal LM over ``input_ids``. The lab model has no padding: a padded batch (``attention_mask`` with zeros,
        left or right, as ``generate`` and lm-eval make) is run row by row on each row's real tokens, so every row's
        logits are exactly those of the row alone; padded positions get zero logits."""
        if attention_mask is None or bool(attention_mask.all()):
            logits, _ = self.gpt(input_ids)
        else:
            logits = torch.zeros(*input_ids.shape, self.config.vocab_size, dtype=self.gpt.lm_head.weight.dtype,
                                 device=input_ids.device)
            for b in range(input_ids.shape[0]):
                keep = attention_mask[b].bool()
                if keep.any():
                    idx = keep.nonzero().flatten()
                    if not torch.equal(idx, torch.arange(int(idx[0]), int(idx[-1]) + 1, device=idx.device)):
                        raise InputError("attention_mask", "holes", "only left or right padding is supported")
                    logits[b, idx] = self.gpt(input_ids[b:b + 1, idx])[0][0]
        loss = None
        if labels is not None:  # HF convention: labels are the inputs, shifted here
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(), ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, **kwargs):
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        """A lab run folder loads from its verified checkpoint (what ``AutoModelForCausalLM.from_pretrained`` on
        the folder calls); anything else, e.g. a folder written by ``save_pretrained``, as transformers does."""
        if isinstance(pretrained_model_name_or_path, (str, Path)) and is_lab_run(pretrained_model_name_or_path):
            model = cls.from_lab(pretrained_model_name_or_path)
            dtype = kwargs.get("dtype", kwargs.get("torch_dtype"))
            return model.to(dtype) if isinstance(dtype, torch.dtype) else model
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, **kwargs)

    @classmethod
    def from_lab(cls, run_dir: str | Path) -> "LabGPTForCausalLM":
        """A finished or checkpointed lab run folder (``config.json`` + a verified checkpoint) as an HF model."""
        from ..train.checkpoint import RECORD, load_checkpoint

        d = Path(run_dir)
        if not (d / "config.json").exists() or not (d / RECORD).exists():
            raise InputError("run", str(d), f"not a lab run folder (needs config.json and {RECORD})")
        cfg = json.loads((d / "config.json").read_text())["model"]
        model = cls(LabGPTConfig(lab=cfg))
        model.gpt.load_state_dict(load_checkpoint(d)["trainable"])
        model.config._name_or_path = str(d)
        return model.eval()


class LabByteTokenizer(PreTrainedTokenizer):
    """UTF-8 bytes as ids 0..255 and BOS (256) prepended to every encoded sequence, as the lab trains."""

    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, **kwargs):
        for k in ("bos_token", "eos_token", "pad_token"):
            kwargs.setdefault(k, BOS_TOKEN)
        add_bos = kwargs.pop("add_bos_token", True)
        self.add_bos_token = add_bos  # before the base __init__, which may already encode
        super().__init__(**kwargs)
        self.add_bos_token = add_bos

    @property
    def vocab_size(self) -> int:
        return VOCAB_SIZE

    def get_vocab(self) -> dict:
        return {**{chr(i): i for i in range(256)}, BOS_TOKEN: BOS}

    def _tokenize(self, text: str, **kwargs) -> list[str]:
        return [chr(b) for b in text.encode("utf-8")]

    def _convert_token_to_id(self, token: str) -> int:
        return BOS if token == BOS_TOKEN else ord(token)

    def _convert_id_to_token(self, index: int) -> str:
        return BOS_TOKEN if index == BOS else chr(index)

    def convert_tokens_to_string(self, tokens: list[str]) -> str:
        return bytes(ord(t) for t in tokens if t != BOS_TOKEN and len(t) == 1 and ord(t) < 256).decode(
            "utf-8", errors="replace")

    def build_inputs_with_special_tokens(self, token_ids_0, token_ids_1=None):
        ids = [BOS] + list(token_ids_0) if self.add_bos_token else list(token_ids_0)
        return ids if token_ids_1 is None else ids + list(token_ids_1)

    def get_special_tokens_mask(self, token_ids_0, token_ids_1=None, already_has_special_tokens=False):
        if already_has_special_tokens:
            return [int(i == BOS) for i in token_ids_0 + (token_ids_1 or [])]
        return ([1] if self.add_bos_token else []) + [0] * (len(token_ids_0) + len(token_ids_1 or []))

    def save_vocabulary(self, save_directory: str, filename_prefix: str | None = None) -> tuple:
        return ()


def register() -> None:
    """Register the lab classes with the Auto classes (idempotent)."""
    try:
        AutoConfig.register(MODEL_TYPE, LabGPTConfig)
    except ValueError:  # already registered
        return
    AutoModelForCausalLM.register(LabGPTConfig, LabGPTForCausalLM)
    AutoTokenizer.register(LabGPTConfig, slow_tokenizer_class=LabByteTokenizer)


def is_lab_run(path: str | Path) -> bool:
    """A ``train-lm`` output folder: ``config.json`` with the lab's ``model``/``train`` records and a checkpoint."""
    d = Path(path)
    from ..train.checkpoint import RECORD

    if not (d / RECORD).is_file() or not (d / "config.json").is_file():
        return False
    try:
        cfg = json.loads((d / "config.json").read_text())
    except ValueError:
        return False
    return (isinstance(cfg, dict) and "model" in cfg and "train" in cfg
            and cfg.get("model_type", MODEL_TYPE) == MODEL_TYPE)  # runs before the Auto-class record had none


def export_lab_run(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Save a lab run as an HF model folder (model + tokenizer) that ``from_pretrained`` / ``focusattn eval`` load."""
    model = LabGPTForCausalLM.from_lab(run_dir)
    out = Path(out_dir)
    model.save_pretrained(out)
    LabByteTokenizer().save_pretrained(out)
    return out


register()
