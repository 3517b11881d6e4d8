"""``focusattn eval``: lm-evaluation-harness on the original and the Focus-composed model, side by side."""
from __future__ import annotations

from .._cli_common import HelpFormatter, set_threads


def _eval(a) -> int:
    import logging

    from .lm_eval_bridge import run_eval

    if not a.verbose:  # lm-eval logs a warning per task and per in-memory model; -v shows them
        logging.getLogger("lm_eval").setLevel(logging.ERROR)
    set_threads(a.threads)
    res = run_eval(a.model, a.tasks, a.out, adapter=a.adapter, top_k=a.top_k, limit=a.limit,
                   batch_size=a.batch_size, num_fewshot=a.num_fewshot, bootstrap_iters=a.bootstrap_iters,
                   seed=a.seed, command=a.command_line)
    from .lm_eval_bridge import render_markdown

    print(render_markdown(res))
    print(f"wrote {a.out}/eval.json and {a.out}/eval.md")
    return 0


def _lazy_probe(a) -> int:
    from .lazy_probe import run_lazy_probe

    set_threads(a.threads)
    doc = run_lazy_probe(a.out, model=a.model, data=a.data, ood_data=None if a.ood_data == "none" else a.ood_data,
                         taus=[float(x) for x in a.taus.split(",") if x.strip()],
                         adapters=[x for x in a.adapters.split(",") if x.strip()],
                         lengths=[int(x) for x in a.lengths.split(",")], ppl_windows=a.ppl_windows,
                         stat_windows=a.stat_windows, command=a.command_line, progress=not a.no_progress)
    for row in doc["points"]:
        for r in row["rows"]:
            att = r["attention"]
            print(f"{row['point']:>14} T={r['T']}: ppl " + ", ".join(f"{k[4:]} {v:.3f}" for k, v in r.items()
                                                                    if k.startswith("ppl_"))
                  + f"; zeros {att['mean']['sparsity']:.1%}, first-token share "
                  f"{max(att['per_layer']['sink_share']) / att['uniform_sink_mass']:.1f}x uniform (largest layer)")
    print(f"wrote {a.out}/lazy_probe.json")
    return 0


def register(sub) -> None:
    q = sub.add_parser("lazy-probe", help="Elastic-Softmax on a pretrained model: perplexity, first-token share, "
                       "exact zeros and zero tiles over tau (training-free) and for trained Lazy adapters",
                       formatter_class=HelpFormatter)
    q.add_argument("--model", default="smollm2-135m", help="alias (smollm2-135m), hub id, or local folder")
    q.add_argument("--data", default="shakespeare", help="in-domain corpus (perplexity and the attention statistics)")
    q.add_argument("--ood-data", default="lee-news", help="out-of-domain corpus for perplexity ('none' = skip)")
    q.add_argument("--taus", default="0.5,1,2,4", help="comma list of fixed thresholds tau > 0 (tau = 0, the "
                   "original, is always measured)")
    q.add_argument("--adapters", default="", help="comma list of Lazy adapter folders (retrofit --method lazy)")
    q.add_argument("--lengths", default="512,2048", help="comma list of window lengths")
    q.add_argument("--ppl-windows", type=int, default=4, help="perplexity windows per split and length")
    q.add_argument("--stat-windows", type=int, default=1, help="windows for the dense attention statistics")
    q.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    q.add_argument("--out", default="runs/lazy-probe", help="folder for lazy_probe.json")
    q.add_argument("--no-progress", action="store_true", help="no progress bars")
    q.set_defaults(func=_lazy_probe)

    p = sub.add_parser("eval", help="lm-eval benchmarks: the original model vs Focus (soft, top-k), side by side",
                       formatter_class=HelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--adapter", default=None,
                   help="Focus adapter folder (RUN/adapter, or a retrofit RUN folder), a LoRA (peft) one from "
                   "`retrofit --method lora`, or a Lazy one from `retrofit --method lazy`; without it only the "
                   "original")
    p.add_argument("--tasks", default="offline",
                   help="comma list: 'offline' (shipped, no network) or its tasks, or lm-eval hub task names")
    p.add_argument("--limit", default=None, help="documents per task (an integer, or a fraction < 1)")
    p.add_argument("--top-k", default="soft,1,2", help="Focus modes to evaluate: comma list of 'soft' and k "
                   "(1..K of the adapter)")
    p.add_argument("--batch-size", type=int, default=1, help="sequences per forward (lm-eval's batch size)")
    p.add_argument("--num-fewshot", type=int, default=None, help="few-shot examples per prompt (default: the task's)")
    p.add_argument("--bootstrap-iters", type=int, default=1000, help="lm-eval bootstrap for non-mean stderrs")
    p.add_argument("--seed", type=int, default=0, help="seed of lm-eval's sampling and few-shot choice")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    p.add_argument("--out", default="runs/eval", help="folder for eval.json and eval.md")
    p.set_defaults(func=_eval)
