"""``focusattn report RUN_DIR... --html OUT.html``: one self-contained HTML page per run or comparison of runs.

Everything is inline (CSS, and plots as base64 PNG from matplotlib), so the page can be mailed or attached. What a run
folder may hold, and the command that writes it:

- ``summary.json``, ``metrics.jsonl``: ``focusattn retrofit --out RUN``
- ``eval.json``: ``focusattn eval --adapter RUN/adapter --out RUN``
- ``sink_probe.json``: ``focusattn sinks --out RUN``
- ``groups.json``: ``focusattn groups --adapter RUN/adapter --out RUN``

A run needs ``summary.json`` or ``eval.json``; any other missing file turns its section into a short "not recorded"
note naming the command that produces it.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
from pathlib import Path

from .._io import read_jsonl, write_text

PRODUCERS = {
    "summary.json": "focusattn retrofit --out {run}",
    "metrics.jsonl": "focusattn retrofit --out {run}",
    "eval.json": "focusattn eval --adapter {run}/adapter --tasks offline --out {run}",
    "sink_probe.json": "focusattn sinks --out {run}",
    "groups.json": "focusattn groups --adapter {run}/adapter --out {run}",
}
# (id, title): every page has every section, in this order
SECTIONS = [
    ("config", "Configuration"),
    ("perplexity", "Perplexity before and after"),
    ("pareto", "Perplexity vs causal pairs kept"),
    ("groups", "Group analysis"),
    ("training", "Training curve"),
    ("collapse", "Group collapse over training"),
    ("sinks", "Attention sinks"),
    ("sparsity", "Sparsity"),
    ("benchmarks", "Benchmarks (lm-eval)"),
]
COLLAPSE_KEYS = ("largest_share", "largest_group_share", "dominance")  # retrofit writes largest_share  # per-layer list in a metrics.jsonl record

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;
color:#1d1d1f;background:#fff;padding:0 16px}
h1{font-size:1.6em;margin-bottom:4px} h2{border-bottom:2px solid #4c72b0;padding-bottom:4px;margin-top:36px}
h3{margin-bottom:6px} table{border-collapse:collapse;margin:8px 0 16px;font-size:.9em}
td,th{border:1px solid #ccc;padding:4px 8px;text-align:right} th{background:#eef2f8} td:first-child,th:first-child{text-align:left}
.muted{color:#666} .missing{background:#fff7e0;border-left:4px solid #e0a800;padding:8px 12px}
code{background:#f3f3f3;padding:1px 4px;border-radius:3px} img{max-width:100%;height:auto}
table.kv td{text-align:left} table.text td,table.text th{text-align:left} .up{color:#b00020} .down{color:#1b7f3b} nav a{margin-right:12px}
"""


# -------------------------------------------------------------------------------------------------------- loading
def _read_json(p: Path):
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{p}: corrupt JSON ({e})") from e


def load_run(path: str | Path) -> dict:
    d = Path(path)
    if not d.is_dir():
        raise ValueError(f"run folder {d}: no such folder")
    run = {"path": str(d), "name": d.name or str(d)}
    for fname in ("summary.json", "eval.json", "sink_probe.json", "groups.json"):
        if (d / fname).is_file():
            run[fname.split(".")[0]] = _read_json(d / fname)
    if (d / "metrics.jsonl").is_file():
        run["metrics"] = read_jsonl(d / "metrics.jsonl")
    if "summary" not in run and "eval" not in run:
        raise ValueError(f"run folder {d}: missing summary.json (written by `{PRODUCERS['summary.json'].format(run=d)}`)"
                         f" and eval.json (written by `{PRODUCERS['eval.json'].format(run=d)}`); a report needs one")
    return run


# ------------------------------------------------------------------------------------------------------- helpers
def _e(x) -> str:
    return html.escape(str(x))


def _f(x, nd=2) -> str:
    return "—" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.{nd}f}"


