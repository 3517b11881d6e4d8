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


# Keys per k-means cluster of the k-means baseline (ClusterKV's clusters hold tens of keys): fine enough that a
# query's selection can follow its own budget to within a fraction of a cluster.
KMEANS_CLUSTER_KEYS = 16
# Clusters :func:`fill_budget` ranks for every query first (a top-k); rows short of their budget rank 4x more.
FILL_FIRST = 32


def keys_side_by_side(k: torch.Tensor) -> torch.Tensor:
    """Keys ``[B, Hkv, T, D]`` as ``[B, T, Hkv * D]`` (one routing serves every head of a layer)."""
    b, hkv, t, d = k.shape
    return k.float().permute(0, 2, 1, 3).reshape(b, t, hkv * d)


def group_mean_queries(q: torch.Tensor, hkv: int) -> torch.Tensor:
    """Queries ``[B, Hq, T, D]`` as ``[B, T, Hkv * D]``: each KV head's query heads averaged (GQA), so a query
    scores a key centroid as the mean of its heads' scores against it."""
    b, hq, t, d = q.shape
    return q.float().view(b, hkv, hq // hkv, t, d).mean(2).permute(0, 2, 1, 3).reshape(b, t, hkv * d)


def fit_kmeans(x: torch.Tensor, num_clusters: int, *, iters: int = 10, seed: int = 0) -> torch.Tensor:
    """Lloyd's k-means on the rows of ``x`` [N, D]; centroids ``[num_clusters, D]`` (seeded on random rows; with
    fewer rows than clusters the duplicates are never nearest and stay where they are)."""
    n = x.shape[0]
    gen = torch.Generator().manual_seed(seed)
    pick = torch.randperm(n, generator=gen)[:num_clusters] if n >= num_clusters else torch.arange(num_clusters) % n
    c = x[pick.to(x.device)].clone()
    for _ in range(iters):
        a = torch.cdist(x, c).argmin(-1)
        cnt = torch.bincount(a, minlength=num_clusters).to(x.dtype)
        s = torch.zeros_like(c).index_add_(0, a, x)
        c = torch.where(cnt[:, None] > 0, s / cnt.clamp_min(1)[:, None], c)
    return c


def kmeans_key_clusters(q: torch.Tensor, k: torch.Tensor, num_clusters: int | None = None, *,
                        centroids: torch.Tensor | None = None, iters: int = 10,
                        seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ClusterKV's routing, with separate query and key roles: each key in its nearest k-means centroid of the
    layer's own keys (its KV heads side by side), each query scoring every centroid with its KV-group-mean query
    (the mean of its heads' logits against the cluster's mean key). Returns ``(cluster of each key [B, T] long,
    query scores [B, T, C])`` for :func:`cluster_budget_keep`.

    Without ``centroids`` [C, Hkv * D] they are fitted per sequence on all its keys (``num_clusters``, default one
    per :data:`KMEANS_CLUSTER_KEYS` keys), as ClusterKV fits them on a prompt's cache: what the keys' geometry alone
    can recall, not a causal routing. Given ``centroids`` (fitted once, elsewhere), they are used as they are."""
    kf, qf = keys_side_by_side(k), group_mean_queries(q, k.shape[1])
    if centroids is None:
        c_num = num_clusters or max(1, -(-k.shape[2] // KMEANS_CLUSTER_KEYS))
        cs = torch.stack([fit_kmeans(kf[i], c_num, iters=iters, seed=seed) for i in range(kf.shape[0])])
    else:
        cs = centroids.to(kf)[None].expand(kf.shape[0], -1, -1)
    return torch.cdist(kf, cs).argmin(-1), qf @ cs.transpose(-1, -2)


def fill_budget(counts: torch.Tensor, scores: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Which clusters a query takes: bool ``[..., C]``, whole clusters in descending order of ``scores`` [..., C]
    until they hold ``want`` [...] of the ``counts`` [..., C] keys; the cluster that crosses ``want`` is taken when
    that lands nearer it than stopping before it (ties: taken). ``want == 0`` takes none. ClusterKV's selection, the
    one rule of the k-means baseline and of the key-space router (``focus.key_router``).

    Why partial sorts in stages: a query fills its budget within its best few clusters (15 of 256 on average for the
    shipped key-space router at 8192, at most 44), so each row ranks only its best :data:`FILL_FIRST` (a top-k), the
    rows that have not filled it by then their best 4x as many, and so on up to the full sort. The answer is the full
    sort's: past the crossing cluster nothing is taken. Measured on three captured layers at 8192 (one thread): 29-31
    ms a layer at C = 256, against 47-52 ms for one top-k sized by the largest ``want / total`` (the early rows' 0.2
    made it rank 110 of 256) and more for a full sort. A cluster holding none of the ``counts`` is ranked last and
    never taken: it adds no key, and left in place such clusters kept two thirds of a layer's queries from filling
    their budget within the ranked prefix (measured on held-out text at 8192 tokens: 188 ms -> 50 ms a layer)."""
    scores = scores.masked_fill(counts == 0, float("-inf"))
    c = scores.shape[-1]
    shape = counts.shape
    counts, scores, want = counts.reshape(-1, c), scores.reshape(-1, c), want.reshape(-1)
    out = None
    rows = None  # every row; then the indices of those still short of their budget
    m = FILL_FIRST
    while True:
        cs, ss, ws = (counts, scores, want) if rows is None else (counts[rows], scores[rows], want[rows])
        if m >= c:
            got = _fill_sorted(cs, ws, ss.argsort(-1, descending=True))
            filled = None
        else:
            order = ss.topk(m, -1).indices  # sorted, best first
            take, filled = _take(cs.gather(-1, order), ws)
            got = torch.zeros(cs.shape, dtype=torch.bool, device=cs.device).scatter_(-1, order, take)
        if rows is None:
            out = got
        else:
            out[rows] = got
        if filled is None or bool(filled.all()):
            return out.view(shape)
        short = (~filled).nonzero().squeeze(1)
        rows = short if rows is None else rows[short]
        m *= 4


def _take(cs: torch.Tensor, want: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fill_budget`'s rule over counts ``cs`` already in score order: which are taken, and whether the ranked
    prefix reached ``want`` (so nothing after it would be)."""
    after = cs.cumsum(-1)
    before = after - cs
    w = want[..., None].to(after.dtype)
    return (before < w) & ((after <= w) | (after - w <= w - before)), after[..., -1] >= w[..., 0]


def _fill_sorted(counts, want, order) -> torch.Tensor:
    take, _ = _take(counts.gather(-1, order), want)
    return torch.zeros_like(take).scatter_(-1, order, take)


def cluster_budget_keep(cluster: torch.Tensor, scores: torch.Tensor, budget: KeepFn, *, window: int,
                        sink: int) -> KeepFn:
    """ClusterKV's selection at another mask's budget, as a :data:`KeepFn`: per query, whole clusters in order of
    its score, until they hold as many of its distant keys as ``budget`` keeps for it (the cluster that crosses it
    is taken when that lands nearer the budget than stopping before it). ``cluster`` [B, T] long, ``scores``
    [B, T, C]. Causal: a query counts only its own distant keys (beyond the window, after the sinks)."""
    c_num = scores.shape[-1]
    onehot = F.one_hot(cluster, c_num).to(torch.int32)  # [B, T, C]
    # distant keys of query i in cluster c: keys sink <= j < i - window, i.e. a prefix count
    prefix = F.pad(onehot.cumsum(1), (0, 0, 1, 0))  # [B, T + 1, C]: keys j < n
    below_sink = prefix[:, min(sink, cluster.shape[1])]

    def keep(r0: int, r1: int, probs=None) -> torch.Tensor:
        t = cluster.shape[1]
        distant = pair_kinds(r0, r1, t, window, sink, cluster.device)[2]
        want = (budget(r0, r1, probs) & distant).sum(-1)  # [B, R]
        upto = (torch.arange(r0, r1, device=cluster.device) - window).clamp(min=0, max=t)
        counts = (prefix[:, upto] - below_sink[:, None]).clamp_min(0)  # [B, R, C]
        sel = fill_budget(counts, scores[:, r0:r1], want)
        return sel.gather(-1, cluster[:, None, :].expand(-1, r1 - r0, -1)) & distant

    return keep
