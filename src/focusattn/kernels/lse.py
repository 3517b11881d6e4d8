"""Exact merging of partial attention results by log-sum-exp.

Softmax attention over a key set that is the *disjoint* union of parts P1, P2, ... can be computed part by part:
each part yields its own normalised output ``o_p`` and log-normaliser ``l_p = logsumexp_j s_ij``; then
``l = logaddexp(l_1, l_2, ...)`` and ``o = sum_p exp(l_p - l) * o_p``. This is exact (no double counting) only if
the parts are disjoint, which is why the Focus decomposition attributes every allowed pair to exactly one part.

Conventions: LSE in natural-log units, ``-inf`` for a query with no key in the part (its ``o_p`` is ignored).
Everything is done in float32 (float64 for float64 inputs) so that bf16/fp16 partials keep the softmax's tail.
"""
from __future__ import annotations

import torch


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """Accumulation dtype: float32, or float64 for float64 inputs (so gradcheck-grade precision stays possible)."""
    return torch.promote_types(dtype, torch.float32)


def acc(x: torch.Tensor) -> torch.Tensor:
    return x.to(acc_dtype(x.dtype))


def finite_or_zero(lse: torch.Tensor) -> torch.Tensor:
    """Replace ``-inf`` by 0 so that ``exp(x - lse)`` is 0 (not NaN) for empty rows, where ``x`` is also ``-inf``."""
    return torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)


def merge_pair(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor):
    """Merge two disjoint partials. ``o``: ``[..., D]``, ``l``: ``[...]``. Returns ``(o, l)`` in float32 (or 64)."""
    l1, l2 = acc(l1), acc(l2)
    lse = torch.logaddexp(l1, l2)
    ref = finite_or_zero(lse)
    w1 = torch.exp(l1 - ref).unsqueeze(-1)
    w2 = torch.exp(l2 - ref).unsqueeze(-1)
    # An empty part (LSE -inf) gets weight exactly 0; its output must be finite (all kernels here return zeros).
    return torch.addcmul(w1 * acc(o1), w2, acc(o2)), lse


def mark_empty(lse: torch.Tensor, has_key: torch.Tensor) -> torch.Tensor:
    """Set LSE to ``-inf`` where a row had no allowed key.

    Needed because PyTorch's CPU flash kernel reports LSE 0 (not ``-inf``) for a fully masked row, which would
    otherwise give that empty part weight ``exp(0 - l)`` in the merge.
    """
    return lse.masked_fill(~has_key, float("-inf"))



def merge_signed_(o1: torch.Tensor, l1: torch.Tensor, o2: torch.Tensor, l2: torch.Tensor, sign: int = 1):
    """In place on ``(o1, l1)`` (accumulation dtype, may be views of a larger buffer): the partial of
    ``Z = exp(l1) + exp(l2)`` (``sign=1``) or ``exp(l1) - exp(l2)`` (``sign=-1``), computed relative to the larger
    LSE. Subtraction is for inclusion–exclusion, where part 2's keys are a subset of what part 1 already holds at
    least twice over (``exp(l2) <= exp(l1) / 2``), so the difference loses at most a factor 2 of relative
    precision. Rows whose result is empty (``Z <= 0``) get ``o = 0``, ``l = -inf``. Returns ``(o1, l1)``."""
    l2 = acc(l2)
    ref = finite_or_zero(torch.maximum(l1, l2))
    a = torch.exp(l1 - ref)
    c = torch.exp(l2 - ref)
    z = a - c if sign < 0 else a + c
    pos = z > 0
    inv = torch.where(pos, 1.0 / z, torch.zeros_like(z))
    l1.copy_(torch.where(pos, ref + torch.log(z.clamp_min(torch.finfo(z.dtype).tiny)), float("-inf")))
    o1.mul_((a * inv).unsqueeze(-1))
    o1.addcmul_((c * inv).unsqueeze(-1), acc(o2), value=-1.0 if sign < 0 else 1.0)
    return o1, l1
