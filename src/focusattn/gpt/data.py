"""Deterministic LM data from a named corpus: byte tokens, BOS-led windows, batches a pure function of
(seed, step, rank, world) drawn in epochs (``data.sampler.EpochWindows``).

Because a batch depends only on those, a resumed run sees exactly the batches an uninterrupted run would, without
saving any sampler state, and ``world`` processes of ``batch_size`` see the samples one process of
``world * batch_size`` would.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..data.corpora import load_corpus
from ..data.sampler import EpochWindows
from ..train.dist import sample_range
from .tokenizer import BOS, encode

DOC_SEP = "\n\n"


@dataclass
class LMData:
    name: str
    train: torch.Tensor  # int64 byte ids, documents joined by DOC_SEP in corpus order
    val: torch.Tensor

    @classmethod
    def load(cls, name: str) -> "LMData":
        c = load_corpus(name)
        return cls(name, encode(DOC_SEP.join(d.text for d in c.train)), encode(DOC_SEP.join(d.text for d in c.val)))

    @staticmethod
    def _windows(tokens: torch.Tensor, offsets: torch.Tensor, t: int):
        idx = offsets[:, None] + torch.arange(t)[None, :]
        y = tokens[idx]
        x = torch.cat([torch.full((len(offsets), 1), BOS, dtype=torch.long), y[:, :-1]], dim=1)
        return x, y

    def batch(self, seed: int, step: int, batch_size: int, t: int, *, rank: int = 0, world: int = 1):
        """This rank's training batch ``(x, y)`` of shape ``[batch_size, t]`` (x = BOS + y shifted right) of global
        micro-batch ``step``, which holds ``world * batch_size`` samples."""
        if len(self.train) <= t:
            raise ValueError(f"train split of {self.name!r} has {len(self.train)} tokens, fewer than a window of {t}")
        key = (int(seed), t)
        if getattr(self, "_sampler_key", None) != key:
            self._sampler, self._sampler_key = EpochWindows(len(self.train), t, seed), key
        starts = self._sampler.starts(sample_range(step, batch_size, rank_=rank, world_=world))
        return self._windows(self.train, torch.from_numpy(starts), t)

    def val_windows(self, t: int, n: int):
        """``n`` evenly spaced validation windows of length ``t`` (the same ones for every model and seed)."""
        if len(self.val) <= t:
            raise ValueError(f"validation split of {self.name!r} has {len(self.val)} tokens, fewer than a window of {t}")
        offsets = torch.linspace(0, len(self.val) - t - 1, n).long()
        return self._windows(self.val, offsets, t)


def load_data(spec: str):
    """A ``--data`` name: a synthetic task (``mqar``, ``passkey``: :mod:`.tasks`) or a text corpus (:class:`LMData`)."""
    from .tasks import parse_task

    task = parse_task(spec)
    return task if task is not None else LMData.load(spec)
