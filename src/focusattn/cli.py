"""``focusattn`` command line: parse, call the library, print. No logic of its own."""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import sys

from ._cli_common import check_shared
from ._errors import cli_message
from ._io import os_error_message
from .analysis import cli as analysis_cli
from .bench import cli as bench_cli
from .gpt import cli as gpt_cli
from .train import cli as train_cli
from .train import dist

# Subcommand modules: each exposes ``register(subparsers)`` and sets ``func`` (args -> exit code) on its parser.
from .eval import cli as eval_cli
from .eval import long_cli as long_eval_cli

COMMANDS = [train_cli, analysis_cli, bench_cli, gpt_cli, eval_cli, long_eval_cli]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="focusattn", description=__doc__)
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    for mod in COMMANDS:
        mod.register(sub)
    return p


# Arguments whose path a command writes into its results (``"adapter": str(...)``, a run's adapter folder).
RECORDED_PATHS = ("out", "adapter", "init_adapter", "routing_file", "first_phase", "long_eval", "model_bench")


def checkout_relative(value: str, root: str | None = None) -> str:
    """A path inside the working directory (the checkout), written relative to it: recorded commands and result
    JSON then run as written on any clone. ``--flag=PATH`` and ``name=PATH`` keep their prefix; anything else is
    returned unchanged."""
    root = os.path.join(os.path.abspath(root or os.getcwd()), "")
    head, sep, tail = value.partition("=" + root)
    if sep:  # --out=/checkout/runs/x, name=/checkout/runs/x
        return head + "=" + os.path.relpath(root + tail, root)
    return os.path.relpath(value, root) if value.startswith(root) else value


def record_relative(args: argparse.Namespace, argv: list[str]) -> None:
    """``args.command_line`` (the command as typed) and the path arguments results record, checkout-relative."""
    args.command_line = "focusattn " + shlex.join(checkout_relative(a) for a in argv)
    for name in RECORDED_PATHS:
        v = getattr(args, name, None)
        if isinstance(v, str):
            setattr(args, name, checkout_relative(v))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    record_relative(args, sys.argv[1:] if argv is None else argv)  # recorded in results: runs/..., not /home/...
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    for noisy in ("transformers", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        check_shared(args)  # before any work: a bad shared flag or an unwritable --out fails now, not after an hour
        rc = int(args.func(args) or 0)
        dist.barrier()  # under torchrun every rank leaves together: one tearing gloo down early aborted another
        return rc
    except (ValueError, RuntimeError, OSError) as e:  # bad input, unwritable or full disk: one line, nothing else
        if args.verbose:
            raise
        msg = os_error_message(e) if isinstance(e, OSError) else cli_message(e, getattr(args, "flags", None))
        print(f"focusattn {args.command}: error: {' '.join(msg.split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted; the last checkpoint is kept", file=sys.stderr)
        return 130
    finally:
        dist.close()  # leave a torchrun process group cleanly (a no-op in one process)


if __name__ == "__main__":
    sys.exit(main())
