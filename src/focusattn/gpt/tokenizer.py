"""Byte-level tokenizer: 256 byte values + one BOS id.

Chosen because it needs no training, no files and no network, is exactly reversible for any UTF-8 text, and makes
the lab deterministic by construction. BOS (id 256) starts every training and evaluation window, as in LLM practice:
the attention sink studied here forms on a fixed first token (the paper's Fig. 2a moves it with a fixed [MASK]).
"""
from __future__ import annotations

import torch

BOS = 256
VOCAB_SIZE = 257


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes as an int64 tensor (no BOS: windows add it)."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(ids) -> str:
    ids = [int(i) for i in ids]
    return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")
