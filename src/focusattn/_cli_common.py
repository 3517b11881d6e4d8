"""What every subcommand shares: one validation of the shared flags, run before any model, corpus or output is
touched, and the help formatter.

Each check raises :class:`~focusattn._errors.InputError` naming the argument by its ``argparse`` dest (``seq_len``,
``top_k``, ``out`` ...), so :func:`focusattn._errors.cli_message` prints the flag (``--seq-len 100000: exceeds the
model's 8192 positions``). :func:`check_shared` applies the checks to any parsed command line by dest name, so a new
command gets them by naming its flags the same; checks that need a command's own meaning (long-eval's variants) are
called by that command.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ._errors import InputError
from ._io import check_writable



class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends ``(default: X)`` only where it informs: not when the help text already states the default, and not for
    an empty or unset default (``None``, ``""``, a switch's ``False``), so no flag prints its default twice."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default in (None, "", False, argparse.SUPPRESS) or "default" in text:
            return text
        return super()._get_help_string(action)


# ------------------------------------------------------------------------------------------------ parsing
def ints(values, param: str) -> tuple[int, ...]:
    """``"1,2"``, ``["1024", "4096"]``, ``["1024,4096"]`` or ``512`` -> a tuple of ints; a token that is not an
    integer names ``param``."""
    if values is None:
        return ()
    items = values if isinstance(values, (list, tuple)) else [values]
    out = []
    for v in items:
        for x in str(v).split(","):
            x = x.strip()
            if not x:
                continue
            try:
                out.append(int(x))
            except ValueError:
                raise InputError(param, ",".join(map(str, items)), f"{x!r} is not an integer: allowed a comma "
                                 "list of integers") from None
    return tuple(out)


def check_int(value, param: str, minimum: int = 0, *, optional: bool = False) -> None:
    """An integer >= ``minimum`` (or None when ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise InputError(param, value, f"allowed an integer >= {minimum}")


# ------------------------------------------------------------------------------------------------ the model
def model_positions(spec: str) -> int | None:
    """The positions the model ``spec`` can attend over, read from its config alone (no weights loaded); None when
    the model has no such limit or its config cannot be read here (then loading reports the problem)."""
    from .hf.loading import resolve_model_path

    path = Path(resolve_model_path(spec))
    cfg_file = path / "config.json"
    if not cfg_file.is_file():  # a hub id: read only if already cached (never a download just to check)
        try:
            from transformers import AutoConfig

            cfg = AutoConfig.from_pretrained(spec, local_files_only=True)
        except (OSError, ValueError):
            return None
        return getattr(cfg, "max_position_embeddings", None)
    try:
        raw = json.loads(cfg_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    if isinstance(raw.get("model"), dict) and "train" in raw:  # a lab run's record
        from .gpt.config import model_config_from_dict

        return model_config_from_dict(raw["model"]).seq_cache  # what LabGPTConfig calls its positions
    # the JSON itself, not AutoConfig: importing transformers' model classes costs seconds (GPT-2 says n_positions)
    for key in ("max_position_embeddings", "n_positions"):
        if isinstance(raw.get(key), int):
            return raw[key]
    return None


def check_lengths(lengths, param: str, positions: int | None) -> tuple[int, ...]:
    """Sequence lengths: each an integer >= 1 and at most the model's ``positions`` (when known)."""
    values = ints(lengths, param)
    for t in values:
        check_int(t, param, 1)
        if positions is not None and t > positions:
            raise InputError(param, t, f"exceeds the model's {positions} positions (allowed 1..{positions})")
    return values


# ------------------------------------------------------------------------------------------------ the adapter
def adapter_groups(spec, param: str = "adapter") -> int | None:
    """K of the Focus adapter ``spec`` (shipped name, adapter or run folder), read from its config alone; None for a
    LoRA (peft) or Lazy (Elastic-Softmax) adapter, which has no groups. An unknown or corrupt adapter names
    ``param``."""
    from .adapters import resolve
    from .focus.config import FocusConfig
    from .hf.io import read_adapter_config
    from .hf.lazy import is_lazy_adapter, read_lazy_config
    from .hf.lora import is_lora_adapter

    try:
        folder = resolve(spec)
        if is_lora_adapter(folder):
            return None
        if is_lazy_adapter(folder):
            read_lazy_config(folder)
            return None
        return FocusConfig.from_dict(read_adapter_config(folder)["focus_config"]).num_groups
    except (ValueError, OSError) as e:  # the adapter's own message names the file and the fault
        raise InputError(param, str(spec), " ".join(str(e).split())) from e


def check_top_ks(values, param: str, num_groups: int | None, *, soft: bool = False, source: str = "") -> None:
    """Hard top-k values, each in 1..K (K = ``num_groups`` when known; ``source`` says where K comes from); ``soft``:
    the word 'soft' (the soft gate) is allowed too."""
    items = values if isinstance(values, (list, tuple)) else [values]
    tokens = [x.strip() for v in items for x in str(v).split(",") if x.strip()]
    allowed = (f"1..{num_groups}" if num_groups is not None else "integers >= 1") + (" or 'soft'" if soft else "")
    for x in tokens:
        if soft and x == "soft":
            continue
        try:
            k = int(x)
        except ValueError:
            raise InputError(param, ",".join(tokens), f"{x!r} is not a top-k: allowed {allowed}") from None
        if k < 1 or (num_groups is not None and k > num_groups):
            where = f" ({source} has K={num_groups} groups)" if source and num_groups is not None else ""
            raise InputError(param, ",".join(tokens), f"top-k {k} out of range{where}: allowed {allowed}")


# ------------------------------------------------------------------------------------------------ names
def check_names(values, param: str, allowed) -> tuple[str, ...]:
    """A comma list (or list) of names, each one of ``allowed``; an unknown one is refused, never dropped."""
    items = values if isinstance(values, (list, tuple)) else [values]
    names = tuple(x.strip() for v in items for x in str(v).split(",") if x.strip())
    allowed = list(dict.fromkeys(allowed))
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise InputError(param, ",".join(names), f"unknown {', '.join(unknown)}: allowed {', '.join(allowed)}")
    return names


def check_long_eval(*, top_ks, baselines: str, variants: str, soft: bool = True) -> tuple[tuple[str, ...],
                                                                                           tuple[str, ...] | None]:
    """``long-eval``'s ``--baselines`` and ``--variants`` -> (baselines, variants or None for all)."""
    from .eval.longctx import BASELINES, variant_names  # the names live where the variants are built

    base = check_names(baselines, "baselines", BASELINES)
    kept = check_names(variants, "variants", variant_names(ints(top_ks, "top_k"), base, soft)) if variants else ()
    return base, kept or None


# ------------------------------------------------------------------------------------------------ threads
def set_threads(threads: int | None) -> None:
    """``--threads``: torch's intra-op CPU threads for this process (None leaves torch's setting)."""
    check_int(threads, "threads", 1, optional=True)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


# ------------------------------------------------------------------------------------------------ all at once
_AT_LEAST = {"window": 0, "sink_tokens": 0, "eval_windows": 1, "groups": 1, "steps": 1,
             "batch_size": 1, "repeats": 1}  # dest -> minimum, where the dest holds one integer


def check_shared(args: argparse.Namespace) -> None:
    """Every shared flag a parsed command line has, checked by dest name before the command runs, cheapest first:
    integer bounds (``--window >= 0``, ``--threads >= 1`` ...), ``--out`` writable, ``--top-k`` / ``--eval-top-k``
    against the K of ``--adapter`` (its config only) or of ``--groups``, ``--seq-len`` / ``--lengths`` against the
    ``--model``'s positions (its config only)."""
    a = vars(args)
    for dest, lo in _AT_LEAST.items():
        if a.get(dest) is not None and not isinstance(a[dest], (list, tuple, str)):  # one integer (not nargs)
            check_int(a[dest], dest, lo)
    check_int(a.get("threads"), "threads", 1, optional=True)
    if isinstance(a.get("out"), str):
        check_writable(a["out"])
    model = a.get("model") if isinstance(a.get("model"), str) else None
    k, source = None, ""
    if isinstance(a.get("adapter"), str) and a["adapter"]:
        k, source = adapter_groups(a["adapter"]), f"adapter {a['adapter']}"
    elif isinstance(a.get("groups"), int):
        k, source = a["groups"], "--groups"
    for dest in ("top_k", "eval_top_k"):
        if a.get(dest):
            check_top_ks(a[dest], dest, k, soft=a.get("command") == "eval" and dest == "top_k", source=source)
    for dest in ("seq_len", "lengths"):  # last: an offline alias is converted once on its first use
        if a.get(dest) is not None:
            check_lengths(a[dest], dest, model_positions(model) if model else None)


__all__ = ["HelpFormatter", "adapter_groups", "check_int", "check_lengths", "check_long_eval",
           "check_names", "check_shared", "check_top_ks", "ints", "model_positions",
           "add_serve_overrides", "serve_overrides", "set_threads"]


# --dense-heads, shared by the commands that serve an adapter (hf.heads.parse_dense_heads reads it)
DENSE_HEADS_HELP = ("override the adapter's dense heads (FocusConfig.dense_heads): 'none', 'layer:kv_head,...', "
                    "or scored on repeated random tokens at load: 'induction:N' (the N KV heads that attend most "
                    "to the token after the earlier occurrence), 'duplicate:M' (to the earlier occurrence itself) "
                    "or 'induction:N+duplicate:M'")


SERVE_OVERRIDES = ("rebalance", "rebalance_warm", "capacity", "window", "budget", "key_scores", "rank_block",
                   "rank_own", "union_block", "min_keys", "dense_heads")


def add_serve_overrides(p) -> None:
    """The inference-time choices ``long-eval`` and ``bench-model`` may serve an adapter with instead of its own
    (no retraining), one set of flags for both; :func:`serve_overrides` reads them back."""
    import argparse

    p.add_argument("--rebalance", type=int, default=None,
                   help="override the adapter's online rebalancing interval (tokens; 0 = off)")
    p.add_argument("--rebalance-warm", action=argparse.BooleanOptionalAction, default=None,
                   help="override the adapter's warm-started rebalancing (FocusConfig.rebalance_warm)")
    p.add_argument("--capacity", type=float, default=None,
                   help="override the adapter's group-size cap at hard top-k: a multiple of the balanced share, "
                        "e.g. 1.5 (FocusConfig.capacity; 0 = off)")
    p.add_argument("--window", type=int, default=None,
                   help="override the adapter's local window (FocusConfig.window, tokens); budget-matched "
                        "baselines match the budget it then keeps")
    p.add_argument("--budget", type=float, default=None,
                   help="override a key-space adapter's budget: the share of each query's distant keys its groups "
                        "fill (FocusConfig.budget, in (0, 1]; the centroids stay as fitted)")
    p.add_argument("--key-scores", choices=("centroids", "means"), default=None,
                   help="override what a key-space adapter's queries rank groups by: the fitted centroids or the "
                        "means of the group's keys in the sequence before the query's window (FocusConfig.key_scores)")
    p.add_argument("--rank-block", type=int, default=None,
                   help="override how a key-space adapter's queries rank groups: 0 = each by its own scores, B = the "
                        "queries of each B-position block by the previous block's mean (64 = the keyed engine's "
                        "block; FocusConfig.rank_block)")
    p.add_argument("--rank-own", type=int, default=None,
                   help="with --rank-block: the groups each query takes by its own scores before the block's shared "
                        "order (FocusConfig.rank_own)")
    p.add_argument("--union-block", type=int, default=None,
                   help="override what a key-space adapter's queries keep: 0 = their own groups, B = also the groups "
                        "of their B-position block's earlier queries and of the block before (64 = the keyed "
                        "engine's block; FocusConfig.union_block)")
    p.add_argument("--min-keys", type=int, default=None,
                   help="override a key-space adapter's floor under each query's budget: at least N of its distant "
                        "keys, all of them when it has fewer (FocusConfig.min_keys; 0 = the share alone)")
    p.add_argument("--dense-heads", default=None, help=DENSE_HEADS_HELP)


def serve_overrides(a) -> dict:
    """The flags of :func:`add_serve_overrides` as the keyword arguments of :func:`hf.pair.load_pair` (None = the
    adapter's own)."""
    return {k: getattr(a, k) for k in SERVE_OVERRIDES}
