"""The collapse ablation (Focus §4-5, Table 8): softmax normalisation vs Sinkhorn with sequence routing vs Sinkhorn
with causal routing, each a ``focusattn retrofit`` run on the same budget.

``focusattn collapse NAME=RUN ...`` gathers each run's per-layer largest-group share over training (``metrics.jsonl``,
key ``largest_share``: the share of the batch's tokens in the layer's largest group, 1/K balanced, 1 collapsed) and its
evaluation (``summary.json``) into one JSON, and plots share vs step; ``docs/RESULTS.md`` renders its table.
"""
from __future__ import annotations

import json
from pathlib import Path

from .._io import pyplot, read_jsonl, write_json
from .report import _f

SHARE_KEY = "largest_share"  # what train/retrofit.py logs per step, one value per layer
PRODUCER = "focusattn retrofit --out {run}"
COLLAPSED = 0.9  # a layer whose largest group holds this share of the tokens routes (almost) nothing

PAPER_CLAIM = ("The paper (§5, Table 8): under softmax normalisation one group absorbed every token within 600 steps "
               "(GPT-2 124M, PG-19); Sinkhorn blocks every escape path and stays balanced (dominance 14.6% "
               "centroid-only, K = 8, where 12.5% is balanced).")


def _read_run(name: str, run: str | Path, every: int) -> dict:
    d = Path(run)
    missing = [f for f in ("summary.json", "metrics.jsonl") if not (d / f).is_file()]
    if missing:
        raise ValueError(f"run folder {d} ({name}): missing {', '.join(missing)} (written by "
                         f"`{PRODUCER.format(run=d)}`)")
    s = json.loads((d / "summary.json").read_text())
    if s.get("method", "focus") != "focus":
        raise ValueError(f"run folder {d} ({name}) is a {s['method']} run: the collapse ablation needs Focus runs")
    recs = read_jsonl(d / "metrics.jsonl")
    recs = [r for r in recs if isinstance(r.get(SHARE_KEY), list) and None not in r[SHARE_KEY]]
    if not recs:
        raise ValueError(f"{d}/metrics.jsonl has no per-layer '{SHARE_KEY}' records (written by "
                         f"`{PRODUCER.format(run=d)}` since the collapse ablation)")
    kept = [r for r in recs if r["step"] % every == 0 or r is recs[-1] or r is recs[0]]
    f, c = s["config"]["focus"], s["config"]
    return {
        "run": str(d), "command": s.get("command"),
        "normalisation": "softmax" if f["sinkhorn_iters"] == 0 else f"sinkhorn ({f['sinkhorn_iters']} iters)",
        # without Sinkhorn there are no potentials: causal and sequence routing are the same softmax
        "routing": f["routing"] if f["sinkhorn_iters"] else "—", "num_groups": f["num_groups"], "steps": c["steps"], "seq_len": c["seq_len"],
        "balance_loss": c.get("balance_loss", 0.0),
        "step": [r["step"] for r in kept], SHARE_KEY: [[round(x, 4) for x in r[SHARE_KEY]] for r in kept],
        "perplexity": s["perplexity"], "eval_dominance": [g["dominance"] for g in s.get("groups", [])],
        "pairs_kept": s.get("pairs_kept", {}),
    }


def collect(runs: dict[str, str], *, every: int = 1, command: str | None = None) -> dict:
    """``{name: run folder}`` -> the ablation JSON (curves sub-sampled to every ``every`` steps)."""
    if not runs:
        raise ValueError("no runs: pass NAME=RUN_DIR ... (e.g. softmax=runs/ablation/softmax)")
    if every < 1:
        raise ValueError(f"--every {every}: must be >= 1")
    return {"command": command, "collapsed_at": COLLAPSED, "paper_claim": PAPER_CLAIM,
            "variants": {name: _read_run(name, run, every) for name, run in runs.items()}}


def _mean(xs):
    return sum(xs) / len(xs)