def _table(head: list[str], rows: list[list], cls: str = "") -> str:
    h = "".join(f"<th>{_e(c)}</th>" for c in head)
    b = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table class='{cls}'><thead><tr>{h}</tr></thead><tbody>{b}</tbody></table>"


def _missing(run: dict, fname: str, what: str) -> str:
    cmd = PRODUCERS[fname].format(run=run["path"])
    return (f'<p class="missing"><b>{_e(run["name"])}</b>: {_e(what)} not recorded ({_e(fname)} absent; '
            f"produce it with <code>{_e(cmd)}</code>).</p>")


def _png(fig) -> str:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _ks(s: dict) -> list[str]:
    return sorted((k for k in s["perplexity"]["after"]["domain"] if k.startswith("top")), key=lambda k: int(k[3:]))


def _modes(s: dict) -> list[str]:
    """The evaluated modes after training: soft + top-k for Focus, ``lora`` for the LoRA baseline."""
    return ["lora"] if _is_lora(s) else ["soft"] + _ks(s)


def _is_lora(s: dict) -> bool:
    return s.get("method") == "lora"


# ------------------------------------------------------------------------------------------------------ sections
def sec_config(runs: list[dict]) -> str:
    out = []
    for r in runs:
        out.append(f"<h3>{_e(r['name'])} <span class='muted'>({_e(r['path'])})</span></h3>")
        s = r.get("summary")
        if s:
            c, f = s["config"], s["config"]["focus"]
            rows = [["command", f"<code>{_e(s.get('command'))}</code>"], ["model", _e(c["model"])],
                    ["data / OOD", f"{_e(c['data'])} / {_e(c.get('ood_data'))}"], ["corpus", _e(s.get("corpus", "—"))],
                    ["budget", f"{c['steps']} steps × {c['batch_size'] * c['grad_accum']} × {c['seq_len']} tokens, "
                               f"lr {c['lr']}"],
                    ["LoRA", f"r={c['lora_rank']}, alpha={c.get('lora_alpha') or 2 * c['lora_rank']:g}, attention "
                             "projections"] if _is_lora(s) else
                    ["Focus", ", ".join(f"{_e(k)}={_e(v)}" for k, v in f.items())],
                    ["trainable", f"{s['parameters'].get('trainable', s['parameters'].get('router')):,} "
                                  f"({s['parameters']['percent']:.3f}% of "
                                  f"{s['parameters']['total']:,})"],
                    ["final loss", _f(s.get("final_loss"), 3)],
                    ["wall time", f"{s.get('wall_seconds', 0) / 60:.1f} min"]]
            out.append(_table(["setting", "value"], rows, "kv"))
        else:
            out.append(_missing(r, "summary.json", "retrofit configuration"))
        ev = r.get("eval")
        if ev:
            out.append(_table(["eval setting", "value"], [
                ["command", f"<code>{_e(ev.get('command'))}</code>"], ["adapter", _e(ev.get("adapter"))],
                ["tasks", _e(", ".join(ev["tasks"]))], ["limit", _e(ev.get("limit"))],
                ["versions", _e(", ".join(f"{k} {v}" for k, v in ev.get("versions", {}).items()))]], "kv"))
    return "".join(out)


