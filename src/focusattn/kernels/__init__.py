"""Pure tensor attention math: no nn.Parameter, no transformers, no I/O.

Every fast path has a dense reference twin in :mod:`.reference` and is tested against it (outputs and gradients).
One entry for hard Focus attention, :func:`.api.focus_attention` (backends, decoding, sinks); the soft training
gate is :func:`.soft.soft_focus_attention`; Lazy Attention's Elastic-Softmax is :func:`.elastic.lazy_attention`.
"""
from .api import focus_attention, focus_attention_with_sinks, validate_focus_inputs
from .backends import BACKENDS
from .common import default_scale, group_bits, in_window, sink_key_mask, topk_membership
from .decode import focus_decode_attention, focus_key_indices
from .decomposed import decomposed_focus_attention
from .flex import flex_focus_attention, focus_block_mask, focus_mask_mod
from .group_index import GroupIndex
from .lse import merge_pair
from .reference import dense_focus_attention, focus_allowed, masked_attention
from .soft import soft_focus_attention

__all__ = ["BACKENDS", "GroupIndex", "decomposed_focus_attention", "default_scale", "dense_focus_attention",
           "flex_focus_attention", "focus_allowed", "focus_attention", "focus_attention_with_sinks",
           "focus_block_mask", "focus_decode_attention", "focus_key_indices", "focus_mask_mod", "group_bits",
           "in_window", "masked_attention", "merge_pair", "sink_key_mask", "soft_focus_attention",
           "topk_membership", "validate_focus_inputs"]
