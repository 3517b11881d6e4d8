"""Markdown for RESULTS.md and the speed-up plot from a ``bench.json`` dict: every number is read from the JSON, none
typed by hand. matplotlib is imported only when a plot is drawn."""
from __future__ import annotations

from .._io import atomic_path, pyplot
from .targets import CAUSES, evaluate_targets


def _ms(seconds):
    if seconds is None:
        return "—"
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def _x(x):
    return "—" if x is None else f"{x:.2f}×"


def _mib(b):
    return "—" if b is None else f"{b / 2**20:.0f}"


def _yes(v):
    return "not measured" if v is None else ("yes" if v else "**no**")


def _pct(x):
    return "—" if x is None else f"{100 * x:.0f}%"


def _rel(a, b):
    return "—" if not a or not b else f"{a / b:.2f}"


def _routing(cfg):
    r = cfg.get("routing", "random")
    if r == "zipf":
        return f"Zipf-imbalanced top-k routing (s = {cfg.get('zipf_s')})"
    if r == "captured":
        cap = cfg.get("routing_capture") or {}
        return (f"routing captured from adapter {cap.get('adapter', '?')} on {cap.get('data', '?')} "
                + ("(most imbalanced layer)" if cfg.get("routing_layer") is None else f"(layer {cfg['routing_layer']})"))
    return "random top-k routing"