def sec_perplexity(runs: list[dict]) -> str:
    out = []
    plt = None
    with_s = [r for r in runs if r.get("summary")]
    for r in runs:
        if not r.get("summary"):
            out.append(_missing(r, "summary.json", "perplexity"))
            continue
        s = r["summary"]
        ppl, modes = s["perplexity"], _modes(s)
        rows = []
        for split in ("domain", "ood"):
            if split not in ppl["after"]:
                continue
            b = ppl["before"].get(split)
            cells = [f"{split} ({_e(s['config']['data'] if split == 'domain' else s['config'].get('ood_data'))})",
                     _f(b)]
            for k in modes:
                a = ppl["after"][split].get(k)
                rel = "" if a is None or not b else f" <span class='{'up' if a > b else 'down'}'>" \
                                                    f"({100 * (a / b - 1):+.1f}%)</span>"
                cells.append(_f(a) + rel)
            rows.append(cells)
        out.append(f"<h3>{_e(r['name'])}</h3>" + _table(["split", "before"] + [k.replace("top", "top-")
                                                                                for k in modes], rows))
    if with_s:
        plt = _plt()
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
        # one tick per mode any run has (runs evaluated at different top-k share the axis), bars side by side
        labels = ["before"] + list(dict.fromkeys(k for r in with_s for k in _modes(r["summary"])))
        for ax, split in zip(axes, ("domain", "ood")):
            width = 0.8 / len(with_s)
            for i, r in enumerate(with_s):
                s = r["summary"]
                if split not in s["perplexity"]["after"]:
                    continue
                vals = [s["perplexity"]["before"].get(split)] + [s["perplexity"]["after"][split].get(k)
                                                                 for k in labels[1:]]
                xs = [(j + i * width, v) for j, v in enumerate(vals) if v is not None]
                ax.bar([x for x, _ in xs], [v for _, v in xs], width=width, label=r["name"])
            ax.set_xticks([j + width * (len(with_s) - 1) / 2 for j in range(len(labels))],
                          [k.replace("top", "top-") for k in labels])
            lows = [v for r in with_s for v in [r["summary"]["perplexity"]["before"].get(split)] if v]
            if lows:
                ax.set_ylim(0.9 * min(lows), None)
            ax.set_title(f"{split} perplexity (lower is better)")
            ax.legend(fontsize=8)
        out.append(_png(fig))
    return "".join(out)


def sec_pareto(runs: list[dict]) -> str:
    usable = [r for r in runs if r.get("summary") and r["summary"].get("pairs_kept")]
    out = [_missing(r, "summary.json", "pairs kept per top-k") for r in runs if not r.get("summary")]
    out += [f"<p class='missing'><b>{_e(r['name'])}</b>: pairs kept not recorded in summary.json (add them with "
            f"<code>{_e(PRODUCERS['groups.json'].format(run=r['path']))} --update-summary {_e(r['path'])}/summary.json"
            "</code>).</p>" for r in runs if r.get("summary") and not r["summary"].get("pairs_kept")
            and not _is_lora(r["summary"])]
    if not usable:
        return "".join(out)
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
    for ax, split in zip(axes, ("domain", "ood")):
        labels = []
        for r in usable:
            s = r["summary"]
            if split not in s["perplexity"]["after"]:
                continue
            ks = [k for k in _ks(s) if k in s["pairs_kept"]]
            xs = [100 * s["pairs_kept"][k] for k in ks] + [100.0]
            ys = [s["perplexity"]["after"][split][k] for k in ks] + [s["perplexity"]["before"][split]]
            line, = ax.plot(xs, ys, "o-", label=r["name"])
            for x, y, lab in zip(xs, ys, [k.replace("top", "top-") for k in ks] + ["full"]):
                labels.append((x, y, lab, line.get_color()))
        # room for the labels inside the frame; a label sits on the side towards the middle, one line per run
        if labels:
            xs, ys = [p[0] for p in labels], [p[1] for p in labels]
            dx, dy = (max(xs) - min(xs)) or 1.0, (max(ys) - min(ys)) or 1.0
            ax.set_xlim(min(xs) - 0.12 * dx, max(xs) + 0.12 * dx)
            ax.set_ylim(min(ys) - 0.1 * dy, max(ys) + 0.15 * dy)
            mid = (min(xs) + max(xs)) / 2
            placed: list[tuple] = []
            for x, y, lab, c in labels:  # labels of points close together are stacked, not drawn over each other
                n = sum(abs(x - px) < 0.06 * dx and abs(y - py) < 0.06 * dy for px, py in placed)
                placed.append((x, y))
                ax.annotate(lab, (x, y), textcoords="offset points", xytext=(-6 if x > mid else 6, 4 + 10 * n),
                            ha="right" if x > mid else "left", fontsize=8, color=c)
        ax.set_xlabel("causal pairs kept (%)")
        ax.set_ylabel("perplexity")
        ax.set_title(f"{split}: cost vs quality (left/down is better)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    out.append("<p>Each point is one inference mode of the same adapter: hard top-k keeps the share of causal pairs "
               "on the x-axis; <i>full</i> is the model before Focus.</p>" + _png(fig))
    return "".join(out)


