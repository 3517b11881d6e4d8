"""An adapter whose routers come, layer by layer, from one of two adapters of the same config: the donor's where a
per-layer measurement says it keeps more of the distant attention as served, the base's elsewhere (issue 22).

The measurement is ``scripts/partition_imitation.py``'s JSON: its held-out windows (cached target windows the
imitator was not trained on) act as the selection set, so the adapter must be judged on other text
(``scripts/router_recall.py``'s validation windows and unseen registers, ``long-eval``). A layer takes the donor when
its capped (served) mass on those windows is higher at a budget no larger than ``--budget-slack`` times the base's.

    python scripts/select_layers.py --base smollm2-135m-focus-g2 --donor runs/routing/g2i/adapter \
        --measure docs/results/partition_imitation.json --out runs/routing/g2is/adapter
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def chosen(doc: dict, slack: float) -> list[int]:
    """The layers whose imitator beats the router as served (capped) on the measurement's held-out windows."""
    return [r["layer"] for r in doc["layers"]
            if r["eval_imitator_served_capped"] > r["eval_router_capped"]
            and r["eval_imitator_served_capped_budget"] <= slack * r["eval_router_capped_budget"]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="adapter name or folder (its routers where the donor's lose)")
    ap.add_argument("--donor", required=True, help="adapter folder of the same config")
    ap.add_argument("--measure", required=True, help="scripts/partition_imitation.py's JSON")
    ap.add_argument("--budget-slack", type=float, default=1.05)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import focusattn as fa
    from focusattn.hf import focus_config, routers

    layers = chosen(json.loads(Path(args.measure).read_text()), args.budget_slack)
    donor, _ = fa.load_model(args.model)
    fa.load_adapter(donor, args.donor)
    model, _ = fa.load_model(args.model)
    fa.load_adapter(model, args.base)
    if focus_config(donor).to_dict() != focus_config(model).to_dict():
        raise SystemExit(f"--donor {args.donor}: its config differs from --base {args.base}'s")
    with torch.no_grad():
        for li in layers:
            routers(model)[li].load_state_dict(routers(donor)[li].state_dict())
    fa.save_adapter(model, args.out)
    (Path(args.out) / "selected_layers.json").write_text(json.dumps(
        {"base": args.base, "donor": args.donor, "measure": args.measure, "budget_slack": args.budget_slack,
         "donor_layers": layers}, indent=1))
    print(f"donor layers ({len(layers)}): {layers}")


if __name__ == "__main__":
    main()
