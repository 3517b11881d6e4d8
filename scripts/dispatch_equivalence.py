"""Does ``backend="auto"`` change the model's outputs? The shipped adapter on held-out text, the same model and
routing run with ``backend="auto"`` (the dispatcher) and ``backend="decomposed"`` (the sparse engines alone, what
ran before the dispatcher): full-sequence log-probabilities at each length and greedy decode steps after a prompt,
compared, with the branches ``auto`` took. Differences should be float summation order only (~1e-5 in log-prob).

    python scripts/dispatch_equivalence.py --out docs/results/dispatch_equivalence.json
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--adapter", default="smollm2-135m-focus-k8")
    ap.add_argument("--data", default="shakespeare")
    ap.add_argument("--lengths", nargs="+", type=int, default=[64, 128, 256, 512, 1024, 2048])
    ap.add_argument("--top-k", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--prompt", type=int, default=300, help="prompt length before the greedy decode steps")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from focusattn.data.corpora import load_corpus
    from focusattn.data.tokens import tokenize
    from focusattn.hf import set_top_k
    from focusattn.hf.pair import load_pair
    from focusattn.kernels.dispatch import PICKS

    pair = load_pair(args.model, args.adapter, lengths=args.lengths, top_ks=args.top_k, threads=1)
    m = pair.focus
    _, val = tokenize(load_corpus(args.data), pair.tokenizer, tokenizer_id=args.model)
    rows = []
    with torch.no_grad():
        for k in args.top_k:
            for t in args.lengths:
                x = torch.as_tensor(val[:t][None].astype("int64"))
                out = {}
                for backend in ("auto", "decomposed"):
                    set_top_k(m, k, backend=backend)
                    before = dict(PICKS)
                    out[backend] = torch.log_softmax(m(x).logits.float(), -1)
                    picks = {b: n - before.get(b, 0) for b, n in PICKS.items() if n != before.get(b, 0)}
                    if backend == "auto":
                        branches = picks
                diff = (out["auto"] - out["decomposed"]).abs()
                same = float((out["auto"].argmax(-1) == out["decomposed"].argmax(-1)).float().mean())
                rows.append({"kind": "prefill", "top_k": k, "T": t, "max_abs_logprob_diff": float(diff.max()),
                             "argmax_agreement": same, "auto_branches": branches})
                print(json.dumps(rows[-1]))
            x = torch.as_tensor(val[:args.prompt][None].astype("int64"))
            gen, logp, branches = {}, {}, {}
            for backend in ("auto", "decomposed"):
                set_top_k(m, k, backend=backend)
                before = dict(PICKS)
                res = m(x, use_cache=True)
                cache, tok = res.past_key_values, res.logits[:, -1:].argmax(-1)
                toks, lps = [int(tok)], []
                for _ in range(args.steps):
                    res = m(tok, past_key_values=cache, use_cache=True)
                    lps.append(torch.log_softmax(res.logits[0, -1].float(), -1))
                    cache, tok = res.past_key_values, res.logits[:, -1:].argmax(-1)
                    toks.append(int(tok))
                gen[backend], logp[backend] = toks, torch.stack(lps)
                branches[backend] = {b: n - before.get(b, 0) for b, n in PICKS.items() if n != before.get(b, 0)}
            rows.append({"kind": "decode", "top_k": k, "T": args.prompt, "steps": args.steps,
                         "max_abs_logprob_diff": float((logp["auto"] - logp["decomposed"]).abs().max()),
                         "same_tokens": gen["auto"] == gen["decomposed"], "auto_branches": branches["auto"]})
            print(json.dumps(rows[-1]))
    doc = {"schema": "focusattn.dispatch_equivalence/1", "command": "python scripts/dispatch_equivalence.py " +
           " ".join(f"--{a.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                    for a, v in vars(args).items()), "model": args.model, "adapter": args.adapter,
           "data": args.data, "torch": torch.__version__, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
