"""Long-context quality of a trained Focus adapter against the original model and training-free baselines at the same
kept-pair budget: perplexity on held-out windows, repeat-copy perplexity and passkey accuracy at each length.

Variants (all on the same inputs):

* ``original``: the pretrained model, full attention;
* ``soft``, ``top{k}``: the adapter's soft gate and hard top-k routing (exact sparse kernels);
* ``sliding@top{k}``: window + first token (StreamingLLM-style) with the window chosen so it keeps at least the share
  of causal pairs that the adapter's top-k keeps at that length on that text (measured, per length);
* ``duo@top{k}`` (with ``FocusConfig.dense_heads``): the same dense heads, the other heads window + first token
  (DuoAttention's retrieval and streaming heads), the window chosen for the same share of causal pairs;
* ``random@top{k}``: random balanced groups per position + the adapter's window and sinks, same K and k (a
  key-space adapter: each key a random group, each query random groups until they hold as many of its distant keys
  as ``top{k}`` keeps for it, :func:`..hf.probe.random_rule`, served by the dense reference);
* ``untrained@top{k}``: a freshly initialised router (seed 0), same config, no training;
* ``kmeans@top{k}``: k-means over each layer's own keys, each query taking the clusters it scores highest until
  they hold as many distant keys as ``top{k}`` keeps for it (ClusterKV's recipe,
  :func:`..kernels.recall.cluster_budget_keep`), served by the dense reference;
* ``oracle@top{k}``: per query as many distant keys as ``top{k}`` keeps, the ones the model attends to most (dense
  reference): what a perfect routing at the same budget would give.

With ``recall_windows`` the attention recall of every mask (``eval/recall.py``: the share of the original model's
distant attention each drops, per layer and head) is measured on held-out windows of each split and length.

The baselines show whether the trained router earns its place; the probes (``eval.probes``) show where sparse
attention loses most: long-range copying and retrieval.
"""
from __future__ import annotations

import contextlib
import dataclasses
import statistics
from pathlib import Path

import numpy as np
import torch

from .._io import write_json
from ..analysis.balance import routing_stats
from .perplexity import perplexity
from .probes import passkey_accuracy, passkey_sequences, repeat_copy_ppl, repeat_copy_sequences

SCHEMA = "focusattn.long_eval/1"
# How the k-means rows were chosen: written into each long_eval.json, so rows of the older rule (a fixed share of
# 8 clusters, 7-11 distant keys per query where the router keeps ~140) are told apart (:func:`budget_matched`).
KMEANS_RULE = "clusters of 16 keys, filled to the router's budget per query"
# The same for a key-space adapter's random rows: runs before it served a random routing, which with the adapter's
# block union (``union_block``) kept most distant keys, far above the router's budget.
RANDOM_RULE = "key-space adapters: random groups filled to the router's count per query"
BASELINES = ("sliding", "duo", "random", "untrained", "kmeans", "oracle")


def variant_names(top_ks, baselines=BASELINES, soft: bool = True) -> list[str]:
    """Every variant name ``run_long_eval`` can produce for these top-ks and baselines."""
    names = ["original"] + (["soft"] if soft else []) + [f"top{k}" for k in top_ks]
    return names + [f"{b}@top{k}" for k in top_ks for b in BASELINES if b in baselines]


