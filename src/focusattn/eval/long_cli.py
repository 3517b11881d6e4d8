"""``focusattn long-eval``: long-context quality of an adapter vs the original model and the sparse baselines."""
from __future__ import annotations


def _ints(values) -> tuple[int, ...]:
    return tuple(int(x) for v in values for x in str(v).split(",") if x)


def register(sub) -> None:
    p = sub.add_parser("long-eval", help="perplexity, repeat-copy and passkey at long context: original vs Focus "
                       "(soft, top-k) vs sliding-window / random-group / untrained-router baselines at the same budget")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--adapter", required=True, help="shipped adapter name or adapter folder")
    p.add_argument("--lengths", nargs="+", default=["2048", "4096", "8192"])
    p.add_argument("--top-k", nargs="+", default=["1", "2"])
    p.add_argument("--baselines", default="sliding,random,untrained", help="comma list, '' for none")
    p.add_argument("--no-soft", action="store_true", help="skip the soft gate")
    p.add_argument("--data", default="shakespeare")
    p.add_argument("--ood-data", default="lee-news", help="'none' to skip; also the passkey/repeat filler")
    p.add_argument("--ppl-windows", type=int, default=4)
    p.add_argument("--ppl-max-len", type=int, default=2048, help="perplexity only at lengths up to this")
    p.add_argument("--passkey-per-depth", type=int, default=1)
    p.add_argument("--repeat-n", type=int, default=2)
    p.add_argument("--variants", default="", help="comma list of variants to keep, e.g. original,top1,sliding@top1 "
                   "(default: all)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rebalance", type=int, default=None,
                   help="override the adapter's online rebalancing interval (tokens; 0 = off)")
    p.add_argument("--out", required=True)
    p.set_defaults(func=_run)


def _run(a) -> int:
    from .longctx import run_long_eval

    doc = run_long_eval(a.out, model=a.model, adapter=a.adapter, lengths=_ints(a.lengths), top_ks=_ints(a.top_k),
                        soft=not a.no_soft, baselines=tuple(b for b in a.baselines.split(",") if b), data=a.data,
                        ood_data=None if a.ood_data == "none" else a.ood_data, ppl_windows=a.ppl_windows,
                        ppl_max_len=a.ppl_max_len, passkey_per_depth=a.passkey_per_depth, repeat_n=a.repeat_n,
                        variants=tuple(v for v in a.variants.split(",") if v) or None, threads=a.threads, rebalance=a.rebalance, command=getattr(a, "command_line", None))
    print(f"wrote {a.out}/long_eval.json ({len(doc['results'])} rows)")
    return 0
