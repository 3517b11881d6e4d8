"""The picture a user decides from: quality (perplexity, long-range retrieval) against measured whole-model speed, for
every trained adapter, its top-k settings, the original model and the training-free baselines.

Inputs are the JSON written by ``focusattn long-eval`` (``long_eval*.json``) and ``focusattn bench-model``
(``model_bench*.json``); nothing is typed by hand. Speed is read at the longest length a bench measured.
``render_decision_table`` is README's compact table (the shipped adapters and the baselines at their budget),
``render_pareto`` the full one in RESULTS (every adapter, length and command), ``plot_pareto`` the picture of the former.
"""
from __future__ import annotations

import functools
from pathlib import Path

from .._io import pyplot


def _adapter_name(doc: dict) -> str:
    """One name per adapter configuration: a shipped adapter by its name, a run's adapter by its folder as recorded
    (``runs/e2e/k16``: a retrofit run's ``RUN/adapter`` by the run folder; an absolute path by the folder's name), and
    ``+rebalance N`` when the command served it with a rebalancing interval of its own (``--rebalance``), and
    ``+warm`` when it served warm-started rebalancing the adapter was not saved with (``--rebalance-warm``),
    ``+cap C`` when it served a group-size cap of its own (``--capacity``), ``+window W`` a local window of its own
    (``--window``), ``+budget B`` a key-space budget of its own (``--budget``), ``+means`` groups scored by their keys'
    running means (``--key-scores means``), ``+rank B`` rankings shared per block (``--rank-block``), ``+own M``
    a query's own best groups first (``--rank-own``), ``+union B`` queries keeping their block's groups
    (``--union-block``), ``+min N`` a floor under the budget (``--min-keys``), and ``+N dense heads`` when it
    served dense heads of its own (``--dense-heads``)."""
    p = Path(doc["adapter"])
    p = p.parent if p.name == "adapter" else p
    name = p.name if p.is_absolute() else p.as_posix()
    cfg, cmd = doc.get("focus_config") or {}, (doc.get("command") or "").split()
    rb = cfg.get("rebalance") or 0
    name = f"{name} +rebalance {rb}" if rb and "--rebalance" in cmd else name
    name = f"{name} +warm" if cfg.get("rebalance_warm") and "--rebalance-warm" in cmd else name
    name = f"{name} +cap {cfg['capacity']:g}" if cfg.get("capacity") and "--capacity" in cmd else name
    name = f"{name} +window {cfg['window']}" if "--window" in cmd else name
    name = f"{name} +budget {cfg['budget']:g}" if "--budget" in cmd else name
    name = f"{name} +means" if cfg.get("key_scores") == "means" and "--key-scores" in cmd else name
    name = f"{name} +rank {cfg['rank_block']}" if cfg.get("rank_block") and "--rank-block" in cmd else name
    name = f"{name} +own {cfg['rank_own']}" if cfg.get("rank_own") and "--rank-own" in cmd else name
    name = f"{name} +union {cfg['union_block']}" if cfg.get("union_block") and "--union-block" in cmd else name
    name = f"{name} +min {cfg['min_keys']}" if cfg.get("min_keys") and "--min-keys" in cmd else name
    heads = cfg.get("dense_heads") or ()
    if "--dense-heads" not in cmd:
        return name
    return f"{name} +{len(heads)} dense heads{_heads_changed(doc['adapter'], heads)}"  # "+0": served without


@functools.lru_cache(maxsize=None)
def _shipped_dense_heads(adapter: str) -> frozenset | None:
    """A shipped adapter's own dense heads (read once: every row of every table names its adapter); None for others."""
    from ..adapters import HERE, shipped
    from ..hf.io import read_adapter_config

    if adapter not in shipped():
        return None
    return frozenset(tuple(h) for h in read_adapter_config(HERE / adapter)["focus_config"].get("dense_heads") or ())


def _heads_changed(adapter: str, heads) -> str:
    """`` (+19:1 -20:2)``: the dense heads a run served beside (``+``) or instead of (``-``) a shipped adapter's own,
    so runs serving as many dense heads but other ones are other rows; empty for other adapters, no change, or where
    the adapter or the run has none (the count says it all)."""
    own = _shipped_dense_heads(adapter)
    if own is None:
        return ""
    served = {tuple(h) for h in heads}
    if not own or not served:
        return ""
    diff = [f"+{a}:{b}" for a, b in sorted(served - own)] + [f"-{a}:{b}" for a, b in sorted(own - served)]
    return f" ({' '.join(diff)})" if diff else ""


