"""Exact sub-quadratic Focus attention for prefill: sort by group, attend inside groups, add the window (see
:mod:`.driver` for the decomposition, its cost and its gradients)."""
from .driver import decomposed_focus_attention

__all__ = ["decomposed_focus_attention"]
