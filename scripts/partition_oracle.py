"""How much of the frozen model's distant attention can *any* one partition into K groups keep? (issue 22)

The long-eval oracle keeps, per query, its own most-attended distant keys; a Focus routing keeps, per query, the
keys of one group, the same ~1/K of the keys for every query of that group. This script separates the two limits on
the cached attention targets of ``retrofit --objective attention`` (``--targets-cache``: per layer, each query's 64
most attended distant keys and their head-mean probability): for each window and layer it fits, *on that window
itself* (non-causal, an oracle), a partition of the keys into K groups of at most ``capacity`` x T/K keys, the
queries capped alike, each query's group one of two roles (``asymmetric``: a query's group need not be its own key
group) or one group per token for both (``symmetric``), by alternating maximisation from the router's own groups.
The router's global keys are kept by every row (``global_share``: the share of the mass they hold); the partitions
and the router's top-1 groups (evaluation mode, uncapped) serve the rest, whose kept share each row reports, beside
the share of distant keys each query sees (the budget). Alternating maximisation finds *a* good partition, so its
numbers are lower bounds on the best partition's.

    python scripts/partition_oracle.py --targets runs/routing/targets --windows 3 \
        --out docs/results/partition_oracle.json
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def _sparse(idx: np.ndarray, w: np.ndarray):
    """(rows, cols, vals) of the valid targets of one window and layer: query i, key j, head-mean probability."""
    t, m = idx.shape
    rows = np.repeat(np.arange(t), m)
    cols, vals = idx.reshape(-1), w.reshape(-1)
    ok = (cols >= 0) & (vals > 0)
    return rows[ok], cols[ok].astype(np.int64), vals[ok].astype(np.float64)


def _fill(gain: np.ndarray, cap: int) -> np.ndarray:
    """Assign each row of ``gain`` [N, K] one group, rows with the largest best gain first, each to its best group
    that is not full (at most ``cap`` rows)."""
    n, k = gain.shape
    prefs = np.argsort(-gain, axis=1).tolist()
    out = np.empty(n, dtype=np.int64)
    size = [0] * k
    for j in np.argsort(-gain.max(1), kind="stable").tolist():
        for g in prefs[j]:
            if size[g] < cap:
                out[j] = g
                size[g] += 1
                break
    return out


def _mass(q_group, k_group, rows, cols, vals) -> float:
    return float(vals[q_group[rows] == k_group[cols]].sum() / vals.sum())


def _budget(q_group, k_group, t: int, window: int, sink: int) -> float:
    """Mean share of a query's distant keys (sink <= j < i - window) that hold its group, from prefix counts."""
    k = int(max(q_group.max(), k_group.max())) + 1
    cum = np.zeros((t + 1, k))
    cum[1:] = np.cumsum(np.eye(k)[k_group], axis=0)  # cum[n, g]: keys before n in group g
    i = np.arange(window + sink + 1, t)
    if not i.size:
        return 0.0
    hi = i - window
    return float(np.mean((cum[hi, q_group[i]] - cum[sink, q_group[i]]) / (hi - sink)))


