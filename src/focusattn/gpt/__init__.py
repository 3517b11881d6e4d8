"""From-scratch lab: a small decoder-only LM whose attention is chosen by name, its training loop and comparisons."""
from .config import ATTENTIONS, PRESETS, ModelConfig, TrainConfig, get_preset
from .model import GPT

__all__ = ["ATTENTIONS", "GPT", "ModelConfig", "PRESETS", "TrainConfig", "get_preset"]