def pareto_rows(long_docs: list[dict], bench_docs: list[dict]) -> list[dict]:
    """One row per (adapter, variant): quality at every length plus speed-ups from the matching model bench."""
    speed = {}
    for b in bench_docs:
        t = max(r["T"] for r in b["results"])
        for r in b["results"]:
            if r["T"] == t:
                speed[(_adapter_name(b), r["variant"])] = (t, r["prefill_speedup"], r["decode_speedup"])
    merged: dict[tuple, dict] = {}  # (adapter, variant) -> row; several long-eval runs of one adapter merge by T
    named: dict[tuple, dict] = {}  # (adapter, T) -> the original's measures from that adapter's runs, first kept
    for d in long_docs:
        for r in d["results"]:
            if r["variant"] == "original":
                key = (_adapter_name(d), r["T"])
                named[key] = {**r, **named.get(key, {})}
    for d in long_docs:
        name, k_groups = _adapter_name(d), d["focus_config"]["num_groups"]
        origs = {r["T"]: r for r in d["results"] if r["variant"] == "original"}
        for r in d["results"]:
            v = r["variant"]
            if v != "original":  # a change is measured against the original of the same run (same windows), or of
                # the same adapter's run (a baselines-only run repeats its settings: the same windows and probes)
                r = {**r, "_base": origs.get(r["T"]) or named.get((name, r["T"]))}
            key = ("—", v) if v == "original" else (name, v)
            row = merged.setdefault(key, {"adapter": key[0], "K": None if v == "original" else k_groups,
                                          "variant": v, "by_T": {}, "_name": name})
            if v == "original" and r["T"] in row["by_T"]:  # the original's measures from every run, first kept
                row["by_T"][r["T"]] = {**r, **row["by_T"][r["T"]]}
            else:
                row["by_T"].setdefault(r["T"], r)

    for d in long_docs:  # recall measured in a run covers every mask of that adapter, evaluated there or not
        name = _adapter_name(d)
        for rec in d.get("recall", []):
            for v, m in rec["overall"]["masks"].items():
                row = merged.get((name, v))
                entry = row["by_T"].get(rec["T"]) if row else None
                if entry is not None and rec["split"] not in entry.get("distant_dropped", {}):
                    row["by_T"][rec["T"]] = {**entry, "distant_dropped": {**entry.get("distant_dropped", {}),
                                                                          rec["split"]: m["dropped_distant"]}}

    def order(r):  # the original; then per adapter: soft, top-1 and the baselines at its budget, top-2 and its ...
        v = r["variant"]
        base, _, k = v.partition("@")
        k = k or base
        return (v != "original", r["adapter"], v != "soft", int(k[3:]) if k[3:].isdigit() else 0, "@" in v,
                list(BASELINES).index(base) if base in BASELINES else len(BASELINES), v)
    rows = sorted(merged.values(), key=order)
    for row in rows:
        sp = speed.get((row["_name"], row["variant"]))
        if row["variant"] == "original":  # the baseline of every bench run: 1x by definition, if any was run
            sp = next((v for (_, var), v in speed.items() if var == "original"), None)
        row["speed_T"], row["prefill_x"], row["decode_x"] = sp if sp else (None, None, None)
    return rows


