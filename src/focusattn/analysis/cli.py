"""``focusattn report``, ``groups`` and ``sinks``: commands that measure a saved run or model and render a report."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .._cli_common import HelpFormatter, ints, set_threads
from .._errors import InputError
from .._io import write_json, write_text
from ..focus.config import KEY_SCORES
from ..eval.sinks import render_markdown as sinks_markdown
from ..eval.sinks import run_sink_probe
from .groups import groups_report
from .groups import render_markdown as groups_markdown
from .results import write_results


class _Deprecated(argparse.Action):
    """A hidden old spelling of a renamed flag: stores into the new ``dest`` and says so once."""

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"note: {option_string} is deprecated, use {self.metavar}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_eval_windows(p: argparse.ArgumentParser, default: int) -> None:
    """``--eval-windows`` (number of evaluation windows; ``--windows`` is its old, hidden spelling, easily confused
    with ``--window``, the attention window)."""
    p.add_argument("--eval-windows", type=int, default=default, help="number of evaluation windows of --seq-len")
    p.add_argument("--windows", type=int, dest="eval_windows", action=_Deprecated, metavar="--eval-windows",
                   default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _report(a) -> int:
    if a.runs or a.html:  # one self-contained HTML page per run or comparison (analysis/html.py)
        from .html import write_html

        if not a.runs:
            raise ValueError("--html needs one or more RUN_DIR folders")
        print(f"wrote {write_html(a.runs, a.html or f'{a.runs[0]}/report.html')}")
        return 0
    path = write_results(a.results, a.out)
    print(f"wrote {path}")
    return 0


def _collapse(a) -> int:
    from .collapse import render_markdown as collapse_markdown
    from .collapse import write_collapse

    runs = {}
    for spec in a.runs:
        name, sep, run = spec.partition("=")
        if not sep or not name or not run:
            raise ValueError(f"run {spec!r}: expected NAME=RUN_DIR (e.g. softmax=runs/ablation/softmax)")
        runs[name] = run
    doc = write_collapse(runs, a.out, every=a.every, command=a.command_line)
    print(collapse_markdown(doc))
    print(f"wrote {a.out} and {Path(a.out).with_suffix('.png')}")
    return 0


def _ship(a) -> int:
    from .model_card import derive_adapter, derive_key_adapter, refresh_card, ship_adapter, ship_key_adapter

    if a.refresh_card:
        out = refresh_card(a.name or a.run, long_eval=a.long_eval, model_bench=a.model_bench)
        print(f"wrote {out / 'README.md'} (measured tables re-rendered; tensors and config unchanged)")
        return 0
    if not a.name:
        raise InputError("name", "", "required: the shipped name, e.g. smollm2-135m-focus-k8")
    fitted = _fitted_keys(a.run)  # a `fit-keys` folder: centroids, served at a budget
    if fitted or _key_space(a.run) or any(x is not None for x in (a.budget, a.key_scores, a.union_block,
                                                                  a.min_keys)):
        if a.rebalance is not None or a.rebalance_warm or a.capacity is not None or (
                fitted and a.dense_heads is not None):
            raise InputError("run", a.run, "a key-space adapter ships with no rebalancing or cap (and a fit with "
                             "its own dense heads): allowed --budget, --key-scores, --union-block, --min-keys, "
                             "--dense-heads (a shipped key-space adapter again), --long-eval, --model-bench")
        kw = {} if fitted else {"dense_heads": a.dense_heads}
        ship = ship_key_adapter if fitted else derive_key_adapter
        out = ship(a.run, a.name, budget=a.budget, key_scores=a.key_scores, union_block=a.union_block,
                   min_keys=a.min_keys, long_eval=a.long_eval, model_bench=a.model_bench, **kw)
        print(f"wrote {out} (adapter + README.md model card)")
        return 0
    if a.dense_heads is not None and not (Path(a.run) / "summary.json").is_file():  # another adapter's routers
        if a.rebalance is not None or a.rebalance_warm or a.capacity is not None:
            raise InputError("run", a.run, "--rebalance/--rebalance-warm/--capacity need a retrofit folder "
                             "(summary.json); "
                             "another adapter's routers are shipped with their own rebalancing")
        out = derive_adapter(a.run, a.name, dense_heads=a.dense_heads, long_eval=a.long_eval,
                             model_bench=a.model_bench)
        print(f"wrote {out} (adapter + README.md model card)")
        return 0
    out = ship_adapter(a.run, a.name, long_eval=a.long_eval, model_bench=a.model_bench, rebalance=a.rebalance,
                       rebalance_warm=a.rebalance_warm, capacity=a.capacity, dense_heads=a.dense_heads,
                       first_phase=a.first_phase)
    print(f"wrote {out} (adapter + README.md model card)")
    return 0


def _key_space(run: str) -> bool:
    """``run`` names a key-space adapter (``router_input="keys"``), shipped or a folder."""
    from ..adapters import resolve
    from ..hf.io import read_adapter_config

    try:
        return read_adapter_config(resolve(run))["focus_config"].get("router_input") == "keys"
    except ValueError:
        return False


def _fitted_keys(run: str) -> bool:
    """A ``focusattn fit-keys --out`` folder: its summary records the fit (``fit_seconds``)."""
    p = Path(run) / "summary.json"
    try:
        return p.is_file() and "fit_seconds" in json.loads(p.read_text())
    except ValueError:
        return False


def _sinks(a) -> int:
    set_threads(a.threads)
    res = run_sink_probe(a.model, a.data, a.out, seq_len=a.seq_len, windows=a.eval_windows, window=a.window,
                         groups=a.groups, sink=a.sink_tokens, command=a.command_line)
    print(sinks_markdown(res))
    return 0


def _summary_path(spec: str) -> Path:
    """``--update-summary``: a summary.json or a retrofit run folder; checked before any work."""
    p = Path(spec)
    p = p / "summary.json" if p.is_dir() else p
    if not p.is_file():
        raise ValueError(f"--update-summary {spec}: missing {p.name} (written by `focusattn retrofit --out RUN`)")
    return p


def _groups(a) -> int:
    summary_path = _summary_path(a.update_summary) if a.update_summary else None
    set_threads(a.threads)
    res = groups_report(a.model, a.adapter, a.data, seq_len=a.seq_len, windows=a.eval_windows,
                        top_ks=list(ints(a.top_k, "top_k")), layers=list(ints(a.layers, "layers")),
                        compare=a.compare or None, roles=list(ints(a.key_top_k, "key_top_k")),
                        per_group=a.per_group, examples=a.examples, command=a.command_line)
    write_json(Path(a.out) / "groups.json", res)
    write_text(Path(a.out) / "groups.md", groups_markdown(res) + "\n")
    if summary_path:  # add the measured pair shares to a retrofit summary made before they were recorded
        p = summary_path
        summary = json.loads(p.read_text())
        summary["pairs_kept"] = res["pairs_kept"]
        summary["pairs_kept_command"] = a.command_line
        write_json(p, summary)
    print("causal pairs kept: " + ", ".join(f"{k}: {100 * v:.1f}%" for k, v in res["pairs_kept"].items()))
    print("distant attention dropped: " + ", ".join(f"{k}: {100 * m['dropped_distant']:.1f}%"
                                                   for k, m in res["recall"]["overall"]["masks"].items()))
    for layer, rows in res["tables"].items():
        print(f"layer {layer}:")
        for r in rows:
            pur = "-" if r["purity"] is None else f"{r['purity']:.2f}"
            print(f"  G{r['group']} share {r['share']:.3f} purity {pur}: "
                  + " ".join(f"{t['token']!r}x{t['count']}" for t in r["tokens"]))
    for layer, x in res.get("stability", {}).items():
        print(f"stability layer {layer}: same group {x['same_index']:.3f}, after relabelling {x['matched']:.3f}")
    print(f"wrote {a.out}/groups.json and {a.out}/groups.md")
    return 0


def register(sub) -> None:
    fmt = HelpFormatter
    r = sub.add_parser("report", help="regenerate docs/RESULTS.md from the result JSON files", formatter_class=fmt)
    r.add_argument("--results", default="docs/results", help="folder with retrofit_*.json, bench.json, compare.json ...")
    r.add_argument("--out", default="docs/RESULTS.md", help="the Markdown report to write")
    r.add_argument("runs", nargs="*", metavar="RUN_DIR", help="run folders: write one HTML page instead (see --html)")
    r.add_argument("--html", default=None, help="HTML output for RUN_DIR... (default RUN_DIR/report.html)")
    r.set_defaults(func=_report)

    s = sub.add_parser("ship-adapter", help="copy a run's adapter into the package (focusattn/adapters/NAME) with a "
                       "model card, so fa.load_adapter(model, NAME) finds it", formatter_class=fmt)
    s.add_argument("run", help="a `focusattn retrofit --out` folder (with --dense-heads: any adapter, e.g. a shipped "
                   "one's name)")
    s.add_argument("--name", default=None, help="e.g. smollm2-135m-focus-k8 (required unless --refresh-card)")
    s.add_argument("--long-eval", nargs="+", default=None,
                   help="long_eval.json of this adapter (`focusattn long-eval`); several merge their rows (e.g. a "
                   "re-measured baseline beside the adapter's run)")
    s.add_argument("--model-bench", default=None, help="model_bench.json of this adapter (`focusattn bench-model`)")
    s.add_argument("--rebalance", type=int, default=None,
                   help="ship with this online-rebalancing interval in tokens (inference setting; 0 = off)")
    s.add_argument("--rebalance-warm", action="store_true", default=None,
                   help="ship with warm-started online rebalancing (FocusConfig.rebalance_warm; inference setting)")
    s.add_argument("--capacity", type=float, default=None,
                   help="ship with this group-size cap at hard top-k, a multiple of the balanced share "
                        "(FocusConfig.capacity; inference setting; 0 = off)")
    s.add_argument("--budget", type=float, default=None,
                   help="a `fit-keys` folder or a key-space adapter: ship it served at this share of each query's "
                        "distant keys (FocusConfig.budget, in (0, 1]; default: the budget it was fitted with)")
    s.add_argument("--key-scores", default=None, choices=KEY_SCORES,
                   help="a `fit-keys` folder or a key-space adapter: ship it with queries ranking groups by these "
                        "(FocusConfig.key_scores; default: the one it was saved with)")
    s.add_argument("--union-block", type=int, default=None,
                   help="a `fit-keys` folder or a key-space adapter: ship it with each query also keeping the groups "
                        "its block's earlier queries and the block before joined (FocusConfig.union_block; 64 = the "
                        "keyed engine's block)")
    s.add_argument("--min-keys", type=int, default=None,
                   help="a `fit-keys` folder or a key-space adapter: ship it with a floor under each query's budget, "
                        "at least N of its distant keys (FocusConfig.min_keys)")
    s.add_argument("--first-phase", default=None,
                   help="the retrofit folder RUN continued from (--init-adapter): its command goes on the card too")
    s.add_argument("--dense-heads", default=None,
                   help="ship with these dense heads (FocusConfig.dense_heads; RUN a retrofit folder, or any adapter "
                        "whose routers are shipped again under NAME): "
                        "'induction:N', 'duplicate:M', 'induction:N+duplicate:M' (scored on the model) or "
                        "'layer:kv_head,...'")
    s.add_argument("--refresh-card", action="store_true",
                   help="RUN is a shipped adapter's name: only re-render its card's measured tables from "
                        "--long-eval / --model-bench (after a re-measurement; tensors and config unchanged)")
    s.set_defaults(func=_ship)

    p = sub.add_parser("sinks", help="attention-sink mass of a pretrained model and perplexity under fixed masks",
                       formatter_class=fmt)
    p.add_argument("--model", default="smollm2-135m", help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--data", default="shakespeare", help="held-out text: the validation split of this corpus")
    p.add_argument("--out", default="runs/sinks", help="folder for sinks.json, sinks.md and the plot")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per evaluation window (at most the model's "
                   "positions)")
    add_eval_windows(p, 4)
    p.add_argument("--window", type=int, default=128, help="w, the Focus window of the fixed masks")
    p.add_argument("--groups", type=int, default=8, help="K, random balanced groups of the grouped masks")
    p.add_argument("--sink-tokens", type=int, default=1, help="first n tokens the '+ first n' masks keep visible")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    p.set_defaults(func=_sinks)

    p = sub.add_parser("groups", help="routing statistics of a saved adapter: dominance, pairs kept, tokens per group",
                       formatter_class=fmt)
    p.add_argument("--model", default="smollm2-135m", help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--adapter", required=True,
                   help="shipped adapter name, or a folder written by retrofit (OUT/adapter or OUT)")
    p.add_argument("--data", default="shakespeare", help="held-out text: the validation split of this corpus")
    p.add_argument("--out", default="runs/groups", help="folder for groups.json and groups.md")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per window (at most the model's positions)")
    add_eval_windows(p, 2)
    p.add_argument("--top-k", default="", help="comma list (default 1..K/2)")
    p.add_argument("--key-top-k", default="", help="comma list of key top-ks served with query top-1 (query and key "
                   "roles): pairs kept as top1key<k> (default none)")
    p.add_argument("--layers", default="", help="layers whose tokens per group are listed (default first/middle/last)")
    p.add_argument("--update-summary", default="", help="retrofit summary.json (or its run folder) to add pairs_kept to")
    p.add_argument("--compare", default="", help="a second adapter, or a retrofit checkpoint.pt: stability of each "
                   "token's group between the two")
    p.add_argument("--per-group", type=int, default=8, help="most frequent tokens listed per group")
    p.add_argument("--examples", type=int, default=3, help="examples in context per group")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    p.set_defaults(func=_groups)

    p = sub.add_parser("collapse", help="the collapse ablation: largest-group share vs step of retrofit runs (JSON "
                       "for RESULTS + plot)", formatter_class=fmt)
    p.add_argument("runs", nargs="+", metavar="NAME=RUN_DIR", help="e.g. softmax=runs/ablation/softmax")
    p.add_argument("--out", default="runs/ablation/collapse.json", help="JSON; the plot goes beside it (.png)")
    p.add_argument("--every", type=int, default=1, help="keep every N-th step of the curves")
    p.set_defaults(func=_collapse)
