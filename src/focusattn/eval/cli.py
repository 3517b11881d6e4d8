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


def register(sub) -> None:
    p = sub.add_parser("eval", help="lm-eval benchmarks: the original model vs Focus (soft, top-k), side by side",
                       formatter_class=HelpFormatter)
    p.add_argument("--model", default="smollm2-135m", help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--adapter", default=None,
                   help="Focus adapter folder (RUN/adapter, or a retrofit RUN folder), or a LoRA (peft) one from "
                   "`retrofit --method lora`; without it only the original")
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