def first_collapse(v: dict) -> int | None:
    """First logged step at which the *mean* over layers of the largest-group share reaches ``COLLAPSED``."""
    return next((s for s, sh in zip(v["step"], v[SHARE_KEY]) if _mean(sh) >= COLLAPSED), None)


def plot(doc: dict, path: str | Path) -> Path:
    """Largest-group share vs step: one panel per variant, a thin line per layer and the layer mean in black."""
    plt = pyplot()
    vs = doc["variants"]
    fig, axes = plt.subplots(1, len(vs), figsize=(4.2 * len(vs), 3.4), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (name, v) in zip(axes[0], vs.items()):
        n = len(v[SHARE_KEY][0])
        for layer in range(n):
            ax.plot(v["step"], [sh[layer] for sh in v[SHARE_KEY]], color=cmap(layer / max(1, n - 1)), lw=0.8,
                    alpha=0.7)
        ax.plot(v["step"], [_mean(sh) for sh in v[SHARE_KEY]], color="k", lw=2, label="mean over layers")
        ax.axhline(1 / v["num_groups"], color="grey", ls="--", lw=1, label=f"balanced 1/{v['num_groups']}")
        ax.set_ylim(0, 1.02)
        ax.set_xlabel("step")
        ax.set_title(f"{name}: {v['normalisation'].split(' ')[0]}" + (f", {v['routing']} routing"
                                                                     if v["routing"] != "—" else ""), fontsize=10)
    axes[0][0].set_ylabel("largest-group share (per layer)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def render_markdown(doc: dict, plot_link: str | None = None) -> str:
    vs = doc["variants"]
    thr = doc.get("collapsed_at", COLLAPSED)
    head = ["variant", "normalisation", "routing", "steps x T", "largest share at start (mean)",
            "at end (mean / max layer)", f"first step mean >= {thr:g}", "held-out dominance (mean)",
            "domain ppl before / soft / top-1", "OOD soft / top-1"]
    lines = [doc.get("paper_claim", PAPER_CLAIM), "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, v in vs.items():
        sh, a, b = v[SHARE_KEY], v["perplexity"]["after"], v["perplexity"]["before"]
        fc = first_collapse(v)
        dom = v.get("eval_dominance") or []
        lines.append("| " + " | ".join([
            name, v["normalisation"], v["routing"], f"{v['steps']} x {v['seq_len']}", f"{_mean(sh[0]):.3f}",
            f"{_mean(sh[-1]):.3f} / {max(sh[-1]):.3f}", str(fc) if fc is not None else "never",
            f"{_mean(dom):.3f}" if dom else "—",
            f"{_f(b.get('domain'))} / {_f(a['domain'].get('soft'))} / {_f(a['domain'].get('top1'))}",
            f"{_f(a.get('ood', {}).get('soft'))} / {_f(a.get('ood', {}).get('top1'))}" if "ood" in a else "—",
        ]) + " |")
    k = next(iter(vs.values()))["num_groups"]
    lines += ["", f"Measured here: the largest-group share is logged per layer at every training step (the training "
              f"batch's tokens; balanced = 1/{k} = {1 / k:.3f}); held-out dominance is the same share on validation "
              "windows after training. "
              + " ".join(f"{name}: mean share {_mean(v[SHARE_KEY][-1]):.3f} after {v['step'][-1]} steps"
                         + (f", collapsed (mean >= {thr:g}) at step {first_collapse(v)}."
                            if first_collapse(v) is not None else ", no collapse.")
                         for name, v in vs.items())]
    if plot_link:
        lines += ["", f"![collapse]({plot_link})"]
    lines += ["", "Commands:", "", f"- table: `{doc.get('command')}`"]
    lines += [f"- {name}: `{v.get('command')}`" for name, v in vs.items()]
    return "\n".join(lines)


def write_collapse(runs: dict[str, str], out: str | Path, *, every: int = 1, command: str | None = None) -> dict:
    """Write ``out`` (JSON) and the plot beside it (same stem, ``.png``)."""
    doc = collect(runs, every=every, command=command)
    out = Path(out)
    doc["plot"] = plot(doc, out.with_suffix(".png")).name
    write_json(out, doc)
    return doc
