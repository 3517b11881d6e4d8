"""What else could the key-space router's groups keep? Causal variants of its key groups and group scores (issue 22).

The served key-space router (``focus/key_router.py``, ``key_scores="means"``) puts each key in its nearest fitted
centroid and has each query take whole groups, best scored first, until they hold the budget of its distant keys.
On held-out text it drops 1.5-1.7x the distant attention the oracle drops at the same budget, and per-sequence
k-means (not causal) drops less. This probe asks which part of that gap a causal change to the groups or the scores
could close, on the same windows and the same attention (distant mass dropped, pooled over layers):

* ``served``: the router as loaded (its own call on the layer's features: what the kernels serve);
* ``online{p}``: each 64-key block joins the nearest *running mean* of the sequence's earlier keys (the centroid
  counted as ``p`` keys; online k-means, causal, so decode = prefill would hold);
* ``cap{a}``: ``online8`` with no group over ``a`` times the mean group size (balanced groups);
* ``gauss{l}``: the served groups, each scored by mean + ``l`` * the query's variance along the group's keys
  (a diagonal-Gaussian estimate of the group's attention per key);
* ``bound``: the served groups scored by Quest's upper bound (per-channel max/min of the group's keys);
* ``kmeans16`` / ``kmeans32``: per-sequence k-means on all keys, 16 or 32 keys a cluster (the long-eval baseline is
  ``kmeans16``; not causal);
* ``oracle@served``: per query the same number of distant keys as ``served``, the most attended.

Every variant fills the same budget share (``FocusConfig.budget``) with the means scores unless named otherwise, so
the keys kept per query match within a key or two (reported). ``imbalance``: K * sum of squared group shares
(1 = equal groups); ``groups_per_query``: groups a query takes. Finer fitted groups are measured by running the
probe on adapters fitted with more centroids (``make key-groups``).

    python scripts/key_groups_probe.py --length 2048 --variants served,online1,online8,cap2,cap4,gauss0.03,\
gauss0.0625,gauss0.125,bound,kmeans16,kmeans32 --out docs/results/key_groups_k256_2k.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

BLOCK = 64  # the means' block (key_router.MEANS_BLOCK)


def online_ids(keys, ok, cent, prior: float, alpha: float = 0.0, cmin: int = 4) -> torch.Tensor:
    """Online k-means in blocks: keys ``[T, W]`` float64 of block ``b`` join the nearest of the running means of the
    countable (``ok``) keys of blocks ``< b``, each centroid counted as ``prior`` keys; ``alpha``: groups holding
    ``alpha`` x the mean count (at least ``cmin``) are closed."""
    t, kk = keys.shape[0], cent.shape[0]
    tot, cnt = torch.zeros_like(cent), torch.zeros(kk, dtype=torch.float64)
    ids = torch.empty(t, dtype=torch.long)
    for s in range(0, t, BLOCK):
        e = min(t, s + BLOCK)
        mu = (tot + prior * cent) / (cnt + prior)[:, None]
        d = (mu * mu).sum(-1) - 2 * keys[s:e] @ mu.t()
        if alpha:
            d = d.masked_fill((cnt >= max(alpha * float(cnt.sum()) / kk, cmin))[None], float("inf"))
        ids[s:e] = d.argmin(-1)
        tot.index_add_(0, ids[s:e], keys[s:e] * ok[s:e, None])
        cnt.index_add_(0, ids[s:e], ok[s:e].double())
    return ids


def stat_scores(qf, keys, gid, ok, cent, window: int, lams) -> dict[str, torch.Tensor]:
    """Causal group statistics at the means' boundaries (keys before ``floor((i - window) / 64) * 64``, the centroid
    as one more key): ``gauss{l}`` = q . mean + l * q^2 . var, and ``bound`` = Quest's max over the group's box."""
    t, w = keys.shape
    kk = cent.shape[0]
    nb = -(-t // BLOCK)
    oh = F.one_hot(gid, kk).double() * ok.double()[:, None]
    bsum, bsq = torch.zeros(nb, kk, w, dtype=torch.float64), torch.zeros(nb, kk, w, dtype=torch.float64)
    bmax = torch.full((nb, kk, w), -float("inf"), dtype=torch.float64)
    bmin = torch.full((nb, kk, w), float("inf"), dtype=torch.float64)
    bcnt = torch.zeros(nb, kk, dtype=torch.float64)
    for b in range(nb):
        sl = slice(b * BLOCK, min(t, (b + 1) * BLOCK))
        bsum[b], bsq[b], bcnt[b] = oh[sl].t() @ keys[sl], oh[sl].t() @ keys[sl] ** 2, oh[sl].sum(0)
        x = keys[sl][ok[sl]]
        g = gid[sl][ok[sl]][:, None].expand_as(x)
        bmax[b].scatter_reduce_(0, g, x, "amax")
        bmin[b].scatter_reduce_(0, g, x, "amin")

    def before(x):  # index m: the blocks < m
        return torch.cat([torch.zeros_like(x[:1]), x.cumsum(0)], 0)

    psum, psq, pcnt = before(bsum), before(bsq), before(bcnt)
    pmax = torch.cat([bmax[:1].clone().fill_(-float("inf")), bmax.cummax(0).values], 0)
    pmin = torch.cat([bmin[:1].clone().fill_(float("inf")), bmin.cummin(0).values], 0)
    m = torch.div(torch.arange(t) - window, BLOCK, rounding_mode="floor").clamp_min(0)
    out = {f"gauss{lam:g}": torch.empty(t, kk, dtype=torch.float64) for lam in lams}
    out["bound"] = torch.empty(t, kk, dtype=torch.float64)
    for mi in m.unique().tolist():
        rows = (m == mi).nonzero().squeeze(1)
        n = pcnt[mi] + 1
        mu = (psum[mi] + cent) / n[:, None]
        var = ((psq[mi] + cent ** 2) / n[:, None] - mu ** 2).clamp_min(0)
        q = qf[rows]
        for lam in lams:
            out[f"gauss{lam:g}"][rows] = q @ mu.t() + lam * (q * q) @ var.t()
        hi, lo = torch.maximum(pmax[mi], cent), torch.minimum(pmin[mi], cent)
        out["bound"][rows] = q.clamp_min(0) @ hi.t() + q.clamp_max(0) @ lo.t()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-keys256-means",
                    help="a key-space adapter (name or folder); served with key_scores='means'")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--corpora", nargs="+", default=["shakespeare", "python-code"],
                    help="held-out registers (validation splits)")
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--windows", type=int, default=1, help="validation windows per corpus")
    ap.add_argument("--variants", default="served,kmeans16", help="comma-separated; see the module docstring")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", required=True)
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

    variants = [v for v in a.variants.split(",") if v]
    known = ("served", "online", "cap", "gauss", "bound", "kmeans")
    bad = [v for v in variants if not v.startswith(known)]
    if bad or "served" not in variants:
        raise SystemExit(f"--variants: unknown {bad}; must include 'served'; allowed prefixes {known}")
    lams = [float(v[5:]) for v in variants if v.startswith("gauss")]
    pair = load_pair(a.model, a.adapter, lengths=(a.length,), top_ks=(1,), threads=a.threads, key_scores="means")
    focus, cfg = pair.focus, pair.cfg
    own = routers(focus)
    result = {"command": "python scripts/key_groups_probe.py " + " ".join(sys.argv[1:]), "adapter": a.adapter,
              "groups": cfg.num_groups, "budget": cfg.budget, "T": a.length, "windows": a.windows, "splits": {}}
    for corpus in a.corpora:
        ids = tokenize(load_corpus(corpus), pair.tokenizer, tokenizer_id=a.model)[1]
        totals, stats = [None] * len(own), {}

        def per_layer(layer, module, h, q, k, scale, softcap):
            r = own[layer]
            w, t = r.width, h.shape[1]
            pos = torch.arange(t)
            ok = pos >= cfg.sink_tokens
            keys, cent = h[0, :, :w].double(), r.centroids.double()
            masks = {}

            def add(name, gid, qm):
                masks[name] = R.shared_group_keep(qm[None], F.one_hot(gid, qm.shape[-1]).bool()[None])
                sizes = torch.bincount(gid, minlength=qm.shape[-1]).double()
                s = stats.setdefault(name, [0.0, 0.0, 0])
                s[0] += float((sizes ** 2).sum() / sizes.sum() ** 2 * qm.shape[-1])
                s[1] += float(qm.sum(-1).double().mean())
                s[2] += 1

            def fill(name, gid, scores):  # the router's rule for any groups and scores
                kk = scores.shape[-1]
                onehot = F.one_hot(gid, kk).to(torch.int32) * ok[:, None].to(torch.int32)
                prefix = torch.cat([torch.zeros(1, kk, dtype=torch.int32), onehot.cumsum(0)], 0)
                counts = prefix[(pos - cfg.window).clamp_min(0)]
                want = torch.round(cfg.budget * counts.sum(-1).double()).long()
                qm = R.fill_budget(counts, scores, want) & (counts > 0)
                qm |= F.one_hot(scores.argmax(-1), kk).to(torch.bool) & ~qm.any(-1, keepdim=True)
                add(name, gid, qm)

            routing = r(h)
            served = routing.membership[0].float().argmax(-1)
            add("served", served, routing.query_membership[0])
            for v in variants:
                if v.startswith("online") or v.startswith("cap"):
                    gid = (online_ids(keys, ok, cent, float(v[6:])) if v.startswith("online")
                           else online_ids(keys, ok, cent, 8.0, alpha=float(v[3:])))
                    fill(v, gid, r._mean_scores(h, gid[None], ok[None], 0, None, None)[0])
                elif v.startswith("kmeans"):
                    per = int(v[6:])
                    cl, sc = R.kmeans_key_clusters(q, k, num_clusters=max(1, -(-t // per)))
                    fill(v, cl[0], sc[0])
            if lams or "bound" in variants:
                for v, s in stat_scores(h[0, :, w:].double(), keys, served, ok, cent, cfg.window, lams).items():
                    if v in variants:
                        fill(v, served, s.float())
            dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1])
            s = R.layer_recall(q, k, masks, window=cfg.window, sink=cfg.sink_tokens, oracle_of=("served",),
                               scale=scale, softcap=softcap, dense=dense)
            totals[layer] = R.add_recall(totals[layer], s)

        t0 = time.time()
        with capture(focus, per_layer), torch.no_grad():
            for win in eval_windows(ids, a.length, a.windows):
                focus(torch.as_tensor(np.asarray(win)[None], dtype=torch.long), logits_to_keep=1)
        pool = pooled(totals, [R.summarize_recall(s) for s in totals])
        out = {n: {"dropped_distant": m["dropped_distant"], "keys_per_query": m["keys_per_query"]}
               for n, m in pool["masks"].items()}
        for n, s in stats.items():
            out[n].update(imbalance=s[0] / s[2], groups_per_query=s[1] / s[2])
        result["splits"][corpus] = out
        print(corpus, f"{time.time() - t0:.0f} s", json.dumps(out), flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(a.out)


if __name__ == "__main__":
    main()
