"""What the kernel benchmark's prefill and decode parts share: the JSON schema, the cost model, inputs, timing."""
from __future__ import annotations

import os
import platform
import time
from pathlib import Path

import torch

SCHEMA = "focusattn.kernel_bench/1"
MEMORY_METHOD = ("rise of peak RSS (VmHWM reset via /proc/self/clear_refs) over RSS just before one forward call; "
                 "glibc mmap threshold pinned at 128 KiB, malloc_trim before; includes output + temporaries, "
                 "excludes inputs")
COST_MODEL = ("pairs: full = T(T+1)/2; focus = sum_g n_g(n_g+1)/2 (measured group sizes, ~k^2/K of full when "
              "balanced) + T*w (window part); theoretical ratio = full / focus ~ 1 / (k^2/K + 2w/T); query and key "
              "roles (query top-1, key top-k): sum_g q_g k_g / 2 (~k/K of full) + T*w")


def env() -> dict:
    """Where and when: recorded with every measurement."""
    return {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "cpu": cpu_model(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def cpu_model(path: str = "/proc/cpuinfo") -> str:
    """The CPU's model name and the matrix/vector extensions the attention kernels use (``"Intel(R) Xeon(R) Processor
    [amx_bf16 avx512f]"``), else ``platform.processor()``. Why: the whole-model ratios depend on the chip (Focus
    prefill at 8192 measured 1.26x the original on one Xeon and 1.09x on another, with AMX, whose dense SDPA is
    relatively faster), so each benchmark names the one it ran on."""
    try:
        text = Path(path).read_text()
    except OSError:
        return platform.processor() or platform.machine()
    first = text.split("\n\n")[0].splitlines()  # the first processor's block
    fields = {k.strip(): v for k, v in (line.split(":", 1) for line in first if ":" in line)}
    name = fields.get("model name", platform.processor() or platform.machine()).strip()
    flags = set(fields.get("flags", "").split())
    ext = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"{name} [{' '.join(ext)}]" if ext else name


def random_membership(t: int, k_groups: int, top_k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    order = torch.rand(1, t, k_groups, generator=gen).argsort(-1)[..., :top_k]
    return torch.zeros(1, t, k_groups, dtype=torch.bool).scatter_(-1, order, True)


ROUTINGS = ("random", "zipf", "captured")


def zipf_membership(t: int, k_groups: int, top_k: int, seed: int, s: float = 1.0) -> torch.Tensor:
    """Imbalanced routing: each token draws ``top_k`` distinct groups with probabilities ``∝ 1 / (g + 1)^s``
    (Gumbel top-k, i.e. sampling without replacement), so group 0 is the giant one (``s = 1``, K = 8: ~37% of
    the tokens' first choices)."""
    gen = torch.Generator().manual_seed(seed)
    logp = -s * torch.log(torch.arange(1, k_groups + 1, dtype=torch.float64))
    gumbel = -torch.log(-torch.log(torch.rand(1, t, k_groups, generator=gen, dtype=torch.float64)))
    order = (logp + gumbel).topk(top_k, dim=-1).indices
    return torch.zeros(1, t, k_groups, dtype=torch.bool).scatter_(-1, order, True)


def load_captured(path) -> tuple[torch.Tensor, dict]:
    """``(top_groups [layers, T, 3] long, metadata)`` from :mod:`scripts/capture_routing.py`'s file."""
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor("top_groups").long(), dict(f.metadata() or {})


def captured_membership(top_groups: torch.Tensor, t: int, k_groups: int, top_k: int, layer: int) -> torch.Tensor:
    """The learned top-k membership of the first ``t`` tokens of one captured layer, ``[1, t, K]``."""
    if t > top_groups.shape[1]:
        raise ValueError(f"length {t} exceeds the captured routing's {top_groups.shape[1]} tokens")
    if top_k > top_groups.shape[2]:
        raise ValueError(f"top_k {top_k} exceeds the captured ranking depth {top_groups.shape[2]}")
    idx = top_groups[layer, :t, :top_k][None]
    return torch.zeros(1, t, k_groups, dtype=torch.bool).scatter_(-1, idx, True)


def worst_layer(top_groups: torch.Tensor, t: int, k_groups: int) -> int:
    """The captured layer whose top-1 groups are the most imbalanced (largest ``sum_g n_g^2``): the slowest."""
    costs = [float((torch.bincount(top_groups[i, :t, 0], minlength=k_groups).double() ** 2).sum())
             for i in range(top_groups.shape[0])]
    return max(range(len(costs)), key=costs.__getitem__)


def work_ratio(membership: torch.Tensor, window: int, query_membership: torch.Tensor | None = None) -> float:
    """Full causal pairs over the pairs the kernel really computes: every same-group part of its plan
    (inclusion–exclusion adds the intersections, each ``n(n+1)/2``) plus the window band ``T (C + w)``.
    ``query_membership``: query and key roles, whose parts are masked row chunks of ``fused.roles_rows`` queries
    against the group's keys up to the chunk's last position (the staircase the fused op computes whole)."""
    from ..kernels.decomposed.fused import roles_rows
    from ..kernels.decomposed.plan import BAND_BLOCK, plan_groups

    t = membership.shape[1]
    plans = plan_groups(membership, None, query_membership=query_membership)
    if query_membership is None:
        parts = sum(len(x.idx) * (len(x.idx) + 1) / 2 for x in plans)
    else:
        parts = 0
        for x in plans:
            step = roles_rows(len(x.idx), len(x.keys))
            parts += sum((min(len(x.idx), r0 + step) - r0) * x.key_end(min(len(x.idx), r0 + step))
                         for r0 in range(0, len(x.idx), step))
    band = t * (BAND_BLOCK + min(window, t)) if window > 0 else 0
    return (t * (t + 1) / 2) / (parts + band)


def theoretical_ratio(membership: torch.Tensor, window: int, query_membership: torch.Tensor | None = None) -> float:
    """Full causal pairs over the cost model's pairs (``COST_MODEL``); ``query_membership``: query and key roles,
    each group's queries against its keys, half of them earlier (``q_g k_g / 2``)."""
    t = membership.shape[1]
    n = membership[0].sum(0).double()
    if query_membership is None:
        same = float((n * (n + 1) / 2).sum())
    else:
        same = float((query_membership[0].sum(0).double() * n / 2).sum())
    focus = same + t * min(window, t)
    return (t * (t + 1) / 2) / focus


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def timed_on(fn, device: str):
    """``(out, wall seconds, decisive seconds)``: thread CPU time on the CPU (:func:`timed_cpu`), CUDA-event time on a
    GPU (the work the call queued, whatever the host did meanwhile)."""
    if device == "cpu":
        return timed_cpu(fn)
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    a.record()
    out = fn()
    b.record()
    torch.cuda.synchronize()
    return out, time.perf_counter() - t0, a.elapsed_time(b) / 1e3


def timed_cpu(fn):
    """``(out, wall seconds, CPU seconds of this thread)``: with one torch thread the CPU time is the kernel's
    own work, unaffected by preemption when other jobs share the cores."""
    c0, t0 = time.thread_time(), time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, time.thread_time() - c0
