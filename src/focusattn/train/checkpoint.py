"""Atomic, resumable checkpoints: the previous good checkpoint survives any crash during saving."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from .._io import atomic_path


def save_checkpoint(path: str | os.PathLike, *, step: int, trainable: dict, optimizer, extra: dict | None = None,
                    rng: bool = True) -> None:
    """Save trainable tensors, optimizer state, step and RNG state (``torch.save`` of plain tensors/dicts only)."""
    state = {
        "step": step,
        "trainable": {k: v.detach().cpu() for k, v in trainable.items()},
        "optimizer": optimizer.state_dict(),
        "extra": extra or {},
    }
    if rng:
        state["rng"] = torch.get_rng_state()
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | os.PathLike) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}: start fresh instead of resuming")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # corrupt or foreign file
        raise ValueError(f"checkpoint {path} is unreadable ({e}); delete it or start fresh") from e
