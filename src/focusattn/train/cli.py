"""``focusattn retrofit`` and ``focusattn report``."""
from __future__ import annotations

import argparse

from ..focus.config import BACKENDS, GATES, ROUTINGS, FocusConfig
from .retrofit import RetrofitConfig


def add_focus_args(p: argparse.ArgumentParser) -> None:
    d = FocusConfig()
    g = p.add_argument_group("Focus")
    g.add_argument("--groups", type=int, default=d.num_groups, help="K, number of groups")
    g.add_argument("--group-dim", type=int, default=d.group_dim, help="d_g, router projection size")
    g.add_argument("--window", type=int, default=d.window, help="w, local window that always attends")
    g.add_argument("--tau", type=float, default=d.tau)
    g.add_argument("--sinkhorn-iters", type=int, default=d.sinkhorn_iters)
    g.add_argument("--gate", choices=GATES, default=d.gate)
    g.add_argument("--lam", type=float, default=d.lam, help="gate sharpness lambda")
    g.add_argument("--gate-offset", type=float, default=d.gate_offset)
    g.add_argument("--routing", choices=ROUTINGS, default=d.routing)
    g.add_argument("--backend", choices=BACKENDS, default=d.backend, help="kernel for hard top-k")
    g.add_argument("--sink-tokens", type=int, default=d.sink_tokens,
                   help="first n tokens always visible (attention sinks); 0 = the paper's mask")


def focus_from_args(a) -> FocusConfig:
    return FocusConfig(num_groups=a.groups, group_dim=a.group_dim, window=a.window, tau=a.tau,
                       sinkhorn_iters=a.sinkhorn_iters, gate=a.gate, lam=a.lam, gate_offset=a.gate_offset,
                       routing=a.routing, backend=a.backend, sink_tokens=a.sink_tokens)


def _retrofit(a) -> int:
    from ..analysis.report import retrofit_table
    from .retrofit import retrofit

    cfg = RetrofitConfig(
        model=a.model, data=a.data, ood_data=None if a.ood_data == "none" else a.ood_data, out=a.out, steps=a.steps,
        seq_len=a.seq_len, batch_size=a.batch_size, grad_accum=a.grad_accum, lr=a.lr, warmup=a.warmup, seed=a.seed,
        eval_windows=a.eval_windows, ood_eval_windows=a.ood_eval_windows,
        eval_top_ks=tuple(int(x) for x in a.eval_top_k.split(",")) if a.eval_top_k else None,
        checkpoint_every=a.checkpoint_every, grad_checkpointing=a.grad_checkpointing, resume=a.resume,
        focus=focus_from_args(a),
    )
    summary = retrofit(cfg, command=a.command_line)
    print(retrofit_table(summary))
    print(f"\nwrote {a.out}/summary.json")
    return 0


def _report(a) -> int:
    if a.runs or a.html:  # one self-contained HTML page per run or comparison (analysis/html.py)
        from ..analysis.html import write_html

        if not a.runs:
            raise ValueError("--html needs one or more RUN_DIR folders")
        print(f"wrote {write_html(a.runs, a.html or f'{a.runs[0]}/report.html')}")
        return 0
    from ..analysis.results import write_results

    path = write_results(a.results, a.out)
    print(f"wrote {path}")
    return 0


def register(sub) -> None:
    d = RetrofitConfig()
    p = sub.add_parser("retrofit", help="train Focus routers on a frozen pretrained LM and evaluate before/after",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=d.model, help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--data", default=d.data, help="shakespeare | lee-news | hf:<dataset> | path to .txt file/folder")
    p.add_argument("--ood-data", default=d.ood_data, help="second corpus for the out-of-domain check ('none' = skip)")
    p.add_argument("--out", default=d.out)
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--grad-accum", type=int, default=d.grad_accum)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--warmup", type=int, default=d.warmup)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--eval-windows", type=int, default=d.eval_windows, help="validation windows of --seq-len")
    p.add_argument("--ood-eval-windows", type=int, default=d.ood_eval_windows)
    p.add_argument("--eval-top-k", default="", help="comma list of hard top-k to evaluate (default 1..K/2: above K/2 every pair shares a group)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every)
    p.add_argument("--grad-checkpointing", action="store_true", help="activation checkpointing for long sequences")
    p.add_argument("--resume", action="store_true", help="continue from OUT/checkpoint.pt")
    add_focus_args(p)
    p.set_defaults(func=_retrofit)

    r = sub.add_parser("report", help="docs/RESULTS.md from the result JSON files, or an HTML page of run folders",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    r.add_argument("--results", default="docs/results", help="folder with retrofit_*.json, bench.json, compare.json ...")
    r.add_argument("--out", default="docs/RESULTS.md")
    r.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run folders: write one HTML page instead (see --html)")
    r.add_argument("--html", default=None, help="HTML output for RUN_DIR... (default RUN_DIR/report.html)")
    r.set_defaults(func=_report)
    register_sinks(sub)
    register_groups(sub)


def _sinks(a) -> int:
    from ..eval.sinks import render_markdown, run_sink_probe

    res = run_sink_probe(a.model, a.data, a.out, seq_len=a.seq_len, windows=a.windows, window=a.window,
                         groups=a.groups, sink=a.sink_tokens, command=a.command_line)
    print(render_markdown(res))
    return 0


def register_sinks(sub) -> None:
    p = sub.add_parser("sinks", help="attention-sink mass of a pretrained model and perplexity under fixed masks",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--data", default="shakespeare")
    p.add_argument("--out", default="runs/sinks")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--windows", type=int, default=4)
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--sink-tokens", type=int, default=1)
    p.set_defaults(func=_sinks)


def _groups(a) -> int:
    import json
    from pathlib import Path

    from .._io import write_json
    from ..analysis.groups import groups_report

    res = groups_report(a.model, a.adapter, a.data, seq_len=a.seq_len, windows=a.windows,
                        top_ks=[int(x) for x in a.top_k.split(",") if x], layers=[int(x) for x in a.layers.split(",")
                                                                                 if x], command=a.command_line)
    write_json(Path(a.out) / "groups.json", res)
    if a.update_summary:  # add the measured pair shares to a retrofit summary made before they were recorded
        p = Path(a.update_summary)
        summary = json.loads(p.read_text())
        summary["pairs_kept"] = res["pairs_kept"]
        summary["pairs_kept_command"] = a.command_line
        write_json(p, summary)
    print("causal pairs kept: " + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in res["pairs_kept"].items()))
    for layer, groups in res["top_tokens"].items():
        print(f"layer {layer}:")
        for gi, toks in enumerate(groups):
            print(f"  G{gi}: " + " ".join(f"{t!r}x{c}" for t, c in toks))
    print(f"wrote {a.out}/groups.json")
    return 0


def register_groups(sub) -> None:
    p = sub.add_parser("groups", help="routing statistics of a saved adapter: dominance, pairs kept, tokens per group",
                       formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", required=True, help="folder written by retrofit (OUT/adapter)")
    p.add_argument("--data", default="shakespeare")
    p.add_argument("--out", default="runs/groups")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--windows", type=int, default=2)
    p.add_argument("--top-k", default="", help="comma list (default 1..K/2)")
    p.add_argument("--layers", default="", help="layers whose tokens per group are listed (default first/middle/last)")
    p.add_argument("--update-summary", default="", help="retrofit summary.json to add pairs_kept to")
    p.set_defaults(func=_groups)
