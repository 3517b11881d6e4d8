"""``LazyAttention``: projections + RoPE + distance bias + Elastic-Softmax, as one causal self-attention layer."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.elastic import elastic_weights, lazy_attention
from .bias import DistanceBias
from .config import ElasticConfig, LazyConfig
from .rope import RotaryEmbedding


def _softplus_inverse(y: float) -> float:
    return y + math.log(-math.expm1(-y))


class LazyAttention(nn.Module):
    """Causal self-attention ``[B, T, d_model] -> [B, T, d_model]`` with Elastic-Softmax in place of softmax.

    ``tau`` is one learnable threshold per query head (subtract convention: threshold ``tau / n_i``). Under
    ``tau_mode="nonneg"`` the parameter is ``tau_raw`` with ``tau = softplus(tau_raw)``; read ``self.tau``.
    """

    def __init__(self, d_model: int, cfg: LazyConfig):
        super().__init__()
        if d_model % cfg.n_heads:
            raise ValueError(f"d_model ({d_model}) must be divisible by n_heads ({cfg.n_heads})")
        self.cfg = cfg
        self.head_dim = d_model // cfg.n_heads
        hkv = cfg.kv_heads
        self.q_proj = nn.Linear(d_model, cfg.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, hkv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_model, hkv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * self.head_dim, d_model, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, cfg.max_seq_len, cfg.rope_base)
        self.bias = DistanceBias(cfg)
        raw = cfg.tau_init if cfg.tau_mode == "free" else _softplus_inverse(cfg.tau_init)
        self.tau_raw = nn.Parameter(torch.full((cfg.n_heads,), float(raw)))

    @property
    def tau(self) -> torch.Tensor:
        return self.tau_raw if self.cfg.tau_mode == "free" else F.softplus(self.tau_raw)

    def _qkv(self, x: torch.Tensor):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, -1, self.head_dim).transpose(1, 2)
        return self.rope(q), self.rope(k), v

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._qkv(x)
        tau, table = self.tau.to(q.dtype), self.bias().to(q.dtype)
        o = lazy_attention(q, k, v, tau, table, impl=self.cfg.impl, block=self.cfg.block,
                           bias_beyond=self.cfg.bias_beyond, n_cap=self.cfg.threshold_len)
        return self.o_proj(o.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))

    @torch.no_grad()
    def attention_weights(self, x: torch.Tensor) -> torch.Tensor:
        """Dense Elastic-Softmax weights ``[B, H, T, T]`` (diagnostics; O(T^2) memory)."""
        q, k, _ = self._qkv(x)
        return elastic_weights(q, k, self.tau.to(q.dtype), self.bias().to(q.dtype), bias_beyond=self.cfg.bias_beyond,
                               n_cap=self.cfg.threshold_len)


class ElasticParams(nn.Module):
    """What Elastic-Softmax adds to one attention layer of a pretrained model (``hf/lazy.py``): one threshold per query
    head (``tau_raw``, read ``tau``) and, with ``use_bias``, a distance-bias table ``[H, W]`` starting at zero (else a
    constant zero ``[H, 1]`` buffer, so the kernel sees one code path)."""

    def __init__(self, n_heads: int, cfg: ElasticConfig):
        super().__init__()
        self.cfg = cfg
        raw = cfg.tau_init if cfg.tau_mode == "free" else _softplus_inverse(cfg.tau_init)
        self.tau_raw = nn.Parameter(torch.full((n_heads,), float(raw)), requires_grad=cfg.train_tau)
        if cfg.use_bias:
            self.table = nn.Parameter(torch.zeros(n_heads, cfg.bias_window))
        else:
            self.register_buffer("table", torch.zeros(n_heads, 1), persistent=False)

    @property
    def tau(self) -> torch.Tensor:
        return self.tau_raw if self.cfg.tau_mode == "free" else F.softplus(self.tau_raw)
