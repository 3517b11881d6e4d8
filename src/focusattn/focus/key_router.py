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
from torch import nn

from ..kernels.recall import fill_budget, group_mean_queries, keys_side_by_side
from .config import FocusConfig
from .router import Routing, position_draws

# Queries per mean (``FocusConfig.key_scores="means"``): the group means a query scores are those of the keys before
# its window, taken at this granularity so a prefill computes one mean per group per block of queries.
MEANS_BLOCK = 64


def key_features(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The router input of a call's new tokens: ``[B, Tq, 2 W]``, each token's keys side by side (``W = Hkv * D``)
    then its KV-group-mean query. ``query`` [B, Hq, Tq, D], ``key`` [B, Hkv, Tk, D] (the last Tq are new)."""
    tq = query.shape[2]
    k = key[:, :, key.shape[2] - tq:]
    return torch.cat([keys_side_by_side(k), group_mean_queries(query, key.shape[1])], -1).detach()


def _cumsum_rows(x: torch.Tensor, block: int = 64) -> torch.Tensor:
    """``x.cumsum(1)`` of an int32 ``[B, L, K]``, by blocks of ``block`` rows then the blocks' running totals: the
    same integers, in 60% of the time of one cumsum along the strided dim (8192 x 256 here)."""
    b, n, k = x.shape
    m = n // block * block
    if m < 2 * block:
        return x.cumsum(1, dtype=x.dtype)
    out = torch.empty_like(x)
    head = out[:, :m].view(b, m // block, block, k)
    torch.cumsum(x[:, :m].view(b, m // block, block, k), 2, dtype=x.dtype, out=head)
    head[:, 1:] += head[:, :-1, -1:].cumsum(1, dtype=x.dtype)
    if m < n:
        torch.cumsum(x[:, m:], 1, dtype=x.dtype, out=out[:, m:])
        out[:, m:] += head[:, -1, -1:]
    return out


def _compact(x: torch.Tensor) -> torch.Tensor:
    """``x`` in storage of its own when it is a small view of a larger tensor: what a memo carries to the next call
    (the last rows of a prefill's [B, T, ...] tensors) must not keep the whole prefill's storage alive, 30 layers
    of it at once (at 8192 tokens the key features and prefix counts held 600 MiB after the prefill)."""
    return x.clone() if x.untyped_storage().nbytes() > 2 * x.numel() * x.element_size() else x


def _boundary_runs(start: int, t: int, window: int, block: int) -> list[tuple[int, int]]:
    """``(lim, count)`` runs of ``lim = max(0, floor((p - window) / block) * block)`` over positions ``start ..
    start + t - 1`` (nondecreasing), in plain integers: a decode step's one run costs no tensor ops."""
    def lim(p: int) -> int:
        return max(0, (p - window) // block * block)

    runs, p, end = [], start, start + t
    while p < end:
        edge = lim(p)
        nxt = min(end, edge + block + window) if edge else min(end, max(p + 1, block + window))
        runs.append((edge, nxt - p))
        p = nxt
    return runs


def own_first(own: torch.Tensor, shared: torch.Tensor, m: int) -> torch.Tensor:
    """Scores ``[..., K]`` whose descending order is a query's best ``m`` groups by its ``own`` scores (in that order),
    then the rest by the ``shared`` ones (``FocusConfig.rank_own``). Only the order matters to ``fill_budget``."""
    if m <= 0:
        return shared
    m = min(m, own.shape[-1])
    top = own.topk(m, -1).indices
    lead = torch.arange(m, 0, -1, device=own.device, dtype=torch.float32).expand(top.shape)  # m .. 1
    base = shared - shared.amax(-1, keepdim=True) - 1  # every shared score below 0, its order kept
    return base.scatter(-1, top, lead)


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
        k = keys.float()
        d = torch.addmm((c * c).sum(-1), k.reshape(-1, k.shape[-1]), c.t(), alpha=-2)  # one pass, not three
        return d.view(*k.shape[:-1], -1).argmin(-1)

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
            scores = None if cfg.key_scores == "means" else h[..., w:].float() @ self.centroids.float().t()  # [B,T,K]
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
        if scores is None:
            scores = self._mean_scores(h, ids, valid & (rank > cfg.sink_tokens), start,
                                       None if memo is None or start == 0 else memo.get("means"), memo)
        if cfg.rank_block:
            scores = self._shared_scores(scores, valid, rank, None if memo is None or start == 0
                                         else memo.get("rank"), memo)
        # the tokens from position `at` on (those not yet counted: at most the window's, in a decode step)
        countable = torch.cat([state["countable"], valid & (rank > cfg.sink_tokens)], 1)  # real, not a sink
        tail_ids = torch.cat([state["ids"], ids], 1)
        # query at position p counts the keys j < p - window (distance > window)
        upto = (torch.arange(start, start + t, device=h.device) - cfg.window).clamp_min(0)
        at, last = state["at"], max(state["at"], int(upto[-1]))
        # row 0 the carried counts, then each new key one-hot: their cumulative sum is the counts before each position
        seg = torch.zeros(b, last - at + 1, cfg.num_groups, dtype=torch.int32, device=h.device)
        seg[:, 0] = state["count"]
        seg[:, 1:].scatter_(2, tail_ids[:, :last - at, None], countable[:, :last - at, None].to(torch.int32))
        prefix = _cumsum_rows(seg)  # [B, L + 1, K]
        counts = prefix[:, (upto - at).clamp_min(0)]  # [B, T, K]
        # their sum over groups, from a running count of the countable keys (summing [B, T, K] cost more)
        run = torch.cat([countable.new_zeros(b, 1, dtype=torch.long), countable[:, :last - at].long().cumsum(1)], 1)
        total = state["count"].sum(-1, keepdim=True).long() + run[:, (upto - at).clamp_min(0)]  # [B, T]
        want = torch.round(cfg.budget * total.double()).long()
        if cfg.min_keys:  # the floor: at least min_keys of the query's distant keys (all of them when fewer)
            want = torch.maximum(want, total.clamp_max(cfg.min_keys))
        # a group none of whose keys is distant for this query adds no pair to its mask (its other keys are local,
        # sinks or later): not joining it leaves the mask as it is and spares the kernels its keys
        qmem = fill_budget(counts, scores, want) & (counts > 0)
        # the kernels' contract: every query in a group. One that took none (no distant key yet, or its first
        # cluster would overshoot the budget twice over) takes its best-scored one.
        none = (~qmem.any(-1)).nonzero(as_tuple=True)  # few rows: the argmax of those only
        qmem[none + (scores[none].argmax(-1),)] = True
        if cfg.union_block:
            qmem = self._block_union(qmem, valid, rank, None if memo is None or start == 0 else memo.get("union"),
                                     memo)
        if memo is not None:
            memo["keys"] = {"n": start + t, "ids": _compact(tail_ids[:, last - at:]),
                            "countable": _compact(countable[:, last - at:]), "real": _compact(rank[:, -1]), "at": last,
                            "count": _compact(prefix[:, -1])}
        membership = torch.zeros(b, t, cfg.num_groups, dtype=torch.bool, device=h.device).scatter_(-1, ids[..., None],
                                                                                                   True)
        return Routing(membership.float(), membership, query_membership=qmem, groups_hard=True)

    def _mean_scores(self, h, ids, countable, start: int, state: dict | None, memo: dict | None) -> torch.Tensor:
        """``FocusConfig.key_scores="means"``: each query scores a group by its KV-group-mean query against the mean
        of the group's keys *in this sequence* before ``lim = floor((i - window) / MEANS_BLOCK) * MEANS_BLOCK``
        (real, not sinks; all distant to it), the fitted centroid counted as one more key (a prior: a group
        with no such key scores its centroid). ``[B, T, K]`` float.

        Why: the fitted centroids summarise the calibration text's keys; a key unlike them (a passkey's digits in
        news) joins the nearest centroid but does not move it, so no query ranks its group for it. The sequence's own
        means do, as the k-means baseline's per-input clusters do, but causally: only keys before the query's window,
        at block granularity so a prefill keeps one mean per ``MEANS_BLOCK`` queries. Sums are float64 and added in
        position order, so a chunked prefill or decode steps give the prefill's scores (``memo["means"]``: the sums
        before ``s0`` and the key features from ``s0`` on)."""
        cfg, w = self.cfg, self.width
        b, t, _ = h.shape
        kk, blk = cfg.num_groups, MEANS_BLOCK
        keys = h[..., :w].double()
        if state is None:
            state = {"s0": 0, "sum": keys.new_zeros(b, kk, w), "cnt": keys.new_zeros(b, kk), "feat": keys[:, :0],
                     "ids": ids[:, :0], "ok": countable[:, :0]}
        s0 = state["s0"]
        feat = torch.cat([state["feat"], keys], 1)  # positions s0 .. start + t - 1
        fid = torch.cat([state["ids"], ids], 1)
        ok = torch.cat([state["ok"], countable], 1)
        total, cnt, mu = state["sum"], state["cnt"], state.get("mu")
        prior = None
        scores = torch.empty(b, t, kk, dtype=torch.float32, device=h.device)
        upto, at, copied = s0, 0, False
        for edge, n in _boundary_runs(start, t, cfg.window, blk):  # queries sharing a boundary: one set of means
            if mu is None or edge > upto:  # else the boundary has not moved: the last means stand (decode steps)
                if not copied:  # the carried sums and means are the memo's: update copies
                    total, cnt, copied = total.clone(), cnt.clone(), True
                    mu = None if mu is None else mu.clone()
                sl = slice(upto - s0, max(upto, edge) - s0)
                for bi in range(b):  # keys up to the boundary, in position order (the same additions in any chunking)
                    okb = ok[bi, sl]
                    total[bi].index_add_(0, fid[bi, sl], feat[bi, sl] * okb[:, None])
                    cnt[bi].index_add_(0, fid[bi, sl], okb.double())
                upto = max(upto, edge)
                prior = self.centroids.double() if prior is None else prior
                if mu is None:
                    mu = ((total + prior) / (cnt + 1)[..., None]).float()  # [B, K, W]
                else:  # only the groups of the keys just added moved: the same arithmetic, on their rows only
                    for bi in range(b):
                        g = fid[bi, sl]
                        mu[bi, g] = ((total[bi, g] + prior[g]) / (cnt[bi, g] + 1)[:, None]).float()
            scores[:, at:at + n] = h[:, at:at + n, w:].float() @ mu.transpose(1, 2)
            at += n
        if memo is not None:
            memo["means"] = {"s0": upto, "sum": total, "cnt": cnt, "mu": mu, "feat": _compact(feat[:, upto - s0:]),
                             "ids": _compact(fid[:, upto - s0:]), "ok": _compact(ok[:, upto - s0:])}
        return scores

    def _shared_scores(self, scores, valid, rank, state: dict | None, memo: dict | None) -> torch.Tensor:
        """``FocusConfig.rank_block = B``: the queries of each block of ``B`` real tokens (``(rank - 1) // B``, so
        left padding does not move the blocks) rank the groups by one shared score, the mean of the previous block's
        own scores; the first block keeps its own. ``scores`` [B, T, K] are the queries' own; ``rank`` [B, T] the
        1-based rank among real tokens.

        Why: every query then fills its budget with a prefix of one order, so the groups a block's queries joined
        are about one query's; the keyed engine computes every key of that union for the whole block, 2.9-3.3x the
        pairs the mask keeps with per-query rankings and 1.2x with shared ones (held-out text at 2048,
        ``scripts/shared_ranking_probe.py``). The previous block, not the block itself: a query's groups must not
        depend on later tokens (decode = prefill). Sums are float64 in position order (a cumulative sum from the
        carried one), so chunked prefill and decode steps see the prefill's means."""
        b, t, kk = scores.shape
        if state is None:
            state = {"block": [0] * b, "sum": scores.new_zeros(b, kk, dtype=torch.float64),
                     "n": [0] * b, "prev": [None] * b}
        state = {"block": list(state["block"]), "sum": state["sum"].clone(), "n": list(state["n"]),
                 "prev": list(state["prev"])}
        out = scores.clone()
        bid = torch.div(rank - 1, self.cfg.rank_block, rounding_mode="floor").clamp_min(0)
        for r in range(b):
            runs, counts = torch.unique_consecutive(bid[r], return_counts=True)
            at = 0
            for blk, m in zip(runs.tolist(), counts.tolist()):
                if blk != state["block"][r]:  # a new block: the one just ended gives the shared scores
                    state["prev"][r] = (state["sum"][r] / state["n"][r]).float() if state["n"][r] else None
                    state["sum"][r].zero_()
                    state["block"][r], state["n"][r] = blk, 0
                if state["prev"][r] is not None:
                    out[r, at:at + m] = own_first(scores[r, at:at + m], state["prev"][r].expand(m, -1),
                                                  self.cfg.rank_own)
                v = valid[r, at:at + m]
                x = scores[r, at:at + m].double() * v[:, None]
                state["sum"][r] = torch.cat([state["sum"][r][None], x]).cumsum(0)[-1]
                state["n"][r] += int(v.sum())
                at += m
        if memo is not None:
            memo["rank"] = state
        return out

    def _block_union(self, qmem, valid, rank, state: dict | None, memo: dict | None) -> torch.Tensor:
        """``FocusConfig.union_block = B``: each query keeps, beside its own groups, every group the real queries of
        its block of ``B`` real tokens (``(rank - 1) // B``, as ``rank_block``) joined up to it, and every group
        the previous block's joined. ``qmem`` [B, T, K] bool, the queries' own groups.

        Why: the keyed engine computes every key of those groups for the whole block anyway (it masked each row
        down to its own); keeping them, a smaller budget keeps as much attention at less compute. Causal (a query
        sees only earlier queries' choices), so ``memo["union"]`` carries the open block's union and the one
        before it across a chunked prefill and decode steps."""
        b, t, kk = qmem.shape
        if state is None:
            state = {"block": [0] * b, "open": qmem.new_zeros(b, kk), "prev": qmem.new_zeros(b, kk)}
        bid = torch.div(rank - 1, self.cfg.union_block, rounding_mode="floor").clamp_min(0)
        if t == 1:  # a decode step: the general path below, for one row per sequence, in a few batched ops
            x = qmem[:, 0] & valid[:, 0, None]
            carried = (bid[:, 0] == torch.as_tensor(state["block"], device=qmem.device))[:, None]
            opened = torch.where(carried, state["open"] | x, x)
            prev = torch.where(carried, state["prev"], state["open"])
            if memo is not None:
                memo["union"] = {"block": bid[:, 0].tolist(), "open": opened, "prev": prev}
            return qmem | (opened | prev)[:, None]
        nxt = {"block": list(state["block"]), "open": state["open"].clone(), "prev": state["prev"].clone()}
        out = qmem.clone()
        for r in range(b):
            runs, counts = torch.unique_consecutive(bid[r], return_counts=True)
            ridx = torch.repeat_interleave(torch.arange(len(runs), device=qmem.device), counts)
            at = torch.arange(t, device=qmem.device) - (counts.cumsum(0) - counts)[ridx]  # row within its block
            x = qmem[r] if bool(valid[r].all()) else qmem[r] & valid[r, :, None]  # real queries' joins
            blocks = qmem.new_zeros(len(runs), int(counts.max()), kk)  # [runs, longest, K], rows by block
            blocks[ridx, at] = x
            carried = int(runs[0]) == nxt["block"][r]  # the first block continues the carried open one
            if carried:
                blocks[0] |= nxt["open"][r]
            step = 1  # prefix OR along each block by doubling (bool ops; a cumsum of int counts cost 5x more)
            while step < blocks.shape[1]:
                blocks[:, step:] |= blocks[:, :-step].clone()
                step *= 2
            closed = blocks[torch.arange(len(runs), device=qmem.device), counts - 1]  # [runs, K]: unions so far
            before = nxt["prev"][r] if carried else nxt["open"][r]  # the first block's predecessor
            prev = torch.cat([before[None], closed[:-1]])  # [runs, K]
            out[r] |= blocks[ridx, at] | prev.index_select(0, ridx)
            nxt["block"][r], nxt["open"][r], nxt["prev"][r] = int(runs[-1]), closed[-1], prev[-1]
        if memo is not None:
            memo["union"] = nxt
        return out

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