def sec_groups(runs: list[dict]) -> str:
    out = []
    for r in runs:
        s = r.get("summary")
        if s and _is_lora(s):
            out.append(f"<p class='muted'><b>{_e(r['name'])}</b>: a LoRA baseline has no groups.</p>")
            continue
        if not s or not s.get("groups"):
            out.append(_missing(r, "summary.json", "group statistics"))
            continue
        g = s["groups"]
        k = len(g[0].get("group_share", [])) or s["config"]["focus"]["num_groups"]
        plt = _plt()
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.4))
        layers = [x["layer"] for x in g]
        a1.plot(layers, [x["dominance"] for x in g], "o-", label="dominance (largest group share)")
        a1.plot(layers, [x["confidence"] for x in g], "s-", label="mean assignment confidence")
        a1.axhline(1 / k, color="k", ls="--", lw=1, label=f"balanced = 1/{k}")
        a1.set_xlabel("layer")
        a1.set_ylim(0, 1.3)  # the legend above the data (shares and confidences are at most 1)
        a1.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
        a1.legend(fontsize=7, loc="upper left", ncol=2)
        a1.set_title(f"{r['name']}: per-layer routing")
        if all("group_share" in x for x in g):
            import numpy as np

            m = np.array([x["group_share"] for x in g]).T
            im = a2.imshow(m, aspect="auto", cmap="viridis", vmin=0)
            a2.set_xlabel("layer")
            a2.set_ylabel("group")
            a2.set_title("share of tokens per group")
            fig.colorbar(im, ax=a2)
        else:
            a2.axis("off")
        mean_dom = sum(x["dominance"] for x in g) / len(g)
        worst = max(g, key=lambda x: x["dominance"])
        out.append(f"<h3>{_e(r['name'])}</h3><p>mean dominance {mean_dom:.3f} (balanced {1 / k:.3f}); most "
                   f"dominated layer {worst['layer']} ({worst['dominance']:.3f}).</p>" + _png(fig))
        gj = r.get("groups")
        if gj and gj.get("top_tokens"):
            rows = [[_e(layer), f"G{i}", _e(" ".join(f"{t!r}×{c}" for t, c in toks[:8]))]
                    for layer, groups in gj["top_tokens"].items() for i, toks in enumerate(groups)]
            out.append(_table(["layer", "group", "most frequent tokens"], rows, cls="text"))
    return "".join(out)


def sec_training(runs: list[dict]) -> str:
    have = [r for r in runs if r.get("metrics")]
    out = [_missing(r, "metrics.jsonl", "training curve") for r in runs if not r.get("metrics")]
    if have:
        plt = _plt()
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.2))
        for r in have:
            m = r["metrics"]
            a1.plot([x["step"] for x in m], [x["loss"] for x in m], label=r["name"])
            a2.plot([x["step"] for x in m], [x.get("tokens_per_s", float("nan")) for x in m], label=r["name"])
        a1.set_title("training loss")
        a2.set_title("tokens / s")
        for a in (a1, a2):
            a.set_xlabel("step")
            a.legend(fontsize=8)
        out.append(_png(fig))
    return "".join(out)