def probe_inputs(val: dict, tok, t: int, *, ppl_max_len: int, ppl_windows: int, passkey_depths, passkey_per_depth: int,
                 repeat_distance: int, repeat_n: int) -> dict:
    """The inputs every variant sees at length ``t``: perplexity windows per split (up to ``ppl_max_len``), passkey
    and repeat-copy sequences built from the out-of-domain text (the domain text without one)."""
    from ..data.tokens import eval_windows

    tests = {}
    if t <= ppl_max_len:
        for split in val:
            tests[f"ppl_{split}"] = eval_windows(val[split], t, ppl_windows)
    filler = val.get("ood", val["domain"])
    tests["passkey"] = passkey_sequences(filler, tok, t, depths=passkey_depths, per_depth=passkey_per_depth)
    distance = min(repeat_distance, t // 2)
    tests["repeat"] = repeat_copy_sequences(filler, t, passage=min(256, distance), distance=distance, n=repeat_n)
    return tests


@torch.no_grad()
def pairs_kept(model, tokens: np.ndarray) -> float:
    """Share of causal pairs kept by a composed model's hard routing on ``tokens`` [T], mean over layers and heads
    (a dense head, ``FocusConfig.dense_heads``, keeps every pair)."""
    from ..focus.attend import served_sinks
    from ..hf import last_routing, routers
    from ..hf.compose import dense_share
    from ..kernels.reference import focus_allowed, sink_key_mask

    x = torch.as_tensor(np.asarray(tokens, dtype=np.int64)[None])
    model(x, logits_to_keep=1)
    t = x.shape[1]
    shares = []
    for i, (r, routing) in enumerate(zip(routers(model), last_routing(model))):
        m = routing.membership  # the keys' groups; with query and key roles the queries' are their own
        kept = focus_allowed(m, r.cfg.window, t, sink_key_mask(t, served_sinks(routing, r.cfg, t)),
                             routing.query_membership).sum().item()
        d = dense_share(model, i)
        shares.append(d + (1 - d) * kept / (t * (t + 1) / 2))
    return statistics.mean(shares)


def run_long_eval(out_dir, *, model: str = "smollm2-135m", adapter: str, lengths=(2048, 4096, 8192), top_ks=(1, 2),
                  soft: bool = True, soft_max_len: int = 4096, baselines=BASELINES, data: str = "shakespeare", ood_data: str | None = "lee-news",
                  ppl_windows: int = 4, ppl_max_len: int = 2048, passkey_depths=(0.1, 0.5, 0.9),
                  passkey_per_depth: int = 1, repeat_n: int = 2, repeat_distance: int = 1024,
                  variants: tuple[str, ...] | None = None, threads: int | None = None,
                  rebalance: int | None = None, rebalance_warm: bool | None = None, dense_heads=None,
                  capacity: float | None = None, window: int | None = None, budget: float | None = None,
                  key_scores: str | None = None, rank_block: int | None = None, rank_own: int | None = None,
                  union_block: int | None = None, min_keys: int | None = None, recall_windows: int = 0,
                  command: str | None = None, progress: bool = True) -> dict:
    """Write ``long_eval.json`` into ``out_dir`` and return it. Perplexity runs at lengths ``<= ppl_max_len`` (it
    needs ``ppl_windows`` windows of each length); the probes run at every length. ``variants``: keep only these
    names (e.g. ``("original", "top1", "sliding@top1")``; None = all, unknown names are an error).
    ``recall_windows``: windows per split and length for attention recall (0 = none)."""
    from ..data.corpora import load_corpus
    from ..data.tokens import check_length, eval_windows, tokenize
    from ..hf import compose, focus_config, load_model, routers, set_top_k
    from ..hf.compose import kv_heads
    from ..hf.baselines import restore, sliding_sink, window_for_budget
    from ..hf.pair import load_pair
    from ..hf.probe import kmeans_rule, masked, oracle_rule, random_rule
    from .recall import measure_recall

    bad = [b for b in baselines if b not in BASELINES]
    if bad:
        raise ValueError(f"unknown baseline(s) {bad}: allowed {list(BASELINES)}")
    if "untrained" in baselines:
        from ..adapters import resolve
        from ..hf.io import read_adapter_config

        if read_adapter_config(resolve(adapter))["focus_config"].get("router_input") == "keys":
            raise ValueError("baseline 'untrained': a key-space adapter has nothing trained (its centroids are "
                             f"fitted); allowed {[b for b in BASELINES if b != 'untrained']}")
    if variants is not None:
        known = variant_names(top_ks, baselines, soft)
        unknown = [v for v in variants if v not in known]
        if unknown:
            raise ValueError(f"unknown variant(s) {unknown}: allowed {known}")
    pair = load_pair(model, adapter, lengths=lengths, top_ks=top_ks, threads=threads, rebalance=rebalance,
                     rebalance_warm=rebalance_warm, dense_heads=dense_heads, capacity=capacity,
                     window=window, budget=budget, key_scores=key_scores,
                     rank_block=rank_block, rank_own=rank_own, union_block=union_block, min_keys=min_keys)
    base, focus, tok, cfg, lengths = pair.base, pair.focus, pair.tokenizer, pair.cfg, pair.lengths
    corpora = {"domain": data} | ({"ood": ood_data} if ood_data else {})
    val = {}
    for split, name in corpora.items():
        val[split] = tokenize(load_corpus(name), tok, tokenizer_id=model)[1]
        check_length(val[split], lengths[-1], f"{name} validation split")

    others = {}
    keyspace = cfg.router_input == "keys"  # its random baseline: a rule at the router's budget query by query
    if "random" in baselines and not keyspace:
        others["random"] = compose(load_model(model)[0], dataclasses.replace(
            cfg, routing="random", rebalance=0, rebalance_warm=False, capacity=0.0, global_rate=0.0))
    if "untrained" in baselines:  # groups only: an untrained global-key scorer has no threshold to serve
        torch.manual_seed(0)
        others["untrained"] = compose(load_model(model)[0], dataclasses.replace(cfg, top_k=None, global_rate=0.0))

    def all_variants(t: int, budget: dict):
        """(name, model, setup) triples for length ``t``; ``setup()`` puts the model in that variant's state."""
        out = [("original", base, lambda: restore(base))]
        if soft and t <= soft_max_len:  # the soft gate is dense O(T^2) in memory: a training form, not a serving one
            out.append(("soft", focus, lambda: set_top_k(focus, None)))
        for k in top_ks:
            out.append((f"top{k}", focus, lambda k=k: set_top_k(focus, k)))
        for k in top_ks:
            if "sliding" in baselines:
                w = window_for_budget(t, budget[k], cfg.sink_tokens)
                out.append((f"sliding@top{k}", base, lambda w=w: sliding_sink(base, w, cfg.sink_tokens)))
            if "duo" in baselines and cfg.dense_heads:
                w = window_for_budget(t, budget[k], cfg.sink_tokens, dense)
                out.append((f"duo@top{k}", base,
                            lambda w=w: sliding_sink(base, w, cfg.sink_tokens, cfg.dense_heads)))
            for b, m in others.items():
                out.append((f"{b}@top{k}", m, lambda m=m, k=k: set_top_k(m, k)))
            for b, rule in (("random", random_rule), ("kmeans", kmeans_rule), ("oracle", oracle_rule)):
                if b in baselines and (b != "random" or keyspace):
                    out.append((f"{b}@top{k}", focus, lambda rule=rule, k=k: masked(focus, rule(k))))
        return out

    def evaluate(t: int, name: str, m, tests: dict, budget: dict) -> dict:
        """One variant's row at length ``t``: perplexity per split, passkey, repeat-copy."""
        row = {"T": t, "variant": name}
        if name.startswith("top") or "@" in name:
            k = int(name.split("top")[-1])
            row["budget_pairs_kept"] = budget[k]
            if name.startswith(("sliding", "duo")):
                row["window"] = base.config._focus_sliding[0]
        for key, inputs in tests.items():
            desc = f"T={t} {name} {key}"
            if key.startswith("ppl_"):
                row[key] = perplexity(m, inputs, desc=desc, progress=progress)["ppl"]
                if m is not base and name != "soft" and not name.startswith(("random", "kmeans", "oracle")):
                    # the learned routing's balance on this corpus (last window): what the kernels pay
                    stats = routing_stats(m, t)
                    row[f"balance_{key[4:]}"] = {k: stats[k] for k in ("max_largest_share",
                                                                       "max_group_cost_vs_balanced")}
            elif key == "passkey":
                row["passkey"] = passkey_accuracy(m, inputs, desc=desc, progress=progress)
            else:
                row["repeat_ppl"] = repeat_copy_ppl(m, inputs, desc=desc, progress=progress)["ppl"]
        return row

    dense = len(cfg.dense_heads) / (len(routers(focus)) * kv_heads(focus))  # share of heads served dense
    rows, recall_rows = [], []
    for t in lengths:
        budget = {}
        for k in top_ks:
            set_top_k(focus, k)
            budget[k] = pairs_kept(focus, val["domain"][:t])
        tests = probe_inputs(val, tok, t, ppl_max_len=ppl_max_len, ppl_windows=ppl_windows,
                             passkey_depths=passkey_depths, passkey_per_depth=passkey_per_depth,
                             repeat_distance=repeat_distance, repeat_n=repeat_n)
        dropped = {}
        if recall_windows:
            sliding = {f"sliding@top{k}": window_for_budget(t, budget[k], cfg.sink_tokens) for k in top_ks} \
                if "sliding" in baselines else None
            duo = {f"duo@top{k}": window_for_budget(t, budget[k], cfg.sink_tokens, dense) for k in top_ks} \
                if "duo" in baselines and cfg.dense_heads else None
            for split in val:
                rec = measure_recall(focus, eval_windows(val[split], t, recall_windows), top_ks=top_ks,
                                     others=others, sliding=sliding, kmeans="kmeans" in baselines,
                                     oracle="oracle" in baselines, duo=duo, desc=f"T={t} recall {split}",
                                     random_groups="random" in baselines and keyspace,
                                     progress=progress)
                recall_rows.append({"T": t, "split": split, **rec})
                for name, m in rec["overall"]["masks"].items():
                    dropped.setdefault(name, {})[split] = m["dropped_distant"]
        for name, m, setup in all_variants(t, budget):
            if variants is not None and name not in variants:
                continue
            state = setup()  # a context manager for the probes (oracle, k-means), else done already
            with state if isinstance(state, contextlib.AbstractContextManager) else contextlib.nullcontext():
                row = evaluate(t, name, m, tests, budget)
            if name in dropped:
                row["distant_dropped"] = dropped[name]
            rows.append(row)
            if progress:
                print({k: v for k, v in row.items() if k != "passkey"} | {"passkey": row["passkey"]["accuracy"]},
                      flush=True)
        restore(base)
    doc = {"schema": SCHEMA, "command": command, "model": model, "adapter": str(adapter),
           "focus_config": focus_config(focus).to_dict(), "corpora": corpora, "ppl_windows": ppl_windows,
           "passkey": {"depths": list(passkey_depths), "per_depth": passkey_per_depth,
                       "filler": corpora.get("ood", data)},
           "repeat": {"n": repeat_n, "distance": repeat_distance}, "kmeans_rule": KMEANS_RULE,
           "random_rule": RANDOM_RULE, "results": rows}
    if recall_rows:
        doc["recall"] = recall_rows
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "long_eval.json", doc)
    return doc


