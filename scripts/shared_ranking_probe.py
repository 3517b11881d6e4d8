"""Would queries that share one ranking of the key groups per block keep the attention, at less compute?

The keyed engine (``kernels/decomposed/keyed.py``) computes, per block of 64 queries, every key of the union of the
groups its queries joined; at 8192 that is 1.5-3.9x the pairs the mask keeps, because each query ranks the groups by
its own query. If the queries of a block rank the groups by one shared score, each fills its budget with a prefix
of the same order, so the union is about one query's set. This probe measures, for the shipped key-space router on
held-out windows, the distant attention each ranking drops (against the oracle at the same budget) and the union's
pairs over the kept pairs per block:

* ``own`` / ``own-means``: each query its own scores (today's serving; ``key_scores`` centroids / means);
* ``prev`` / ``prev-means``: the block ranks by the mean scores of the previous block's queries (causal: known
  before the block starts, so decode = prefill);
* ``prev-means-own{m}``: a query's own best ``m`` groups first, then the previous block's order
  (``FocusConfig.rank_own``);
* ``block-means``: the block's own mean scores (not causal: a bound on what sharing can keep).

    python scripts/shared_ranking_probe.py --adapter smollm2-135m-focus-keys256 --length 2048 --windows 1 \
        --out runs/shared_ranking_2k.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

BLOCK = 64


def block_mean(s: torch.Tensor, shift: bool) -> torch.Tensor:
    """[T, K] scores -> each row the mean over its 64-block (``shift``: over the previous block; the first block keeps
    its own rows' scores, as it has no earlier block)."""
    t, k = s.shape
    nb = -(-t // BLOCK)
    pad = F.pad(s, (0, 0, 0, nb * BLOCK - t))
    rows = torch.ones(nb * BLOCK, dtype=s.dtype)
    rows[t:] = 0
    m = pad.view(nb, BLOCK, k).sum(1) / rows.view(nb, BLOCK).sum(1)[:, None]
    if shift:
        m = torch.cat([m[:1], m[:-1]], 0)
    out = m.repeat_interleave(BLOCK, 0)[:t]
    if shift:
        out[:BLOCK] = s[:BLOCK]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-keys256")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import eval_windows, tokenize
    from focusattn.focus.attend import dense_query_heads
    from focusattn.hf import routers
    from focusattn.hf.pair import load_pair
    from focusattn.hf.probe import capture
    from focusattn.kernels import recall as R
    from focusattn.kernels.recall import fill_budget
    from focusattn.eval.recall import pooled
    from focusattn.focus.key_router import own_first

    pair = load_pair(a.model, a.adapter, lengths=(a.length,), top_ks=(1,), threads=a.threads)
    focus, cfg = pair.focus, pair.cfg
    own = routers(focus)
    names = ("own", "own-means", "prev", "prev-means", "prev-means-own1", "prev-means-own2", "prev-means-own4",
             "block-means")
    command = "python scripts/shared_ranking_probe.py " + " ".join(sys.argv[1:])
    result = {"command": command, "adapter": a.adapter, "T": a.length, "windows": a.windows, "splits": {}}
    for split, corpus in (("domain", "shakespeare"), ("ood", "lee-news")):
        ids = tokenize(load_corpus(corpus), pair.tokenizer, tokenizer_id=a.model)[1]
        totals = [None] * len(own)
        waste = {n: [0.0, 0.0] for n in names}  # union pairs, kept pairs

        def per_layer(layer, module, h, q, k, scale, softcap):
            r = own[layer]
            w = r.width
            gid = r.clusters(h[..., :w])[0]  # [T]
            t = gid.shape[0]
            pos = torch.arange(t)
            countable = pos >= cfg.sink_tokens
            onehot = F.one_hot(gid, cfg.num_groups).to(torch.int32) * countable[:, None].to(torch.int32)
            prefix = torch.cat([torch.zeros(1, cfg.num_groups, dtype=torch.int32), onehot.cumsum(0)], 0)
            counts = prefix[(pos - cfg.window).clamp_min(0)]  # [T, K] distant keys per group
            want = torch.round(cfg.budget * counts.sum(-1).double()).long()
            cent = (h[0, :, w:].float() @ r.centroids.float().t())
            means = r._mean_scores(h, gid[None], countable[None], 0, None, None)[0]
            scores = {"own": cent, "own-means": means, "prev": block_mean(cent, True),
                      "prev-means": block_mean(means, True), "block-means": block_mean(means, False)}
            for m in (1, 2, 4):  # the first block has no previous one: its own scores, as the router
                shared = own_first(means, block_mean(means, True), m)
                shared[:BLOCK] = means[:BLOCK]
                scores[f"prev-means-own{m}"] = shared
            masks = {}
            for n, s in scores.items():
                qm = fill_budget(counts, s, want) & (counts > 0)
                qm |= F.one_hot(s.argmax(-1), cfg.num_groups).to(torch.bool) & ~qm.any(-1, keepdim=True)
                masks[n] = R.shared_group_keep(qm[None], F.one_hot(gid, cfg.num_groups).bool()[None])
                nb = -(-t // BLOCK)
                for bi in range(nb):
                    sl = slice(bi * BLOCK, min(t, (bi + 1) * BLOCK))
                    union = qm[sl].any(0)
                    waste[n][0] += float((counts[sl] * union).sum())
                    waste[n][1] += float((counts[sl] * qm[sl]).sum())
            dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1])
            s = R.layer_recall(q, k, masks, window=cfg.window, sink=cfg.sink_tokens, oracle_of=("own",),
                               scale=scale, softcap=softcap, dense=dense)
            totals[layer] = R.add_recall(totals[layer], s)

        with capture(focus, per_layer), torch.no_grad():
            for win in eval_windows(ids, a.length, a.windows):
                focus(torch.as_tensor(np.asarray(win)[None], dtype=torch.long), logits_to_keep=1)
        layers = [R.summarize_recall(s) for s in totals]
        pool = pooled(totals, layers)
        result["splits"][split] = {
            n: {"dropped_distant": m["dropped_distant"], "keys_per_query": m["keys_per_query"],
                **({"union_over_kept": waste[n][0] / max(waste[n][1], 1.0)} if n in waste else {})}
            for n, m in pool["masks"].items()}
        print(split, json.dumps(result["splits"][split], indent=1), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
