"""Cache the attention targets of more training windows for ``scripts/partition_imitation.py --extra-train``
(issue 22: does the imitator keep learning from more windows?).

The targets are ``retrofit --objective attention``'s own (``train.objectives.AttentionObjective``: one no-grad
forward of the frozen model, each layer's input and its 64 most attended distant keys per query, the adapter's dense
heads excluded), for windows of the corpus's *training* split at sample numbers ``--samples`` of the retrofit's
window sampler (seed 0: the g2 pool is samples 0-23, so later samples are other, non-overlapping windows). A window
that shares a run of 32 consecutive tokens with a window of ``--exclude`` (the held-out evaluation windows) is
skipped (its file removed): layer 0's input depends on the token alone, so shared text shows as equal rows whatever
the positions.

    python scripts/cache_targets.py --samples 24:144 --exclude runs/routing/targets --exclude-from 40 \
        --out runs/routing/targets_more
"""
from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch

RUN = 32  # consecutive equal embedding rows that count as shared text


def _runs(h: torch.Tensor) -> set[str]:
    """Hashes of every run of RUN consecutive rows of a layer-0 input [1, T, d]."""
    rows = [hashlib.sha1(r.numpy().tobytes()).hexdigest()[:12] for r in h[0].to(torch.bfloat16).float()]
    return {"".join(rows[i:i + RUN]) for i in range(len(rows) - RUN + 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--adapter", default="smollm2-135m-focus-g2", help="its dense heads and window shape the targets")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--data", default="shakespeare+python-docs")
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--samples", default="24:144", help="first:last sample numbers (the sampler's, seed 0)")
    ap.add_argument("--attn-keys", type=int, default=64)
    ap.add_argument("--exclude", default="runs/routing/targets", help="a targets folder whose held-out windows "
                    "must not share text with the new ones")
    ap.add_argument("--exclude-from", type=int, default=40, help="the held-out windows: from this one (sorted)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from safetensors import safe_open
    from tqdm import tqdm

    import focusattn as fa
    from focusattn.data.corpora import load_corpus
    from focusattn.data.sampler import EpochWindows
    from focusattn.data.tokens import tokenize
    from focusattn.train.objectives import AttentionObjective

    lo, hi = (int(x) for x in args.samples.split(":"))
    held = set()
    for f in sorted(Path(args.exclude).glob("*.safetensors"))[args.exclude_from:]:
        with safe_open(str(f), "pt") as sf:
            held |= _runs(sf.get_tensor("0.h"))
    model, tok = fa.load_model(args.model)
    fa.load_adapter(model, args.adapter)
    model.eval()
    train_ids, _ = tokenize(load_corpus(args.data), tok, tokenizer_id=args.model)
    sampler = EpochWindows(len(train_ids), args.seq_len, 0)
    objective = AttentionObjective(model, top_m=args.attn_keys, cache_dir=args.out)
    out, skipped = Path(args.out), 0
    for s in tqdm(range(lo, hi), desc="targets", unit="window"):
        x = torch.as_tensor(sampler.windows(train_ids, [s]), dtype=torch.long)
        before = set(out.glob("*.safetensors"))
        tg = objective.targets(x)
        if _runs(tg[0].h) & held:
            skipped += 1
            for f in set(out.glob("*.safetensors")) - before:
                f.unlink()
    print(f"{hi - lo - skipped} windows cached in {args.out}; {skipped} skipped (text shared with held-out windows)")


if __name__ == "__main__":
    main()
