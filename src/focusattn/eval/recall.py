"""Attention recall of served masks on held-out text: per layer and head, the share of the original model's attention
probability each mask drops (local / sink / distant), beside the oracle at the same budget.

One capture forward of the original model per window (``hf.probe.capture``: full attention, the frozen model's own
activations); every mask is evaluated on the same layer inputs and probabilities:

* ``top{k}``: the adapter's routing at hard top-k (what is served);
* ``top1key{k}``: the same router with query and key roles: query top-1, key top-``k`` (``roles``);
* ``oracle@top{k}``: per query as many distant keys as ``top{k}`` keeps for it, the most attended ones;
* ``sliding@top{k}``: a wider window + sinks at the same share of causal pairs (given by the caller);
* ``random@top{k}``, ``untrained@top{k}``: other routers (other composed models) on the same layer inputs;
* ``kmeans@top{k}``: k-means over the layer's keys, each query's clusters filled to ``top{k}``'s budget for it
  (:func:`..kernels.recall.kmeans_key_clusters`, :func:`..kernels.recall.cluster_budget_keep`).

Distant mass dropped by a mask over the oracle's says how much of a quality gap is the routing, not the budget.
"""
from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from ..hf.probe import served_keep
from ..kernels import recall as R


@torch.no_grad()
def measure_recall(focus, windows: np.ndarray, *, top_ks=(1, 2), others: dict | None = None,
                   sliding: dict[str, int] | None = None, kmeans: bool = True, oracle: bool = True,
                   desc: str = "recall", progress: bool = True, roles: tuple[int, ...] = (),
                   duo: dict[str, int] | None = None, random_groups: bool = False) -> dict:
    """Recall of every mask on ``windows`` [N, T] (one prefill each) through composed model ``focus``.

    ``others``: name -> another composed model whose routers give ``<name>@top{k}``; ``sliding``: mask name ->
    window (distant keys within it kept); ``duo``: the same for windows on the routed heads beside the dense ones
    (``duo@top{k}``, DuoAttention-style); ``roles``: key top-ks served with query top-1 (``top1key{k}`` and its
    oracle); ``random_groups``: ``random@top{k}`` as random groups at top-k's budget query by query
    (:func:`..hf.probe.random_clusters`, a key-space adapter's random baseline). Returns ``{"layers": [per-layer summary], "overall": {...}}``; see
    :func:`..kernels.recall.summarize_recall` for the fields."""
    from ..focus.attend import dense_query_heads
    from ..hf import focus_config, routers
    from ..hf.probe import capture, random_clusters

    cfg = focus_config(focus)
    if cfg.query_proj and set(top_ks) - {1}:  # before any forward
        raise ValueError(f"top_ks={tuple(top_ks)}: a router with query_proj=True serves query top-1 only; allowed "
                         "top_ks=(1,)")
    own = routers(focus)
    other = {n: routers(m) for n, m in (others or {}).items()}
    totals: list[dict | None] = [None] * len(own)

    def per_layer(layer, module, h, q, k, scale, softcap):
        masks, oracle_of, clusters = {}, [], None
        for kk in top_ks:
            masks[f"top{kk}"] = served_keep(own[layer], h, kk)
            if oracle:
                oracle_of.append(f"top{kk}")
            for n, rs in other.items():
                masks[f"{n}@top{kk}"] = served_keep(rs[layer], h, kk)
            if random_groups:  # at the same per-query budget as top-k
                masks[f"random@top{kk}"] = R.cluster_budget_keep(
                    *random_clusters(k.shape[0], k.shape[2], cfg.num_groups, k.device), masks[f"top{kk}"],
                    window=cfg.window, sink=cfg.sink_tokens)
            if kmeans:  # at the same per-query budget as top-k
                if clusters is None:
                    clusters = R.kmeans_key_clusters(q, k)
                masks[f"kmeans@top{kk}"] = R.cluster_budget_keep(*clusters, masks[f"top{kk}"], window=cfg.window,
                                                                 sink=cfg.sink_tokens)
        for kk in roles:
            masks[f"top1key{kk}"] = served_keep(own[layer], h, 1, kk)
            if oracle:
                oracle_of.append(f"top1key{kk}")
        dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1])  # they keep every pair under every mask
        s = R.layer_recall(q, k, masks, window=cfg.window, sink=cfg.sink_tokens, oracle_of=tuple(oracle_of),
                           windows={**(sliding or {}), **(duo or {})}, scale=scale, softcap=softcap, dense=dense,
                           dense_windows=tuple(duo or ()))
        totals[layer] = R.add_recall(totals[layer], s)

    device = next(focus.parameters()).device
    with capture(focus, per_layer):
        for w in tqdm(windows, desc=desc, leave=False, disable=not progress, unit="win"):
            focus(torch.as_tensor(np.asarray(w)[None], dtype=torch.long, device=device), logits_to_keep=1)
    layers = [R.summarize_recall(s) for s in totals]
    return {"windows": int(len(windows)), "T": int(windows.shape[1]), "layers": layers,
            "overall": pooled(totals, layers)}


def pooled(totals: list[dict], layers: list[dict]) -> dict:
    """Over all layers: the attention shares (mean over layers) and, per mask, the distant mass dropped pooled over
    layers (every layer's distant mass counts by its size) and as the mean of the layers' shares."""
    dist = sum(float(s["mass"]["distant"].sum()) for s in totals)
    out = {"share": {kind: float(np.mean([lay["share"][kind] for lay in layers])) for kind in layers[0]["share"]},
           "masks": {}}
    for n in layers[0]["masks"]:
        kept = sum(float(s["kept"][n].sum()) for s in totals)
        out["masks"][n] = {
            "dropped_distant": 1 - kept / dist if dist > 0 else 0.0,
            "dropped_distant_layer_mean": float(np.mean([lay["masks"][n]["dropped_distant"] for lay in layers])),
            "keys_per_query": float(np.mean([lay["masks"][n]["keys_per_query"] for lay in layers])),
        }
    for n, m in out["masks"].items():  # how far a mask is from the best routing at its own budget
        o = out["masks"].get(f"oracle@{n}")
        if o is not None and o["dropped_distant"] > 0:
            m["vs_oracle"] = m["dropped_distant"] / o["dropped_distant"]
    for n, m in out["masks"].items():  # baselines are compared with the oracle of the budget they match
        if "@" in n and not n.startswith("oracle@"):
            o = out["masks"].get(f"oracle@{n.split('@')[1]}")
            if o is not None and o["dropped_distant"] > 0:
                m["vs_oracle"] = m["dropped_distant"] / o["dropped_distant"]
    return out
