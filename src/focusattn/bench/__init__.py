"""Benchmarks: timers, suites, JSON + plots (CPU-honest: alternating runs, medians, same-run baselines)."""
from .kernels import run_kernel_bench
from .report import render_markdown

__all__ = ["run_kernel_bench", "render_markdown"]