def _base_value(r: dict, t: int, key: str, base: dict):
    """The original's ``key`` at length ``t`` for row ``r``: from the same long-eval run when it measured the
    original, else the table's original row."""
    own = r["by_T"].get(t, {}).get("_base")
    return (own or base["by_T"].get(t, {})).get(key)


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
    kept_t = _quality_length(rows)
    head += [f"pairs kept T={kept_t}", "prefill ×", "decode ×"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["adapter"], r["variant"]]
        for t in ppl_t:
            for key in ("ppl_domain", "ppl_ood"):
                x, b = r["by_T"].get(t, {}).get(key), _base_value(r, t, key, base)
                cells.append("—" if x is None else f"{x:.2f}" + ("" if r is base or b is None
                                                                 else f" ({100 * (x / b - 1):+.1f}%)"))
        for t in rec_t:
            dd = r["by_T"].get(t, {}).get("distant_dropped")
            cells.append("0%" if r["variant"] == "original" else "—" if not dd else
                         " / ".join(f"{100 * dd[s]:.0f}%" for s in ("domain", "ood") if s in dd))
        cells += [_f(r["by_T"].get(t, {}).get("repeat_ppl")) for t in lengths]
        cells += [_f((r["by_T"].get(t) or {}).get("passkey", {}).get("accuracy")) for t in lengths]
        kept = r["by_T"].get(kept_t, {}).get("budget_pairs_kept")
        cells.append("100%" if r["variant"] == "original" else ("—" if kept is None else f"{100 * kept:.0f}%"))
        cells += [("—" if r["prefill_x"] is None else f"{r['prefill_x']:.2f}×"),
                  ("—" if r["decode_x"] is None else f"{r['decode_x']:.2f}×")]
        lines.append("| " + " | ".join(cells) + " |")
    speed_t = sorted({r["speed_T"] for r in rows if r["speed_T"]})
    notes = [f"Speed-ups: whole model against the original in the same `bench-model` run at T={speed_t}; "
             "— = not measured. Passkey: accuracy over depths (teacher-forced greedy = what greedy decoding "
             "answers). Sliding, duo, random and untrained rows keep the same share of causal pairs as the "
             "adapter's top-k at each length; an adapter served with dense heads (`+N dense heads`) counts their "
             "pairs in that share, and its random, untrained, k-means and oracle rows keep the same heads dense."]
    if any(r["variant"].startswith(("kmeans@", "oracle@")) for r in rows):
        notes[0] += (" K-means and oracle rows keep as many distant keys per query as the adapter's top-k (k-means: "
                     "whole clusters of about 16 keys, in the order the query scores them, to the nearest cluster).")
    if any(r["variant"].startswith("kmeans-share@") for r in rows):
        notes[0] += (" `kmeans-share` rows: runs made before the k-means baseline kept the router's budget (a fixed "
                     "share of 8 clusters, about a tenth of the router's distant keys per query).")
    if any(r["variant"].startswith("random-union@") for r in rows):
        notes[0] += (" `random-union` rows: a key-space adapter's random routing served with its block union, "
                     "before the random baseline kept the router's count per query (it kept most distant keys).")
    if rec_t:
        notes[0] += (" Distant attention dropped: the share of the original model's attention on keys beyond the "
                     "window and sinks that the mask removes (domain / OOD, `long-eval --recall-windows`).")
    cmds = [f"- `{d['command']}`" for d in long_docs + bench_docs if d.get("command")]
    out = "\n".join(lines + ["", *notes, "", "Commands:", "", *cmds])
    if plot_link:
        out += f"\n\n![pareto]({plot_link})"
    return out


# Training-free baselines at the adapter's budget (``NAME@topK`` variants of long-eval), in table order.
BASELINES = {"oracle": "oracle: the most-attended keys", "sliding": "sliding window + sinks",
             "duo": "the same dense heads, sliding window + sinks elsewhere (DuoAttention-style)",
             "kmeans": "k-means keys", "random": "random groups", "untrained": "untrained router"}


def _shipped() -> set[str]:
    from ..adapters import shipped
    return set(shipped())


def _quality_length(rows: list[dict]) -> int:
    """The length every row's perplexity was measured at: the longest one the original has it for."""
    base = next(r for r in rows if r["variant"] == "original")
    ts = [t for t, x in base["by_T"].items() if "ppl_domain" in x] or list(base["by_T"])
    return max(ts)