def render_markdown(doc: dict, *, plot_link: str = "bench.png") -> str:
    cfg, env = doc["config"], doc["env"]
    rows = doc["results"]
    by = {(r["backend"], r["T"], r["K"], r["top_k"]): r for r in rows}
    sdpa = {r["T"]: r for r in rows if r["backend"] == "sdpa"}
    dense = {r["T"]: r for r in rows if r["backend"] == "dense"}
    lines = [
        "### Kernel benchmark (forward attention, CPU)",
        "",
        f"SmolLM2-135M attention shapes: {cfg['heads']} query heads, {cfg['kv_heads']} KV heads, "
        f"D={cfg['head_dim']}, batch {cfg['batch']}, {cfg['dtype']}, window {cfg['window']}, {_routing(cfg)}. "
        f"torch {env['torch']}, {env['threads']} threads, {env['platform']}, {env['time_utc']}. "
        f"Median of {cfg['repeats']} alternating repeats; speedup = full causal SDPA time / backend time in the same "
        f"run (CPU speedup: the same from the thread's CPU time; share = CPU speedup / theory, i.e. how much of "
        f"the cost model's limit is reached). Mem ×: peak memory / SDPA's, forward (and forward + backward). "
        f"Flex: {cfg.get('flex_mode')}.",
        "",
        f"Command: `{doc.get('command') or 'run_kernel_bench(...)'}`",
        "",
    ]
    if rows:
        lines += ["| T | K | top-k | SDPA ms | decomposed ms | speedup | theory | flex ms | flex speedup | "
                  "dense ms | mem decomposed MiB | mem SDPA MiB | max abs diff | CPU speedup | share | mem × | "
                  "fwd+bwd mem × |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for t in cfg["lengths"]:
        for kk in cfg["groups"]:
            for tk in cfg["top_ks"]:
                d = by.get(("decomposed", t, kk, tk))
                if d is None:
                    continue
                f = by.get(("flex", t, kk, tk))
                s = sdpa.get(t, {})
                dn = dense.get(t)
                diff = "—" if d.get("max_abs_diff") is None else f"{d['max_abs_diff']:.1e} ({d['diff_reference']})"
                lines.append(
                    f"| {t} | {kk} | {tk} | {_ms(s.get('median_s'))} | {_ms(d['median_s'])} | "
                    f"{_x(d['ratio_vs_sdpa'])} | {_x(d.get('theoretical_ratio'))} | "
                    f"{_ms(f['median_s']) if f else '—'} | {_x(f['ratio_vs_sdpa']) if f else '—'} | "
                    f"{_ms(dn['median_s']) if dn else '—'} | {_mib(d.get('peak_mem_bytes'))} | "
                    f"{_mib(s.get('peak_mem_bytes'))} | {diff} | {_x(d.get('cpu_ratio_vs_sdpa'))} | "
                    f"{_pct(d.get('cpu_share_of_limit'))} | {_rel(d.get('peak_mem_bytes'), s.get('peak_mem_bytes'))} | "
                    f"{_rel(d.get('peak_mem_fwd_bwd_bytes'), s.get('peak_mem_fwd_bwd_bytes'))} |")
    dec = doc.get("decode")
    if dec:
        when = "".join(f", {k} {dec[v]}" for k, v in (("threads", "threads"), ("at", "time_utc")) if dec.get(v))
        lines += ["", f"Decode step at T={dec['T']} (one query, cached K/V, window {dec['window']}; median of "
                      f"{dec['repeats']} alternating repeats{when}). `focus_decode` finds the query's keys by "
                      "scanning all T keys' membership; `focus_decode_indexed` reads them from a `GroupIndex` "
                      "(timed step = append the new token + attend). `malloc`: glibc mmap threshold during the timing, "
                      "`heap` = 32 MiB (temporaries reused, the steady state of a long-running process), `mmap` = "
                      "128 KiB (every temporary >= 128 KiB is fresh zeroed pages, as in the prefill run). CPU ms = the "
                      "thread's CPU time, unaffected by preemption on a shared machine:", ""]
        if dec.get("command"):
            lines += [f"Command: `{dec['command']}`", ""]
        lines += ["| malloc | backend | K | top-k | keys attended | wall ms | speedup vs SDPA | CPU ms | "
                  "CPU speedup | max abs diff vs scan |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in dec["results"]:
            diff = r.get("max_abs_diff_vs_scan")
            cpu = r.get("cpu_median_s")
            lines.append(f"| {r.get('malloc', '—')} | {r['backend']} | {r['K'] or '—'} | {r['top_k'] or '—'} | "
                         f"{r['keys_attended']} | {r['median_s'] * 1e3:.2f} | {_x(r['ratio_vs_sdpa'])} | "
                         f"{'—' if cpu is None else f'{cpu * 1e3:.2f}'} | {_x(r.get('cpu_ratio_vs_sdpa'))} | "
                         f"{'—' if diff is None else f'{diff:.1e}'} |")
    tg = evaluate_targets(doc)  # re-evaluated from the results, so every JSON is read against today's targets
    lines += ["", "Targets (evaluated from the JSON):", "",
              f"- K=8 top-1 at T=32K ≥ 5× full SDPA: {_yes(tg.get('k8_top1_32k_at_least_5x'))} "
              f"(measured {_x(tg.get('k8_top1_32k_speedup_vs_sdpa'))})"]
    for st in tg.get("speed_targets", []):  # the kernel issue's targets: wall and CPU time must both reach them
        lines.append(f"- K={st['K']} top-{st['top_k']} at T={st['T'] // 1024}K ≥ {st['target']:g}×: {_yes(st['met'])} "
                     f"(wall {_x(st['measured'])}, CPU {_x(st['cpu'])}; cost model {_x(st['theoretical'])})")
    if any(not st["met"] for st in tg.get("speed_targets", [])):
        lines.append(f"  - why: {CAUSES['speed']}")
    if tg.get("k8_top1_2k_breaks_even") is not None:
        lines.append(f"- K=8 top-1 breaks even with SDPA at T=2048: {_yes(tg['k8_top1_2k_breaks_even'])} "
                     f"(measured {_x(tg['k8_top1_2k_speedup_vs_sdpa'])})")
        if not tg["k8_top1_2k_breaks_even"]:
            lines.append(f"  - why: {CAUSES['break_even']}")
    if tg.get("decode_k8_plus_faster_everywhere") is not None:
        slow = tg.get("decode_not_faster") or []
        lines.append("- decode step with K ≥ 8 faster than cached SDPA in every malloc regime: "
                     f"{_yes(tg['decode_k8_plus_faster_everywhere'])}" + (" (not: " + ", ".join(
                         f"{d['malloc']} K={d['K']} top-{d['top_k']} {_x(d['speedup'])} wall / "
                         f"{_x(d['cpu_speedup'])} CPU" for d in slow) + ")" if slow else ""))
        if slow:
            lines.append(f"  - why: {CAUSES['decode']}")
    lines.append(f"- decomposed faster than flex at every T ≥ 4K: {_yes(tg.get('faster_than_flex_all_T_ge_4k'))}")
    for s in tg.get("not_faster_than_flex", []):
        lines.append(f"  - not faster at T={s['T']} K={s['K']} top-{s['top_k']}: "
                     f"{_ms(s['decomposed_s'])} ms vs flex {_ms(s['flex_s'])} ms")
    for name, label in (("memory_fwd", "forward"), ("memory_fwd_bwd", "forward + backward")):
        if tg.get(f"{name}_max_ratio_vs_sdpa") is not None:
            lines.append(f"- peak memory ({label}) ≤ 1.5× SDPA's at every T: {_yes(tg[f'{name}_at_most_1_5x_sdpa'])} "
                         f"(largest {tg[f'{name}_max_ratio_vs_sdpa']:.2f}×)")
            if not tg[f"{name}_at_most_1_5x_sdpa"]:
                lines.append(f"  - why: {CAUSES['memory']}")
    if tg.get("cost_model_within_15pct") is not None:
        out = tg.get("cost_model_outside_15pct") or []
        lines.append(f"- cost model predicts the CPU time within 15%: {_yes(tg['cost_model_within_15pct'])}"
                     + (" (outside: " + ", ".join(f"T={d['T']} K={d['K']} top-{d['top_k']} "
                                                   f"{_pct(d['cpu_share_of_limit'])}" for d in out) + ")"
                        if out else ""))
        if out:
            lines.append(f"  - why: {CAUSES['cost_model']}")
    exps = tg.get("memory_growth_exponent") or {}
    if exps:
        lines.append("- peak-memory growth exponent in T (1 = linear): " + ", ".join(
            f"{k} {v:.2f}" for k, v in sorted(exps.items()) if v is not None))
    errs = [r for r in rows if r.get("error")]
    for r in errs:
        lines.append(f"- {r['backend']} failed at T={r['T']} K={r['K']} top-{r['top_k']}: {r['error']}")
    lines += ["", f"Cost model: {doc['cost_model']}.", "", f"Memory: {doc['memory_method']}.", "",
              f"![speedup vs T]({plot_link})", ""]
    return "\n".join(lines)


def plot_bench(doc, path) -> None:
    """Speedup over full SDPA vs T, one panel per top-k, one colour per K; dashed = cost-model prediction."""
    plt = pyplot()

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


def _pct(x) -> str:
    return "—" if x is None else f"{x:.0%}"


def render_model_markdown(doc: dict, *, plot_link: str = "model_bench.png") -> str:
    """The whole-model benchmark (``model_bench.json``) as a table; ratios are to the original model, same run."""
    cfg = doc["focus_config"]
    lines = [
        f"Model `{doc['model']}` + adapter `{doc['adapter']}` (K={cfg['num_groups']}, w={cfg['window']}, "
        f"sinks={cfg['sink_tokens']}), held-out `{doc['data']}` text, {doc['threads']} thread(s), median of "
        f"{doc['repeats']} alternating repeats; decode = one new token at context T (median of "
        f"{doc['decode_tokens']} steps); CPU: {doc.get('cpu') or 'not recorded (before 2026-12-06)'}.",
        "",
        "| T | variant | prefill s | × | decode ms/token | × | attention share (prefill) | attention × | "
        "attention share (decode) | peak MiB | largest group (max over layers) | group cost / balanced (max) | "
        "cost-model × | kernel real/random speed | prefill CPU × | decode CPU × |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["results"]:
        rt, kn = r.get("routing") or {}, r.get("kernel") or {}
        share = f"{rt['max_largest_share']:.2f}" if rt else "—"
        cost = f"{rt['max_group_cost_vs_balanced']:.2f}" if rt else "—"
        model_x = _x(rt.get("mean_cost_model_ratio"))
        real = f"{kn['real_over_random_speed']:.2f}" if kn else "—"
        lines.append(
            f"| {r['T']} | {r['variant']} | {r['prefill_s']:.2f} | {_x(r['prefill_speedup'])} | {_ms(r['decode_s'])} | "
            f"{_x(r['decode_speedup'])} | {r['attention_share']:.0%} | {_x(r['attention_speedup'])} | "
            f"{_pct(r.get('decode_attention_share'))} | {_mib(r['peak_bytes'])} | {share} | {cost} | {model_x} | "
            f"{real} | {_x(r.get('prefill_cpu_speedup'))} | {_x(r.get('decode_cpu_speedup'))} |")
    lines += ["", "CPU ×: the same ratios from process CPU time (robust to other jobs on the machine; with one thread "
              "it is the work's own time).", "", f"Command: `{doc['command']}`", "", f"![model bench]({plot_link})"]
    return "\n".join(lines)


def plot_model_bench(doc: dict, path) -> None:
    from pathlib import Path

    plt = pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    variants = [v for v in dict.fromkeys(r["variant"] for r in doc["results"]) if v != "original"]
    for v in variants:
        rows = [r for r in doc["results"] if r["variant"] == v]
        ts = [r["T"] for r in rows]
        axes[0].plot(ts, [r["prefill_speedup"] for r in rows], "o-", label=v)
        axes[1].plot(ts, [r["decode_speedup"] for r in rows], "o-", label=v)
    for ax, title in zip(axes, ("prefill speed-up vs original", "decode-step speed-up vs original")):
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context T (tokens)")
        ax.set_title(title)
        ax.legend()
    fig.suptitle(f"{doc['model']} + {Path(doc['adapter']).name}: whole model, learned routing")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
