"""How much the keyed engine (``kernels.decomposed.keyed``) computes beyond the pairs a key-space adapter keeps.

One prefill of ``--length`` held-out tokens through the adapted model captures each layer's key groups and query
memberships; for every block layout it counts the group keys computed (a block computes every key, before its
window, of every group one of its queries joined) over the group pairs kept. Layouts: consecutive blocks of 64 /
32 / 16 queries (the engine's), and two levels (groups joined by fewer than ``shared`` x 64 of a block's queries
computed instead for the 16-query sub-blocks that joined them). Counts only: the timing of the two-level engine
is in docs/DECISIONS.md ("The keyed engine stays one level").

    PYTHONPATH=src python scripts/keyed_union_probe.py --out runs/union/shakespeare.json
"""
from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F


def counts(qmem, gid, window: int, bq: int, sub: int = 0, shared: float = 0.0) -> tuple[int, int]:
    """(group keys computed, group pairs kept) for one layer: ``qmem`` [T, K] bool, ``gid`` [T] long."""
    t, kk = qmem.shape
    pref = torch.cat([torch.zeros(1, kk, dtype=torch.long), F.one_hot(gid, kk).long().cumsum(0)])  # keys before p
    comp = kept = 0
    for b0 in range(0, t, bq):
        m = qmem[b0:b0 + bq]
        lims = (torch.arange(b0, b0 + len(m)) - window).clamp_min(0)
        lim = int(lims.max())
        common = m.sum(0) >= max(1, round(shared * bq)) if sub else m.any(0)
        comp += len(m) * int((pref[lim] * common).sum())
        for s0 in range(0, len(m), sub) if sub else ():  # the rare groups, per sub-block that joined them
            comp += len(m[s0:s0 + sub]) * int((pref[lim] * (m[s0:s0 + sub].any(0) & ~common)).sum())
        kept += int((m.long() * pref[lims]).sum())
    return comp, kept


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-keys256-means")
    ap.add_argument("--data", default="shakespeare")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--layers", default="2,6,10,16,20,24,28")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from focusattn._io import atomic_path
    from focusattn.adapters import resolve
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import tokenize
    from focusattn.hf import focus_config, last_routing, set_top_k
    from focusattn.hf.io import load_adapter
    from focusattn.hf.loading import load_model

    torch.set_num_threads(1)
    model, tok = load_model("smollm2-135m")
    load_adapter(model, resolve(args.adapter))
    set_top_k(model, 1)
    model.eval()
    _, val = tokenize(load_corpus(args.data), tok, tokenizer_id="smollm2-135m")
    with torch.no_grad():
        model(torch.as_tensor(val[:args.length][None].astype("int64")), use_cache=False, logits_to_keep=1)
    window = focus_config(model).window
    routings = last_routing(model)  # each layer's key groups (key top-1) and query memberships
    layouts = {"blocks of 64": (64, 0, 0.0), "blocks of 32": (32, 0, 0.0), "blocks of 16": (16, 0, 0.0),
               "two levels 64/16, shared 0.15": (64, 16, 0.15), "two levels 64/16, shared 0.25": (64, 16, 0.25)}
    rows = {}
    for name, (bq, sub, shared) in layouts.items():
        comp = kept = 0
        for layer in map(int, args.layers.split(",")):
            r = routings[layer]
            c, k = counts(r.query_membership[0], r.membership[0].to(torch.uint8).argmax(-1).long(), window, bq, sub,
                          shared)
            comp, kept = comp + c, kept + k
        rows[name] = {"computed_over_kept": round(comp / kept, 3), "computed": comp, "kept": kept}
        print(name, rows[name], flush=True)
    with atomic_path(args.out) as tmp:
        tmp.write_text(json.dumps({"adapter": args.adapter, "data": args.data, "length": args.length,
                                   "layers": args.layers, "layouts": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
