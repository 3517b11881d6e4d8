"""Run attention variants at equal compute over several seeds; aggregate to ``compare.json``, a table and plots.

Equal compute means the same preset: identical model width/depth, context, batch, steps and data order (a batch is a
function of ``(seed, step)``, so seed s gives every variant the same batches). Runs live in ``OUT/<variant>/seed<s>``;
finished runs are reused and interrupted ones resumed, so re-running the same command continues where it stopped.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

from .. import _io
from .._errors import InputError
from ..train.checkpoint import has_checkpoint
from .config import DEFAULT_ROPE_BASE, TrainConfig, check_attention, get_preset
from .data import load_data
from .train import load_result, read_metrics, train_lm

SUMMARY_KEYS = ("val_loss", "val_loss_2x", "val_loss_4x", "sink_mass", "sparsity", "surviving_mass", "train_time_s")
ACC_KEYS = ("val_acc", "val_acc_2x", "val_acc_4x")  # absent from runs made before accuracy was recorded
SHARE_KEYS = ("sink_share", "empty_rows")  # absent from runs made before the like-for-like sink metric


def _run_summary(res: dict, curve: list[dict]) -> dict:
    att = res["attention"]
    by_len = res["val_loss_by_length"]
    return {
        "seed": res["config"]["seed"], "parameters": res["config"]["parameters"],
        "val_loss": by_len["1x"], "val_loss_2x": by_len["2x"], "val_loss_4x": by_len["4x"],
        "sink_mass": att["mean"]["sink_mass"], "sparsity": att["mean"]["sparsity"],
        "surviving_mass": att["mean"]["surviving_mass"], "train_time_s": res["train_time_s"],
        **{k: att["mean"][k] for k in SHARE_KEYS if k in att["mean"]},
        "per_layer": att["per_layer"], "per_head": att["per_head"], "tau": res["tau"],
        "curve": [{k: r[k] for k in ("step", "loss", "val_loss", "val_acc") if k in r} for r in curve],
        **({f"val_acc{sfx}": res["val_acc_by_length"][m] for sfx, m in (("", "1x"), ("_2x", "2x"), ("_4x", "4x"))}
           if "val_acc_by_length" in res else {}),
    }


def _mean_std(xs: list[float]) -> dict:
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def aggregate(runs: dict[str, list[dict]]) -> tuple[dict, dict]:
    summary, per_layer = {}, {}
    for name, rs in runs.items():
        summary[name] = {k: _mean_std([r[k] for r in rs]) for k in SUMMARY_KEYS + ACC_KEYS + SHARE_KEYS
                         if k in rs[0]}
        summary[name]["parameters"] = rs[0]["parameters"]
        per_layer[name] = {m: [statistics.fmean(vals) for vals in zip(*(r["per_layer"][m] for r in rs))]
                           for m in ("sink_mass", "sparsity", "surviving_mass") + SHARE_KEYS if m in rs[0]["per_layer"]}
    return summary, per_layer


def run_compare(attentions: list[str], seeds: int, preset: str, out_dir: str | Path, *, data: str = "shakespeare",
                steps: int | None = None, threads: int | None = None, command: str = "", progress: bool = True,
                model_overrides: dict | None = None) -> dict:
    for a in attentions:
        check_attention(a)
    if seeds < 1:
        raise ValueError(f"seeds must be >= 1, got {seeds}")
    out = Path(out_dir)
    lm_data = load_data(data)
    runs: dict[str, list[dict]] = {}
    tcfg: TrainConfig | None = None
    for a in attentions:
        runs[a] = []
        for s in range(seeds):
            mcfg, tcfg = get_preset(preset, a, **(model_overrides or {}))
            tcfg = replace(tcfg, **{k: v for k, v in (("steps", steps), ("threads", threads)) if v is not None})
            run_dir = out / a / f"seed{s}"
            res = load_result(run_dir)
            if res is None:
                resume = has_checkpoint(run_dir)
                res = train_lm(mcfg, tcfg, data=lm_data, seed=s, out_dir=run_dir, resume=resume, progress=progress)
            elif res["config"]["model"] != mcfg.to_dict() or res["config"]["train"] != tcfg.to_dict():
                raise InputError("out", str(out), f"{run_dir} holds a finished run with different settings; use another folder")
            runs[a].append(_run_summary(res, read_metrics(run_dir)))
    summary, per_layer = aggregate(runs)
    base, _ = get_preset(preset, attentions[0], **(model_overrides or {}))
    result = {
        "command": command, "preset": preset, "data": data, "seeds": list(range(seeds)), "attentions": attentions,
        "model": {k: v for k, v in base.to_dict().items() if k != "attention"}, "train": tcfg.to_dict(),
        "equal_compute": {"steps": tcfg.steps, "batch_size": tcfg.batch_size, "block_size": base.block_size,
                          "tokens_per_run": tcfg.steps * tcfg.batch_size * base.block_size},
        "uniform_sink_mass": _uniform(base.block_size),
        **({"task": task_reach(lm_data, base)} if hasattr(lm_data, "min_distance") else {}),
        "summary": summary, "per_layer": per_layer, "runs": runs,
    }
    _io.write_json(out / "compare.json", result)
    _io.write_text(out / "compare.md", render_markdown(result))
    plot_compare(result, out)
    return result


def task_reach(task, cfg) -> dict:
    """What makes a task out of the sliding window's reach: the shortest distance from a query to what it must
    recall, against the farthest a stack of ``n_layer`` windows of ``window`` keys can carry anything
    (``n_layer * (window - 1)``). When ``needed > reach`` the sliding model sees nothing that depends on the answer,
    so it is at chance by construction."""
    needed = {f"{m}x": task.min_distance(m * cfg.block_size) for m in (1, 2, 4)}
    reach = cfg.n_layer * (cfg.window - 1)
    return {"min_distance": needed, "sliding_reach": reach, "sliding_blind": needed["1x"] > reach}


def _uniform(t: int) -> float:
    from ..lazy.metrics import uniform_sink_mass

    return uniform_sink_mass(t)


def _fmt(d: dict, digits: int = 3, pct: bool = False) -> str:
    m, s = (d["mean"] * 100, d["std"] * 100) if pct else (d["mean"], d["std"])
    return f"{m:.{digits}f} ± {s:.{digits}f}" + ("%" if pct else "")


def _default_bases(names: list[str]) -> str:
    return "per variant (" + ", ".join(f"{n} {DEFAULT_ROPE_BASE[n]:g}" for n in names) + ")"


def render_markdown(cj: dict | str | Path) -> str:
    """Markdown section for docs/RESULTS.md; every number comes from ``compare.json`` (a dict or its path)."""
    if not isinstance(cj, dict):
        cj = json.loads(Path(cj).read_text())
    ec, m = cj["equal_compute"], cj["model"]
    task = cj.get("task")
    has_acc = all("val_acc" in s for s in cj["summary"].values())
    title = f"## Attention lab: `{cj['data']}` task at equal compute" if task else \
        "## Attention lab: from-scratch byte-level LMs at equal compute"
    unit = ("loss in nats per answer token, accuracy = share of answer tokens predicted (top-1), "
            "on held-out sequences") if task else "loss in nats/byte" + (", accuracy = next-byte top-1" if has_acc else "")
    lines = [
        title, "",
        f"Command: `{cj['command']}`" if cj.get("command") else "", "",
        f"Preset `{cj['preset']}` on `{cj['data']}`: {m['n_layer']} layers, d_model {m['d_model']}, {m['n_head']} heads, "
        f"context {ec['block_size']}, {ec['steps']} steps x {ec['batch_size']} windows "
        f"({ec['tokens_per_run']:,} tokens per run), seeds {cj['seeds']}; Elastic-Softmax tau_mode `{m['tau_mode']}`, "
        f"RoPE base {m['rope_base'] or _default_bases(cj['attentions'])}; "
        f"train s is wall-clock on a shared CPU. Mean ± std over seeds. Validation {unit}, "
        f"at 1x, 2x and 4x the training length. Sink mass = mean weight on the first (BOS) token over rows "
        f"i >= 1; uniform attention would give {cj['uniform_sink_mass']:.4f}. Sparsity = share of causal weights "
        f"exactly 0. Surviving mass = mean row sum of the weights.", "",
    ]
    if task:
        d = task["min_distance"]
        lines[-1:-1] = [f"Every answer lies at least {d['1x']} tokens (2x: {d['2x']}, 4x: {d['4x']}) before the "
                        f"query that needs it; {m['n_layer']} stacked windows of {m['window']} keys reach "
                        f"{task['sliding_reach']} tokens, so `sliding` is at chance by construction"
                        f"{'' if task['sliding_blind'] else ' (NOT the case here: the window reaches)'}.", ""]
    acc_head = "val acc | val acc 2x | val acc 4x | " if has_acc else ""
    lines += ["| attention | " + acc_head + "val loss | val loss 2x | val loss 4x | sink mass | sparsity | "
              "surviving mass | train s |", "|---|" + "---|" * (10 if has_acc else 7)]
    for name, s in cj["summary"].items():
        acc = "".join(f"{_fmt(s[k], 1, pct=True)} | " for k in ACC_KEYS) if has_acc else ""
        lines.append(f"| {name} | {acc}{_fmt(s['val_loss'])} | {_fmt(s['val_loss_2x'])} | {_fmt(s['val_loss_4x'])} | "
                     f"{_fmt(s['sink_mass'])} | {_fmt(s['sparsity'], 1, pct=True)} | {_fmt(s['surviving_mass'])} | "
                     f"{s['train_time_s']['mean']:.0f} |")
    n_layer = len(next(iter(cj["per_layer"].values()))["sink_mass"])
    lines += ["", "Per layer (mean over seeds), sink mass / sparsity:", "",
              "| attention | " + " | ".join(f"layer {i}" for i in range(n_layer)) + " |",
              "|---|" + "---|" * n_layer]
    for name, pl in cj["per_layer"].items():
        cells = [f"{sm:.3f} / {sp * 100:.1f}%" for sm, sp in zip(pl["sink_mass"], pl["sparsity"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    if all("sink_share" in pl for pl in cj["per_layer"].values()):
        u = cj["uniform_sink_mass"]
        lines += ["", f"Per layer (mean over seeds), like for like: sink share (the first token's share of the row's "
                      f"surviving mass, rows that keep nothing left out) / the largest head's share, both as multiples "
                      f"of the uniform {u:.4f}, and the share of rows that keep nothing:", "",
                  "| attention | " + " | ".join(f"layer {i}" for i in range(n_layer)) + " |",
                  "|---|" + "---|" * n_layer]
        for name, pl in cj["per_layer"].items():
            heads = [[statistics.fmean(v) for v in zip(*(r["per_head"]["sink_share"][li] for r in cj["runs"][name]))]
                     for li in range(n_layer)]
            cells = [f"{sh / u:.1f}x / {max(hs) / u:.1f}x / {er * 100:.1f}%"
                     for sh, hs, er in zip(pl["sink_share"], heads, pl["empty_rows"])]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    taus = {n: rs[0]["tau"] for n, rs in cj["runs"].items() if rs[0].get("tau")}
    if taus:
        lines += ["", "Learned tau (seed 0), per layer: min / mean / max over heads:", ""]
        for n, t in taus.items():
            lines.append(f"- {n}: " + "; ".join(f"L{i} {min(h):.2f}/{sum(h) / len(h):.2f}/{max(h):.2f}"
                                                for i, h in enumerate(t)))
    return "\n".join(lines) + "\n"


def _savefig(fig, path: Path) -> None:
    with _io.atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=120)


def plot_compare(cj: dict, out_dir: str | Path) -> list[Path]:
    plt = _io.pyplot()

    out = Path(out_dir)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, rs in cj["runs"].items():
        steps = [r["step"] for r in rs[0]["curve"]]
        loss = [statistics.fmean(c) for c in zip(*([r["loss"] for r in run["curve"]] for run in rs))]
        line, = ax.plot(steps, loss, label=f"{name} (train)", alpha=0.8)
        vs = [(r["step"], r["val_loss"]) for r in rs[0]["curve"] if "val_loss" in r]
        vals = [statistics.fmean(c) for c in zip(*([r["val_loss"] for r in run["curve"] if "val_loss" in r] for run in rs))]
        ax.plot([s for s, _ in vs], vals, "o--", color=line.get_color(), label=f"{name} (val)")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/byte)")
    ax.set_ylim(top=min(4.0, ax.get_ylim()[1]))
    ax.set_title(f"loss, mean over {len(cj['seeds'])} seeds")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    paths.append(out / "loss_curves.png")
    _savefig(fig, paths[-1])
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for name, pl in cj["per_layer"].items():
        xs = range(len(pl["sink_mass"]))
        axes[0].plot(xs, pl["sink_mass"], "o-", label=name)
        axes[1].plot(xs, [v * 100 for v in pl["sparsity"]], "o-", label=name)
    axes[0].axhline(cj["uniform_sink_mass"], color="gray", ls=":", label="uniform")
    axes[0].set(xlabel="layer", ylabel="sink mass (weight on BOS)", title="sink mass per layer")
    axes[1].set(xlabel="layer", ylabel="exact zeros (%)", title="sparsity per layer")
    for ax in axes:
        ax.set_xticks(list(range(len(next(iter(cj["per_layer"].values()))["sink_mass"]))))
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    paths.append(out / "attention_layers.png")
    _savefig(fig, paths[-1])
    plt.close(fig)
    return paths
