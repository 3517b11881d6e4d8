"""Decode-step benchmark: one query against a long cache, full SDPA vs Focus decode (scan and indexed)."""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from .._io import write_json
from ..kernels.decode import focus_decode_attention
from ..kernels.group_index import GroupIndex
from .common import COST_MODEL, MEMORY_METHOD, SCHEMA, env, random_membership, timed
from .memory import MALLOC_REGIMES, frozen_heap, set_mmap_threshold
from .targets import evaluate_targets


def decode_bench(t, configs, window, heads, kv_heads, head_dim, repeats, seed):
    """One decode step at context ``t``: cached full attention (SDPA, 1 query vs t keys) vs Focus decode, both
    ways of finding the query's keys: scanning all ``t`` keys' membership (``focus_decode``), and a
    :class:`GroupIndex` (``focus_decode_indexed``). The indexed step is timed as a generation loop runs it: append
    the new token's membership to an index of ``t - 1`` tokens, then attend; the index is cropped back untimed.
    Run once per allocator regime (:data:`MALLOC_REGIMES`), each with its own SDPA baseline. Besides wall time,
    the thread's CPU time is recorded: on a box shared with other jobs a step of a few ms is often preempted for a
    scheduler slice, which the wall-clock median then partly reflects, while CPU time does not."""
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
            if not set_mmap_threshold(threshold):
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
                    times[key].append(timed(fn)[1])
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


@frozen_heap
def run_decode_bench(out_dir, *, groups=(4, 8, 16), top_ks=(1, 2), window=128, heads=9, kv_heads=3, head_dim=64,
                     decode_len=32768, decode_repeats=20, seed=0, threads=None, command=None) -> dict:
    """Only the decode-step timing, merged into ``out_dir/bench.json`` (its prefill results and plot are kept, so
    a decode change does not need the hour-long prefill run again); returns the merged JSON dict."""
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
               "env": env(),
               "cost_model": COST_MODEL, "memory_method": MEMORY_METHOD, "results": []}
    dec = decode_bench(decode_len, configs, window, heads, kv_heads, head_dim, decode_repeats, seed)
    dec["command"] = command
    doc["decode"] = dec
    doc["targets"] = evaluate_targets(doc)
    write_json(out_dir / "bench.json", doc)
    return doc
