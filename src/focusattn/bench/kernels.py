"""Kernel benchmark: Focus forward attention (decomposed, flex, dense) against full causal SDPA.

Method, chosen so the numbers mean something on a shared CPU box:

* every compared function for one length runs in the same process, *alternating* (round-robin over repeats), so
  load changes hit all of them alike; we report medians and each function's ratio to full SDPA from the same run;
* shapes are SmolLM2-135M's attention (9 query heads, 3 KV heads, D = 64), batch 1, float32;
* routing is random top-k over K groups (balanced in expectation), window ``w``;
* peak memory is measured once per function (on its first timed repeat) as the rise of the process's peak resident
  set size (``VmHWM``, reset through ``/proc/self/clear_refs``) above the resident size just before the call, with
  glibc's mmap threshold pinned to 128 KiB and ``malloc_trim`` first so freed blocks return to the OS. It counts the
  output and every temporary (the inputs already exist), on Linux only (``None`` elsewhere);
* theoretical ratio (cost model, in attended pairs): full causal attention costs ``T(T+1)/2``; the decomposed
  kernel costs ``sum_g n_g(n_g+1)/2`` for the same-group part (``n_g`` = measured group sizes; ``≈ k^2/K`` of full
  for balanced top-k groups, pairs sharing several groups being computed in each but counted once) plus ``T·w``
  for the window part, so ``ratio = T(T+1)/2 / (sum_g n_g(n_g+1)/2 + T·w)`` ≈ ``1 / (k^2/K + 2w/T)``.
"""
from __future__ import annotations

import ctypes
import gc
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .._io import atomic_path, write_json

SCHEMA = "focusattn.kernel_bench/1"
MEMORY_METHOD = ("rise of peak RSS (VmHWM reset via /proc/self/clear_refs) over RSS just before one forward call; "
                 "glibc mmap threshold pinned at 128 KiB, malloc_trim before; includes output + temporaries, "
                 "excludes inputs")
COST_MODEL = ("pairs: full = T(T+1)/2; focus = sum_g n_g(n_g+1)/2 (measured group sizes, ~k^2/K of full when "
              "balanced) + T*w (window part); theoretical ratio = full / focus ~ 1 / (k^2/K + 2w/T)")


# ------------------------------------------------------------------------------------------------ memory probe
class _PeakRSS:
    """Peak-RSS probe (Linux). ``measure(fn)`` returns ``(result, bytes or None)``."""

    def __init__(self):
        self.ok = sys.platform.startswith("linux") and os.path.exists("/proc/self/clear_refs")
        self.libc = None
        if self.ok:
            try:
                self.libc = ctypes.CDLL("libc.so.6")
                self.libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD: fixed, so big frees go back to the OS
            except OSError:
                self.libc = None

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        raise KeyError(key)

    def measure(self, fn):
        if not self.ok:
            return fn(), None
        gc.collect()
        if self.libc is not None:
            self.libc.malloc_trim(0)
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.ok = False
            return fn(), None
        base = self._status("VmRSS")
        out = fn()
        return out, max(0, self._status("VmHWM") - base)


