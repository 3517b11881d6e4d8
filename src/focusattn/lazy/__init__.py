"""Lazy Attention (Fu et al., arXiv 2601.00919): RoPE + per-head distance bias + Elastic-Softmax."""
from ..kernels.elastic import lazy_attention
from .attention import ElasticParams, LazyAttention
from .bias import DistanceBias
from .config import ElasticConfig, LazyConfig
from .metrics import (attention_report, empty_rows, sink_mass, sink_share, sparsity, surviving_mass,
                      uniform_sink_mass)
from .rope import RotaryEmbedding

__all__ = ["DistanceBias", "ElasticConfig", "ElasticParams", "LazyAttention", "LazyConfig", "RotaryEmbedding", "attention_report", "lazy_attention",
           "empty_rows", "sink_mass", "sink_share", "sparsity", "surviving_mass", "uniform_sink_mass"]
