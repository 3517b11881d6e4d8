"""The group-size cap (``FocusConfig.capacity``), one value at a time: an adapter at top-1 (with its dense heads, or
``--dense-heads``) served with each cap (0 = off), beside the DuoAttention-style baseline (the same dense heads,
window + sink on the others) at that cap's share of causal pairs. Per cap: the share of causal pairs kept at the
sweep's length and at ``--long`` (the budget the cap buys), the largest group (max over layers) on each corpus,
perplexity on held-out windows of each corpus, repeat-copy and passkey (filler: the second corpus). One process,
one model load; the original model is measured once.

python scripts/capacity_sweep.py --adapter smollm2-135m-focus-g2 --caps 0 2 1.5 1.25 \
    --out docs/results/capacity_sweep.json
"""
import argparse
import sys

import torch
from dense_heads_sweep import duo, probes, quality  # the same tests as the dense-heads sweep (scripts/ is on the path)

from focusattn._io import write_json
from focusattn.analysis.balance import routing_stats
from focusattn.data.corpora import load_corpus
from focusattn.data.tokens import tokenize
from focusattn.eval.longctx import pairs_kept
from focusattn.hf import focus_config, set_top_k, update_config
from focusattn.hf.compose import kv_heads, routers
from focusattn.hf.pair import load_pair


def largest(m, tokens, t: int) -> float:
    with torch.no_grad():
        m(torch.as_tensor(tokens[:t][None].astype("int64")), logits_to_keep=1)
    return routing_stats(m, t)["max_largest_share"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapter", required=True)
    p.add_argument("--caps", nargs="+", type=float, default=[0.0, 2.0, 1.5, 1.25])
    p.add_argument("--dense-heads", default=None, help="override the adapter's dense heads (a --dense-heads spec)")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--long", type=int, default=8192, help="also count the pairs kept at this length (0 = no)")
    p.add_argument("--corpora", nargs="+", default=["shakespeare", "lee-news", "python-code"])
    p.add_argument("--ppl-windows", type=int, default=2)
    p.add_argument("--repeat-n", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    t = a.length
    pair = load_pair("smollm2-135m", a.adapter, lengths=[t, *([a.long] if a.long else [])], top_ks=[1], threads=1,
                     dense_heads=a.dense_heads)
    base, focus, tok = pair.base, pair.focus, pair.tokenizer
    set_top_k(focus, 1)
    val = {c: tokenize(load_corpus(c), tok, tokenizer_id="smollm2-135m")[1] for c in a.corpora}
    tests = probes(val, tok, t, a.corpora[1], a.ppl_windows, a.repeat_n)
    cfg = focus_config(focus)
    heads = cfg.dense_heads
    doc = {"command": "python " + " ".join(sys.argv), "adapter": a.adapter, "T": t, "long": a.long,
           "corpora": a.corpora, "filler": a.corpora[1], "focus_config": cfg.to_dict(),
           "original": quality(base, tests), "rows": []}
    print("original", doc["original"], flush=True)
    dense = len(heads) / (len(routers(focus)) * kv_heads(focus))
    for cap in a.caps:
        update_config(focus, capacity=float(cap))
        budget = pairs_kept(focus, val[a.corpora[0]][:t])
        row = {"capacity": cap, "pairs_kept": budget,
               "pairs_kept_long": pairs_kept(focus, val[a.corpora[0]][:a.long]) if a.long else None,
               "largest_group": {c: largest(focus, v, t) for c, v in val.items()}, "top1": quality(focus, tests)}
        row["duo"] = duo(base, tests, t, budget, dense, heads)
        doc["rows"].append(row)
        print(row, flush=True)
        write_json(a.out, doc)  # after every cap: a partial sweep is kept


if __name__ == "__main__":
    main()
