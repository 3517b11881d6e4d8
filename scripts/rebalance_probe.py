"""Online rebalancing interval N of the shipped K=8 adapter: perplexity against the original model and the largest
group per layer, at 2048 tokens on Shakespeare (training kind) and Lee news (another kind). ~15 min on 1 core."""
import json
import math
from pathlib import Path

import torch

import focusattn as fa
from focusattn.hf import last_routing, update_config
from focusattn.data.corpora import load_corpus
from focusattn.data.tokens import tokenize
torch.set_num_threads(1)
T, W = 2048, 2
base, tok = fa.load_model("smollm2-135m")
model, _ = fa.load_model("smollm2-135m")
fa.load_adapter(model, "smollm2-135m-focus-k8"); model.eval()
res = []
for data in ("shakespeare", "lee-news"):
    _, val = tokenize(load_corpus(data), tok, tokenizer_id="smollm2-135m")
    xs = [torch.as_tensor(val[i * T:(i + 1) * T][None].astype("int64")) for i in range(W)]
    def nll(m):
        tot = 0.0
        with torch.no_grad():
            for x in xs:
                tot += float(m(x, labels=x).loss)
        return tot / len(xs)
    b = nll(base); print(data, "base", math.exp(b), flush=True)
    for rb in (0, 128, 256, 512):
        for k in (1, 2):
            update_config(model, rebalance=rb, top_k=k)
            l = nll(model)
            shares = [float(r.membership[0].sum(0).max()) / T for r in last_routing(model)]
            top1 = [float(torch.bincount(r.groups[0].argmax(-1), minlength=8).max()) / T for r in last_routing(model)]
            row = dict(data=data, rebalance=rb, top_k=k, ppl=math.exp(l), delta=math.exp(l - b) - 1,
                       max_share=max(shares), max_top1_share=max(top1))
            res.append(row); print(row, flush=True)
out = {"command": "python scripts/rebalance_probe.py", "adapter": "smollm2-135m-focus-k8", "T": T, "windows": W, "results": res}
Path("docs/results").mkdir(parents=True, exist_ok=True)
Path("docs/results/rebalance_probe.json").write_text(json.dumps(out, indent=1) + "\n")
