"""How much of the distant attention does a floor under the key-space router's budget keep, and at what cost in keys?

``FocusConfig.min_keys = N``: each query fills at least ``N`` of its distant keys (all of them when it has fewer),
beside the adapter's share (``budget``). A share is stingy early in a sequence: at 2048 tokens 4% is a group or two
of 256. This probe serves the adapter's routing (means scores, block unions as configured) with floors ``--floors``
and reports, per held-out corpus: distant attention dropped (head mean, dense heads as served), distant keys kept per
query, and the oracle's drop at the same per-query keys.

    python scripts/floor_probe.py --length 2048 --windows 1 --floors 0 64 128 256 --out runs/floor_2k.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from block_union_probe import block_prefix_union, previous_union  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-keys256-union")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--floors", type=int, nargs="+", default=[0, 64, 128, 256])
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
    if cfg.router_input != "keys" or cfg.key_scores != "means":
        raise SystemExit(f"--adapter {a.adapter}: a key-space adapter scoring groups by means")
    own = routers(focus)
    result = {"command": "python scripts/floor_probe.py " + " ".join(sys.argv[1:]), "adapter": a.adapter,
              "T": a.length, "windows": a.windows, "budget": cfg.budget, "union_block": cfg.union_block,
              "splits": {}}
    for corpus in a.corpora:
        ids = tokenize(load_corpus(corpus), pair.tokenizer, tokenizer_id=a.model)[1]
        totals = [None] * len(own)

        def per_layer(layer, module, h, q, k, scale, softcap):
            r = own[layer]
            gid = r.clusters(h[..., :r.width])[0]  # [T]
            t = gid.shape[0]
            pos = torch.arange(t)
            countable = pos >= cfg.sink_tokens
            onehot = F.one_hot(gid, cfg.num_groups).to(torch.int32) * countable[:, None].to(torch.int32)
            prefix = torch.cat([torch.zeros(1, cfg.num_groups, dtype=torch.int32), onehot.cumsum(0)], 0)
            counts = prefix[(pos - cfg.window).clamp_min(0)]  # [T, K] distant keys per group
            total = counts.sum(-1).long()
            scores = r._mean_scores(h, gid[None], countable[None], 0, None, None)[0]
            masks = {}
            for floor in a.floors:
                want = torch.maximum(torch.round(cfg.budget * total.double()).long(), total.clamp_max(floor))
                qm = fill_budget(counts, scores, want) & (counts > 0)
                qm |= F.one_hot(scores.argmax(-1), cfg.num_groups).to(torch.bool) & ~qm.any(-1, keepdim=True)
                if cfg.union_block:
                    qm = block_prefix_union(qm, cfg.union_block) | previous_union(qm, cfg.union_block)
                masks[f"min{floor}"] = qm
            kmem = F.one_hot(gid, cfg.num_groups).bool()[None]
            keep = {n: R.shared_group_keep(m[None], kmem) for n, m in masks.items()}
            dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1])
            s = R.layer_recall(q, k, keep, window=cfg.window, sink=cfg.sink_tokens, oracle_of=tuple(keep),
                               scale=scale, softcap=softcap, dense=dense)
            totals[layer] = R.add_recall(totals[layer], s)

        wins = list(eval_windows(ids, a.length, a.windows))
        with capture(focus, per_layer), torch.no_grad():
            for win in wins:
                focus(torch.as_tensor(np.asarray(win)[None], dtype=torch.long), logits_to_keep=1)
        pool = pooled(totals, [R.summarize_recall(s) for s in totals])
        rows = {}
        for floor in a.floors:
            m, o = pool["masks"][f"min{floor}"], pool["masks"][f"oracle@min{floor}"]
            rows[str(floor)] = {"dropped_distant": m["dropped_distant"], "keys_per_query": m["keys_per_query"],
                                "oracle_dropped_distant": o["dropped_distant"]}
        result["splits"][corpus] = rows
        print(corpus, json.dumps(rows, indent=1), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
