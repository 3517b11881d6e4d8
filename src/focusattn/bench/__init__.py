"""Benchmarks: timers, suites, JSON + plots (CPU-honest: alternating runs, medians, same-run baselines).

``prefill.py`` (forward attention vs full SDPA), ``decode.py`` (one cached decode step), ``memory.py`` (peak-RSS probe,
allocator regimes), ``targets.py`` (the stated targets), ``report.py`` (markdown and plot), ``cli.py``.
"""
from .decode import run_decode_bench
from .prefill import run_kernel_bench
from .report import plot_bench, render_markdown

__all__ = ["plot_bench", "render_markdown", "run_decode_bench", "run_kernel_bench"]