def decision_rows(long_docs: list[dict], bench_docs: list[dict]) -> list[dict]:
    """The README's rows: the original, then per shipped adapter (every adapter when none is shipped) each hard
    top-k followed by the baselines measured at its budget. The soft gate (a training mode) is left out, and so are
    runs that served a shipped adapter with settings of their own (``NAME +window 512``: experiments, in RESULTS'
    full table), so each row is what loading that name gives."""
    names = list(dict.fromkeys(_adapter_name(d) for d in long_docs))
    shipped = _shipped()
    names = [n for n in names if n in shipped] or names
    # the original row as measured beside these adapters (same windows, passkey depths and repeats), then the rest
    rows = pareto_rows(sorted(long_docs, key=lambda d: _adapter_name(d) not in names), bench_docs)
    out = [r for r in rows if r["variant"] == "original"][:1]
    for name in names:
        mine = {r["variant"]: r for r in rows if r["adapter"] == name}
        for k in sorted(int(v[3:]) for v in mine if v.startswith("top") and v[3:].isdigit()):
            out.append(mine[f"top{k}"])
            out += [mine[f"{b}@top{k}"] for b in BASELINES if f"{b}@top{k}" in mine]
    return out


def render_decision_table(long_docs: list[dict], bench_docs: list[dict], *, full: str = "docs/RESULTS.md",
                          plot_link: str | None = None) -> str:
    """The one table a user decides from (README): per shipped configuration and per baseline at the same budget,
    quality (perplexity change), retrieval (repeat-copy, passkey), attention recall and whole-model speed. One length
    for quality, one for speed, both stated; a column nobody measured, and a row with no quality number at that
    length, are left out. ``full``: where the table of every
    adapter, length and command lives."""
    rows = decision_rows(long_docs, bench_docs)
    base = rows[0]
    t = _quality_length(rows)
    at = lambda r, key: r["by_T"].get(t, {}).get(key)  # noqa: E731
    rec_t = sorted({tt for r in rows for tt, x in r["by_T"].items() if x.get("distant_dropped")})
    rt = t if t in rec_t else (rec_t[-1] if rec_t else None)
    speed_t = sorted({r["speed_T"] for r in rows if r["speed_T"]})

    def label(r):
        if r is base:
            return "original model (full attention)"
        v = r["variant"]
        if "@" in v:
            b, k = v.split("@")
            return f"↳ {BASELINES.get(b, b)}, same budget"
        return f"**{r['adapter']}** {v.replace('top', 'top-')}"

    def ppl(r):
        d, o = at(r, "ppl_domain"), at(r, "ppl_ood")
        if r is base:
            return " / ".join(_f(x) for x in (d, o))
        bd, bo = _base_value(r, t, "ppl_domain", base), _base_value(r, t, "ppl_ood", base)
        pct = lambda x, b: "—" if x is None or b is None else f"{100 * (x / b - 1):+.1f}%"  # noqa: E731
        return f"{pct(d, bd)} / {pct(o, bo)}"

    def dropped(r):
        if r is base:
            return "0%"
        dd = r["by_T"].get(rt, {}).get("distant_dropped") if rt else None
        return "—" if not dd else " / ".join(f"{100 * dd[s]:.0f}%" for s in ("domain", "ood") if s in dd)

    def hits(p):
        return "—" if not p or p.get("accuracy") is None else (
            f"{round(p['accuracy'] * p['n'])}/{p['n']}" if p.get("n") else f"{100 * p['accuracy']:.0f}%")

    def passkey(r):  # runs differ in passkeys per depth: a row whose own run's original differs says so
        mine, own = hits(at(r, "passkey")), hits(_base_value(r, t, "passkey", base))
        return mine if r is base or mine == "—" or own in ("—", hits(at(base, "passkey"))) else \
            f"{mine} (original {own})"

    def repeat(r):  # likewise the repeated passages
        mine, own, shown = at(r, "repeat_ppl"), _base_value(r, t, "repeat_ppl", base), at(base, "repeat_ppl")
        return _f(mine) if r is base or None in (mine, own, shown) or _f(own) == _f(shown) else \
            f"{_f(mine)} (original {_f(own)})"

    kept = lambda r: "100%" if r is base else ("—" if at(r, "budget_pairs_kept") is None  # noqa: E731
                                               else f"{100 * at(r, 'budget_pairs_kept'):.0f}%")
    times = lambda x: "—" if x is None else f"{x:.2f}×"  # noqa: E731
    cols = [("configuration", label), (f"causal pairs kept (T={t})", kept),
            (f"perplexity, domain / OOD (T={t}; Δ vs the original in the same run)", ppl),
            (f"repeat-copy ppl (T={t})", repeat),
            (f"passkey (T={t})", passkey),
            (f"distant attention dropped (T={rt}; domain / OOD)", dropped),
            (f"prefill × (T={'/'.join(map(str, speed_t))})", lambda r: times(r["prefill_x"])),
            (f"decode × (T={'/'.join(map(str, speed_t))})", lambda r: times(r["decode_x"]))]
    table = [[fn(r) for _, fn in cols] for r in rows]
    # a configuration with no quality number at this length (measured at another one, or timed only) says nothing
    # here: its row is left out (RESULTS' full table has it); so is a column nobody measured
    quality = range(1, len(cols) - 2)
    empty = lambda cell: set(cell.replace("/", " ").split()) <= {"—"}  # noqa: E731  ("— / —" too)
    # ... and so are the baselines under it: a ↳ row belongs to the configuration above it, never to another one
    shown, parent = [], True
    for i, (r, row) in enumerate(zip(rows, table)):
        measured = i == 0 or not all(empty(row[j]) for j in quality)
        if "@" not in r["variant"] or r is base:
            parent = measured
        if measured and (parent or "@" not in r["variant"]):
            shown.append(row)
    table = shown
    keep = [j for j in range(len(cols)) if j == 0 or any(not empty(row[j]) for row in table[1:])]
    lines = ["| " + " | ".join(cols[j][0] for j in keep) + " |", "|" + "---|" * len(keep)]
    lines += ["| " + " | ".join(row[j] for j in keep) + " |" for row in table]
    notes = [f"Perplexity on held-out text at T = {t} (domain = the training corpus' held-out works, OOD = news), "
             "repeat-copy = perplexity of a passage seen earlier (the original's is the floor), passkey = hidden "
             "numbers retrieved (a row whose run hid other passkeys or passages names its own original's); ↳ rows "
             "are training-free masks that keep the same share of causal pairs as the top-k above them (not served, "
             "so not timed)."]
    if speed_t:
        notes[0] += (f" Speed: the whole model's prefill and one decode step against the original in the same "
                     f"`focusattn bench-model` run at T = {'/'.join(map(str, speed_t))}.")
    if rt:
        notes[0] += (" Distant attention dropped: the share of the original model's attention on keys beyond the "
                     "window and sinks that the mask removes.")
    notes[0] += f" Every adapter, length and command: [{Path(full).name}]({full})."
    out = "\n".join(lines + ["", *notes])
    return out + (f"\n\n![quality against budget and speed]({plot_link})" if plot_link else "")


