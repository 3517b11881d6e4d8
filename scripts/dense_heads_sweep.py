"""How many dense heads: an adapter at top-1 served with the N key/value heads of highest induction score dense
(``--dense-heads induction:N``, scored on repeated random tokens, no corpus), for several N, or with scored heads of
both kinds (``--specs induction:6+duplicate:4 ...``: duplicate-token heads too, ``hf.heads.scored_heads``), beside the
DuoAttention-style baseline (the same dense heads, window + sink on the others) at the same share of causal pairs.
Perplexity on held-out windows of each corpus, repeat-copy and passkey (filler: the first held-out corpus), the
share of causal pairs kept. One process, one model load; the original model is measured once.

python scripts/dense_heads_sweep.py --adapter runs/attn_g2_2k/adapter --rebalance-warm --heads 0 2 4 6 8 10 14 \
    --out docs/results/dense_heads_sweep.json
python scripts/dense_heads_sweep.py --adapter runs/attn_g2_2k/adapter --rebalance-warm --heads 6 \
    --specs induction:6+duplicate:2 induction:6+duplicate:4 induction:4+duplicate:4 \
    --out docs/results/dense_heads_duplicate_sweep.json
"""
import argparse
import sys

import torch

from focusattn._io import write_json
from focusattn.data.corpora import load_corpus
from focusattn.data.tokens import eval_windows, tokenize
from focusattn.eval.longctx import pairs_kept
from focusattn.eval.perplexity import perplexity
from focusattn.eval.probes import passkey_accuracy, passkey_sequences, repeat_copy_ppl, repeat_copy_sequences
from focusattn.hf import set_top_k, update_config
from focusattn.hf.baselines import restore, sliding_sink, window_for_budget
from focusattn.hf.compose import kv_heads
from focusattn.hf.heads import copy_scores, parse_dense_heads, scored_heads
from focusattn.hf.pair import load_pair


def probes(val: dict, tok, t: int, filler: str, ppl_windows: int, repeat_n: int) -> dict:
    """The sweeps' tests at length ``t``: held-out windows of each corpus, repeat-copy and passkey in ``filler``."""
    return {"ppl": {c: eval_windows(v, t, ppl_windows) for c, v in val.items()},
            "repeat": repeat_copy_sequences(val[filler], t, passage=256, distance=min(1024, t // 2), n=repeat_n),
            "passkey": passkey_sequences(val[filler], tok, t, depths=(0.1, 0.5, 0.9), per_depth=1)}


def quality(m, tests) -> dict:
    row = {f"ppl_{c}": perplexity(m, w, progress=False)["ppl"] for c, w in tests["ppl"].items()}
    row["repeat_ppl"] = repeat_copy_ppl(m, tests["repeat"], progress=False)["ppl"]
    row["passkey"] = passkey_accuracy(m, tests["passkey"], progress=False)["accuracy"]
    return row


def duo(base, tests, t: int, budget: float, dense: float, heads) -> dict:
    """The DuoAttention-style baseline at ``budget``: ``heads`` dense (their share ``dense``), window + first token
    on the others, the window chosen for the same share of causal pairs."""
    w = window_for_budget(t, budget, 1, dense)
    sliding_sink(base, w, 1, heads)
    try:
        return {"window": w, **quality(base, tests)}
    finally:
        restore(base)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapter", required=True)
    p.add_argument("--rebalance-warm", action="store_true")
    p.add_argument("--heads", nargs="*", type=int, default=[0, 2, 4, 6, 8, 10, 14])
    p.add_argument("--specs", nargs="*", default=[], help="scored-heads specs, e.g. induction:6+duplicate:4")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--corpora", nargs="+", default=["shakespeare", "lee-news", "python-code"])
    p.add_argument("--ppl-windows", type=int, default=2)
    p.add_argument("--repeat-n", type=int, default=1)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    specs = [f"induction:{n}" for n in a.heads] + a.specs
    counts = {sp: parse_dense_heads(sp) for sp in specs}
    if not all(isinstance(c, dict) for c in counts.values()):
        raise SystemExit(f"--specs: scored heads only (induction:N, duplicate:M, induction:N+duplicate:M), got {specs}")
    pair = load_pair("smollm2-135m", a.adapter, lengths=[a.length], top_ks=[1], threads=1,
                     rebalance_warm=True if a.rebalance_warm else None)
    base, focus, tok, t = pair.base, pair.focus, pair.tokenizer, a.length
    set_top_k(focus, 1)
    val = {c: tokenize(load_corpus(c), tok, tokenizer_id="smollm2-135m")[1] for c in a.corpora}
    tests = probes(val, tok, t, a.corpora[1], a.ppl_windows, a.repeat_n)
    scores = copy_scores(focus)
    hkv, layers = kv_heads(focus), scores["induction"].shape[0]
    doc = {"command": "python " + " ".join(sys.argv), "adapter": a.adapter, "T": t, "corpora": a.corpora,
           "filler": a.corpora[1], "induction_scores": scores["induction"].tolist(),
           "duplicate_scores": scores["duplicate"].tolist(), "original": quality(base, tests), "rows": []}
    print("original", doc["original"], flush=True)
    for spec in specs:
        heads = scored_heads(focus, counts[spec], scores=scores)
        n = len(heads)
        update_config(focus, dense_heads=heads)
        budget = pairs_kept(focus, val[a.corpora[0]][:t])
        row = {"spec": spec, "heads": n, "dense_heads": [list(h) for h in heads], "pairs_kept": budget,
               "top1": quality(focus, tests)}
        row["duo"] = duo(base, tests, t, budget, n / (layers * hkv), heads)
        doc["rows"].append(row)
        print(row, flush=True)
        write_json(a.out, doc)  # after every N: a partial sweep is kept


if __name__ == "__main__":
    main()