def sec_collapse(runs: list[dict]) -> str:
    out = []
    for r in runs:
        rows = [x for x in r.get("metrics", []) if any(isinstance(x.get(k), list) for k in COLLAPSE_KEYS)]
        if not rows:
            out.append(f"<p class='missing'><b>{_e(r['name'])}</b>: collapse curves not recorded (metrics.jsonl has "
                       f"no per-layer largest-group shares: keys {', '.join(COLLAPSE_KEYS)}).</p>")
            continue
        key = next(k for k in COLLAPSE_KEYS if isinstance(rows[0].get(k), list))
        plt = _plt()
        fig, ax = plt.subplots(figsize=(10, 3.4))
        n_layers = len(rows[0][key])
        cmap = plt.get_cmap("viridis")
        for layer in range(n_layers):
            ax.plot([x["step"] for x in rows], [x[key][layer] for x in rows], color=cmap(layer / max(1, n_layers - 1)),
                    lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("largest group share")
        ax.set_title(f"{r['name']}: largest-group share per layer (light = late layers)")
        out.append(_png(fig))
    return "".join(out)


def sec_sinks(runs: list[dict]) -> str:
    out = []
    for r in runs:
        sp = r.get("sink_probe")
        if not sp:
            out.append(_missing(r, "sink_probe.json", "attention-sink probe"))
            continue
        plt = _plt()
        fig, ax = plt.subplots(figsize=(10, 3.0))
        mass = sp["sink_mass_per_layer"]
        ax.bar(range(len(mass)), mass, color="tab:red")
        ax.axhline(sp["uniform_weight"], color="k", ls="--", lw=1, label="uniform weight")
        ax.set_xlabel("layer")
        ax.set_ylabel("attention on first token")
        ax.legend(fontsize=8)
        rows = [[_e(k), _f(v)] for k, v in sp["perplexity"].items()]
        out.append(f"<h3>{_e(r['name'])}</h3>" + _table(["fixed mask", "perplexity"], rows) + _png(fig))
    return "".join(out)


def sec_sparsity(runs: list[dict]) -> str:
    out = []
    have = []
    for r in runs:
        pk = (r.get("summary") or {}).get("pairs_kept") or (r.get("groups") or {}).get("pairs_kept")
        if pk:
            have.append((r, pk))
        else:
            out.append(_missing(r, "groups.json", "share of causal pairs kept"))
    if have:
        head = ["run"] + sorted({k for _, pk in have for k in pk}, key=lambda k: int(k[3:]))
        out.append(_table([h.replace("top", "top-") for h in head],
                          [[_e(r["name"])] + [f"{100 * pk[k]:.1f}%" if k in pk else "—" for k in head[1:]]
                           for r, pk in have]))
        plt = _plt()
        fig, ax = plt.subplots(figsize=(10, 3.0))
        width = 0.8 / len(have)
        for i, (r, pk) in enumerate(have):
            ks = head[1:]
            ax.bar([j + i * width for j in range(len(ks))], [100 * (1 - pk.get(k, float("nan"))) for k in ks],
                   width=width, label=r["name"])
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(ks))], [k.replace("top", "top-") for k in ks])
        ax.set_ylabel("causal pairs skipped (%)")
        ax.set_title("sparsity of hard top-k (higher = fewer pairs computed)")
        ax.legend(fontsize=8)
        out.append(_png(fig))
    return "".join(out)


def _main_metric(by_mode: dict) -> str | None:
    metrics = next(iter(by_mode.values()), {})
    for m in ("acc", "acc_norm", "perplexity"):
        if m in metrics:
            return m
    return next(iter(metrics), None)


