"""``focusattn`` command line: parse, call the library, print. No logic of its own."""
from __future__ import annotations

import argparse
import logging
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


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.command_line = "focusattn " + shlex.join(sys.argv[1:] if argv is None else argv)  # recorded in results
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(message)s")
    for noisy in ("transformers", "httpx", "huggingface_hub"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    try:
        check_shared(args)  # before any work: a bad shared flag or an unwritable --out fails now, not after an hour
        return int(args.func(args) or 0)
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
