"""The picture a user decides from: quality (perplexity, long-range retrieval) against measured whole-model speed, for
every trained adapter, its top-k settings, the original model and the training-free baselines.

Inputs are the JSON written by ``focusattn long-eval`` (``long_eval*.json``) and ``focusattn bench-model``
(``model_bench*.json``); nothing is typed by hand. Speed is read at the longest length both measured.
"""
from __future__ import annotations

from pathlib import Path

from .._io import pyplot


def _adapter_name(doc: dict) -> str:
    """A shipped name as is; a folder by its name (a retrofit run's ``RUN/adapter`` by the run's name); ``+rebalance N``
    when the run served the adapter with online rebalancing."""
    p = Path(doc["adapter"])
    name = p.parent.name if p.name == "adapter" else p.name
    rb = (doc.get("focus_config") or {}).get("rebalance") or 0
    return f"{name} +rebalance {rb}" if rb else name


def pareto_rows(long_docs: list[dict], bench_docs: list[dict]) -> list[dict]:
    """One row per (adapter, variant): quality at every length plus speed-ups from the matching model bench."""
    speed = {}
    for b in bench_docs:
        t = max(r["T"] for r in b["results"])
        for r in b["results"]:
            if r["T"] == t:
                speed[(_adapter_name(b), r["variant"])] = (t, r["prefill_speedup"], r["decode_speedup"])
    merged: dict[tuple, dict] = {}  # (adapter, variant) -> row; several long-eval runs of one adapter merge by T
    for d in long_docs:
        name, k_groups = _adapter_name(d), d["focus_config"]["num_groups"]
        for r in d["results"]:
            v = r["variant"]
            key = ("—", v) if v == "original" else (name, v)
            row = merged.setdefault(key, {"adapter": key[0], "K": None if v == "original" else k_groups,
                                          "variant": v, "by_T": {}, "_name": name})
            row["by_T"].setdefault(r["T"], r)
    rows = sorted(merged.values(), key=lambda r: (r["variant"] != "original", r["adapter"]))
    for row in rows:
        sp = speed.get((row["_name"], row["variant"]))
        if row["variant"] == "original":  # the baseline of every bench run: 1x by definition, if any was run
            sp = next((v for (_, var), v in speed.items() if var == "original"), None)
        row["speed_T"], row["prefill_x"], row["decode_x"] = sp if sp else (None, None, None)
    return rows


def _f(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def render_pareto(long_docs: list[dict], bench_docs: list[dict], *, plot_link: str | None = None) -> str:
    rows = pareto_rows(long_docs, bench_docs)
    lengths = sorted({t for r in rows for t in r["by_T"]})
    ppl_t = sorted({t for r in rows for t, x in r["by_T"].items() if "ppl_domain" in x})
    base = next(r for r in rows if r["variant"] == "original")
    head = ["adapter", "variant"]
    for t in ppl_t:
        head += [f"ppl domain T={t}", f"ppl OOD T={t}"]
    rec_t = sorted({t for r in rows for t, x in r["by_T"].items() if "distant_dropped" in x})
    head += [f"distant attention dropped T={t}" for t in rec_t]
    head += [f"repeat-copy ppl T={t}" for t in lengths] + [f"passkey T={t}" for t in lengths]
    head += [f"pairs kept T={lengths[-1]}", "prefill ×", "decode ×"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["adapter"], r["variant"]]
        for t in ppl_t:
            for key in ("ppl_domain", "ppl_ood"):
                x, b = r["by_T"].get(t, {}).get(key), base["by_T"].get(t, {}).get(key)
                cells.append("—" if x is None else f"{x:.2f}" + ("" if r is base or b is None
                                                                 else f" ({100 * (x / b - 1):+.1f}%)"))
        for t in rec_t:
            dd = r["by_T"].get(t, {}).get("distant_dropped")
            cells.append("0%" if r["variant"] == "original" else "—" if not dd else
                         " / ".join(f"{100 * dd[s]:.0f}%" for s in ("domain", "ood") if s in dd))
        cells += [_f(r["by_T"].get(t, {}).get("repeat_ppl")) for t in lengths]
        cells += [_f((r["by_T"].get(t) or {}).get("passkey", {}).get("accuracy")) for t in lengths]
        kept = r["by_T"].get(lengths[-1], {}).get("budget_pairs_kept")
        cells.append("100%" if r["variant"] == "original" else ("—" if kept is None else f"{100 * kept:.0f}%"))
        cells += [("—" if r["prefill_x"] is None else f"{r['prefill_x']:.2f}×"),
                  ("—" if r["decode_x"] is None else f"{r['decode_x']:.2f}×")]
        lines.append("| " + " | ".join(cells) + " |")
    speed_t = sorted({r["speed_T"] for r in rows if r["speed_T"]})
    notes = [f"Speed-ups: whole model against the original in the same `bench-model` run at T={speed_t}; "
             "— = not measured. Passkey: accuracy over depths (teacher-forced greedy = what greedy decoding answers). Sliding, random "
             "and untrained rows keep the same share of causal pairs as the adapter's top-k at each length; k-means and oracle "
             "rows keep as many distant keys per query as the adapter's top-k (k-means: the matching share of its "
             "clusters). Distant attention dropped: the share of the original model's attention on keys beyond the "
             "window and sinks that the mask removes (domain / OOD, `long-eval --recall-windows`)."]
    cmds = [f"- `{d['command']}`" for d in long_docs + bench_docs if d.get("command")]
    out = "\n".join(lines + ["", *notes, "", "Commands:", "", *cmds])
    if plot_link:
        out += f"\n\n![pareto]({plot_link})"
    return out


def plot_pareto(long_docs: list[dict], bench_docs: list[dict], path) -> None:
    """Quality loss vs prefill speed-up: x = whole-model prefill speed-up, y = perplexity change (%) at the longest
    perplexity length; marker = adapter/variant."""
    rows = pareto_rows(long_docs, bench_docs)
    base = next(r for r in rows if r["variant"] == "original")
    ppl_t = max(t for t, x in base["by_T"].items() if "ppl_domain" in x)
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, title in ((axes[0], "ppl_domain", "in domain"), (axes[1], "ppl_ood", "out of domain")):
        for r in rows:
            x = r["prefill_x"] if r["prefill_x"] is not None else (1.0 if r is base else None)
            y = r["by_T"].get(ppl_t, {}).get(key)
            if x is None or y is None:
                continue
            y = 100 * (y / base["by_T"][ppl_t][key] - 1)
            ax.scatter([x], [y], s=40)
            ax.annotate(f"{r['adapter']} {r['variant']}" if r is not base else "original", (x, y), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel("whole-model prefill speed-up vs original")
        ax.set_ylabel(f"perplexity change at T={ppl_t} (%)")
        ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
