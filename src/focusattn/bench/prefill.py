"""Kernel benchmark, prefill: Focus forward attention (decomposed, flex, dense) against full causal SDPA.

Method, chosen so the numbers mean something on a shared CPU box:

* every compared function for one length runs in the same process, *alternating* (round-robin over repeats), so
  load changes hit all of them alike; we report medians and each function's ratio to full SDPA from the same run;
* shapes are SmolLM2-135M's attention (9 query heads, 3 KV heads, D = 64), batch 1, float32;
* routing (``routing``): ``random`` top-k over K groups (balanced in expectation), ``zipf`` (imbalanced: group
  probabilities ``∝ 1/(g+1)^s``, one giant group), or ``captured`` (the membership a trained adapter learned on real
  text, read from ``routing_file``, the most imbalanced layer unless ``routing_layer`` is given); window ``w``;
* time is wall clock and, with it, the thread's CPU time (``cpu_*`` fields): at one thread on a shared machine the
  CPU time is the kernel's own work, the wall time adds whatever preemption happened to hit it;
* peak memory is measured once per function (on its first timed repeat) as the rise of the process's peak resident
  set size (``VmHWM``, reset through ``/proc/self/clear_refs``) above the resident size just before the call, with
  glibc's mmap threshold pinned to 128 KiB and ``malloc_trim`` first so freed blocks return to the OS. It counts the
  output and every temporary (the inputs already exist), on Linux only (``None`` elsewhere);
* theoretical ratio (cost model, in attended pairs): full causal attention costs ``T(T+1)/2``; the decomposed
  kernel costs ``sum_g n_g(n_g+1)/2`` for the same-group part (``n_g`` = measured group sizes; ``≈ k^2/K`` of full
  for balanced top-k groups, pairs sharing several groups being computed in each but counted once) plus ``T·w``
  for the window part, so ``ratio = T(T+1)/2 / (sum_g n_g(n_g+1)/2 + T·w)`` ≈ ``1 / (k^2/K + 2w/T)``;
  ``share_of_limit`` = measured ratio / theoretical ratio (1 = the cost model predicts the time exactly);
  ``work_ratio`` counts what the kernel really computes (inclusion–exclusion's intersections, the band's
  ``T (C + w)``);
* ``memory_backward``: peak memory of forward + backward as well (``peak_mem_fwd_bwd_bytes``, one call each,
  upstream gradient and inputs allocated before).
"""
from __future__ import annotations

import gc
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .._io import write_json
from ..kernels.decomposed import decomposed_focus_attention
from ..kernels.flex import flex_focus_attention, focus_block_mask
from ..kernels.reference import dense_focus_attention
from .common import (COST_MODEL, MEMORY_METHOD, ROUTINGS, SCHEMA, captured_membership, env, load_captured,
                     random_membership, theoretical_ratio, timed_cpu, work_ratio, worst_layer, zipf_membership)
from .decode import decode_bench
from .memory import PeakRSS, frozen_heap
from .report import plot_bench
from .targets import evaluate_targets