# ------------------------------------------------------------------------------------------------ inputs
def random_membership(t: int, k_groups: int, top_k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    order = torch.rand(1, t, k_groups, generator=gen).argsort(-1)[..., :top_k]
    return torch.zeros(1, t, k_groups, dtype=torch.bool).scatter_(-1, order, True)


def theoretical_ratio(membership: torch.Tensor, window: int) -> float:
    t = membership.shape[1]
    n = membership[0].sum(0).double()
    focus = float((n * (n + 1) / 2).sum()) + t * min(window, t)
    return (t * (t + 1) / 2) / focus


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _raise_recompile_limit():
    """Each (K, top-k) block mask comes with a new mask_mod closure; dynamo must not fall back to eager after the
    default 8 recompiles (eager flex materialises T x T scores and would distort or OOM the run)."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))


# ------------------------------------------------------------------------------------------------ benchmark
def run_kernel_bench(out_dir, *, lengths=(1024, 4096, 16384, 32768, 65536), groups=(4, 8, 16), top_ks=(1, 2),
                     window=128, heads=9, kv_heads=3, head_dim=64, repeats=3, quick=False, dense_max_len=4096,
                     flex=True, flex_groups=None, flex_compile=True, decode_len=32768, decode_repeats=20, seed=0,
                     threads=None, command=None, progress=True) -> dict:
    """Time forward attention and write ``bench.json`` + ``bench.png`` into ``out_dir``; returns the JSON dict.

    ``quick``: tiny lengths, 2 repeats, eager flex (no compile), small decode — a smoke run for tests and CI.
    ``flex_groups``: run flex only for these K (compiled flex costs about full attention here, as random routing
    leaves no 128x128 block empty, so it dominates the wall clock); None = every K.
    ``threads``: torch intra-op threads for the run (None = leave as is). On a machine shared with other jobs use 1:
    with more OpenMP threads than free cores every parallel op can stall for a scheduler slice (~10 ms measured
    here), which penalises kernels made of many ops far more than one big fused call.
    """
    from tqdm.auto import tqdm

    from ..kernels.decode import focus_decode_attention
    from ..kernels.decomposed import decomposed_focus_attention
    from ..kernels.flex import flex_focus_attention, focus_block_mask
    from ..kernels.reference import dense_focus_attention

    if quick:
        lengths, groups, top_ks = tuple(x for x in lengths if x <= 512) or (256, 512), tuple(groups)[:2], top_ks
        repeats, flex_compile, decode_len, decode_repeats = 2, False, min(decode_len, 1024), 5
    lengths = tuple(sorted(set(int(x) for x in lengths)))
    configs = [(int(kk), int(tk)) for kk in groups for tk in top_ks if tk <= kk]
    if not lengths or not configs:
        raise ValueError("need at least one length and one (groups, top_k) pair with top_k <= groups")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if threads is not None:
        torch.set_num_threads(int(threads))
    if flex and flex_compile:
        _raise_recompile_limit()
    probe = _PeakRSS()
    gen = torch.Generator().manual_seed(seed)
    results = []

    # warm the fused SDPA/flash ops once on a small shape, so no length pays one-time initialisation
    wq = torch.randn(1, heads, 128, head_dim)
    wk = torch.randn(1, kv_heads, 128, head_dim)
    with torch.no_grad():
        F.scaled_dot_product_attention(wq, wk, wk, is_causal=True, enable_gqa=True)
        decomposed_focus_attention(wq, wk, wk, random_membership(128, 2, 1, seed), 8)

    bar = tqdm(total=len(lengths) * (repeats + 1) + 1, desc="kernel bench", disable=not progress)
    for t in lengths:
        q = torch.randn(1, heads, t, head_dim, generator=gen)
        k = torch.randn(1, kv_heads, t, head_dim, generator=gen)
        v = torch.randn(1, kv_heads, t, head_dim, generator=gen)
        fns, meta, membs = {}, {}, {}
        fns[("sdpa", None, None)] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        for kk, tk in configs:
            memb = membs[(kk, tk)] = random_membership(t, kk, tk, seed + 1000 * kk + tk)
            theo = theoretical_ratio(memb, window)
            fns[("decomposed", kk, tk)] = (lambda m=memb: decomposed_focus_attention(q, k, v, m, window))
            meta[("decomposed", kk, tk)] = {"theoretical_ratio": theo}
            if flex and (flex_groups is None or kk in flex_groups):
                t0 = time.perf_counter()
                bm = focus_block_mask(memb, window, t)
                bm_s = time.perf_counter() - t0
                fns[("flex", kk, tk)] = (lambda m=memb, b=bm: flex_focus_attention(
                    q, k, v, m, window, block_mask=b, compile=flex_compile))
                meta[("flex", kk, tk)] = {"theoretical_ratio": theo, "block_mask_build_s": bm_s,
                                          "mode": "compiled" if flex_compile else "eager"}
        if t <= dense_max_len:  # the dense reference costs the same for any routing: time it for the first one
            kk, tk = configs[0]
            fns[("dense", kk, tk)] = (lambda m=membs[(kk, tk)]: dense_focus_attention(q, k, v, m, window))
            meta[("dense", kk, tk)] = {"theoretical_ratio": theoretical_ratio(membs[(kk, tk)], window)}

        times = {key: [] for key in fns}
        mem, errors, outputs = {}, {}, {}
        with torch.no_grad():
            # warm-up only where it is needed (flex compiles per shape; the fused ops were warmed at startup).
            # Outputs are kept to check decomposed against dense (else flex); others come from the first repeat.
            for key, fn in fns.items():
                if key[0] == "flex":
                    try:
                        outputs[key] = fn()
                    except Exception as exc:  # record and keep going: one failing backend must not void the run
                        errors[key] = f"{type(exc).__name__}: {exc}"
            bar.update(1)
            for key in errors:
                fns.pop(key)
                times.pop(key)
            for r in range(repeats):
                for key, fn in fns.items():
                    if r == 0:
                        (out, dt), peak = probe.measure(lambda f=fn: _timed(f))
                        mem[key] = peak
                        if key[0] in ("decomposed", "dense"):
                            outputs[key] = out
                        del out
                    else:
                        _, dt = _timed(fn)
                    times[key].append(dt)
                bar.update(1)
        sdpa_median = statistics.median(times[("sdpa", None, None)])
        for key in list(times) + list(errors):
            backend, kk, tk = key
            rec = {"T": t, "backend": backend, "K": kk, "top_k": tk, "window": window}
            if key in errors:
                rec.update(error=errors[key], median_s=None, times_s=[], ratio_vs_sdpa=None, peak_mem_bytes=None)
            else:
                med = statistics.median(times[key])
                rec.update(median_s=med, times_s=times[key], ratio_vs_sdpa=sdpa_median / med,
                           peak_mem_bytes=mem.get(key), error=None)
            rec.update(meta.get(key, {}))
            if backend == "decomposed" and key in outputs:
                for ref_name in ("dense", "flex"):
                    ref = outputs.get((ref_name, kk, tk))
                    if ref is not None:
                        rec["max_abs_diff"] = float((outputs[key] - ref).abs().max())
                        rec["diff_reference"] = ref_name
                        break
            results.append(rec)
        del q, k, v, outputs, fns
        gc.collect()

    decode = _decode_bench(decode_len, configs, window, heads, kv_heads, head_dim, decode_repeats, seed,
                           focus_decode_attention) if decode_len else None
    bar.update(1)
    bar.close()

    doc = {
        "schema": SCHEMA,
        "command": command,
        "config": {"lengths": list(lengths), "groups": sorted({c[0] for c in configs}),
                   "top_ks": sorted({c[1] for c in configs}), "window": window, "heads": heads,
                   "kv_heads": kv_heads, "head_dim": head_dim, "batch": 1, "dtype": "float32", "repeats": repeats,
                   "quick": quick, "dense_max_len": dense_max_len, "flex": flex,
                   "flex_groups": None if flex_groups is None else sorted(flex_groups),
                   "flex_mode": ("compiled" if flex_compile else "eager") if flex else None, "seed": seed},
        "env": {"torch": torch.__version__, "python": platform.python_version(), "platform": platform.platform(),
                "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
                "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
        "cost_model": COST_MODEL,
        "memory_method": MEMORY_METHOD if probe.ok else "unavailable on this platform",
        "flex_note": ("torch.compile(flex_attention) on CPU supports inference only and no LSE (torch 2.13); "
                      "block-mask build time is reported separately, not in median_s"),
        "results": results,
        "decode": decode,
    }
    doc["targets"] = evaluate_targets(doc)
    write_json(out_dir / "bench.json", doc)
    try:
        plot_bench(doc, out_dir / "bench.png")
    except Exception as exc:  # a missing plotting backend must not lose the measurements
        doc["plot_error"] = f"{type(exc).__name__}: {exc}"
        write_json(out_dir / "bench.json", doc)
    return doc


# glibc allocator regimes for the decode step, whose cost is small enough that page faults on its temporaries
# matter: "heap" = mmap threshold 32 MiB, trim threshold 64 MiB (glibc's dynamic maximum, where a long-running
# process ends up: freed temporaries are reused), "mmap" = 128 KiB (as pinned by the memory probe of the prefill
# run: every temporary of >= 128 KiB is fresh zeroed pages). Left to glibc's dynamic threshold, the result depends
# on what ran before (measured: the scan path's step went from ~3 to ~12 ms with the order of the other kernels).
MALLOC_REGIMES = (("heap", 32 << 20), ("mmap", 128 << 10))


def _set_mmap_threshold(nbytes: int) -> bool:
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    gc.collect()
    libc.malloc_trim(0)
    # M_MMAP_THRESHOLD, and M_TRIM_THRESHOLD at twice it (glibc's own rule when it adjusts the threshold itself:
    # else freeing a large temporary at the heap top would return its pages, and the next call would fault them in)
    return bool(libc.mallopt(-3, int(nbytes))) and bool(libc.mallopt(-1, 2 * int(nbytes)))


def _decode_bench(t, configs, window, heads, kv_heads, head_dim, repeats, seed, focus_decode_attention):
    """One decode step at context ``t``: cached full attention (SDPA, 1 query vs t keys) vs Focus decode, both
    ways of finding the query's keys: scanning all ``t`` keys' membership (``focus_decode``), and a
    :class:`GroupIndex` (``focus_decode_indexed``). The indexed step is timed as a generation loop runs it: append
    the new token's membership to an index of ``t - 1`` tokens, then attend; the index is cropped back untimed.
    Run once per allocator regime (:data:`MALLOC_REGIMES`), each with its own SDPA baseline. Besides wall time,
    the thread's CPU time is recorded: on a box shared with other jobs a step of a few ms is often preempted for a
    scheduler slice, which the wall-clock median then partly reflects, while CPU time does not."""
    from ..kernels.group_index import GroupIndex

    gen = torch.Generator().manual_seed(seed + 7)
    q = torch.randn(1, heads, 1, head_dim, generator=gen)
    k = torch.randn(1, kv_heads, t, head_dim, generator=gen)
    v = torch.randn(1, kv_heads, t, head_dim, generator=gen)
    fns = {("sdpa_cached", None, None): lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)}
    resets, keys, meta = {}, {}, {}
    for kk, tk in configs:
        memb = random_membership(t, kk, tk, seed + 1000 * kk + tk)
        shared = (memb[0] & memb[0, -1]).any(-1)
        shared[-window - 1:] = True
        keys[("focus_decode", kk, tk)] = keys[("focus_decode_indexed", kk, tk)] = int(shared.sum())
        fns[("focus_decode", kk, tk)] = (lambda m=memb: focus_decode_attention(q, k, v, m, window))
        t0 = time.perf_counter()
        index = GroupIndex(memb[:, :-1])
        meta[("focus_decode_indexed", kk, tk)] = {"index_build_s": time.perf_counter() - t0}
        fns[("focus_decode_indexed", kk, tk)] = (lambda m=memb, ix=index: focus_decode_attention(
            q, k, v, m, window, group_index=ix.append(m[:, -1:])))
        resets[("focus_decode_indexed", kk, tk)] = (lambda ix=index: ix.crop(t - 1))
    out = []
    with torch.no_grad():
        first = {}
        for key, fn in fns.items():
            first[key] = fn()
            if key in resets:
                resets[key]()
        for regime, threshold in MALLOC_REGIMES:
            if not _set_mmap_threshold(threshold):
                regime = "default"
            times = {key: [] for key in fns}
            for key, fn in fns.items():  # one untimed call per function in this regime
                fn()
                if key in resets:
                    resets[key]()
            cpu = {key: [] for key in fns}
            for _ in range(repeats):
                for key, fn in fns.items():
                    c0 = time.thread_time()
                    times[key].append(_timed(fn)[1])
                    cpu[key].append(time.thread_time() - c0)
                    if key in resets:
                        resets[key]()
            base = statistics.median(times[("sdpa_cached", None, None)])
            cpu_base = statistics.median(cpu[("sdpa_cached", None, None)])
            for key, ts in times.items():
                med, cpu_med = statistics.median(ts), statistics.median(cpu[key])
                rec = {"backend": key[0], "K": key[1], "top_k": key[2], "malloc": regime, "median_s": med,
                       "times_s": ts, "ratio_vs_sdpa": base / med, "cpu_median_s": cpu_med, "cpu_times_s": cpu[key],
                       "cpu_ratio_vs_sdpa": cpu_base / cpu_med, "keys_attended": keys.get(key, t)}
                rec.update(meta.get(key, {}))
                if key[0] == "focus_decode_indexed":  # same answer as the scan path
                    rec["max_abs_diff_vs_scan"] = float(
                        (first[key] - first[("focus_decode", key[1], key[2])]).abs().max())
                out.append(rec)
            if regime == "default":
                break
    return {"T": t, "window": window, "repeats": repeats, "threads": torch.get_num_threads(),
            "malloc_regimes": {name: nbytes for name, nbytes in MALLOC_REGIMES},
            "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "results": out}


def run_decode_bench(out_dir, *, groups=(4, 8, 16), top_ks=(1, 2), window=128, heads=9, kv_heads=3, head_dim=64,
                     decode_len=32768, decode_repeats=20, seed=0, threads=None, command=None) -> dict:
    """Only the decode-step timing, merged into ``out_dir/bench.json`` (its prefill results and plot are kept, so
    a decode change does not need the hour-long prefill run again); returns the merged JSON dict."""
    from ..kernels.decode import focus_decode_attention

    configs = [(int(kk), int(tk)) for kk in groups for tk in top_ks if tk <= kk]
    if not configs or decode_len < 1:
        raise ValueError("decode-only needs decode_len >= 1 and one (groups, top_k) pair with top_k <= groups")
    if threads is not None:
        torch.set_num_threads(int(threads))
    out_dir = Path(out_dir)
    path = out_dir / "bench.json"
    doc = json.loads(path.read_text()) if path.exists() else None
    if doc is None or doc.get("schema") != SCHEMA:
        doc = {"schema": SCHEMA, "command": None, "config": {
                   "lengths": [], "groups": sorted({c[0] for c in configs}), "top_ks": sorted({c[1] for c in configs}),
                   "window": window, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim, "batch": 1,
                   "dtype": "float32", "repeats": 0, "seed": seed},
               "env": {"torch": torch.__version__, "python": platform.python_version(),
                       "platform": platform.platform(), "threads": torch.get_num_threads(),
                       "cpu_count": os.cpu_count(), "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
               "cost_model": COST_MODEL, "memory_method": MEMORY_METHOD, "results": []}
    dec = _decode_bench(decode_len, configs, window, heads, kv_heads, head_dim, decode_repeats, seed,
                        focus_decode_attention)
    dec["command"] = command
    doc["decode"] = dec
    doc["targets"] = evaluate_targets(doc)
    write_json(out_dir / "bench.json", doc)
    return doc


# ------------------------------------------------------------------------------------------------ targets
def _find(doc, backend, t, kk, tk):
    for r in doc["results"]:
        if r["backend"] == backend and r["T"] == t and r["K"] == kk and r["top_k"] == tk and r.get("error") is None:
            return r
    return None


def evaluate_targets(doc) -> dict:
    """The project's stated targets, evaluated from the measurements (None = not measured in this run)."""
    res = {}
    r = _find(doc, "decomposed", 32768, 8, 1)
    res["k8_top1_32k_speedup_vs_sdpa"] = None if r is None else r["ratio_vs_sdpa"]
    res["k8_top1_32k_at_least_5x"] = None if r is None else r["ratio_vs_sdpa"] >= 5.0
    slower = []
    compared = 0
    for d in doc["results"]:
        if d["backend"] != "decomposed" or d["T"] < 4096 or d.get("error"):
            continue
        f = _find(doc, "flex", d["T"], d["K"], d["top_k"])
        if f is None:
            continue
        compared += 1
        if d["median_s"] >= f["median_s"]:
            slower.append({"T": d["T"], "K": d["K"], "top_k": d["top_k"],
                           "decomposed_s": d["median_s"], "flex_s": f["median_s"]})
    res["faster_than_flex_all_T_ge_4k"] = None if compared == 0 else not slower
    res["not_faster_than_flex"] = slower
    # memory growth exponent: slope of log(peak) vs log(T) (1 = linear, 2 = quadratic)
    slopes = {}
    for backend in ("decomposed", "sdpa"):
        for kk, tk in {(d["K"], d["top_k"]) for d in doc["results"] if d["backend"] == backend}:
            pts = [(d["T"], d["peak_mem_bytes"]) for d in doc["results"]
                   if d["backend"] == backend and d["K"] == kk and d["top_k"] == tk and d.get("peak_mem_bytes")]
            if len(pts) >= 2:
                xs = [math.log(a) for a, _ in pts]
                ys = [math.log(b) for _, b in pts]
                mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
                den = sum((x - mx) ** 2 for x in xs)
                name = backend if kk is None else f"{backend}_K{kk}_top{tk}"
                slopes[name] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den if den else None
    res["memory_growth_exponent"] = slopes
    return res


# ------------------------------------------------------------------------------------------------ plot
def plot_bench(doc, path) -> None:
    """Speedup over full SDPA vs T, one panel per top-k, one colour per K; dashed = cost-model prediction."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    top_ks = doc["config"]["top_ks"]
    fig, axes = plt.subplots(1, len(top_ks), figsize=(5.5 * len(top_ks), 4.2), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, tk in zip(axes[0], top_ks):
        for ci, kk in enumerate(doc["config"]["groups"]):
            if tk > kk:
                continue
            c = colours[ci % len(colours)]
            for backend, style, label in (("decomposed", "o-", "decomposed"), ("flex", "s:", "flex")):
                pts = sorted((r["T"], r["ratio_vs_sdpa"], r["theoretical_ratio"]) for r in doc["results"]
                             if r["backend"] == backend and r["K"] == kk and r["top_k"] == tk and not r.get("error"))
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=c, label=f"{label} K={kk}")
                    if backend == "decomposed":
                        ax.plot([p[0] for p in pts], [p[2] for p in pts], "--", color=c, alpha=0.6,
                                label=f"theory K={kk}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("sequence length T")
        ax.set_ylabel("speedup vs full causal SDPA (x)")
        ax.set_title(f"top-{tk}, window {doc['config']['window']}")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Focus forward attention, CPU ({doc['env']['threads']} threads, torch {doc['env']['torch']})")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
