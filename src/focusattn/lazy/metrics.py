"""Attention-allocation diagnostics, defined on dense causal weights ``a`` of shape ``[B, H, T, T]``.

Definitions (per head; averaged over the batch; "causal pairs" are ``j <= i``):

* **sparsity**: the share of causal pairs whose weight is exactly 0 (not ``< eps``: Elastic-Softmax produces true
  zeros and softmax never does, so any tolerance would blur the distinction being measured).
* **surviving mass**: the mean over query rows ``i`` of ``sum_j a_ij`` (1 for softmax; <= 1 for Elastic-Softmax
  with tau >= 0; > 1 when tau < 0).
* **sink mass**: the mean over query rows ``i >= 1`` of ``a_i0``, the weight on the first token. Row 0 is left out:
  it sees only the first token, so it would count 1 for every softmax head whatever the model learned. For reference,
  uniform attention gives ``mean_{i>=1} 1/(i+1)`` (:func:`uniform_sink_mass`, about ln(T)/T).
* **sink share**: the same mean of ``a_i0 / sum_j a_ij``, the first token's share of what the row keeps. For softmax
  it equals the sink mass; for Elastic-Softmax (rows sum to < 1) it is the like-for-like comparison: a row that keeps
  0.3 in total and puts 0.15 on the first token has sink mass 0.15 but sink share 0.5. Rows that keep nothing have no
  share and are left out; **empty rows** counts them (share of all rows ``i >= 0`` whose weights are all 0). The
  uniform baseline is the same ``uniform_sink_mass``.
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


def sink_share(a: torch.Tensor, first_row: int = 1) -> torch.Tensor:
    """Per-head mean of ``a_i0 / sum_j a_ij`` over rows ``i >= first_row`` that keep any weight: ``[H]`` (NaN for a
    head whose rows are all empty)."""
    _check(a)
    if a.shape[-1] <= first_row:
        raise ValueError(f"sink share needs T > first_row ({first_row})")
    a = a[..., first_row:, :].double()
    tot = a.sum(-1)
    live = tot > 0
    share = torch.where(live, a[..., 0] / tot.clamp_min(1e-300), torch.zeros_like(tot))
    return share.sum((0, 2)) / live.sum((0, 2))


def empty_rows(a: torch.Tensor) -> torch.Tensor:
    """Per-head share of query rows (all ``i``, row 0 included) whose weights are all exactly 0: ``[H]``."""
    _check(a)
    return (a == 0).all(-1).double().mean((0, 2))


def uniform_sink_mass(t: int) -> float:
    """Sink mass of uniform causal attention over ``t`` tokens: the no-sink reference level."""
    return sum(1.0 / (i + 1) for i in range(1, t)) / (t - 1)


def attention_report(weights: list[torch.Tensor]) -> dict:
    """Per-layer, per-head metrics from one ``[B, H, T, T]`` tensor per layer, plus means over heads and layers."""
    per = {name: [fn(a).tolist() for a in weights]
           for name, fn in (("sparsity", sparsity), ("surviving_mass", surviving_mass), ("sink_mass", sink_mass),
                            ("sink_share", sink_share), ("empty_rows", empty_rows))}
    out = {"T": weights[0].shape[-1], "uniform_sink_mass": uniform_sink_mass(weights[0].shape[-1]), "per_head": per}
    out["per_layer"] = {k: [sum(h) / len(h) for h in v] for k, v in per.items()}
    out["mean"] = {k: sum(v) / len(v) for k, v in out["per_layer"].items()}
    return out
