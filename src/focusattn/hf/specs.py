"""Per-architecture facts: where the attention modules live. The only model-specific table in the library.

Softcapping and sliding windows need no entry: the models pass them to the attention function as ``softcap`` and
``sliding_window`` (and build sliding masks themselves), and our function honours both.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArchSpec:
    layers: str  # dotted path to the list of decoder blocks
    attention: str  # attribute of a block holding its self-attention module
    notes: str
    # the attention projections (children of the attention module) a LoRA baseline adapts: q, k, v and output
    projections: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
    # the projections that make the attention scores (LoRA beside the Lazy retrofit's thresholds); GPT-2 fuses q, k
    # and v into c_attn, so there LoRA adapts all three
    query_key: tuple[str, ...] = ("q_proj", "k_proj")


SPECS: dict[str, ArchSpec] = {
    "gpt2": ArchSpec("transformer.h", "attn", "MHA, fused c_attn, learned positions", ("c_attn", "c_proj"),
                     ("c_attn",)),
    "llama": ArchSpec("model.layers", "self_attn", "GQA, RoPE (SmolLM2 is a Llama)"),
    "mistral": ArchSpec("model.layers", "self_attn", "GQA, optional sliding window"),
    "qwen2": ArchSpec("model.layers", "self_attn", "GQA, q/k/v bias, optional sliding window"),
    "olmo2": ArchSpec("model.layers", "self_attn", "QK-norm"),
    "gemma2": ArchSpec("model.layers", "self_attn", "interleaved sliding window + attention logit softcap"),
}


def spec_for(model) -> ArchSpec:
    model_type = getattr(model.config, "model_type", None)
    if model_type not in SPECS:
        raise ValueError(f"unsupported architecture {model_type!r}: focusattn supports {sorted(SPECS)}")
    return SPECS[model_type]


def attention_modules(model) -> list:
    spec = spec_for(model)
    blocks = model.get_submodule(spec.layers)
    return [getattr(block, spec.attention) for block in blocks]
