"""Subcommands ``train-lm``, ``compare`` and ``bench-lazy``; ``register(subparsers)`` adds them to the main CLI.

Handlers parse, call and print; they return an exit code (0 ok, 2 bad usage/state). ``python -m focusattn.gpt.cli``
runs them standalone.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace

from .._cli_common import HelpFormatter
from .._errors import cli_message
from ..lazy.bench import run_lazy_bench
from ..train import dist
from ..lazy.config import TAU_MODES
from .compare import render_markdown, run_compare
from .config import ATTENTIONS, PRESETS, get_preset
from .train import train_lm


def _model_overrides(args) -> dict:
    o = {}
    if args.rope_base is not None:
        o["rope_base"] = args.rope_base
    if args.tau_mode is not None:
        o["tau_mode"] = args.tau_mode
    return o


def _add_common(p):
    p.add_argument("--data", default="shakespeare", help="corpus name (see focusattn.data.corpora), or a task: mqar, passkey "
                   "(settings as mqar:pairs=8,keys=64,values=64 / passkey:digits=5,min_gap=32; see gpt/tasks.py)")
    p.add_argument("--preset", default="lab", choices=sorted(PRESETS), help="model/training preset")
    p.add_argument("--steps", type=int, default=None, help="override the preset's training steps")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (preset default otherwise)")
    p.add_argument("--rope-base", type=float, default=None, help="override the variant's RoPE base")
    p.add_argument("--tau-mode", choices=TAU_MODES, default=None, help="Elastic-Softmax tau parameterisation")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (logs to files only)")


def _train_handler(args) -> int:
    try:
        mcfg, tcfg = get_preset(args.preset, args.attention, **_model_overrides(args))
        over = {"steps": args.steps, "threads": args.threads, "batch_size": args.batch_size,
                "checkpoint_every": args.checkpoint_every}
        tcfg = replace(tcfg, **{k: v for k, v in over.items() if v is not None})
        res = train_lm(mcfg, tcfg, data=args.data, seed=args.seed, out_dir=args.out, resume=args.resume,
                       stop_at=args.stop_at, progress=not args.no_progress, fsdp=args.fsdp)
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"error: {cli_message(e)}", file=sys.stderr)
        return 2
    if not dist.is_main():
        return 0
    if "stopped_at" in res:
        print(f"stopped after step {res['stopped_at']}; continue with --resume")
        return 0
    att = res["attention"]["mean"]
    by_len = res["val_loss_by_length"]
    acc = res["val_acc_by_length"]
    print(f"{args.attention}: val loss {by_len['1x']:.4f} (2x {by_len['2x']:.4f}, 4x {by_len['4x']:.4f}); "
          f"val acc {acc['1x']:.2%} (2x {acc['2x']:.2%}, 4x {acc['4x']:.2%}); "
          f"sink mass {att['sink_mass']:.4f}, sparsity {att['sparsity']:.2%}, surviving mass {att['surviving_mass']:.3f}"
          f" -> {args.out}/result.json")
    return 0


def _compare_handler(args) -> int:
    names = [a.strip() for a in args.attention.split(",") if a.strip()]
    try:
        res = run_compare(names, args.seeds, args.preset, args.out, data=args.data, steps=args.steps,
                          threads=args.threads,
                          command=getattr(args, "command_line", None) or "focusattn " + shlex.join(sys.argv[1:]),
                          progress=not args.no_progress, model_overrides=_model_overrides(args))
    except (ValueError, FileExistsError, FileNotFoundError) as e:
        print(f"error: {cli_message(e)}", file=sys.stderr)
        return 2
    print(render_markdown(res))
    return 0


def _bench_handler(args) -> int:
    try:
        res = run_lazy_bench(args.out, T=args.T, B=args.B, H=args.H, D=args.D, W=args.W, block=args.block,
                             reps=args.reps, backward=not args.forward_only, threads=args.threads,
                             command=getattr(args, "command_line", None))
    except ValueError as e:
        print(f"error: {cli_message(e)}", file=sys.stderr)
        return 2
    for mode, r in res["results"].items():
        print(f"{mode}: lazy {r['lazy_median_s'] * 1e3:.1f} ms vs SDPA {r['sdpa_median_s'] * 1e3:.1f} ms "
              f"-> {r['ratio']:.2f}x (target <= {res['target_ratio']}x)")
    print(f"-> {args.out}/lazy_bench.json")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("train-lm", help="train the from-scratch lab LM with a chosen attention",
                              formatter_class=HelpFormatter)
    p.add_argument("--attention", required=True, choices=ATTENTIONS, help="the attention the model trains with")
    p.add_argument("--seed", type=int, default=0, help="seed of initialisation and data order")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--stop-at", type=int, default=None, help="checkpoint and stop after this step (resume later)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per step and process (preset's otherwise; the global batch is processes x this)")
    p.add_argument("--checkpoint-every", type=int, default=None, help="override the preset's checkpoint interval")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard the model with FSDP2 (for models that do not fit one device)")
    _add_common(p)
    p.set_defaults(func=_train_handler)

    p = subparsers.add_parser("compare", help="train several attentions x seeds at equal compute; table + plots",
                              formatter_class=HelpFormatter)
    p.add_argument("--attention", default="standard,lazy,focus",
                   help=f"comma-separated, from: {','.join(ATTENTIONS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per attention")
    _add_common(p)
    p.set_defaults(func=_compare_handler)

    p = subparsers.add_parser("bench-lazy", help="time the chunked Lazy kernel against causal SDPA",
                              formatter_class=HelpFormatter)
    p.add_argument("--T", type=int, default=4096, help="sequence length")
    p.add_argument("--B", type=int, default=1, help="batch size")
    p.add_argument("--H", type=int, default=8, help="attention heads")
    p.add_argument("--D", type=int, default=64, help="head dimension")
    p.add_argument("--W", type=int, default=1024, help="bias table width")
    p.add_argument("--block", type=int, default=64, help="query block of the chunked kernel")
    p.add_argument("--reps", type=int, default=5, help="timed repeats (the median is reported)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    p.add_argument("--forward-only", action="store_true", help="time the forward alone (default: forward + backward)")
    p.add_argument("--out", required=True, help="folder for lazy_bench.json")
    p.set_defaults(func=_bench_handler)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="focusattn")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
