"""Where a decode step's time goes, per layer: the original model against the shipped adapter (top-1, top-2).

After a prefill of T held-out tokens, N greedy decode steps per variant; each step is split (thread CPU time, one
torch thread) into the attention function per layer, and inside Focus's: routing (``RoutingCache.route``: router,
top-k, online rebalancing, routing cache and group index), the kernel (``focus_attention`` as ``focus.attend`` calls
it: validation, dispatch, attention) and the rest of the attention function (masks, layout). Everything outside the
attention function (projections, MLPs, norms, logits) is "model". Only public entry points of the package are
wrapped, so the same script profiles an older revision: ``PYTHONPATH=/tmp/old/src python scripts/decode_profile.py``.

    python scripts/decode_profile.py --lengths 2048 8192 --steps 8 --label after --out docs/results/decode_profile.json

Each run adds its label's rows to ``--out`` (rendered in docs/RESULTS.md by ``make results``).
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import torch


class Clock:
    """Thread CPU seconds spent inside wrapped callables, by name (re-entrant calls are not double counted)."""

    def __init__(self):
        self.s: dict[str, float] = {}
        self.depth: dict[str, int] = {}

    def wrap(self, name, fn):
        def timed(*a, **kw):
            if self.depth.get(name):
                return fn(*a, **kw)
            self.depth[name] = 1
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.s[name] = self.s.get(name, 0.0) + time.thread_time() - t0
                self.depth[name] = 0
        return timed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", default="smollm2-135m-focus-k8")
    ap.add_argument("--data", default="shakespeare")
    ap.add_argument("--lengths", nargs="+", type=int, default=[2048, 8192])
    ap.add_argument("--top-k", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--label", required=True, help="e.g. before / after (the revision is recorded too)")
    ap.add_argument("--revision", default=None, help="the code's git revision (default: this checkout's HEAD)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)

    import importlib

    attend_mod = importlib.import_module("focusattn.focus.attend")  # the package re-exports a function of that name
    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import tokenize
    from focusattn.focus.cache import RoutingCache
    from focusattn.hf import set_top_k
    from focusattn.hf.attention_fn import focus_attention_forward
    from focusattn.hf.pair import load_pair
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    clock = Clock()
    RoutingCache.route = clock.wrap("routing", RoutingCache.route)
    attend_mod.focus_attention = clock.wrap("kernel", attend_mod.focus_attention)
    pair = load_pair(args.model, args.adapter, lengths=args.lengths, top_ks=args.top_k, threads=1)
    for name, model, fn in (("sdpa-prof", pair.base, sdpa_attention_forward),
                            ("focus-prof", pair.focus, focus_attention_forward)):
        AttentionInterface.register(name, clock.wrap("attention_fn", fn))
        AttentionMaskInterface.register(name, sdpa_mask)
        model.set_attn_implementation(name)
    _, val = tokenize(load_corpus(args.data), pair.tokenizer, tokenizer_id=args.model)
    layers = pair.base.config.num_hidden_layers
    rev = args.revision or subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                                          text=True).stdout.strip()
    rows = []
    for t in args.lengths:
        x = torch.as_tensor(val[:t][None].astype("int64"))
        for variant, model, k in [("original", pair.base, None)] + [(f"top{k}", pair.focus, k) for k in args.top_k]:
            if k is not None:
                set_top_k(model, k)
            with torch.no_grad():
                out = model(x, use_cache=True, logits_to_keep=1)
                cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
                per = []
                for _ in range(args.steps + 1):  # the first step is not counted (first-call allocations)
                    clock.s.clear()
                    t0 = time.thread_time()
                    out = model(tok, past_key_values=cache, use_cache=True)
                    per.append({"step": time.thread_time() - t0, **clock.s})
                    cache, tok = out.past_key_values, out.logits[:, -1:].argmax(-1)
            per = per[1:]
            med = {key: statistics.median(p.get(key, 0.0) for p in per) for key in per[0]}
            row = {"T": t, "variant": variant, "layers": layers, "step_ms": 1e3 * med["step"],
                   "attention_fn_ms_per_layer": 1e3 * med["attention_fn"] / layers,
                   "model_ms": 1e3 * (med["step"] - med["attention_fn"])}
            if k is not None:
                row["routing_ms_per_layer"] = 1e3 * med.get("routing", 0.0) / layers
                row["kernel_ms_per_layer"] = 1e3 * med.get("kernel", 0.0) / layers
                row["rest_ms_per_layer"] = row["attention_fn_ms_per_layer"] - row["routing_ms_per_layer"] - \
                    row["kernel_ms_per_layer"]
            rows.append(row)
            print(json.dumps(row))
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {"schema": "focusattn.decode_profile/1", "runs": {}}
    doc["runs"][args.label] = {"revision": rev, "command": "python scripts/decode_profile.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items() if v is not None), "steps": args.steps, "torch": torch.__version__, "rows": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
