"""Would a query that also attends to the groups its block's earlier queries joined keep more, at less compute?

The keyed engine (``kernels/decomposed/keyed.py``) computes, per block of 64 queries, every key of the union of the
groups its queries joined, and masks each row down to its own groups: at 8192 about 2.3x the pairs it keeps. This
probe measures causal masks that keep more of what is computed anyway, at a smaller per-query budget ``b``:

* ``own@b``: each query its own groups (fill to ``b`` of its distant keys by its means scores: today's serving);
* ``pre@b``: query ``i`` keeps the groups any query of its block at or before ``i`` joined (a prefix union: causal,
  a decode step carries the block's running union);
* ``pp@b``: ``pre@b`` plus every group the previous block's queries joined (known before the block starts).

For each: distant attention dropped (head mean, dense heads as served), distant keys kept per query, and the keys
a query's block computes (``computed``: the block's columns, i.e. the union of what its rows may see, counted per
row), so masks can be compared at equal kept keys and at equal compute.

    python scripts/block_union_probe.py --length 2048 --windows 1 --budgets 0.04 0.06 --out runs/bu_2k.json
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


def block_prefix_union(qm: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """[T, K] bool -> each row the OR of its block's rows up to and including it."""
    t, k = qm.shape
    nb = -(-t // block)
    pad = F.pad(qm.to(torch.int32), (0, 0, 0, nb * block - t))
    return (pad.view(nb, block, k).cumsum(1) > 0).view(nb * block, k)[:t]


def block_union(qm: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """[T, K] bool -> [nb, K]: the OR of each block's rows."""
    t, k = qm.shape
    nb = -(-t // block)
    return F.pad(qm, (0, 0, 0, nb * block - t)).view(nb, block, k).any(1)


def previous_union(qm: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """[T, K]: each row the union of the previous block's rows (none for the first block)."""
    u = block_union(qm, block)
    u = torch.cat([torch.zeros_like(u[:1]), u[:-1]], 0)
    return u.repeat_interleave(block, 0)[:qm.shape[0]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-keys256-means")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--budgets", type=float, nargs="+", default=[0.04, 0.06])
    ap.add_argument("--corpora", nargs="+", default=["shakespeare", "python-code"])
    ap.add_argument("--out", required=True)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import eval_windows, tokenize
    from focusattn.eval.recall import pooled
    from focusattn.focus.attend import dense_query_heads
    from focusattn.hf import routers
    from focusattn.hf.pair import load_pair
    from focusattn.hf.probe import capture
    from focusattn.kernels import recall as R
    from focusattn.kernels.recall import fill_budget

    pair = load_pair(a.model, a.adapter, lengths=(a.length,), top_ks=(1,), threads=a.threads)
    focus, cfg = pair.focus, pair.cfg
    own = routers(focus)
    command = "python scripts/block_union_probe.py " + " ".join(sys.argv[1:])
    result = {"command": command, "adapter": a.adapter, "T": a.length, "windows": a.windows, "block": BLOCK,
              "served_budget": cfg.budget, "splits": {}}
    for corpus in a.corpora:
        ids = tokenize(load_corpus(corpus), pair.tokenizer, tokenizer_id=a.model)[1]
        totals = [None] * len(own)
        computed: dict[str, float] = {}

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
            scores = r._mean_scores(h, gid[None], countable[None], 0, None, None)[0]
            kmem = F.one_hot(gid, cfg.num_groups).bool()[None]
            masks, cols = {}, {}
            for b in sorted({cfg.budget, *a.budgets}):
                want = torch.round(b * counts.sum(-1).double()).long()
                qm = fill_budget(counts, scores, want) & (counts > 0)
                qm |= F.one_hot(scores.argmax(-1), cfg.num_groups).to(torch.bool) & ~qm.any(-1, keepdim=True)
                u = block_union(qm).repeat_interleave(BLOCK, 0)[:t]
                pu = previous_union(qm)
                masks[f"own@{b:g}"], cols[f"own@{b:g}"] = qm, u
                if b in a.budgets:
                    masks[f"pre@{b:g}"], cols[f"pre@{b:g}"] = block_prefix_union(qm), u
                    masks[f"pp@{b:g}"], cols[f"pp@{b:g}"] = block_prefix_union(qm) | pu, u | pu
            for n, c in cols.items():  # distant keys of the computed columns, per row
                computed[n] = computed.get(n, 0.0) + float((counts * c).sum()) / t / len(own)
            keep = {n: R.shared_group_keep(m[None], kmem) for n, m in masks.items()}
            dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1])
            s = R.layer_recall(q, k, keep, window=cfg.window, sink=cfg.sink_tokens,
                               oracle_of=tuple(keep), scale=scale, softcap=softcap, dense=dense)
            totals[layer] = R.add_recall(totals[layer], s)

        wins = list(eval_windows(ids, a.length, a.windows))
        with capture(focus, per_layer), torch.no_grad():
            for win in wins:
                focus(torch.as_tensor(np.asarray(win)[None], dtype=torch.long), logits_to_keep=1)
        layers = [R.summarize_recall(s) for s in totals]
        pool = pooled(totals, layers)
        rows = {}
        for n, m in pool["masks"].items():
            rows[n] = {"dropped_distant": m["dropped_distant"], "keys_per_query": m["keys_per_query"]}
            if n in computed:
                rows[n]["computed_per_query"] = computed[n] / len(wins)
        result["splits"][corpus] = rows
        print(corpus, json.dumps(rows, indent=1), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
