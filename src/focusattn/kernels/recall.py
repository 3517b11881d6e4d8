"""Attention recall: how much of a layer's own attention probability a sparse mask keeps, and the oracle mask that
keeps the most at the same budget. Pure tensor math on one layer's q/k (prefill, queries = keys), in row chunks so
no ``[H, T, T]`` tensor is ever whole.

A causal pair (query ``i``, key ``j <= i``) is *local* when ``i - j <= window`` (:func:`.common.in_window`), a *sink*
when key ``j`` is one of the first ``sink`` tokens and not local, and *distant* otherwise. Focus always keeps local
and sink pairs, so what a routing decides is only the distant mass. The *oracle at a mask's budget* keeps, for every
query, as many distant keys as that mask keeps for it, but the ones with the highest probability (mean over heads:
a routing is shared by every head of a layer, so the oracle is too).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from .common import apply_softcap, default_scale, row_distance
from .reference import expand_kv

# Query rows per chunk: [B, H, ROWS, T] float32 probabilities at a time (9 heads x 256 x 8192 = 75 MB).
ROWS = 256

# (r0, r1, probs=None) -> bool [B, r1 - r0, T]: the distant pairs a mask keeps for query rows r0:r1; ``probs`` are
# those rows' causal probabilities [B, H, r1 - r0, T] when the caller has them (a rule that needs them reuses them)
KeepFn = Callable[..., torch.Tensor]


def causal_probs(q: torch.Tensor, k: torch.Tensor, r0: int, r1: int, *, scale: float | None = None,
                 softcap: float | None = None) -> torch.Tensor:
    """Causal softmax probabilities ``[B, Hq, r1 - r0, T]`` (float32) of query rows ``r0:r1`` over all ``T`` keys;
    q ``[B, Hq, T, D]``, k ``[B, Hkv, T, D]`` (GQA)."""
    t = k.shape[2]  # keys at or after r1 are above the diagonal for every row: scored never, zero-padded after
    s = torch.matmul(q[:, :, r0:r1].float(), expand_kv(k[:, :, :r1], q.shape[1]).float().transpose(-1, -2))
    s = apply_softcap(s * default_scale(q.shape[-1], scale), softcap)
    causal = row_distance(r0, r1, r1, q.device) >= 0
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), dim=-1)
    return p if t == r1 else F.pad(p, (0, t - r1))


def pair_kinds(r0: int, r1: int, t: int, window: int, sink: int, device=None):
    """``(local, sink, distant)`` bool ``[r1 - r0, T]`` for query rows ``r0:r1`` of a length-``t`` prefill."""
    d = row_distance(r0, r1, t, device)
    local = (d >= 0) & (d <= window)
    sinks = (d > window) & (torch.arange(t, device=device) < sink)[None, :]
    return local, sinks, (d > window) & ~sinks


def oracle_keep(pbar: torch.Tensor, distant: torch.Tensor, budget: torch.Tensor) -> torch.Tensor:
    """Bool ``[B, R, T]``: per row, the ``budget[b, r]`` distant keys of highest ``pbar`` (exactly that many, or all
    of them when fewer exist). ``pbar`` ``[B, R, T]``, ``distant`` ``[R, T]`` bool, ``budget`` ``[B, R]`` int."""
    keep = torch.zeros(pbar.shape, dtype=torch.bool, device=pbar.device)
    m = int(budget.max()) if budget.numel() else 0
    if m == 0:
        return keep
    scored = pbar.masked_fill(~distant, -1.0)
    idx = scored.topk(min(m, pbar.shape[-1]), dim=-1).indices
    take = torch.arange(idx.shape[-1], device=pbar.device) < budget[..., None]
    keep.scatter_(-1, idx, take)
    return keep & distant


def shared_group_keep(membership_q: torch.Tensor, membership_k: torch.Tensor | None = None, *,
                      global_keys: torch.Tensor | None = None) -> KeepFn:
    """The Focus rule as a :data:`KeepFn`: query ``i`` keeps key ``j`` iff they share a group (or ``j`` is a global
    key, ``global_keys`` [B, T] bool). ``membership_q`` ``[B, T, K]`` bool is the queries' groups, ``membership_k``
    the keys' (default: the same, the paper's symmetric routing)."""
    mk = (membership_q if membership_k is None else membership_k).float()
    mq = membership_q.float()
    if global_keys is None:
        return lambda r0, r1, probs=None: torch.einsum("bik,bjk->bij", mq[:, r0:r1], mk) > 0
    return lambda r0, r1, probs=None: (torch.einsum("bik,bjk->bij", mq[:, r0:r1], mk) > 0) | global_keys[:, None, :]


def layer_recall(q: torch.Tensor, k: torch.Tensor, masks: dict[str, KeepFn], *, window: int, sink: int,
                 oracle_of: tuple[str, ...] = (), windows: dict[str, int] | None = None, scale: float | None = None,
                 softcap: float | None = None, rows: int = ROWS, dense: torch.Tensor | None = None,
                 dense_windows: tuple[str, ...] = ()) -> dict:
    """Mass sums of one layer on one batch of prefills: ``{"queries": n, "mass": {kind: [Hq]}, "kept": {name: [Hq]},
    "keys": {name: distant keys kept, summed over queries}, "distant_keys": total}``. Sums, so batches and windows
    add up; :func:`summarize_recall` turns them into shares.

    ``masks``: named :data:`KeepFn` over distant pairs; ``windows``: named sliding windows (a distant key ``j`` is
    kept iff ``i - j <= w``); ``oracle_of``: mask names whose per-query budget the oracle ``oracle@<name>`` matches.
    ``dense``: bool [Hq], query heads served with every pair (dense heads): every mask but the sliding windows keeps
    all their distant mass, and the oracle ranks keys by the other heads' mean probability; ``dense_windows``: the
    windows that keep them too (streaming heads beside the dense ones, DuoAttention-style).
    """
    b, hq, t, _ = q.shape
    windows = windows or {}

    def hsum(p: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """[Hq] float64: the probability ``p`` [B, Hq, R, T] on the pairs of ``keep`` ([R, T] or [B, R, T] bool),
        summed in one contraction (float32 within a chunk, float64 across chunks and windows)."""
        keep = keep.expand(b, -1, -1) if keep.dim() == 2 else keep
        return torch.einsum("bhrt,brt->h", p, keep.to(p.dtype)).double().cpu()

    mass = {kind: torch.zeros(hq, dtype=torch.float64) for kind in ("local", "sink", "distant")}
    names = list(masks) + list(windows) + [f"oracle@{n}" for n in oracle_of]
    kept = {n: torch.zeros(hq, dtype=torch.float64) for n in names}
    keys = {n: 0 for n in names}
    distant_keys = 0
    for r0 in range(0, t, rows):
        r1 = min(t, r0 + rows)
        p = causal_probs(q, k, r0, r1, scale=scale, softcap=softcap)
        local, sinks, distant = pair_kinds(r0, r1, t, window, sink, q.device)
        for kind, m in (("local", local), ("sink", sinks), ("distant", distant)):
            mass[kind] += hsum(p, m)
        distant_keys += int(distant.sum()) * b
        pbar = p.mean(1) if dense is None or not dense.any() or dense.all() else p[:, ~dense.to(p.device)].mean(1)
        pd = hsum(p, distant)
        d_rel = row_distance(r0, r1, t, q.device)
        chosen = {}
        for n, fn in masks.items():
            chosen[n] = fn(r0, r1) & distant
        for n, w in windows.items():
            chosen[n] = (d_rel <= w)[None].expand(b, -1, -1) & distant
        for n in oracle_of:
            chosen[f"oracle@{n}"] = oracle_keep(pbar, distant, chosen[n].sum(-1))
        for n, keep in chosen.items():
            kk = hsum(p, keep)
            skip = dense is None or (n in windows and n not in dense_windows)
            kept[n] += kk if skip else torch.where(dense.cpu(), pd, kk)
            keys[n] += int(keep.sum())
    return {"queries": b * t, "heads": hq, "mass": mass, "kept": kept, "keys": keys, "distant_keys": distant_keys}


def add_recall(total: dict | None, part: dict) -> dict:
    """Sum two :func:`layer_recall` results (windows of a corpus, batches)."""
    if total is None:
        return part
    out = {"queries": total["queries"] + part["queries"], "heads": part["heads"],
           "distant_keys": total["distant_keys"] + part["distant_keys"]}
    for key in ("mass", "kept"):
        out[key] = {n: total[key][n] + part[key][n] for n in part[key]}
    out["keys"] = {n: total["keys"][n] + part["keys"][n] for n in part["keys"]}
    return out


def summarize_recall(s: dict) -> dict:
    """Shares from summed masses: ``local``/``sink``/``distant`` share of all attention (head mean), per mask the
    share of the distant mass it *drops* (head mean and per head) and the distant keys it keeps per query."""
    total = s["queries"]  # every query row sums to 1 in every head
    dist = s["mass"]["distant"]
    out = {"share": {kind: float(m.mean() / total) for kind, m in s["mass"].items()},
           "distant_keys_per_query": s["distant_keys"] / total, "masks": {}}
    for n, kept in s["kept"].items():
        per_head = [float(1 - kv / dv) if dv > 0 else 0.0 for kv, dv in zip(kept, dist)]
        out["masks"][n] = {"dropped_distant": float(1 - kept.sum() / dist.sum()) if dist.sum() > 0 else 0.0,
                           "dropped_distant_per_head": per_head,
                           "dropped_total": float((dist.sum() - kept.sum()) / (total * s["heads"])),
                           "keys_per_query": s["keys"][n] / total}
    return out


def kmeans_key_routing(q: torch.Tensor, k: torch.Tensor, num_groups: int, query_top: int, *, iters: int = 10,
                       seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A training-free routing with separate query and key roles (ClusterKV's recipe): k-means over the layer's own
    keys (its KV heads side by side, so one routing serves every head), each key in its nearest cluster, each query
    in the ``query_top`` clusters whose centroid its KV-group-mean query scores highest. Returns bool memberships
    ``(queries [B, T, K], keys [B, T, K])`` for :func:`shared_group_keep`.

    The clusters are fitted on every key of the sequence, as ClusterKV fits them on a prompt's cache: a baseline of
    what the keys' geometry alone can recall, not a causal routing.
    """
    b, hkv, t, d = k.shape
    kf = k.float().permute(0, 2, 1, 3).reshape(b, t, hkv * d)
    qf = q.float().view(b, hkv, q.shape[1] // hkv, t, d).mean(2).permute(0, 2, 1, 3).reshape(b, t, hkv * d)
    gen = torch.Generator().manual_seed(seed)
    mq = torch.zeros(b, t, num_groups, dtype=torch.bool, device=q.device)
    mk = torch.zeros_like(mq)
    for i in range(b):
        x = kf[i]
        pick = torch.randperm(t, generator=gen)[:num_groups] if t >= num_groups else torch.arange(num_groups) % t
        c = x[pick.to(x.device)].clone()  # fewer keys than clusters: duplicates, never nearest, stay empty
        for _ in range(iters):
            a = torch.cdist(x, c).argmin(-1)
            n = torch.bincount(a, minlength=num_groups).to(x.dtype)
            s = torch.zeros_like(c).index_add_(0, a, x)
            c = torch.where(n[:, None] > 0, s / n.clamp_min(1)[:, None], c)
        mk[i].scatter_(-1, torch.cdist(x, c).argmin(-1, keepdim=True), True)
        mq[i].scatter_(-1, (qf[i] @ c.t()).topk(min(query_top, num_groups), dim=-1).indices, True)
    return mq, mk


def kmeans_query_top(num_groups: int, top_k: int) -> int:
    """Query clusters of the k-means baseline matched to symmetric top-k: balanced top-k groups keep a share
    ``1 - C(K-k, k) / C(K, k)`` of the distant pairs, k-means with one cluster per key and ``q`` per query keeps
    ``q / K``; the closest ``q`` (at least 1)."""
    from math import comb

    share = 1 - comb(num_groups - top_k, top_k) / comb(num_groups, top_k)
    return max(1, min(num_groups, round(share * num_groups)))
