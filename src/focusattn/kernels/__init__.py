"""Pure tensor attention math: no nn.Parameter, no transformers, no I/O."""
from .reference import dense_focus_attention, focus_allowed, masked_attention
from .soft import soft_focus_attention

__all__ = ["dense_focus_attention", "focus_allowed", "masked_attention", "soft_focus_attention"]