def fit(rows, cols, vals, t: int, k: int, cap: int, init: np.ndarray, iters: int, symmetric: bool):
    """Alternating maximisation of the kept mass from ``init`` key groups; returns (query groups, key groups)."""
    kg = init.copy()
    best = (-1.0, None, None)
    for _ in range(iters):
        qgain = np.zeros((t, k))
        np.add.at(qgain, (rows, kg[cols]), vals)  # a query's mass in each group
        qg = _fill(qgain, cap)
        kgain = np.zeros((t, k))
        np.add.at(kgain, (cols, qg[rows]), vals)  # a key's mass from the queries of each group
        if symmetric:  # one group per token for both roles: its row and its column mass together
            kg = _fill(qgain + kgain, cap)
            qg = kg
        else:  # the queries capped like the keys, so the budget stays that of balanced groups
            kg = _fill(kgain, cap)
            qgain = np.zeros((t, k))
            np.add.at(qgain, (rows, kg[cols]), vals)
            qg = _fill(qgain, cap)
        kept = _mass(qg, kg, rows, cols, vals)
        if kept > best[0] + 1e-6:
            best = (kept, qg.copy(), kg.copy())
        else:
            break
    return best[1], best[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="runs/routing/targets", help="a retrofit --targets-cache folder")
    ap.add_argument("--adapter", default="smollm2-135m-focus-g2", help="the router whose groups start the fit")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--capacity", type=float, default=1.5, help="largest group, times the balanced share T/K")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from safetensors.torch import load_file

    import focusattn as fa
    from focusattn.hf import focus_config, routers

    files = sorted(Path(args.targets).glob("*.safetensors"))[:args.windows]
    if not files:
        raise SystemExit(f"--targets {args.targets}: no cached targets (run retrofit --objective attention "
                         "--targets-cache DIR first)")
    model, _ = fa.load_model(args.model)
    fa.load_adapter(model, args.adapter)
    model.eval()
    cfg, rs = focus_config(model), routers(model)
    k = cfg.num_groups
    layers: dict[int, list[dict]] = {}
    t0 = time.time()
    for f in files:
        flat = load_file(str(f))
        for li, r in enumerate(rs):
            idx, w = flat[f"{li}.idx"][0].numpy(), flat[f"{li}.weight"][0].numpy()
            t = idx.shape[0]
            with torch.no_grad():
                routing = r(flat[f"{li}.h"].float())
            router_g = routing.groups[0].argmax(-1).numpy()
            glob = np.zeros(t, dtype=bool) if routing.global_keys is None else routing.global_keys[0].numpy()
            rows, cols, vals = _sparse(idx, w)
            total = vals.sum()
            keep = ~glob[cols]  # the global keys are kept by every routing: the partitions serve the rest
            rows, cols, vals = rows[keep], cols[keep], vals[keep]
            if not vals.size:
                continue
            cap = int(np.ceil(args.capacity * t / k))
            row = {"global_share": float(1 - vals.sum() / total),
                   "router": _mass(router_g, router_g, rows, cols, vals),
                   "router_budget": _budget(router_g, router_g, t, cfg.window, cfg.sink_tokens)}
            for name, sym in (("symmetric", True), ("asymmetric", False)):
                qg, kg = fit(rows, cols, vals, t, k, cap, router_g, args.iters, sym)
                row[name] = _mass(qg, kg, rows, cols, vals)
                row[f"{name}_budget"] = _budget(qg, kg, t, cfg.window, cfg.sink_tokens)
            layers.setdefault(li, []).append(row)
        print(f"{f.name}: {time.time() - t0:.0f} s", flush=True)
    keys = ("global_share", "router", "router_budget", "symmetric", "symmetric_budget", "asymmetric",
            "asymmetric_budget")
    per_layer = [{"layer": li, **{kk: float(np.mean([r[kk] for r in rows_])) for kk in keys}}
                 for li, rows_ in sorted(layers.items())]
    write_doc("partition_oracle", args, per_layer, {
        "windows": [f.name for f in files], "groups": k, "capacity": args.capacity, "window": cfg.window,
        "what": "share of the targets' distant attention mass (each query's 64 most attended distant keys, head "
                "mean over the routed heads) outside the router's global keys kept by the router's top-1 groups and "
                "by partitions fitted on the window itself; global_share: the mass the global keys hold; *_budget: "
                "mean share of a query's distant keys in its group"})


def write_doc(script: str, args, layers: list[dict], fields: dict) -> None:
    """Write ``args.out`` whole (the command that made it, ``fields``, the per-layer rows and their mean) and print
    the mean."""
    from focusattn._io import write_json

    mean = {kk: float(np.mean([r[kk] for r in layers])) for kk in layers[0] if kk != "layer"}
    command = f"python scripts/{script}.py " + " ".join(
        f"--{a.replace('_', '-')} {v}" for a, v in vars(args).items() if v not in ("", None))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, {"command": command, **fields, "mean": mean, "layers": layers})
    print(json.dumps(mean, indent=1))


if __name__ == "__main__":
    main()
