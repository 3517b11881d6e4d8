"""``KeyRouter``: Focus groups in the layer's own key space (``FocusConfig.router_input="keys"``; not in the paper).

Each key joins its nearest of K centroids fitted on the layer's keys after RoPE (its KV heads side by side); each
query scores the centroids with its KV-group-mean query (the mean of its heads' logits against a cluster's mean key)
and takes whole groups in that order until they hold ``cfg.budget`` of its distant keys (beyond the window, after
the sinks; ``kernels.recall.fill_budget``, ClusterKV's selection), at least its best one. A key is in one group
and a query in several: query and key roles, served exactly by the kernels' query membership, no pair counted
twice.

Why: on held-out text the learned router (``FocusRouter``, routing the layer input) drops 2-3x the distant attention
the oracle drops at the same budget; k-means over the keys themselves drops 1.4-1.65x (docs/DECISIONS.md, "Routing
in the layer's own key space"). The router sees what attention sees, so it needs no training to start.

Causal: a query's groups depend on its own query and on the groups of the keys before it, so a prefill and the
decode steps after it give the same mask. The router's input ``h`` is :func:`key_features` of the call's new
tokens (the attention function builds it from the post-RoPE query and key states), so the routing cache keeps,
defers and replays it like a layer input.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..kernels.recall import fill_budget, group_mean_queries, keys_side_by_side
from .config import FocusConfig
from .router import Routing, position_draws


def key_features(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The router input of a call's new tokens: ``[B, Tq, 2 W]``, each token's keys side by side (``W = Hkv * D``)
    then its KV-group-mean query. ``query`` [B, Hq, Tq, D], ``key`` [B, Hkv, Tk, D] (the last Tq are new)."""
    tq = query.shape[2]
    k = key[:, :, key.shape[2] - tq:]
    return torch.cat([keys_side_by_side(k), group_mean_queries(query, key.shape[1])], -1).detach()


class KeyRouter(nn.Module):
    """Routing in the layer's key space; see the module docstring. ``centroids`` [K, W] is a buffer (saved with the
    adapter), fitted by ``train.key_fit.fit_key_centroids``."""

    def __init__(self, width: int, cfg: FocusConfig):
        super().__init__()
        if cfg.router_input != "keys":
            raise ValueError(f"KeyRouter needs FocusConfig.router_input='keys', got {cfg.router_input!r}")
        self.cfg = cfg
        self.width = width
        self.register_buffer("centroids", torch.zeros(cfg.num_groups, width))
        self.balance = None  # FocusRouter's training statistics: never set (nothing here is trained by gradient)
        self.largest_share = None

    def clusters(self, keys: torch.Tensor) -> torch.Tensor:
        """Each key's nearest centroid ``[B, T]`` (long), ``keys`` [B, T, W]."""
        c = self.centroids.float()
        return ((c * c).sum(-1) - 2 * keys.float() @ c.t()).argmin(-1)

    @torch.no_grad()
    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None, start: int = 0,
                past: tuple | None = None, memo: dict | None = None) -> Routing:
        """``h`` [B, T, 2 W]: :func:`key_features` of positions ``start .. start + T - 1``; ``mask`` [B, T] their
        padding (True = real). ``memo["keys"]`` carries, from one call to the next (a prefill, then decode steps
        without a gap), the per-group counts of the keys before position ``at`` and the groups of the tokens from
        ``at`` on (not yet counted: a decode step touches a window's worth of state, not the whole sequence)."""
        cfg, w = self.cfg, self.width
        b, t, _ = h.shape
        if cfg.routing == "random":  # the baseline: each key a random group, queries ranking groups at random
            ids = position_draws(start, t, cfg.num_groups, h.device).argmax(-1).expand(b, t)
            scores = position_draws(start, t, cfg.num_groups, h.device, salt=1).expand(b, t, cfg.num_groups)
        else:
            ids = self.clusters(h[..., :w])
            scores = h[..., w:].float() @ self.centroids.float().t()  # [B, T, K]
        state = None if memo is None or start == 0 else memo.get("keys")
        if start > 0 and (state is None or state["n"] != start):
            raise ValueError(f"the key-space router needs the groups of the {start} earlier tokens: start generation "
                             "with a full prefill")
        valid = torch.ones(b, t, dtype=torch.bool, device=h.device) if mask is None else mask.to(torch.bool)
        if state is None:
            state = {"n": 0, "ids": ids[:, :0], "countable": valid[:, :0], "real": torch.zeros(b, dtype=torch.long,
                                                                                              device=h.device),
                     "at": 0, "count": torch.zeros(b, cfg.num_groups, dtype=torch.int32, device=h.device)}
        rank = state["real"][:, None] + valid.long().cumsum(1)  # 1-based among real tokens
        # the tokens from position `at` on (those not yet counted: at most the window's, in a decode step)
        countable = torch.cat([state["countable"], valid & (rank > cfg.sink_tokens)], 1)  # real, not a sink
        tail_ids = torch.cat([state["ids"], ids], 1)
        # query at position p counts the keys j < p - window (distance > window)
        upto = (torch.arange(start, start + t, device=h.device) - cfg.window).clamp_min(0)
        at, last = state["at"], max(state["at"], int(upto[-1]))
        seg = torch.zeros(b, last - at, cfg.num_groups, dtype=torch.int32, device=h.device).scatter_(
            2, tail_ids[:, :last - at, None], countable[:, :last - at, None].to(torch.int32))  # one-hot, int32
        prefix = torch.cat([state["count"][:, None], state["count"][:, None] + seg.cumsum(1, dtype=torch.int32)],
                           1)  # [B, L + 1, K]
        counts = prefix[:, (upto - at).clamp_min(0)]  # [B, T, K]
        want = torch.round(cfg.budget * counts.sum(-1).double()).long()
        # a group none of whose keys is distant for this query adds no pair to its mask (its other keys are local,
        # sinks or later): not joining it leaves the mask as it is and spares the kernels its keys
        qmem = fill_budget(counts, scores, want) & (counts > 0)
        # the kernels' contract: every query in a group. One that took none (no distant key yet, or its first
        # cluster would overshoot the budget twice over) takes its best-scored one.
        qmem |= F.one_hot(scores.argmax(-1), cfg.num_groups).to(torch.bool) & ~qmem.any(-1, keepdim=True)
        if memo is not None:
            memo["keys"] = {"n": start + t, "ids": tail_ids[:, last - at:], "countable": countable[:, last - at:],
                            "real": rank[:, -1], "at": last, "count": prefix[:, -1]}
        membership = F.one_hot(ids, cfg.num_groups).to(torch.bool)
        return Routing(membership.float(), membership, query_membership=qmem)

    def served(self, h: torch.Tensor, top_k: int, key_top_k: int | None = None) -> Routing:
        """The routing this router serves on one full sequence's features (the only one: its config's)."""
        if top_k != 1 or key_top_k not in (None, 1):
            raise ValueError(f"top_k={top_k}, key_top_k={key_top_k}: the key-space router serves key top-1 with its "
                             "budget only; allowed top_k=1, key_top_k=None")
        return self(h)

    def defers(self) -> bool:
        """Always: a token's routing depends on its own features and the earlier tokens' groups only."""
        return True

    def decode(self, h: torch.Tensor, start: int, memo: dict) -> Routing:
        return self(h, start=start, memo=memo)

    def flush_offsets(self) -> None:
        """Nothing to fold (no training statistics): here so adapters save every router alike."""

    def num_parameters(self) -> int:
        return self.centroids.numel()