def _kind(variant: str) -> str:
    return variant.split("@")[0] if "@" in variant else "focus"


def plot_pareto(long_docs: list[dict], bench_docs: list[dict], path) -> None:
    """The README table's rows as a picture: perplexity change against cost. Left and middle: against the share of
    causal pairs kept (the budget), so the baselines at the adapter's budget stand beside it, in domain and out of
    domain; right: against the measured whole-model prefill and decode speed-up. Colour = adapter (baselines: one
    colour and marker per kind); every label inside the frame."""
    rows = decision_rows(long_docs, bench_docs)
    base = rows[0]
    t = _quality_length(rows)
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    adapters = list(dict.fromkeys(r["adapter"] for r in rows if r is not base))
    colour = {a: c for a, c in zip(adapters, ["#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd", "#d62728"] * 9)}
    marks = {"oracle": ("*", "#7f7f7f"), "sliding": ("s", "#8c564b"), "duo": ("P", "#ff9896"),
             "kmeans": ("D", "#bcbd22"),
             "random": ("X", "#17becf"), "untrained": ("v", "#e377c2")}

    def delta(r, key):
        x, b = r["by_T"].get(t, {}).get(key), _base_value(r, t, key, base)
        return None if x is None or b is None else 100 * (x / b - 1)

    def frame(ax, pts):
        """Limits with room for the labels (nothing drawn outside the frame); a label's side: towards the middle."""
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
        ax.set_xlim(min(xs) - 0.15 * dx, max(xs) + 0.15 * dx)
        ax.set_ylim(min(ys) - 0.12 * dy, max(ys) + 0.15 * dy)
        mid = (min(xs) + max(xs)) / 2
        return lambda x: ((-8, 0), "right") if x > mid else ((8, 0), "left")

    def label(ax, side, x, y, text, c):
        off, ha = side(x)
        ax.annotate(text, (x, y), xytext=off, textcoords="offset points", fontsize=8, color=c, ha=ha, va="center")

    for ax, key, title in ((axes[0], "ppl_domain", "in domain"), (axes[1], "ppl_ood", "out of domain (news)")):
        pts, texts = [(100.0, 0.0)], []
        for a in adapters:
            mine = [r for r in rows if r["adapter"] == a and delta(r, key) is not None
                    and r["by_T"].get(t, {}).get("budget_pairs_kept") is not None]
            focus = sorted((100 * r["by_T"][t]["budget_pairs_kept"], delta(r, key), r["variant"]) for r in mine
                           if _kind(r["variant"]) == "focus")
            if focus:
                ax.plot([p[0] for p in focus], [p[1] for p in focus], "o-", color=colour[a], label=a, zorder=3)
                texts += [(x, y, v.replace("top", "top-"), colour[a]) for x, y, v in focus]
            for r in mine:
                kind = _kind(r["variant"])
                if kind != "focus":
                    m, c = marks.get(kind, ("P", "#333333"))
                    x, y = 100 * r["by_T"][t]["budget_pairs_kept"], delta(r, key)
                    ax.scatter([x], [y], marker=m, color=c, s=50, zorder=2,
                               label=BASELINES.get(kind, kind) + " (same budget)")
                    pts.append((x, y))
            pts += [(x, y) for x, y, _ in focus]
        ax.scatter([100.0], [0.0], marker="o", color="black", s=45, zorder=3, label="original (full attention)")
        side = frame(ax, pts)
        for x, y, text, c in texts:
            label(ax, side, x, y, text, c)
        ax.axhline(0, color="grey", lw=0.8)
        ax.set_xlabel(f"causal pairs kept at T={t} (%)")
        ax.set_ylabel(f"perplexity change vs original (%), T={t}")
        ax.set_title(f"quality against budget, {title}")
        ax.grid(alpha=0.3)
    ax = axes[2]
    timed = [r for r in rows if r is not base and r["prefill_x"] is not None and delta(r, "ppl_domain") is not None]
    if timed:
        pts = [(1.0, 0.0)]
        for r in timed:
            y, c = delta(r, "ppl_domain"), colour[r["adapter"]]
            ax.plot([r["prefill_x"], r["decode_x"]], [y, y], color=c, lw=0.8, zorder=2)
            ax.scatter([r["prefill_x"]], [y], marker="o", color=c, s=50, zorder=3)
            ax.scatter([r["decode_x"]], [y], marker="^", facecolors="white", edgecolors=c, s=60, zorder=3)
            pts += [(r["prefill_x"], y), (r["decode_x"], y)]
        frame(ax, pts)
        for r in timed:
            y, c = delta(r, "ppl_domain"), colour[r["adapter"]]
            ax.annotate(r["variant"].replace("top", "top-"), ((r["prefill_x"] + r["decode_x"]) / 2, y),
                        xytext=(0, 7), textcoords="offset points", fontsize=8, color=c, ha="center")
        ax.scatter([1.0], [0.0], marker="o", color="black", s=45, zorder=3)
        ax.scatter([], [], marker="o", color="grey", label="prefill")
        ax.scatter([], [], marker="^", facecolors="white", edgecolors="grey", label="one decode step")
        ax.legend(fontsize=8, loc="best")
        ax.axvline(1.0, color="grey", lw=0.8)
        ax.axhline(0, color="grey", lw=0.8)
        speed_t = "/".join(map(str, sorted({r["speed_T"] for r in timed})))
        ax.set_xlabel(f"whole-model speed-up vs original, T={speed_t} (right = faster)")
        ax.set_ylabel(f"perplexity change in domain (%), T={t}")
        ax.set_title("quality against measured speed")
        ax.grid(alpha=0.3)
    else:
        ax.text(0.5, 0.5, "whole-model speed not measured\n(focusattn bench-model)", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
    handles = {}
    for a in axes[:2]:
        for h, lab in zip(*a.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    ncol = min(4, len(handles))
    fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=ncol, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.04 + 0.04 * -(-len(handles) // ncol), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
