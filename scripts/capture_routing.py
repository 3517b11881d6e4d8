"""Capture the routing a trained Focus adapter learned on real text, for ``focusattn bench --routing captured``.

One prefill of ``--length`` tokens of the corpus's validation split through the adapted model (hard top-1, the
fastest forward; the ranking of groups is read from the router's soft scores, so top-2 and top-3 memberships come
from the same pass). Writes ``[layers, T, 3]`` uint8 group ids, best first, to a safetensors file (370 KB at
T = 4096; the committed file took 26 min of wall time at nice 15 on a shared, overloaded 2-core machine, where the
135M-parameter prefill is ~1 TFLOP):

    PYTHONPATH=src python scripts/capture_routing.py --out docs/results/data/routing-smollm2-135m-focus-k8.safetensors
"""
from __future__ import annotations

import argparse
import json
import time

import torch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", default="smollm2-135m-focus-k8")
    ap.add_argument("--data", default="shakespeare")
    ap.add_argument("--length", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from safetensors.torch import save_file

    from focusattn._io import atomic_path
    from focusattn.adapters import resolve
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import tokenize
    from focusattn.hf import last_routing, set_top_k
    from focusattn.hf.io import load_adapter
    from focusattn.hf.loading import load_model

    torch.set_num_threads(args.threads)
    model, tok = load_model(args.model)
    load_adapter(model, resolve(args.adapter))
    model.eval()
    set_top_k(model, 1)
    _, val = tokenize(load_corpus(args.data), tok, tokenizer_id=args.model)
    if len(val) < args.length:
        raise SystemExit(f"{args.data} validation split has {len(val)} tokens, fewer than --length {args.length}")
    x = torch.as_tensor(val[:args.length][None].astype("int64"))
    t0 = time.perf_counter()
    with torch.no_grad():
        model(x, use_cache=False, logits_to_keep=1)
    groups = torch.stack([r.groups[0, :args.length] for r in last_routing(model)])  # [L, T, K]
    top = groups.argsort(-1, descending=True)[..., :3].to(torch.uint8).contiguous()
    meta = {"model": args.model, "adapter": args.adapter, "data": f"{args.data} validation split",
            "length": str(args.length), "num_groups": str(groups.shape[-1]), "layers": str(groups.shape[0]),
            "captured_with": "hard top-1 prefill; groups ranked by the router's soft scores",
            "command": "PYTHONPATH=src python scripts/capture_routing.py " + " ".join(argv or __import__("sys").argv[1:])}
    with atomic_path(args.out) as tmp:
        save_file({"top_groups": top}, str(tmp), metadata=meta)
    print(json.dumps({**meta, "seconds": round(time.perf_counter() - t0, 1), "out": args.out}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
