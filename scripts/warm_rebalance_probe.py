"""Group balance of online rebalancing started cold (from zero, the default) or warm (``rebalance_warm``: from the
previous re-estimate), at the same Sinkhorn iterations, for each adapter at top-1 on the corpora it was and was not
trained on. One no-grad prefill per (adapter, corpus, mode), read through ``analysis.balance.routing_stats`` (what
the kernels are served). ~1 min per prefill at 4096 tokens on 1 core.

python scripts/warm_rebalance_probe.py --adapters runs/attn_g2_2k/adapter smollm2-135m-focus-k8 \
    --corpora shakespeare lee-news python-code --length 4096 --out docs/results/warm_rebalance_probe.json
"""
import argparse
import statistics

import torch

import focusattn as fa
from focusattn._io import write_json
from focusattn.analysis.balance import routing_stats
from focusattn.data.corpora import load_corpus
from focusattn.data.tokens import tokenize
from focusattn.hf import focus_config, update_config

CORPORA = ("shakespeare", "python-docs", "lee-news", "python-code")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--adapters", nargs="+", required=True)
    p.add_argument("--corpora", nargs="+", default=list(CORPORA))
    p.add_argument("--length", type=int, default=4096)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    for adapter in a.adapters:
        model, tok = fa.load_model("smollm2-135m")
        fa.load_adapter(model, adapter)
        model.eval()
        cfg = focus_config(model)
        if not cfg.rebalance:
            raise SystemExit(f"adapter {adapter}: rebalance=0, nothing to compare (needs online rebalancing)")
        for data in a.corpora:
            val = tokenize(load_corpus(data), tok, tokenizer_id="smollm2-135m")[1]
            x = torch.as_tensor(val[:a.length][None].astype("int64"))
            for warm in (False, True):
                update_config(model, top_k=1, key_top_k=None, rebalance_warm=warm)
                with torch.no_grad():
                    model(x, logits_to_keep=1)
                s = routing_stats(model, a.length)
                row = {"adapter": str(adapter), "corpus": data, "warm": warm, "T": a.length,
                       "mean_group_cost_vs_balanced": statistics.mean(x["group_cost_vs_balanced"] for x in s["layers"]),
                       "max_group_cost_vs_balanced": s["max_group_cost_vs_balanced"],
                       "max_largest_share": s["max_largest_share"],
                       "mean_cost_model_ratio": s["mean_cost_model_ratio"]}
                rows.append(row)
                print(row, flush=True)
    write_json(a.out, {"command": "python scripts/warm_rebalance_probe.py --adapters " + " ".join(a.adapters)
                       + " --corpora " + " ".join(a.corpora) + f" --length {a.length} --out {a.out}", "sinkhorn_iters": cfg.sinkhorn_iters,
                       "rebalance": cfg.rebalance, "results": rows})


if __name__ == "__main__":
    main()
