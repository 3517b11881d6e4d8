"""Synthetic long-range tasks for the lab, generated deterministically and offline, with the ``LMData`` interface.

A batch is ``(x, y)`` with ``x[:, 0] = BOS`` and ``y`` the next token, as for text, except that every target that is
not an answer token is ``IGNORE`` (-100, ``cross_entropy``'s ``ignore_index``): the loss, and the accuracy beside
it, are measured on the answers only. A batch is a pure function of ``(seed, step)``; validation draws from its own
stream (and, for ``passkey``, from held-out text), the same for every model and seed.

* ``mqar`` (multi-query associative recall, Zoology): ``BOS k1 v1 ... kN vN  <gap of noise>  q1 a1 ... qN aN`` with
  keys and values from disjoint byte ranges, every key queried once in random order; the answer ``a`` is the value
  that followed the key. The noise gap puts every answer more than ``min_distance`` tokens after its value.
* ``passkey``: real filler text (Shakespeare train/val split, ``data/corpora.py``) with
  ``" The pass key is NNNNN. Remember it. "`` hidden at a random depth, closed by
  ``"\\nWhat is the pass key? The pass key is NNNNN"``; the answer is the digits. The needle ends at least
  ``min_distance`` tokens before the question.

Longer windows (the 2x/4x evaluations) keep the task and lengthen the gap/filler, so distances grow with length.
A model whose every query sees only keys within ``R`` tokens (sliding window ``w`` stacked ``L`` times: ``R = L(w-1)``)
cannot do better than chance when ``min_distance > R``: the answer is independent of everything it can see.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .._errors import InputError
from .tokenizer import BOS, encode

IGNORE = -100
TASKS = ("mqar", "passkey")
_VAL_SEED = 7_919  # validation stream, disjoint from training seeds' streams by construction (see _gen)


def _gen(seed: int, step: int, val: bool = False) -> torch.Generator:
    return torch.Generator().manual_seed((int(seed) * 1_000_003 + int(step)) * 2 + (1 if val else 0))


def _pack(seqs: list[torch.Tensor], answers: list[torch.Tensor]):
    """``seqs[b]`` full token sequence (no BOS), ``answers[b]`` bool mask of answer tokens -> ``(x, y)``."""
    y = torch.stack(seqs)
    x = torch.cat([torch.full((len(seqs), 1), BOS, dtype=torch.long), y[:, :-1]], dim=1)
    return x, torch.where(torch.stack(answers), y, torch.full_like(y, IGNORE))


@dataclass
class MQARData:
    """Multi-query associative recall. ``pairs`` key-value pairs; keys from bytes ``[0, keys)``, values from
    ``[128, 128 + values)``, gap noise from ``[keys, 128)`` (never a key or a value)."""

    pairs: int = 4
    keys: int = 16
    values: int = 16
    name: str = "mqar"

    def __post_init__(self):
        if not 1 <= self.pairs <= self.keys:
            raise InputError("pairs", self.pairs, f"allowed 1..keys ({self.keys})")
        if not 1 <= self.keys < 128 or not 1 <= self.values <= 128:
            raise InputError("keys", (self.keys, self.values), "allowed keys in 1..127 and values in 1..128")

    def min_len(self) -> int:
        return 4 * self.pairs

    def min_distance(self, t: int) -> int:
        """Smallest distance from an answer-predicting query position to the value it needs, at window length t."""
        return t - 4 * self.pairs + 1

    def _one(self, g: torch.Generator, t: int):
        if t < self.min_len() + 1:
            raise InputError("block_size", t, f"too short for mqar with {self.pairs} pairs (need > {self.min_len()})")
        n = self.pairs
        k = torch.randperm(self.keys, generator=g)[:n]
        v = 128 + torch.randint(0, self.values, (n,), generator=g)
        gap = t - 4 * n
        noise = torch.randint(self.keys, 128, (gap,), generator=g) if self.keys < 128 else torch.zeros(gap).long()
        order = torch.randperm(n, generator=g)
        kv = torch.stack([k, v], 1).flatten()
        qa = torch.stack([k[order], v[order]], 1).flatten()
        seq = torch.cat([kv, noise, qa])
        ans = torch.zeros(t, dtype=torch.bool)
        ans[t - 2 * n + 1::2] = True
        return seq, ans

    def _batch(self, g, n, t):
        return _pack(*zip(*(self._one(g, t) for _ in range(n))))

    def batch(self, seed: int, step: int, batch_size: int, t: int, *, rank: int = 0, world: int = 1):
        """This rank's slice of global micro-batch ``step`` (``world * batch_size`` examples, one generator)."""
        x, y = self._batch(_gen(seed, step), batch_size * world, t)
        return x[rank * batch_size:(rank + 1) * batch_size], y[rank * batch_size:(rank + 1) * batch_size]

    def val_windows(self, t: int, n: int):
        return self._batch(_gen(_VAL_SEED, t, val=True), n, t)


