"""A nanoGPT-scale decoder-only LM whose attention is chosen by name (``ModelConfig.attention``).

Every variant is a causal self-attention module with the same interface: ``forward(x) -> y`` on ``[B, T, d]`` and
``attention_weights(x) -> [B, H, T, T]`` (dense weights for the sink/sparsity diagnostics). The rest of the model
(pre-LayerNorm blocks, GELU MLP, tied embeddings, no learned positions: RoPE everywhere) is shared.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..focus import FocusConfig, FocusRouter, attend
from ..kernels.common import in_window
from ..lazy import LazyAttention, LazyConfig
from ..lazy.rope import RotaryEmbedding
from .config import ModelConfig


def _weights_via_identity(kernel, q, k) -> torch.Tensor:
    """Any attention linear in V returns its weights when V is the identity: reuse the kernel, restate nothing."""
    b, hkv, t = k.shape[0], k.shape[1], k.shape[2]
    eye = torch.eye(t, dtype=q.dtype, device=q.device).expand(b, hkv, t, t)
    return kernel(q, k, eye)


class SoftmaxAttention(nn.Module):
    """``standard`` (full causal softmax) and ``sliding`` attention with RoPE. ``sliding`` sees ``window`` keys,
    ``0 <= i - j < window``: Focus's local window (``common.in_window``, ``<= w``) of ``window - 1``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.head_dim = cfg.n_head, cfg.d_model // cfg.n_head
        self.window = cfg.window if cfg.attention == "sliding" else None
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)
        self.rope = RotaryEmbedding(self.head_dim, cfg.seq_cache, cfg.base)

    def _qkv(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_head, self.head_dim).permute(2, 0, 3, 1, 4)
        return self.rope(q), self.rope(k), v

    def kernel(self, q, k, v, x=None):
        if self.window is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        t = q.shape[2]
        i = torch.arange(t, device=q.device)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=in_window(i[:, None] - i[None, :], self.window - 1))

    def forward(self, x):
        q, k, v = self._qkv(x)
        o = self.kernel(q, k, v, x)
        return self.o_proj(o.transpose(1, 2).reshape(x.shape))

    @torch.no_grad()
    def attention_weights(self, x):
        q, k, _ = self._qkv(x)
        return _weights_via_identity(lambda q_, k_, v_: self.kernel(q_, k_, v_, x), q, k)


class FocusSelfAttention(SoftmaxAttention):
    """``focus``: a FocusRouter trained jointly with the model gates distant pairs (soft gate, as in router training);
    pairs within ``window`` are never gated."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.focus_cfg = FocusConfig(num_groups=cfg.focus_groups, group_dim=cfg.focus_group_dim, window=cfg.window)
        self.router = FocusRouter(cfg.d_model, self.focus_cfg)

    def kernel(self, q, k, v, x=None):
        return attend(q, k, v, self.router(x), self.focus_cfg)


def lazy_config(cfg: ModelConfig) -> LazyConfig:
    return LazyConfig(
        n_heads=cfg.n_head, max_seq_len=cfg.seq_cache, rope_base=cfg.base,
        use_bias=cfg.attention == "lazy", bias_window=cfg.bias_window or cfg.block_size,
        tau_mode=cfg.tau_mode, impl=cfg.lazy_impl,
    )


def make_attention(cfg: ModelConfig) -> nn.Module:
    if cfg.attention in ("standard", "sliding"):
        return SoftmaxAttention(cfg)
    if cfg.attention == "focus":
        return FocusSelfAttention(cfg)
    return LazyAttention(cfg.d_model, lazy_config(cfg))  # lazy, lazy-no-bias, elastic-only


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = make_attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model), nn.GELU(),
                                 nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model))

    def forward(self, x, weights: list | None = None):
        h = self.ln1(x)
        if weights is not None:
            weights.append(self.attn.attention_weights(h).float())
        x = x + self.attn(h)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    _no_split_modules = ["Block"]  # what FSDP2 shards as a unit (``train.dist.fsdp_plan``), as transformers names it
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.tok_emb.weight  # tied
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2 scaled init of residual projections
            if name.endswith("o_proj.weight") or name.endswith("mlp.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / (2 * cfg.n_layer) ** 0.5)

    @staticmethod
    def _init(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, *, weights: list | None = None):
        """(logits, loss); ``weights``, a list, receives each layer's dense attention weights (diagnostics go
        through ``forward`` so that a sharded model, FSDP2, gathers its weights as for training)."""
        x = self.tok_emb(idx)
        for blk in self.blocks:
            x = blk(x, weights)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss

    @torch.no_grad()
    def attention_weights(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """One dense ``[B, H, T, T]`` weight tensor per layer (evaluation mode is the caller's business)."""
        out: list[torch.Tensor] = []
        self(idx, weights=out)
        return out

    def taus(self) -> list[list[float]] | None:
        """Learned Elastic-Softmax thresholds per layer and head (None for softmax variants)."""
        if not isinstance(self.blocks[0].attn, LazyAttention):
            return None
        taus = [blk.attn.tau.detach() for blk in self.blocks]
        return [(t.full_tensor() if hasattr(t, "full_tensor") else t).tolist() for t in taus]  # whole if sharded

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
