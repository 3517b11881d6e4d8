"""Query and key roles measured without training: one trained router served three ways on held-out text — symmetric
top-1, symmetric top-2, and query top-1 / key top-k (``FocusConfig(top_k=1, key_top_k=k)``) — with, per mask, the
share of causal pairs kept, the share of the original model's distant attention dropped (and the oracle's at the
same budget), the perplexity against the original on the same windows, and long-eval's probes (repeat-copy
perplexity and passkey accuracy, out-of-domain filler) for each.

    python scripts/roles_eval.py --adapter smollm2-135m-focus-k8 --out docs/results/long_eval_k8_roles.json

Attention recall: ``eval/recall.py`` (``measure_recall(..., roles=(k,))``); pairs kept: ``eval.longctx.pairs_kept``
(mean over layers, the roles mask fed both memberships); perplexity: the exact sparse kernels (backend ``auto``).
"""
from __future__ import annotations

import argparse
import sys
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="alias, hub id or local folder")
    p.add_argument("--adapter", required=True, help="adapter folder or shipped adapter name")
    p.add_argument("--data", default="shakespeare", help="in-domain corpus (held-out split)")
    p.add_argument("--ood-data", default="lee-news", help="out-of-domain corpus (held-out split)")
    p.add_argument("--length", type=int, default=2048, help="tokens per window (T)")
    p.add_argument("--recall-windows", type=int, default=1, help="windows per corpus for attention recall")
    p.add_argument("--ppl-windows", type=int, default=2, help="windows per corpus for perplexity")
    p.add_argument("--key-top-k", type=int, default=2, help="key top-k served with query top-1")
    p.add_argument("--no-probes", action="store_true", help="skip repeat-copy and passkey")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args(argv)

    from focusattn._io import write_json
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import check_length, eval_windows, tokenize
    from focusattn.eval.longctx import pairs_kept
    from focusattn.eval.perplexity import perplexity
    from focusattn.eval.probes import passkey_accuracy, passkey_sequences, repeat_copy_ppl, repeat_copy_sequences
    from focusattn.eval.recall import measure_recall
    from focusattn.hf import set_top_k
    from focusattn.hf.pair import load_pair

    t0 = time.time()
    kk = a.key_top_k
    pair = load_pair(a.model, a.adapter, lengths=(a.length,), top_ks=(1, 2, kk), threads=a.threads)
    base, focus, tok, t = pair.base, pair.focus, pair.tokenizer, a.length
    corpora = {"domain": a.data, "ood": a.ood_data}
    val = {}
    for split, name in corpora.items():
        val[split] = tokenize(load_corpus(name), tok, tokenizer_id=a.model)[1]
        check_length(val[split], t, f"{name} validation split")
    roles = f"top1key{kk}"
    serve = {"top1": dict(k=1, key_top_k=None), "top2": dict(k=2, key_top_k=None), roles: dict(k=1, key_top_k=kk)}
    doc = {"schema": "focusattn.roles_eval/1",
           "command": "python " + " ".join(["scripts/roles_eval.py"] + list(sys.argv[1:] if argv is None else argv)),
           "model": a.model, "adapter": str(a.adapter), "T": t, "recall_windows": a.recall_windows,
           "ppl_windows": a.ppl_windows, "corpora": corpora,
           "masks": {n: f"query top-{s['k']}, key top-{s['key_top_k'] or s['k']}" for n, s in serve.items()},
           "splits": {}}
    for split in corpora:
        rec = measure_recall(focus, eval_windows(val[split], t, a.recall_windows), top_ks=(1, 2), roles=(kk,),
                             kmeans=False, oracle=True, desc=f"recall {split}")
        masks = rec["overall"]["masks"]
        rows = {}
        for name, s in serve.items():
            set_top_k(focus, s["k"], key_top_k=s["key_top_k"])
            rows[name] = {"pairs_kept": pairs_kept(focus, val[split][:t]),
                          "distant_dropped": masks[name]["dropped_distant"],
                          "distant_dropped_oracle": masks[f"oracle@{name}"]["dropped_distant"],
                          "vs_oracle": masks[name].get("vs_oracle"),
                          "distant_keys_per_query": masks[name]["keys_per_query"]}
        windows = eval_windows(val[split], t, a.ppl_windows)
        ppl = {"original": perplexity(base, windows, desc=f"{split} original")["ppl"]}
        for name, s in serve.items():
            set_top_k(focus, s["k"], key_top_k=s["key_top_k"])
            ppl[name] = perplexity(focus, windows, desc=f"{split} {name}")["ppl"]
            rows[name]["ppl"] = ppl[name]
            rows[name]["ppl_change"] = ppl[name] / ppl["original"] - 1
        doc["splits"][split] = {"ppl_original": ppl["original"], "masks": rows,
                                "attention_share": rec["overall"]["share"],
                                "per_layer_distant_dropped": {n: [lay["masks"][n]["dropped_distant"]
                                                                  for lay in rec["layers"]] for n in serve}}
        print(split, {n: {k: round(v, 4) if isinstance(v, float) else v for k, v in r.items()}
                      for n, r in rows.items()}, flush=True)
    if not a.no_probes:  # as long-eval builds them at this length: filler from the out-of-domain text
        distance = min(1024, t // 2)
        tests = {"passkey": passkey_sequences(val["ood"], tok, t, depths=(0.1, 0.5, 0.9), per_depth=1),
                 "repeat": repeat_copy_sequences(val["ood"], t, passage=min(256, distance), distance=distance, n=2)}
        probes = {}
        for name, m, setup in [("original", base, None)] + [(n, focus, s) for n, s in serve.items()]:
            if setup is not None:
                set_top_k(focus, setup["k"], key_top_k=setup["key_top_k"])
            probes[name] = {"repeat_ppl": repeat_copy_ppl(m, tests["repeat"], desc=f"repeat {name}")["ppl"],
                            "passkey": passkey_accuracy(m, tests["passkey"], desc=f"passkey {name}")["accuracy"]}
            print(name, probes[name], flush=True)
        doc["probes"] = {"filler": a.ood_data, "passkey_depths": [0.1, 0.5, 0.9], "repeat_distance": distance,
                         "repeat_n": 2, "results": probes}
    doc["wall_s"] = round(time.time() - t0, 1)
    write_json(a.out, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
