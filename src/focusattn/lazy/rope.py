"""Rotary position embedding with an explicit cache length (longer inputs are an error, never a silent wrap)."""
from __future__ import annotations

import torch
from torch import nn


class RotaryEmbedding(nn.Module):
    """Half-split RoPE (GPT-NeoX/Llama layout) for ``[B, H, T, D]`` tensors, D even."""

    def __init__(self, head_dim: int, max_seq_len: int, base: float = 10000.0):
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {head_dim}")
        if max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {max_seq_len}")
        self.head_dim, self.max_seq_len, self.base = head_dim, max_seq_len, float(base)
        cos, sin = self._tables()
        # Buffers are not saved: they are a pure function of (head_dim, max_seq_len, base).
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def _tables(self):
        cpu = torch.device("cpu")  # explicit: also right under a meta-device context (HF from_pretrained)
        inv = 1.0 / (self.base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64, device=cpu) / self.head_dim))
        ang = torch.arange(self.max_seq_len, dtype=torch.float64, device=cpu)[:, None] * inv[None, :]
        return ang.cos().float(), ang.sin().float()

    @torch.no_grad()
    def reset_tables(self) -> None:
        """Recompute the cos/sin buffers in place (a loader that allocates buffers without values calls this)."""
        cos, sin = self._tables()
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        t = x.shape[-2]
        if offset + t > self.max_seq_len:
            raise ValueError(f"sequence length {offset + t} exceeds the RoPE cache (max_seq_len={self.max_seq_len}); "
                             f"build the model with a larger max_seq_len")
        cos = self.cos[offset:offset + t].to(x.dtype)
        sin = self.sin[offset:offset + t].to(x.dtype)
        x1, x2 = x[..., : self.head_dim // 2], x[..., self.head_dim // 2:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
