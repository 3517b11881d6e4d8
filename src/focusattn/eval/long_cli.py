"""``focusattn long-eval``: long-context quality of an adapter vs the original model and the sparse baselines."""
from __future__ import annotations

from .._cli_common import HelpFormatter, add_serve_overrides, serve_overrides


def _ints(values) -> tuple[int, ...]:
    return tuple(int(x) for v in values for x in str(v).split(",") if x)


def register(sub) -> None:
    p = sub.add_parser("long-eval", help="perplexity, repeat-copy, passkey and attention recall at long context: "
                       "original vs Focus (soft, top-k) vs training-free baselines at the same budget",
                       formatter_class=HelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--adapter", required=True, help="shipped adapter name or adapter folder")
    p.add_argument("--lengths", nargs="+", default=["2048", "4096", "8192"], help="sequence lengths to evaluate")
    p.add_argument("--top-k", nargs="+", default=["1", "2"], help="hard top-k routings to evaluate")
    p.add_argument("--baselines", default="sliding,duo,random,untrained,kmeans,oracle",
                   help="comma list of baselines at the adapter's budget ('' for none): sliding (window + sink), "
                        "duo (the adapter's dense heads, window + sink elsewhere; only with dense heads), "
                        "random (groups), untrained (router), kmeans (keys, ClusterKV-style), oracle (the most "
                        "attended distant keys, as many per query as top-k keeps)")
    p.add_argument("--no-soft", action="store_true", help="skip the soft gate")
    p.add_argument("--data", default="shakespeare", help="in-domain corpus (held-out split)")
    p.add_argument("--ood-data", default="lee-news", help="'none' to skip; also the passkey/repeat filler")
    p.add_argument("--ppl-windows", type=int, default=4, help="perplexity windows per split and length")
    p.add_argument("--ppl-max-len", type=int, default=2048, help="perplexity only at lengths up to this")
    p.add_argument("--passkey-per-depth", type=int, default=1, help="passkey trials at each of 3 depths")
    p.add_argument("--repeat-n", type=int, default=2, help="repeat-copy sequences per length")
    p.add_argument("--variants", default="", help="comma list of variants to keep, e.g. original,top1,sliding@top1 "
                   "(default: all)")
    p.add_argument("--recall-windows", type=int, default=0,
                   help="attention recall: the share of the original model's distant attention each mask drops, "
                        "per layer and head, on this many held-out windows per split and length (0 = off)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add_serve_overrides(p)
    p.add_argument("--out", required=True, help="folder for long_eval.json")
    p.set_defaults(func=_run)


def _run(a) -> int:
    from .._cli_common import check_long_eval
    from ..adapters import resolve
    from ..hf.lazy import is_lazy_adapter
    from .longctx import run_long_eval

    try:
        lazy = is_lazy_adapter(resolve(a.adapter))
    except ValueError:
        lazy = False  # an unknown adapter: run_long_eval's own one-line error
    if lazy:  # Elastic-Softmax: the original and the adapter, no top-k or budget baselines
        from .long_lazy import run_long_eval_lazy

        doc = run_long_eval_lazy(a.out, model=a.model, adapter=a.adapter, lengths=_ints(a.lengths), data=a.data,
                                 ood_data=None if a.ood_data == "none" else a.ood_data, ppl_windows=a.ppl_windows,
                                 ppl_max_len=a.ppl_max_len, passkey_per_depth=a.passkey_per_depth,
                                 repeat_n=a.repeat_n, threads=a.threads, command=getattr(a, "command_line", None))
        print(f"wrote {a.out}/long_eval.json ({len(doc['results'])} rows)")
        return 0

    baselines, variants = check_long_eval(top_ks=a.top_k, baselines=a.baselines, variants=a.variants,
                                          soft=not a.no_soft)
    doc = run_long_eval(a.out, model=a.model, adapter=a.adapter, lengths=_ints(a.lengths), top_ks=_ints(a.top_k),
                        soft=not a.no_soft, baselines=baselines, data=a.data,
                        ood_data=None if a.ood_data == "none" else a.ood_data, ppl_windows=a.ppl_windows,
                        ppl_max_len=a.ppl_max_len, passkey_per_depth=a.passkey_per_depth, repeat_n=a.repeat_n,
                        variants=variants, threads=a.threads, recall_windows=a.recall_windows, **serve_overrides(a),
                        command=getattr(a, "command_line", None))
    print(f"wrote {a.out}/long_eval.json ({len(doc['results'])} rows)")
    return 0