NEEDLE = " The pass key is {}. Remember it. "
QUESTION = "\nWhat is the pass key? The pass key is {}"


@dataclass
class PasskeyData:
    """A ``digits``-digit number hidden in filler text at a uniformly random depth, asked for at the end. Train
    windows take filler from the train split, validation windows from the held-out works."""

    train_text: torch.Tensor
    val_text: torch.Tensor
    digits: int = 5
    min_gap: int = 32
    name: str = "passkey"

    @classmethod
    def load(cls, corpus: str = "shakespeare", **kw) -> "PasskeyData":
        from .data import LMData

        d = LMData.load(corpus)
        return cls(d.train, d.val, **kw)

    def _lens(self):
        return len(encode(NEEDLE.format("0" * self.digits))), len(encode(QUESTION.format("0" * self.digits)))

    def min_distance(self, t: int) -> int:
        """Smallest distance from a query position to the needle digit it must copy (needle at the deepest depth)."""
        nl, ql = self._lens()
        # Answer digit i is predicted at input position t - digits + i; needle digit i sits at input position
        # depth + len(prefix) + i + 1, and depth <= t - nl - ql - min_gap (see _one).
        return nl + ql + self.min_gap - self.digits - len(encode(NEEDLE.split("{}")[0])) - 1

    def _one(self, g: torch.Generator, t: int, text: torch.Tensor):
        nl, ql = self._lens()
        filler_len = t - nl - ql
        if filler_len < self.min_gap:
            raise InputError("block_size", t, f"too short for passkey (need >= {nl + ql + self.min_gap})")
        if len(text) <= filler_len:
            raise InputError("data", len(text), f"filler text shorter than a window of {filler_len}")
        key = "".join(str(int(d)) for d in torch.randint(0, 10, (self.digits,), generator=g))
        start = int(torch.randint(0, len(text) - filler_len, (1,), generator=g))
        filler = text[start:start + filler_len]
        depth = int(torch.randint(0, filler_len - self.min_gap + 1, (1,), generator=g))
        seq = torch.cat([filler[:depth], encode(NEEDLE.format(key)), filler[depth:], encode(QUESTION.format(key))])
        ans = torch.zeros(t, dtype=torch.bool)
        ans[t - self.digits:] = True
        return seq, ans

    def _batch(self, g, n, t, text):
        return _pack(*zip(*(self._one(g, t, text) for _ in range(n))))

    def batch(self, seed: int, step: int, batch_size: int, t: int, *, rank: int = 0, world: int = 1):
        """This rank's slice of global micro-batch ``step`` (``world * batch_size`` examples, one generator)."""
        x, y = self._batch(_gen(seed, step), batch_size * world, t, self.train_text)
        return x[rank * batch_size:(rank + 1) * batch_size], y[rank * batch_size:(rank + 1) * batch_size]

    def val_windows(self, t: int, n: int):
        return self._batch(_gen(_VAL_SEED, t, val=True), n, t, self.val_text)


def parse_task(spec: str):
    """``mqar`` / ``passkey``, optionally with ``:name=int,...`` settings (``mqar:pairs=16``); None if not a task."""
    name, _, rest = spec.partition(":")
    if name not in TASKS:
        return None
    kw = {}
    for item in filter(None, rest.split(",")):
        k, _, v = item.partition("=")
        if not v.lstrip("-").isdigit():
            raise InputError("data", spec, f"task settings are name=integer pairs, got {item!r}")
        kw[k] = int(v)
    allowed = {"mqar": ("pairs", "keys", "values"), "passkey": ("digits", "min_gap")}[name]
    bad = set(kw) - set(allowed)
    if bad:
        raise InputError("data", spec, f"unknown {name} setting(s) {sorted(bad)}; allowed {allowed}")
    if name == "mqar":
        return MQARData(**kw, name=spec)
    return PasskeyData.load(**kw, name=spec)
