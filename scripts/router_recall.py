"""Attention recall of several adapters' served top-1 masks on held-out text of several registers (issue 22).

The retrofit's held-out curve (``heldout_kept_top1``) scores a router's *uncapped* top-1 groups on one window of its
training registers; the user is served the *capped* mask (``FocusConfig.capacity``) on any text. This script
measures, in one pass per window (the frozen model's own attention, ``eval.recall.measure_recall``), the share of
the original's distant attention each adapter's served top-1 mask drops, with its cap and without it, and the
oracle at the first adapter's budget, on the validation windows of each corpus (``--corpora``; Shakespeare and the
Python docs were trained on, Lee news and Python code never were). The routers are compared on the same windows
and the same attention, so the differences are the routings'.

    python scripts/router_recall.py --adapters smollm2-135m-focus-g2 runs/routing/g2m48/adapter \
        --corpora shakespeare lee-news python-code --windows 2 --out docs/results/router_recall.json
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapters", nargs="+", required=True, help="adapter names or folders (the first is the reference)")
    ap.add_argument("--names", nargs="*", help="row names, one per adapter (default: the adapter argument)")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpora", nargs="+", default=["shakespeare", "lee-news", "python-code"])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=2, help="validation windows per corpus")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    names = args.names or args.adapters
    if len(names) != len(args.adapters):
        raise SystemExit(f"--names: {len(names)} names for {len(args.adapters)} adapters")
    torch.set_num_threads(1)
    import focusattn as fa
    from focusattn._io import write_json
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import eval_windows, tokenize
    from focusattn.eval.recall import measure_recall
    from focusattn.hf import focus_config, update_config

    models = {}
    for name, a in zip(names, args.adapters):
        m, tok = fa.load_model(args.model)
        fa.load_adapter(m, a)
        models[name] = m.eval()
        cfg = focus_config(m)
        if cfg.capacity:  # the same routers uncapped: a second composed copy
            u, _ = fa.load_model(args.model)
            fa.load_adapter(u, a)
            update_config(u.eval(), capacity=0.0)
            models[f"{name} uncapped"] = u
    first, *rest = models
    rows, t0 = [], time.time()
    for corpus in args.corpora:
        val = tokenize(load_corpus(corpus), tok, tokenizer_id=args.model)[1]
        win = eval_windows(val, args.length, args.windows)
        rec = measure_recall(models[first], win, top_ks=(1,), others={n: models[n] for n in rest}, kmeans=False,
                             desc=f"recall {corpus}")
        ov = rec["overall"]["masks"]
        for mask, m in ov.items():
            name = first if mask in ("top1", "oracle@top1") else mask.rsplit("@", 1)[0]
            rows.append({"corpus": corpus, "mask": mask if mask == "oracle@top1" else name,
                         "dropped_distant": m["dropped_distant"], "keys_per_query": m.get("keys_per_query")})
        print(corpus, {r["mask"]: round(r["dropped_distant"], 3) for r in rows if r["corpus"] == corpus}, flush=True)
    out = {"command": "python scripts/router_recall.py " + " ".join(
               f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
               for k, v in vars(args).items() if v is not None),
           "model": args.model, "adapters": dict(zip(names, args.adapters)), "length": args.length,
           "windows": args.windows, "trained_on": "shakespeare+python-docs", "rows": rows,
           "seconds": round(time.time() - t0, 1)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, out)  # atomic: a crash leaves no half-written file
    print("wrote", args.out)


if __name__ == "__main__":
    main()
