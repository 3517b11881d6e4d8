"""The original model and a copy with a Focus adapter, side by side, for commands that compare them (``bench-model``,
``long-eval``). Inputs are checked before anything heavy runs, so bad input fails fast and writes nothing."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..focus.config import FocusConfig


@dataclass
class Pair:
    base: torch.nn.Module  # the original model (its own attention)
    focus: torch.nn.Module  # a second copy with the adapter loaded, in eval mode
    tokenizer: object
    cfg: FocusConfig  # the adapter's config
    adapter_dir: object
    lengths: list[int]  # sorted, unique


def load_pair(model: str, adapter, *, lengths, top_ks, threads: int | None = None,
              rebalance: int | None = None, rebalance_warm: bool | None = None, dense_heads=None,
              capacity: float | None = None, window: int | None = None, budget: float | None = None,
              key_scores: str | None = None, rank_block: int | None = None,
              rank_own: int | None = None, union_block: int | None = None, min_keys: int | None = None) -> Pair:
    """``rebalance`` / ``rebalance_warm`` / ``capacity`` / ``window`` / ``budget`` / ``key_scores`` /
    ``rank_block`` / ``rank_own`` / ``union_block`` / ``min_keys`` / ``dense_heads``: override the adapter's
    ``FocusConfig`` fields of those names (inference-time choices, no retraining). ``dense_heads``: a ``--dense-heads``
    spec (:func:`.heads.parse_dense_heads`; scored heads, ``induction:N`` / ``duplicate:M``, are measured on the loaded
    model) or (layer, kv_head)
    pairs; None keeps the adapter's."""
    from ..adapters import resolve
    from .io import load_adapter, read_adapter_config
    from .heads import parse_dense_heads, scored_heads
    from .loading import load_model

    if isinstance(dense_heads, str):
        dense_heads = parse_dense_heads(dense_heads)
    adapter_dir = resolve(adapter)
    cfg = FocusConfig.from_dict(read_adapter_config(adapter_dir)["focus_config"])
    over = {k: v for k, v in (("rebalance", None if rebalance is None else int(rebalance)),
                              ("rebalance_warm", rebalance_warm),
                              ("capacity", None if capacity is None else float(capacity)),
                              ("window", None if window is None else int(window)),
                              ("budget", None if budget is None else float(budget)),
                              ("key_scores", key_scores), ("rank_block", rank_block),
                              ("rank_own", rank_own), ("union_block", union_block),
                              ("min_keys", min_keys)) if v is not None}
    if dense_heads is not None and not isinstance(dense_heads, dict):
        over["dense_heads"] = dense_heads
    if over:
        cfg = FocusConfig.from_dict({**cfg.to_dict(), **over})  # validated before loading
    if (cfg.key_top_k is not None or cfg.query_proj) and [int(k) for k in top_ks] != [1]:
        roles = "its own query projection" if cfg.query_proj else f"query top-1, key top-{cfg.key_top_k}"
        raise ValueError(f"top-k {list(top_ks)}: adapter {adapter} serves query and key roles ({roles}); allowed "
                         "--top-k 1 (its rows are then that mask)")
    bad = [k for k in top_ks if not 1 <= int(k) <= cfg.num_groups]
    if bad:
        raise ValueError(f"top-k {bad} out of range for adapter {adapter} (K={cfg.num_groups}): allowed "
                         f"1..{cfg.num_groups}")
    if threads is not None:
        torch.set_num_threads(int(threads))
    base, tok = load_model(model)
    max_pos = getattr(base.config, "max_position_embeddings", None)
    lengths = sorted(set(int(t) for t in lengths))
    if max_pos is not None and lengths[-1] > max_pos:
        raise ValueError(f"length {lengths[-1]} exceeds the model's {max_pos} positions")
    focus, _ = load_model(model)
    load_adapter(focus, adapter_dir)
    focus.eval()
    if isinstance(dense_heads, dict):  # scored heads, measured on this model (eval mode: no dropout)
        over["dense_heads"] = scored_heads(focus, dense_heads)
    if over:
        from .compose import update_config

        cfg = update_config(focus, **over)  # also checks dense_heads against the model
    focus.eval()
    return Pair(base, focus, tok, cfg, adapter_dir, lengths)
