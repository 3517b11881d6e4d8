"""Can a router learn the partitions fitted on windows it has seen, and do they carry over to windows it has not?
(issue 22)

``scripts/partition_oracle.py`` fits, on each window *with hindsight*, an 8-group symmetric partition that keeps 59%
of the distant attention mass outside the global keys where the router keeps 36%. Either such a partition is a
function of each token's layer input that the router failed to find (then imitating the fitted partitions should
carry over to unseen windows), or it fits one window's attention (then it will not). This script tells the two
apart on the cached targets of ``retrofit --objective attention`` (``--targets-cache``):

1. per layer, fit the symmetric partition on every window (from the router's own groups, as partition_oracle does);
2. train a classifier of each token's standardised layer input (linear: the function class of the linear router,
   whose W_g, centroids and offsets can represent it; ``--hidden``: an MLP) by cross-entropy against the fitted
   groups of the ``--train`` windows only;
3. on the ``--eval`` windows, never trained on, measure the mass and budget of the router's top-1 groups (uncapped,
   and capped as served), the imitator's top-1 (uncapped), and the partition fitted on those windows (the hindsight
   ceiling), with the agreement with the fitted groups on both splits.

The global keys are kept by every row (the router's global-key scorer), so every mass is a share of the rest.

    python scripts/partition_imitation.py --targets runs/routing/targets --train 40 --eval 9 \
        --save-adapter runs/routing/g2i/adapter --out docs/results/partition_imitation.json
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from partition_oracle import _budget, _mass, _sparse, fit, write_doc  # noqa: E402

ROWS = ("router", "router_capped", "imitator", "imitator_served", "imitator_served_capped", "fitted")


def _groups(router, h: torch.Tensor) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(uncapped top-1 groups, capped top-1 groups as served, global keys) of one window's layer input [1, T, d]."""
    r = router.served(h, 1)
    t = h.shape[1]
    glob = np.zeros(t, dtype=bool) if r.global_keys is None else r.global_keys[0].numpy()
    return r.groups[0].argmax(-1).numpy(), r.membership[0].float().argmax(-1).numpy(), glob


def _as_router(net, mu, sd, router, cfg, hidden: int):
    """The imitator as a FocusRouter served like the original one (its global keys, online rebalancing and cap):
    ``net((h - mu) / sd) = W' h + b'``; ``W'`` goes into ``W_g`` (``hidden``: into the MLP's first layer, ``W_g`` at
    zero) against centroids ``[tau I_K | 0]``, ``b'`` into the offsets the online rebalancing starts from."""
    from dataclasses import replace

    k, dg = cfg.num_groups, cfg.group_dim
    if dg < k:
        raise SystemExit(f"group_dim {dg} < num_groups {k}: the imitator does not fit the router")
    out = type(router)(router.proj.weight.shape[1], replace(cfg, router_hidden=hidden))
    out.load_state_dict(router.state_dict(), strict=False)  # the global-key scorer and its threshold
    with torch.no_grad():
        out.centroids.zero_()
        out.centroids[:, :k] = torch.eye(k) * cfg.tau
        first = net if not hidden else net[0]
        w, b = first.weight / sd, first.bias - first.weight @ (mu / sd)
        if not hidden:
            out.proj.weight.zero_()
            out.proj.weight[:k] = w
            out.offsets.copy_(b - b.mean())
        else:
            out.proj.weight.zero_()
            out.mlp[0].weight.copy_(w)
            out.mlp[0].bias.copy_(b)
            out.mlp[2].weight.zero_()
            out.mlp[2].weight[:k] = net[2].weight
            out.offsets.copy_(net[2].bias - net[2].bias.mean())
        out.offsets_ready.fill_(True)
    return out.eval()


def _inputs(h: torch.Tensor, n: int) -> torch.Tensor:
    """[1, T, d * (n + 1)]: each token's layer input beside those of the ``n`` tokens before it (zeros before the
    first): what a router that also reads its neighbours would see, still causal."""
    parts = [h] + [torch.nn.functional.pad(h, (0, 0, i, 0))[:, :h.shape[1]] for i in range(1, n + 1)]
    return torch.cat(parts, -1)