def budget_matched(doc: dict) -> dict:
    """``doc`` (a long_eval.json) with the k-means rows of runs made before :data:`KMEANS_RULE` renamed
    ``kmeans-share@top{k}`` (results and recall masks): they kept a fixed share of 8 clusters, a tenth of the
    router's distant keys, so they must not stand in a table as the baseline "at the same budget". Likewise the
    random rows of a key-space adapter with a block union (``union_block``) from runs before :data:`RANDOM_RULE`,
    renamed ``random-union@top{k}``: a random routing with the union kept most distant keys."""
    cfg = doc.get("focus_config") or {}
    names = {} if "kmeans_rule" in doc else {"kmeans@": "kmeans-share@"}
    if "random_rule" not in doc and cfg.get("router_input") == "keys" and cfg.get("union_block"):
        names["random@"] = "random-union@"
    if not names:
        return doc

    def rename(name: str) -> str:
        for old, new in names.items():
            if name.startswith(old):
                return new + name.split("@", 1)[1]
        return name

    doc = {**doc, "results": [{**r, "variant": rename(r["variant"])} for r in doc.get("results", [])]}
    if "recall" in doc:
        doc["recall"] = [{**rec, "overall": {**rec["overall"], "masks": {rename(n): m for n, m in
                                                                         rec["overall"]["masks"].items()}},
                          "layers": [{**lay, "masks": {rename(n): m for n, m in lay["masks"].items()}}
                                     for lay in rec["layers"]]} for rec in doc["recall"]]
    return doc
