"""Does routing in the layer's own key space keep what the model attends to? (issue 22)

ClusterKV-style selection, measured beside the shipped router on the same windows and the same attention: each key
joins its nearest centroid of the layer's keys (KV heads side by side), each query takes whole clusters in the order
its KV-group-mean query scores their centroids, until they hold as many distant keys as the adapter's served top-1
mask keeps for it (``kernels.recall.cluster_budget_keep``: the same budget, query by query). Two kinds of centroids:

* ``kmeans``: fitted per sequence on all its keys (ClusterKV's prefill recipe; long-eval's ``kmeans`` baseline);
* ``fitted{C}``: ``C`` centroids per layer fitted once on training windows of the registers the adapter was trained
  on (``--fit-corpora``, their *train* splits) and then used unchanged on every held-out window: a router with no
  per-sequence fitting, whose parameters could be shipped and trained.

``fitted{C}-top{m}`` is the same centroids with a fixed number of clusters per query (``m = C / K``, the router's
nominal share at top-1): what a static query top-m / key top-1 routing would serve, at whatever budget it lands.
Distant mass dropped (pooled over layers) and distant keys kept per query are reported per held-out corpus.

    python scripts/key_clusters_probe.py --length 2048 --windows 2 --out docs/results/key_clusters_2k.json
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-g2")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpora", nargs="+", default=["shakespeare", "lee-news", "python-code"],
                    help="held-out registers (validation splits)")
    ap.add_argument("--fit-corpora", nargs="+", default=["shakespeare", "python-docs"],
                    help="registers whose train splits fit the centroids (the adapter's training registers)")
    ap.add_argument("--fit-windows", type=int, default=2, help="training windows per fit corpus")
    ap.add_argument("--clusters", nargs="+", type=int, default=[64, 256], help="fitted centroids per layer")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=2, help="validation windows per corpus")
    ap.add_argument("--ppl", action="store_true",
                    help="also the perplexity of each mask served by the dense reference on the same windows")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if min(args.clusters) < 1 or args.length < 1 or args.windows < 1 or args.fit_windows < 1:
        raise SystemExit("--clusters, --length, --windows and --fit-windows must be >= 1")
    torch.set_num_threads(1)
    import numpy as np

    import focusattn as fa
    from focusattn._io import write_json
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import eval_windows, tokenize
    from focusattn.eval.recall import pooled
    from focusattn.focus.attend import dense_query_heads
    from focusattn.eval.perplexity import perplexity
    from focusattn.hf import focus_config, routers, set_top_k
    from focusattn.hf.probe import capture, kmeans_rule, masked, oracle_rule, served_keep
    from focusattn.kernels import recall as R

    model, tok = fa.load_model(args.model)
    fa.load_adapter(model, args.adapter)
    model.eval()
    cfg = focus_config(model)
    own = routers(model)
    t0 = time.time()

    def run(windows: np.ndarray, fn) -> None:
        with torch.no_grad(), capture(model, fn):
            for w in windows:
                model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long), logits_to_keep=1)

    keys: dict[int, list[torch.Tensor]] = {}
    for corpus in args.fit_corpora:  # train splits only: the held-out windows never fit a centroid
        train = tokenize(load_corpus(corpus), tok, tokenizer_id=args.model)[0]
        run(eval_windows(train, args.length, args.fit_windows),
            lambda layer, module, h, q, k, scale, softcap: keys.setdefault(layer, []).append(
                R.keys_side_by_side(k).flatten(0, 1)))
    cents = {layer: {c: R.fit_kmeans(torch.cat(ks), c) for c in args.clusters} for layer, ks in keys.items()}
    del keys
    fit_s = time.time() - t0
    print(f"fitted {args.clusters} centroids per layer in {fit_s:.0f} s", flush=True)

    rules = {"kmeans": kmeans_rule(1)}  # the same budget as the served top-1, query by query
    rules |= {f"fitted{c}": kmeans_rule(1, {layer: cs[c] for layer, cs in cents.items()}) for c in args.clusters}

    def perplexities(windows: np.ndarray, corpus: str) -> dict[str, float]:
        """Every mask's perplexity on ``windows``: the original (a capture that records nothing), the served
        top-1, and the others through the dense reference under their rule."""
        out = {}
        with capture(model, lambda *a: None):
            out["original"] = perplexity(model, windows, desc=f"{corpus} original")["ppl"]
        set_top_k(model, 1)
        out["top1"] = perplexity(model, windows, desc=f"{corpus} top1")["ppl"]
        set_top_k(model, None)
        for name, rule in (rules | {"oracle@top1": oracle_rule(1)}).items():
            with masked(model, rule):
                out[name] = perplexity(model, windows, desc=f"{corpus} {name}")["ppl"]
        print(corpus, {n: round(v, 2) for n, v in out.items()}, flush=True)
        return out

    rows = []
    for corpus in args.corpora:
        val = tokenize(load_corpus(corpus), tok, tokenizer_id=args.model)[1]
        totals: list[dict | None] = [None] * len(own)

        def per_layer(layer, module, h, q, k, scale, softcap):
            masks = {"top1": served_keep(own[layer], h, 1)}
            masks |= {name: rule(layer, module, h, q, k, scale, softcap) for name, rule in rules.items()}
            for c, cen in cents[layer].items():  # the same centroids, a fixed number of clusters per query
                cluster, scores = R.kmeans_key_clusters(q, k, centroids=cen)
                m = max(1, c // cfg.num_groups)
                mq = torch.zeros(scores.shape, dtype=torch.bool).scatter_(-1, scores.topk(m, -1).indices, True)
                masks[f"fitted{c}-top{m}"] = R.shared_group_keep(mq, torch.nn.functional.one_hot(cluster, c).bool())
            dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1])
            s = R.layer_recall(q, k, masks, window=cfg.window, sink=cfg.sink_tokens, oracle_of=("top1",),
                               scale=scale, softcap=softcap, dense=dense)
            totals[layer] = R.add_recall(totals[layer], s)

        windows = eval_windows(val, args.length, args.windows)
        set_top_k(model, None)
        run(windows, per_layer)
        layers = [R.summarize_recall(s) for s in totals]
        ov = pooled(totals, layers)["masks"]
        ppl = perplexities(windows, corpus) if args.ppl else {}
        for mask, m in ov.items():
            rows.append({"corpus": corpus, "mask": mask, "dropped_distant": m["dropped_distant"],
                         "keys_per_query": m["keys_per_query"], **({"ppl": ppl[mask]} if mask in ppl else {}),
                         "dropped_per_layer": [lay["masks"][mask]["dropped_distant"] for lay in layers]})
        if "original" in ppl:
            rows.append({"corpus": corpus, "mask": "original", "ppl": ppl["original"]})
        print(corpus, {r["mask"]: (round(r["dropped_distant"], 3), round(r["keys_per_query"]))
                       for r in rows if r["corpus"] == corpus and r["mask"] != "original"}, flush=True)
    flags = [f"--{k.replace('_', '-')}" + ("" if v is True else
                                           f" {' '.join(map(str, v)) if isinstance(v, list) else v}")
             for k, v in vars(args).items() if v is not None and v is not False]
    out = {"command": "python scripts/key_clusters_probe.py " + " ".join(flags),
           "model": args.model, "adapter": args.adapter, "length": args.length, "windows": args.windows,
           "fit": {"corpora": args.fit_corpora, "windows": args.fit_windows, "seconds": round(fit_s, 1)},
           "rows": rows, "seconds": round(time.time() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, out)  # atomic: a crash leaves no half-written file
    print("wrote", args.out)


if __name__ == "__main__":
    main()