class _ContextRouter:
    """The imitator of ``--context`` served like a router (its global keys, online rebalancing and cap), for
    measurement only: the router's own logits are replaced by the imitator's on the window's inputs with context."""

    def __init__(self, net, mu, sd, router):
        import copy

        self.net, self.mu, self.sd, self.r = net, mu, sd, copy.deepcopy(router)
        last = net if isinstance(net, torch.nn.Linear) else net[-1]
        with torch.no_grad():
            self.r.offsets.copy_(last.bias - last.bias.mean())
            self.r.offsets_ready.fill_(True)
        self.bias = last.bias.detach()

    def groups(self, h: torch.Tensor, n: int):
        with torch.no_grad():
            logits = self.net((_inputs(h, n) - self.mu) / self.sd) - self.bias
        self.r.scores = lambda _h: logits  # instance override: the served pipeline on these logits
        try:
            return _groups(self.r, h)
        finally:
            del self.r.scores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", default="runs/routing/targets", help="a retrofit --targets-cache folder")
    ap.add_argument("--adapter", default="smollm2-135m-focus-g2", help="the router that starts the fits and the "
                                                                       "imitator")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--train", type=int, default=40, help="windows whose fitted partitions the imitator learns")
    ap.add_argument("--eval", type=int, default=9, help="the next windows (sorted by name), never trained on")
    ap.add_argument("--extra-train", default=None, help="a folder of more cached windows (scripts/cache_targets.py), "
                    "all added to the training windows")
    ap.add_argument("--eval-from", type=int, default=None, help="the first eval window (default: --train): fixed "
                    "eval windows for a learning curve over --train")
    ap.add_argument("--hidden", type=int, default=0, help="an MLP of this width beside W_g (0: linear)")
    ap.add_argument("--context", type=int, default=0, help="also give the imitator the layer inputs of the N "
                    "previous tokens (causal; a router would need them served too: measured, not served)")
    ap.add_argument("--steps", type=int, default=600, help="full-batch Adam steps per layer")
    ap.add_argument("--weight-decay", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--capacity", type=float, default=1.5, help="largest fitted group, times the balanced share")
    ap.add_argument("--iters", type=int, default=12)
    ap.add_argument("--layers", default="", help="comma-separated layers (default: all)")
    ap.add_argument("--save-adapter", default=None, help="also write an adapter whose trained layers' routers are "
                                                          "the imitators (the other layers keep --adapter's)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.save_adapter and (args.hidden or args.context):
        raise SystemExit("--save-adapter: a linear imitator of the token's own input only (the adapter keeps its "
                         "routers' shape)")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    from safetensors import safe_open

    import focusattn as fa
    from focusattn.hf import focus_config, routers

    files = sorted(Path(args.targets).glob("*.safetensors"))
    e0 = args.train if args.eval_from is None else args.eval_from
    if e0 < args.train or len(files) < e0 + args.eval:
        raise SystemExit(f"--targets {args.targets}: {len(files)} cached windows; need --train {args.train} <= "
                         f"--eval-from {e0} and --eval-from + --eval {args.eval} <= {len(files)}")
    tr_files, ev_files = files[:args.train], files[e0:e0 + args.eval]
    if args.extra_train:
        tr_files += sorted(Path(args.extra_train).glob("*.safetensors"))
    model, _ = fa.load_model(args.model)
    fa.load_adapter(model, args.adapter)
    model.eval()
    cfg, rs = focus_config(model), routers(model)
    k = cfg.num_groups
    layers = range(len(rs)) if not args.layers else [int(x) for x in args.layers.split(",")]
    out_rows, t0, imitators = [], time.time(), {}
    for li in layers:
        r = rs[li]
        data = {}  # split -> list of (h, rows, cols, vals, labels, router groups uncapped/capped, t)
        for split, fs in (("train", tr_files), ("eval", ev_files)):
            data[split] = []
            for f in fs:
                with safe_open(str(f), "pt") as sf:
                    h = sf.get_tensor(f"{li}.h").float()
                    idx, w = sf.get_tensor(f"{li}.idx")[0].numpy(), sf.get_tensor(f"{li}.weight")[0].numpy()
                t = h.shape[1]
                rg, rgc, glob = _groups(r, h)
                rows, cols, vals = _sparse(idx, w)
                keep = ~glob[cols]
                rows, cols, vals = rows[keep], cols[keep], vals[keep]
                if not vals.size:
                    continue
                cap = int(np.ceil(args.capacity * t / k))
                lab, _ = fit(rows, cols, vals, t, k, cap, rg, args.iters, True)
                data[split].append(dict(h=h, rows=rows, cols=cols, vals=vals, lab=lab, rg=rg, rgc=rgc, glob=glob,
                                        t=t))
        if not data["train"] or not data["eval"]:
            continue
        # the imitator: a classifier of the token's standardised layer input (the standardisation is an affine map a
        # router folds into W_g / W_1 and its offsets, so the class is what a linear or MLP router can serve; without
        # it the massive activations of a few channels leave the cross-entropy ill-conditioned)
        hs = torch.cat([_inputs(d["h"], args.context)[0] for d in data["train"]])
        mu, sd = hs.mean(0), hs.std(0) + 1e-3
        ys = torch.from_numpy(np.concatenate([d["lab"] for d in data["train"]]))
        d_model = hs.shape[1]
        net = torch.nn.Linear(d_model, k) if not args.hidden else torch.nn.Sequential(
            torch.nn.Linear(d_model, args.hidden), torch.nn.GELU(), torch.nn.Linear(args.hidden, k))
        opt = torch.optim.Adam(net.parameters(), lr=args.lr, weight_decay=args.weight_decay)
        xs = (hs - mu) / sd
        losses = []
        for _ in range(args.steps):
            loss = torch.nn.functional.cross_entropy(net(xs), ys)
            losses.append(float(loss.detach()))
            opt.zero_grad()
            loss.backward()
            opt.step()

        def imitate(h: torch.Tensor) -> np.ndarray:
            with torch.no_grad():
                return net((_inputs(h, args.context)[0] - mu) / sd).argmax(-1).numpy()

        served = _as_router(net, mu, sd, r, cfg, args.hidden) if not args.context else _ContextRouter(net, mu, sd, r)
        imitators[li] = served

        row = {"layer": li, "train_loss_start": losses[0], "train_loss": losses[-1]}
        for split, ds in data.items():
            acc = {"router": [], "imitator": []}
            res = {n: [] for n in ROWS}
            bud = {n: [] for n in ROWS}
            for d in ds:
                ig = imitate(d["h"])
                sg, sgc, _ = _groups(served, d["h"]) if not args.context else served.groups(d["h"], args.context)
                acc["router"].append(float((d["rg"] == d["lab"]).mean()))
                acc["imitator"].append(float((ig == d["lab"]).mean()))
                for n, g in (("router", d["rg"]), ("router_capped", d["rgc"]), ("imitator", ig),
                             ("imitator_served", sg), ("imitator_served_capped", sgc), ("fitted", d["lab"])):
                    res[n].append(_mass(g, g, d["rows"], d["cols"], d["vals"]))
                    bud[n].append(_budget(g, g, d["t"], cfg.window, cfg.sink_tokens))
            for n in ROWS:
                row[f"{split}_{n}"] = float(np.mean(res[n]))
                row[f"{split}_{n}_budget"] = float(np.mean(bud[n]))
            for n in acc:
                row[f"{split}_{n}_agreement"] = float(np.mean(acc[n]))
        out_rows.append(row)
        print(f"layer {li}: eval router {row['eval_router']:.3f} ({row['eval_router_budget']:.3f}) imitator "
              f"{row['eval_imitator']:.3f} ({row['eval_imitator_budget']:.3f}) served "
              f"{row['eval_imitator_served']:.3f} "
              f"({row['eval_imitator_served_budget']:.3f}) capped {row['eval_router_capped']:.3f} "
              f"({row['eval_router_capped_budget']:.3f}) / {row['eval_imitator_served_capped']:.3f} "
              f"({row['eval_imitator_served_capped_budget']:.3f}) fitted {row['eval_fitted']:.3f}; train imitator "
              f"{row['train_imitator']:.3f} agreement {row['train_imitator_agreement']:.2f} / "
              f"{row['eval_imitator_agreement']:.2f}; {time.time() - t0:.0f} s", flush=True)
    if args.save_adapter:  # after every measurement: the routers above were the adapter's own until now
        for li, served in imitators.items():
            rs[li].load_state_dict(served.state_dict())
        fa.save_adapter(model, args.save_adapter)
    write_doc("partition_imitation", args, out_rows, {
        "train_windows": [f.name for f in tr_files], "eval_windows": [f.name for f in ev_files], "groups": k,
        "capacity": args.capacity, "window": cfg.window, "hidden": args.hidden, "context": args.context,
        "what": "share of the targets' distant attention mass outside the router's global keys that each routing's "
                "top-1 groups keep (*_budget: the mean share of a query's distant keys in its group): the router's "
                "(uncapped / capped as served), the imitator's (a classifier of the layer input trained by "
                "cross-entropy on the partitions fitted on the train windows, served as a router: uncapped with "
                "online rebalancing, and capped), and the partition fitted on the window itself (hindsight); "
                "agreement: the share of tokens whose top-1 group is the fitted one"})


if __name__ == "__main__":
    main()
