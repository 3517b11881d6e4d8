"""The project's stated kernel targets, evaluated from a ``bench.json`` dict."""
from __future__ import annotations

import math


def _find(doc, backend, t, kk, tk):
    for r in doc["results"]:
        if r["backend"] == backend and r["T"] == t and r["K"] == kk and r["top_k"] == tk and r.get("error") is None:
            return r
    return None


# (T, K, top-k) -> the speed-up over full causal SDPA the kernel issue asks for (one thread, float32)
SPEED_TARGETS = {(32768, 8, 1): 6.5, (32768, 8, 2): 1.6, (32768, 16, 2): 3.0}


# Why a target can be missed on this CPU, as profiled (shown under a target only when the JSON says it was missed).
CAUSES = {
    "speed": "the pair count is not the whole cost: each group's rows are gathered before the fused op runs and its "
             "output is put back, the window band computes BAND_BLOCK + w keys per query through a masked fused call "
             "where w are needed (the op copies the strided key windows), big parts run as tiles against key blocks "
             "(more, smaller calls), and top-k > 1 adds inclusion-exclusion's intersection parts and merges of "
             "overlapping rows (README: where the measured time goes)",
    "break_even": "at 2048 tokens a K=8 group holds ~256 tokens: the fused op's small-call regime (its cost per "
                  "pair at 256 rows is ~1.5-2x that at >= 1K rows, the floor SDPA's single call never enters), plus "
                  "a fixed cost per part (plan, gathers, puts) and the band's 64-row blocks; on a shared 2-core host "
                  "single runs also swing by up to ~2x (in-process A/Bs at 2048 read 0.88-1.10x)",
    "decode": "when a query's list holds a large share of the cache (top-2 of 8: about half), a step reads that "
              "share of K and V (gathered) or all of them (one masked pass): at best 1/share on paper",
    "memory": "SDPA's whole extra footprint is its output; the kernel adds the LSE, the largest whole part's (up to "
              "T/8 rows) or one tile's gathered queries, keys, values and fused-op output, and the band chunk's "
              "mask and key-window copies; at T <= 2K the fused op's small-call floor (256-row tiles) keeps these "
              "near half the output",
    "cost_model": "the model counts pairs at SDPA's cost per pair; the same-group calls run within ~3% of that "
                  "(profiled at 4K rows vs 32K), but the kernel also does O(T) and O(T w) work the model leaves "
                  "out: per-part dispatch, row gathers and puts, and the window band (masked fused calls on 64-row "
                  "blocks, BAND_BLOCK + w keys per query where w are needed, at about twice the per-pair cost); "
                  "dispatch dominates at T <= 16K, the band and gathers at 32K-64K (shares of the limit 49-69% there)",
}


def _speed_targets(doc) -> list[dict]:
    out = []
    for (t, kk, tk), target in SPEED_TARGETS.items():
        r = _find(doc, "decomposed", t, kk, tk)
        if r is None:
            continue
        cpu = r.get("cpu_ratio_vs_sdpa")
        out.append({"T": t, "K": kk, "top_k": tk, "target": target, "measured": r["ratio_vs_sdpa"], "cpu": cpu,
                    "met": r["ratio_vs_sdpa"] >= target and (cpu is None or cpu >= target),
                    "theoretical": r.get("theoretical_ratio")})
    return out


def _decode_targets(doc) -> tuple[bool | None, list[dict]]:
    """A decode step with K >= 8 (read through the index) faster than cached SDPA in every malloc regime, by CPU
    time (and wall time)."""
    dec = doc.get("decode") or {}
    rows = [r for r in dec.get("results", []) if r["backend"] == "focus_decode_indexed" and (r["K"] or 0) >= 8]
    if not rows:
        return None, []
    slow = [{"malloc": r.get("malloc"), "K": r["K"], "top_k": r["top_k"], "cpu_speedup": r.get("cpu_ratio_vs_sdpa"),
             "speedup": r["ratio_vs_sdpa"]} for r in rows
            if min(r["ratio_vs_sdpa"], r.get("cpu_ratio_vs_sdpa") or r["ratio_vs_sdpa"]) <= 1.0]
    return not slow, slow


def evaluate_targets(doc) -> dict:
    """The project's stated targets, evaluated from the measurements (None = not measured in this run)."""
    res = {}
    res["speed_targets"] = _speed_targets(doc)
    res["decode_k8_plus_faster_everywhere"], res["decode_not_faster"] = _decode_targets(doc)
    r2k = _find(doc, "decomposed", 2048, 8, 1)
    res["k8_top1_2k_speedup_vs_sdpa"] = None if r2k is None else r2k["ratio_vs_sdpa"]
    res["k8_top1_2k_breaks_even"] = None if r2k is None else r2k["ratio_vs_sdpa"] >= 1.0
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
    # peak memory vs SDPA's at the same T (forward, and forward + backward when measured): target <= 1.5x
    sdpa = {d["T"]: d for d in doc["results"] if d["backend"] == "sdpa"}
    for field, name in (("peak_mem_bytes", "memory_fwd"), ("peak_mem_fwd_bwd_bytes", "memory_fwd_bwd")):
        ratios = [d[field] / sdpa[d["T"]][field] for d in doc["results"]
                  if d["backend"] == "decomposed" and d.get(field) and sdpa.get(d["T"], {}).get(field)]
        res[f"{name}_max_ratio_vs_sdpa"] = max(ratios) if ratios else None
        res[f"{name}_at_most_1_5x_sdpa"] = (max(ratios) <= 1.5) if ratios else None
    # the cost model predicts the time within 15%: measured speed-up / theoretical one in [0.85, 1.15] (CPU time)
    shares = [d for d in doc["results"] if d["backend"] == "decomposed" and d.get("cpu_share_of_limit")]
    res["cost_model_within_15pct"] = (all(0.85 <= d["cpu_share_of_limit"] <= 1.15 for d in shares)
                                      if shares else None)
    res["cost_model_outside_15pct"] = [{"T": d["T"], "K": d["K"], "top_k": d["top_k"],
                                        "cpu_share_of_limit": d["cpu_share_of_limit"]}
                                       for d in shares if not 0.85 <= d["cpu_share_of_limit"] <= 1.15]
    return res
