"""Attention-allocation diagnostics, defined on dense causal weights ``a`` of shape ``[B, H, T, T]``.

Definitions (per head; averaged over the batch; "causal pairs" are ``j <= i``):

* **sparsity**: the share of causal pairs whose weight is exactly 0 (not ``< eps``: Elastic-Softmax produces true
  zeros and softmax never does, so any tolerance would blur the distinction being measured).
* **surviving mass**: the mean over query rows ``i`` of ``sum_j a_ij`` (1 for softmax; <= 1 for Elastic-Softmax
  with tau >= 0; > 1 when tau < 0).
* **sink mass**: the mean over query rows ``i >= 1`` of ``a_i0``, the weight on the first token. Row 0 is left out:
  it sees only the first token, so it would count 1 for every softmax head whatever the model learned. For reference,
  uniform attention gives ``mean_{i>=1} 1/(i+1)`` (:func:`uniform_sink_mass`, about ln(T)/T).
"""
from __future__ import annotations

import torch


def _check(a: torch.Tensor) -> None:
    if a.dim() != 4 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"weights must be [B, H, T, T] (square, causal), got {tuple(a.shape)}")


def sparsity(a: torch.Tensor) -> torch.Tensor:
    """Per-head share of causal pairs with weight exactly 0: ``[H]``."""
    _check(a)
    t = a.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=a.device).tril()
    zeros = ((a == 0) & causal).sum((-1, -2)).double()
    return (zeros / causal.sum()).mean(0)


def surviving_mass(a: torch.Tensor) -> torch.Tensor:
    """Per-head mean row sum of the weights: ``[H]``."""
    _check(a)
    return a.double().sum(-1).mean((0, 2))


def sink_mass(a: torch.Tensor) -> torch.Tensor:
    """Per-head mean weight on the first token over rows ``i >= 1``: ``[H]`` (needs T >= 2)."""
    _check(a)
    if a.shape[-1] < 2:
        raise ValueError("sink mass needs T >= 2 (row 0 is excluded)")
    return a[..., 1:, 0].double().mean((0, 2))


def uniform_sink_mass(t: int) -> float:
    """Sink mass of uniform causal attention over ``t`` tokens: the no-sink reference level."""
    return sum(1.0 / (i + 1) for i in range(1, t)) / (t - 1)


def attention_report(weights: list[torch.Tensor]) -> dict:
    """Per-layer, per-head metrics from one ``[B, H, T, T]`` tensor per layer, plus means over heads and layers."""
    per = {name: [fn(a).tolist() for a in weights]
           for name, fn in (("sparsity", sparsity), ("surviving_mass", surviving_mass), ("sink_mass", sink_mass))}
    out = {"T": weights[0].shape[-1], "uniform_sink_mass": uniform_sink_mass(weights[0].shape[-1]), "per_head": per}
    out["per_layer"] = {k: [sum(h) / len(h) for h in v] for k, v in per.items()}
    out["mean"] = {k: sum(v) / len(v) for k, v in out["per_layer"].items()}
    return out