def sec_benchmarks(runs: list[dict]) -> str:
    out = []
    for r in runs:
        ev = r.get("eval")
        if not ev:
            out.append(_missing(r, "eval.json", "benchmark results"))
            continue
        modes = ev["modes"]
        rows = []
        for task, by in ev["results"].items():
            for metric in dict.fromkeys(m for ms in by.values() for m in ms):
                cells = [_e(task), _e(metric), _e(ev["n_samples"].get(task, ""))]
                for mode in modes:
                    v = by.get(mode, {}).get(metric)
                    if v is None:
                        cells.append("—")
                        continue
                    c = f"{v['value']:.4g}" + (f" ± {v['stderr']:.2g}" if v.get("stderr") is not None else "")
                    d = ev["deltas"].get(task, {}).get(mode, {}).get(metric)
                    if d is not None:
                        good = (d < 0) if metric == "perplexity" else (d > 0)
                        c += f" <span class='{'down' if good else 'up'}'>({d:+.3g})</span>" if d else " (±0)"
                    cells.append(c)
                rows.append(cells)
        if not ev.get("complete", True):
            out.append(f"<p class='missing'><b>{_e(r['name'])}</b>: incomplete eval run; finished "
                       f"{_e(', '.join(modes))} of {_e(', '.join(ev.get('modes_requested', modes)))}.</p>")
        out.append(f"<h3>{_e(r['name'])}</h3><p class='muted'>lm-eval {_e(ev['versions'].get('lm_eval'))}; value ± "
                   "standard error (delta vs the original model; green = better).</p>"
                   + _table(["task", "metric", "n"] + [m.replace("top", "top-") for m in modes], rows))
        if len(modes) > 1:
            plt = _plt()
            tasks = list(ev["results"])
            fig, ax = plt.subplots(figsize=(10, 3.2))
            width = 0.8 / (len(modes) - 1)
            for i, mode in enumerate(modes[1:]):
                vals = []
                for t in tasks:
                    m = _main_metric(ev["results"][t])
                    d = ev["deltas"].get(t, {}).get(mode, {}).get(m)
                    vals.append(0 if d is None else (-d if m == "perplexity" else d))
                ax.bar([j + i * width for j in range(len(tasks))], vals, width=width, label=mode)
            ax.axhline(0, color="k", lw=0.8)
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tasks))], tasks, fontsize=8)
            ax.set_ylabel("delta vs original (up = better)")
            ax.set_title("main metric per task (acc; perplexity negated)")
            ax.legend(fontsize=8)
            out.append(_png(fig))
        pk = ev.get("breakdowns", {}).get("focus_passkey")
        if pk:
            depths = sorted({d for b in pk.values() for d in b["by_depth"]}, key=float)
            out.append("<p>Passkey accuracy by depth of the key:</p>" + _table(
                ["mode"] + depths, [[_e(m)] + [_f(b["by_depth"].get(d, {}).get("acc")) for d in depths]
                                    for m, b in pk.items()]))
    return "".join(out)


RENDERERS = {"config": sec_config, "perplexity": sec_perplexity, "pareto": sec_pareto, "groups": sec_groups,
             "training": sec_training, "collapse": sec_collapse, "sinks": sec_sinks, "sparsity": sec_sparsity,
             "benchmarks": sec_benchmarks}


def render_html(runs: list[dict]) -> str:
    title = (f"focusattn run {runs[0]['name']}" if len(runs) == 1
             else "focusattn comparison: " + ", ".join(r["name"] for r in runs))
    nav = "".join(f'<a href="#{sid}">{_e(t)}</a>' for sid, t in SECTIONS)
    body = [f"<h1>{_e(title)}</h1><p class='muted'>generated by <code>focusattn report --html</code></p><nav>{nav}</nav>"]
    for sid, t in SECTIONS:
        body.append(f'<section id="{sid}"><h2>{_e(t)}</h2>{RENDERERS[sid](runs)}</section>')
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")


def write_html(run_dirs: list[str | Path], out: str | Path) -> Path:
    if not run_dirs:
        raise ValueError("report --html needs at least one RUN_DIR")
    runs = [load_run(d) for d in run_dirs]  # every folder is checked before anything is written
    names = [r["name"] for r in runs]
    for i, r in enumerate(runs):  # same folder names in different places: tell them apart
        if names.count(r["name"]) > 1:
            r["name"] = r["path"]
    out = Path(out)
    write_text(out, render_html(runs))
    return out
