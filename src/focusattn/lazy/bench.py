"""Wall-clock of the chunked Elastic-Softmax kernel against full causal SDPA, measured in the same run.

The two are timed alternately (SDPA, lazy, SDPA, lazy, ...) so that load from other processes on a shared machine
hits both alike; medians are reported, and the ratio is lazy / SDPA. Forward runs under ``no_grad`` (inference);
forward+backward includes the gradient of q, k, v (and tau, bias for lazy).
"""
from __future__ import annotations

import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import _io
from ..kernels.elastic import lazy_attention


def _time(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_lazy_bench(out_dir: str | Path, T: int = 4096, *, B: int = 1, H: int = 8, D: int = 64, W: int = 1024,
                   block: int = 64, reps: int = 5, backward: bool = True, threads: int | None = None,
                   dtype: torch.dtype = torch.float32, seed: int = 0, command: str | None = None) -> dict:
    """Time forward (and forward+backward) at ``[B, H, T, D]``; write ``lazy_bench.json`` and ``lazy_bench.png``."""
    if reps < 1:
        raise ValueError(f"reps must be >= 1, got {reps}")
    if threads is not None:
        torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, T, D, generator=g, dtype=dtype) for _ in range(3))
    tau = torch.ones(H, dtype=dtype)
    bias = torch.randn(H, W, generator=g, dtype=dtype) * 0.02

    def sdpa_fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def lazy_fwd():
        with torch.no_grad():
            lazy_attention(q, k, v, tau, bias, impl="chunked", block=block)

    def grads(*ts):
        return [t.detach().requires_grad_() for t in ts]

    def sdpa_bwd():
        q_, k_, v_ = grads(q, k, v)
        F.scaled_dot_product_attention(q_, k_, v_, is_causal=True).sum().backward()

    def lazy_bwd():
        q_, k_, v_, t_, b_ = grads(q, k, v, tau, bias)
        lazy_attention(q_, k_, v_, t_, b_, impl="chunked", block=block).sum().backward()

    pairs = {"forward": (sdpa_fwd, lazy_fwd)}
    if backward:
        pairs["forward_backward"] = (sdpa_bwd, lazy_bwd)
    results = {}
    for mode, (base, ours) in pairs.items():
        base(), ours()  # warm-up
        tb, to = [], []
        for _ in range(reps):
            tb.append(_time(base))
            to.append(_time(ours))
        mb, mo = statistics.median(tb), statistics.median(to)
        results[mode] = {"sdpa_s": tb, "lazy_s": to, "sdpa_median_s": mb, "lazy_median_s": mo, "ratio": mo / mb}
    out = {"shape": {"B": B, "H": H, "T": T, "D": D, "W": W}, "block": block, "reps": reps, "dtype": str(dtype),
           "threads": torch.get_num_threads(), "torch": torch.__version__, "machine": platform.machine(),
           "processor": platform.processor(), "target_ratio": 3.0, "results": results, "command": command}
    d = Path(out_dir)
    _io.write_json(d / "lazy_bench.json", out)
    _plot(out, d / "lazy_bench.png")
    return out


def _plot(res: dict, path: Path) -> None:
    plt = _io.pyplot()

    modes = list(res["results"])
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = range(len(modes))
    sd = [res["results"][m]["sdpa_median_s"] * 1e3 for m in modes]
    lz = [res["results"][m]["lazy_median_s"] * 1e3 for m in modes]
    ax.bar([x - 0.2 for x in xs], sd, 0.4, label="SDPA causal")
    ax.bar([x + 0.2 for x in xs], lz, 0.4, label="Lazy (chunked)")
    for x, m in zip(xs, modes):
        ax.text(x + 0.2, lz[x], f"{res['results'][m]['ratio']:.2f}x", ha="center", va="bottom")
    ax.set_xticks(list(xs), modes)
    ax.set_ylabel("median ms")
    s = res["shape"]
    ax.set_title(f"B={s['B']} H={s['H']} T={s['T']} D={s['D']} W={s['W']}, {res['threads']} threads, {res['dtype']}")
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with _io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)
    plt.close(fig)
