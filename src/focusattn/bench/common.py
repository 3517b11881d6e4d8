"""What the kernel benchmark's prefill and decode parts share: the JSON schema, the cost model, inputs, timing."""
from __future__ import annotations

import os
import platform
import time

import torch

SCHEMA = "focusattn.kernel_bench/1"
MEMORY_METHOD = ("rise of peak RSS (VmHWM reset via /proc/self/clear_refs) over RSS just before one forward call; "
                 "glibc mmap threshold pinned at 128 KiB, malloc_trim before; includes output + temporaries, "
                 "excludes inputs")
COST_MODEL = ("pairs: full = T(T+1)/2; focus = sum_g n_g(n_g+1)/2 (measured group sizes, ~k^2/K of full when "
              "balanced) + T*w (window part); theoretical ratio = full / focus ~ 1 / (k^2/K + 2w/T)")


def env() -> dict:
    """Where and when: recorded with every measurement."""
    return {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def random_membership(t: int, k_groups: int, top_k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    order = torch.rand(1, t, k_groups, generator=gen).argsort(-1)[..., :top_k]
    return torch.zeros(1, t, k_groups, dtype=torch.bool).scatter_(-1, order, True)


def theoretical_ratio(membership: torch.Tensor, window: int) -> float:
    t = membership.shape[1]
    n = membership[0].sum(0).double()
    focus = float((n * (n + 1) / 2).sum()) + t * min(window, t)
    return (t * (t + 1) / 2) / focus


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0
