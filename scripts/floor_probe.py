"""How much of the distant attention does a floor under the key-space router's budget keep, and at what cost in keys?

``FocusConfig.min_keys = N``: each query fills at least ``N`` of its distant keys (all of them when it has fewer),
beside the adapter's share (``budget``). A share is stingy early in a sequence: at 2048 tokens 4% is a group or two
of 256. This probe serves the adapter's own router (``KeyRouter``) with each floor of ``--floors`` and reports, per
held-out corpus: distant attention dropped (head mean, dense heads as served), distant keys kept per
query, and the oracle's drop at the same per-query keys.

    python scripts/floor_probe.py --length 2048 --windows 1 --floors 0 64 128 256 --out runs/floor_2k.json
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch


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

    pair = load_pair(a.model, a.adapter, lengths=(a.length,), top_ks=(1,), threads=a.threads)
    focus, cfg = pair.focus, pair.cfg
    if cfg.router_input != "keys":
        raise SystemExit(f"--adapter {a.adapter}: a key-space adapter (router_input='keys')")
    own = routers(focus)
    result = {"command": "python scripts/floor_probe.py " + " ".join(sys.argv[1:]), "adapter": a.adapter,
              "T": a.length, "windows": a.windows, "budget": cfg.budget, "union_block": cfg.union_block,
              "splits": {}}
    for corpus in a.corpora:
        ids = tokenize(load_corpus(corpus), pair.tokenizer, tokenizer_id=a.model)[1]
        totals = [None] * len(own)

        def per_layer(layer, module, h, q, k, scale, softcap):
            r = own[layer]
            masks = {}
            try:  # the router itself, served with each floor: its groups, budget, fallback and block unions
                for floor in a.floors:
                    r.cfg = replace(cfg, min_keys=floor)
                    routing = r(h)
                    masks[f"min{floor}"] = routing.query_membership[0]
            finally:
                r.cfg = cfg
            kmem = routing.membership.bool()
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
