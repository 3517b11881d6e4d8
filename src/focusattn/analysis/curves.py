"""A retrofit run's curves: what its routing keeps, how balanced it stays and what quality it serves, step by step.

Read from the run's ``metrics.jsonl`` (``focusattn retrofit --out RUN``): per step the share of the training
targets' distant mass that top-1 keeps (``kept_top1``, attention objective) and the per-layer largest-group share
(``largest_share``: 1/K balanced, 1 collapsed); every ``--eval-every`` steps the same on a held-out window
(``heldout_kept_top1``, beside the share of distant keys top-1 keeps, ``heldout_budget_top1``, in runs that
recorded it) and the served top-1 perplexity of the first held-out window of each split
(``heldout_top1``, ``heldout_ood_top1``). ``docs/RESULTS.md`` renders the held-out rows and plots all three.
"""
from __future__ import annotations

from pathlib import Path

from .._io import pyplot
from .report import _f

HELD_OUT = ("heldout_kept_top1", "heldout_budget_top1", "heldout_top1", "heldout_ood_top1")


def _layers(r: dict) -> tuple[float, float]:
    s = r["largest_share"]
    return sum(s) / len(s), max(s)


def held_out_rows(recs: list[dict], *, smooth: int = 10, start: dict | None = None) -> list[dict]:
    """One row per held-out evaluation: its step, held-out values, and the training kept mass and largest-group
    share (mean and worst layer) averaged over the ``smooth`` steps up to it (one step is one window). ``start``:
    the summary's ``heldout_start``, the same evaluation before the first step (step 0)."""
    rows = [{"step": 0, **{k: start.get(k) for k in HELD_OUT}}] if start else []
    for r in recs:
        if "heldout_top1" not in r:
            continue
        near = [x for x in recs if r["step"] - smooth < x["step"] <= r["step"] and "largest_share" in x]
        row = {"step": r["step"], **{k: r.get(k) for k in HELD_OUT}}
        if near:
            row["train_kept_top1"] = sum(x.get("kept_top1", float("nan")) for x in near) / len(near)
            row["largest_mean"] = sum(_layers(x)[0] for x in near) / len(near)
            row["largest_max"] = sum(_layers(x)[1] for x in near) / len(near)
        rows.append(row)
    return rows


def render_curves(recs: list[dict], summary: dict, *, plot_link: str | None = None) -> str:
    """Markdown: the held-out rows of a run (step 0: the routers it started from, when the run measured them)."""
    rows = held_out_rows(recs, start=summary.get("heldout_start"))
    if not rows:
        return "_No held-out curve (the run had no `--eval-every`)._"
    before = summary["perplexity"]["before"]
    lines = [f"Held-out curve (`--eval-every`; one window per split at T = {summary['config']['seq_len']}; the "
             f"original model: {_f(before.get('domain'))} domain, {_f(before.get('ood'))} OOD):", "",
             "| step | held-out mass kept (top-1) | held-out distant keys kept (top-1) | train mass kept (last 10 "
             "steps) | largest group, mean / worst layer | top-1 ppl domain | top-1 ppl OOD |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        pct = lambda v: "—" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        lines.append(f"| {r['step']} | {pct(r.get('heldout_kept_top1'))} | {pct(r.get('heldout_budget_top1'))} | "
                     f"{pct(r.get('train_kept_top1'))} | "
                     f"{_f(r.get('largest_mean'), 3)} / {_f(r.get('largest_max'), 3)} | {_f(r.get('heldout_top1'))} | "
                     f"{_f(r.get('heldout_ood_top1'))} |")
    if plot_link:
        lines += ["", f"![training curves]({plot_link})"]
    return "\n".join(lines)


def plot_curves(recs: list[dict], summary: dict, path: str | Path) -> Path:
    """Three panels against the step: mass kept (train, held-out), largest group (mean, worst layer), held-out
    top-1 perplexity (domain, OOD) with the original model's as dashed lines."""
    plt = pyplot()
    train = [r for r in recs if "largest_share" in r]
    rows = held_out_rows(recs, start=summary.get("heldout_start"))
    fig, ax = plt.subplots(1, 3, figsize=(14, 3.8))
    steps = [r["step"] for r in train]

    def rolling(ys, n=10):  # one training step is one window: the mean over the last n steps reads as a trend
        return [sum(ys[max(0, i - n + 1):i + 1]) / len(ys[max(0, i - n + 1):i + 1]) for i in range(len(ys))]

    if all("kept_top1" in r for r in train) and train:
        kept = [r["kept_top1"] for r in train]
        ax[0].plot(steps, kept, lw=0.6, alpha=0.3, c="C0")
        ax[0].plot(steps, rolling(kept), lw=1.2, c="C0", label="train windows (mean of 10 steps)")
    ax[0].plot([r["step"] for r in rows], [r.get("heldout_kept_top1") for r in rows], "o-", c="C1",
               label="held-out window")
    ax[0].set(title="distant target mass kept by top-1", xlabel="step")
    for j, (name, c) in enumerate((("mean over layers", "C0"), ("worst layer", "C1"))):
        ys = [_layers(r)[j] for r in train]
        ax[1].plot(steps, ys, lw=0.6, alpha=0.3, c=c)
        ax[1].plot(steps, rolling(ys), lw=1.2, c=c, label=f"{name} (mean of 10 steps)")
    k = summary["config"]["focus"]["num_groups"]
    ax[1].axhline(1 / k, ls=":", c="grey", label=f"balanced (1/{k})")
    ax[1].set(title="largest group's share of tokens", xlabel="step")
    before = summary["perplexity"]["before"]
    for key, split, c in (("heldout_top1", "domain", "C0"), ("heldout_ood_top1", "ood", "C1")):
        pts = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
        if pts:
            ax[2].plot(*zip(*pts), "o-", c=c, label=f"top-1, {split}")
        if before.get(split) is not None:
            ax[2].axhline(before[split], ls="--", c=c, lw=0.8, label=f"original, {split}")
    ax[2].set(title="held-out perplexity", xlabel="step")
    for a in ax:
        a.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)  # a crash never leaves a half-written plot
    return path
