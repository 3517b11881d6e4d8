"""Training windows in epochs, shared across ranks: sample ``i`` of a run is a pure function of ``(seed, i)``.

An epoch is the ``n = n_tokens // seq_len`` disjoint windows that tile the token stream from an offset drawn per
epoch (``0 .. n_tokens - n * seq_len``, so the fewer than ``seq_len`` tokens an epoch leaves out vary from epoch
to epoch), in an order drawn per epoch. Sample ``i`` is window ``i mod n`` of epoch ``i // n``. With
``train.dist.sample_range`` giving each rank disjoint sample numbers, no window is dropped or repeated within an
epoch across all ranks, and a resumed run (or one with another process count but the same global batch) sees
exactly the same samples, without saving any sampler state.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np


class EpochWindows:
    def __init__(self, n_tokens: int, seq_len: int, seed: int):
        if n_tokens < seq_len:
            raise ValueError(f"{n_tokens} tokens are fewer than one window of {seq_len}")
        self.n_tokens, self.seq_len, self.seed = int(n_tokens), int(seq_len), int(seed)
        self.per_epoch = self.n_tokens // self.seq_len
        self._epoch = lru_cache(maxsize=4)(self._draw)

    def _draw(self, epoch: int) -> tuple[int, np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch, 0x5EED])
        offset = int(rng.integers(0, self.n_tokens - self.per_epoch * self.seq_len + 1))
        return offset, rng.permutation(self.per_epoch)

    def starts(self, samples: range | list[int]) -> np.ndarray:
        """Start offsets (into the token stream) of the windows with these global sample numbers."""
        out = np.empty(len(samples), dtype=np.int64)
        for j, i in enumerate(samples):
            offset, order = self._epoch(i // self.per_epoch)
            out[j] = offset + int(order[i % self.per_epoch]) * self.seq_len
        return out

    def windows(self, ids, samples: range | list[int]) -> np.ndarray:
        """``[len(samples), seq_len]`` token windows of ``ids`` (an array or memory map of ``n_tokens`` ids)."""
        if len(ids) != self.n_tokens:
            raise ValueError(f"expected {self.n_tokens} tokens, got {len(ids)}")
        return np.stack([np.asarray(ids[s:s + self.seq_len]) for s in self.starts(samples)])