def _raise_recompile_limit():
    """Each (K, top-k) block mask comes with a new mask_mod closure; dynamo must not fall back to eager after the
    default 8 recompiles (eager flex materialises T x T scores and would distort or OOM the run)."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))


def _fwd_bwd_memory(probe, q, k, v, membs, window) -> dict:
    """Peak-RSS rise of one forward + backward per function (leaf copies of q/k/v and the upstream gradient exist
    before; the ``.grad`` tensors are part of what is measured, as they are for SDPA)."""
    go = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    fns = {("sdpa", None, None): lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True,
                                                                               enable_gqa=True)}
    for (kk, tk), m in membs.items():
        fns[("decomposed", kk, tk)] = lambda a, b, c, m=m: decomposed_focus_attention(a, b, c, m, window)
    res = {}
    for key, fn in fns.items():
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v)]

        def step(fn=fn, leaves=leaves):
            fn(*leaves).backward(go)

        step()  # first call allocates once-only state
        for x in leaves:
            x.grad = None
        res[key] = probe.measure(step)[1]
        del leaves
    return res


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@frozen_heap
def run_kernel_bench(out_dir, *, lengths=(1024, 4096, 16384, 32768, 65536), groups=(4, 8, 16), top_ks=(1, 2),
                     window=128, heads=9, kv_heads=3, head_dim=64, repeats=3, quick=False, dense_max_len=4096,
                     flex=True, flex_groups=None, flex_compile=True, decode_len=32768, decode_repeats=20, seed=0,
                     threads=None, command=None, progress=True, routing="random", zipf_s=1.0, routing_file=None,
                     routing_layer=None, memory_backward=False, dtype="float32") -> dict:
    """Time forward attention and write ``bench.json`` + ``bench.png`` into ``out_dir``; returns the JSON dict.

    ``quick``: tiny lengths, 2 repeats, eager flex (no compile), small decode — a smoke run for tests and CI.
    ``flex_groups``: run flex only for these K (compiled flex costs about full attention here, as random routing
    leaves no 128x128 block empty, so it dominates the wall clock); None = every K.
    ``dtype``: ``"float32"``, ``"bfloat16"`` or ``"float16"`` inputs (every backend gets the same tensors; the
    decomposed engine accumulates in float32 and the max-abs-diff column compares it with the dense reference run
    in that dtype).
    ``threads``: torch intra-op threads for the run (None = leave as is). On a machine shared with other jobs use 1:
    with more OpenMP threads than free cores every parallel op can stall for a scheduler slice, which penalises
    kernels made of many ops far more than one big fused call.
    """
    from tqdm.auto import tqdm

    if quick:
        lengths, groups, top_ks = tuple(x for x in lengths if x <= 512) or (256, 512), tuple(groups)[:2], top_ks
        repeats, flex_compile, decode_len, decode_repeats = 2, False, min(decode_len, 1024), 5
    lengths = tuple(sorted(set(int(x) for x in lengths)))
    configs = [(int(kk), int(tk)) for kk in groups for tk in top_ks if tk <= kk]
    if not lengths or not configs:
        raise ValueError("need at least one length and one (groups, top_k) pair with top_k <= groups")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
    tdtype = DTYPES[dtype]
    if routing not in ROUTINGS:
        raise ValueError(f"routing must be one of {ROUTINGS}, got {routing!r}")
    captured, capture_meta = None, None
    if routing == "captured":
        if routing_file is None:
            raise ValueError("routing='captured' needs routing_file (made by scripts/capture_routing.py)")
        captured, capture_meta = load_captured(routing_file)
        kc = int(capture_meta.get("num_groups", 0))
        if any(kk != kc for kk, _ in configs) or lengths[-1] > captured.shape[1]:
            raise ValueError(f"routing_file holds K={kc} groups over {captured.shape[1]} tokens: groups must be "
                             f"({kc},) and lengths <= {captured.shape[1]}")
        if routing_layer is not None and not 0 <= routing_layer < captured.shape[0]:
            raise ValueError(f"routing_layer must be in [0, {captured.shape[0]}), got {routing_layer}")

    def membership_for(t, kk, tk):
        if routing == "zipf":
            return zipf_membership(t, kk, tk, seed + 1000 * kk + tk, zipf_s)
        if routing == "captured":
            layer = worst_layer(captured, t, kk) if routing_layer is None else routing_layer
            return captured_membership(captured, t, kk, tk, layer), layer
        return random_membership(t, kk, tk, seed + 1000 * kk + tk)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if threads is not None:
        torch.set_num_threads(int(threads))
    if flex and flex_compile:
        _raise_recompile_limit()
    probe = PeakRSS()
    gen = torch.Generator().manual_seed(seed)
    results = []

    # warm the fused SDPA/flash ops once on a small shape, so no length pays one-time initialisation
    wq = torch.randn(1, heads, 128, head_dim).to(tdtype)
    wk = torch.randn(1, kv_heads, 128, head_dim).to(tdtype)
    with torch.no_grad():
        F.scaled_dot_product_attention(wq, wk, wk, is_causal=True, enable_gqa=True)
        decomposed_focus_attention(wq, wk, wk, random_membership(128, 2, 1, seed), 8)

    bar = tqdm(total=len(lengths) * (repeats + 1) + 1, desc="kernel bench", disable=not progress)
    for t in lengths:
        q = torch.randn(1, heads, t, head_dim, generator=gen).to(tdtype)
        k = torch.randn(1, kv_heads, t, head_dim, generator=gen).to(tdtype)
        v = torch.randn(1, kv_heads, t, head_dim, generator=gen).to(tdtype)
        fns, meta, membs = {}, {}, {}
        fns[("sdpa", None, None)] = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        for kk, tk in configs:
            memb, layer = membership_for(t, kk, tk) if routing == "captured" else (membership_for(t, kk, tk), None)
            membs[(kk, tk)] = memb
            theo = theoretical_ratio(memb, window)
            fns[("decomposed", kk, tk)] = (lambda m=memb: decomposed_focus_attention(q, k, v, m, window))
            sizes = memb[0].sum(0)
            meta[("decomposed", kk, tk)] = {"theoretical_ratio": theo, "work_ratio": work_ratio(memb, window),
                                            "largest_group_share": float(sizes.max()) / t,
                                            **({} if layer is None else {"routing_layer": layer})}
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
        cpu = {key: [] for key in fns}
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
                cpu.pop(key)
            for r in range(repeats):
                for key, fn in fns.items():
                    if r == 0:
                        (out, dt, ct), peak = probe.measure(lambda f=fn: timed_cpu(f))
                        mem[key] = peak
                        if key[0] in ("decomposed", "dense"):
                            outputs[key] = out
                        del out
                    else:
                        _, dt, ct = timed_cpu(fn)
                    times[key].append(dt)
                    cpu[key].append(ct)
                bar.update(1)
        mem_fb = _fwd_bwd_memory(probe, q, k, v, membs, window) if memory_backward else {}
        sdpa_median = statistics.median(times[("sdpa", None, None)])
        sdpa_cpu = statistics.median(cpu[("sdpa", None, None)])
        for key in list(times) + list(errors):
            backend, kk, tk = key
            rec = {"T": t, "backend": backend, "K": kk, "top_k": tk, "window": window}
            if key in errors:
                rec.update(error=errors[key], median_s=None, times_s=[], ratio_vs_sdpa=None, peak_mem_bytes=None)
            else:
                med, cmed = statistics.median(times[key]), statistics.median(cpu[key])
                rec.update(median_s=med, times_s=times[key], ratio_vs_sdpa=sdpa_median / med,
                           cpu_median_s=cmed, cpu_times_s=cpu[key], cpu_ratio_vs_sdpa=sdpa_cpu / cmed,
                           peak_mem_bytes=mem.get(key), peak_mem_fwd_bwd_bytes=mem_fb.get(key), error=None)
            rec.update(meta.get(key, {}))
            if rec.get("theoretical_ratio") and rec.get("ratio_vs_sdpa"):
                rec["share_of_limit"] = rec["ratio_vs_sdpa"] / rec["theoretical_ratio"]
                rec["cpu_share_of_limit"] = rec["cpu_ratio_vs_sdpa"] / rec["theoretical_ratio"]
            if backend == "decomposed" and key in outputs:
                for ref_name in ("dense", "flex"):
                    ref = outputs.get((ref_name, kk, tk))
                    if ref is not None:
                        rec["max_abs_diff"] = float((outputs[key].float() - ref.float()).abs().max())
                        rec["diff_reference"] = ref_name
                        break
            results.append(rec)
        del q, k, v, outputs, fns
        gc.collect()

    decode = decode_bench(decode_len, configs, window, heads, kv_heads, head_dim, decode_repeats,
                          seed) if decode_len else None
    bar.update(1)
    bar.close()

    doc = {
        "schema": SCHEMA,
        "command": command,
        "config": {"lengths": list(lengths), "groups": sorted({c[0] for c in configs}),
                   "top_ks": sorted({c[1] for c in configs}), "window": window, "heads": heads,
                   "kv_heads": kv_heads, "head_dim": head_dim, "batch": 1, "dtype": dtype, "repeats": repeats,
                   "quick": quick, "dense_max_len": dense_max_len, "flex": flex,
                   "flex_groups": None if flex_groups is None else sorted(flex_groups),
                   "flex_mode": ("compiled" if flex_compile else "eager") if flex else None, "seed": seed,
                   "routing": routing, "zipf_s": zipf_s if routing == "zipf" else None,
                   "routing_file": None if routing_file is None else str(routing_file),
                   "routing_capture": capture_meta, "routing_layer": routing_layer,
                   "memory_backward": memory_backward},
        "env": env(),
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
