"""Group statistics of a composed model: dominance (share of tokens in the largest group; 1/K is balanced), mean
assignment confidence (mean of each token's largest group probability), group sizes per layer, and the share of
causal pairs that hard top-k routing keeps (the sparsity that inference actually gets)."""
from __future__ import annotations

import numpy as np
import torch

from ..hf.compose import last_routing, routers
from ..kernels.common import sink_key_mask, topk_membership
from ..kernels.reference import focus_allowed


@torch.no_grad()
def group_stats(model, windows: np.ndarray, top_ks=()) -> dict:
    """Run ``windows`` [N, T] through the composed model (soft mode, eval) and summarise every layer's routing.

    Returns ``{"layers": [...], "pairs_kept": {"top1": share, ...}}``; pairs are counted over all layers and windows
    with the model's window and sink settings, as a share of all causal pairs.
    """
    model.eval()
    device = next(model.parameters()).device
    rs = routers(model)
    counts = [None] * len(rs)
    conf = [0.0] * len(rs)
    kept = {k: 0 for k in top_ks}
    causal_pairs = 0
    n = 0
    for w in windows:
        model(torch.as_tensor(np.asarray(w)[None], dtype=torch.long, device=device))
        t = w.shape[-1]
        routings = last_routing(model)
        for i, r in enumerate(rs):
            g = routings[i].groups.float()  # [1, T, K]
            flat = g.reshape(-1, r.cfg.num_groups)
            c = torch.bincount(flat.argmax(-1), minlength=r.cfg.num_groups).cpu()
            counts[i] = c if counts[i] is None else counts[i] + c
            conf[i] += flat.max(-1).values.sum().item()
            sinks = sink_key_mask(t, r.cfg.sink_tokens, device=device)
            for k in top_ks:
                member = topk_membership(g, k)
                kept[k] += focus_allowed(member, r.cfg.window, t, sinks).sum().item()
            causal_pairs += t * (t + 1) // 2
        n += w.shape[-1]
    layers = []
    for i, c in enumerate(counts):
        share = (c.float() / c.sum()).tolist()
        layers.append({"layer": i, "dominance": max(share), "confidence": conf[i] / n, "group_share": share})
    return {"layers": layers, "pairs_kept": {f"top{k}": kept[k] / causal_pairs for k in top_ks}}


@torch.no_grad()
def top_tokens(model, tokenizer, windows: np.ndarray, layers: list[int], per_group: int = 8) -> dict:
    """Most frequent tokens assigned (argmax) to each group, per requested layer: what the groups *mean*."""
    model.eval()
    device = next(model.parameters()).device
    rs = routers(model)
    tallies = {li: [dict() for _ in range(rs[li].cfg.num_groups)] for li in layers}
    for w in windows:
        ids = np.asarray(w)
        model(torch.as_tensor(ids[None], dtype=torch.long, device=device))
        routings = last_routing(model)
        for li in layers:
            arg = routings[li].groups[0].argmax(-1).tolist()
            for tid, g in zip(ids.tolist(), arg):
                tallies[li][g][tid] = tallies[li][g].get(tid, 0) + 1
    out = {}
    for li, groups in tallies.items():
        out[str(li)] = [
            [[tokenizer.decode([tid]), c] for tid, c in sorted(g.items(), key=lambda x: -x[1])[:per_group]]
            for g in groups
        ]
    return out


def groups_report(model_spec: str, adapter: str, data: str, *, seq_len: int, windows: int, top_ks, layers,
                  command: str | None = None) -> dict:
    """Load a base model plus a saved adapter and measure its routing on held-out data."""
    from ..data.corpora import load_corpus
    from ..data.tokens import eval_windows, tokenize
    from ..hf.io import load_adapter
    from ..hf.loading import load_model

    model, tok = load_model(model_spec)
    load_adapter(model, adapter)
    _, val = tokenize(load_corpus(data), tok, tokenizer_id=model_spec)
    w = eval_windows(val, seq_len, windows)
    k_max = routers(model)[0].cfg.num_groups
    top_ks = list(top_ks or range(1, max(1, k_max // 2) + 1))
    stats = group_stats(model, w, top_ks)
    layers = list(layers) if layers else [0, len(routers(model)) // 2, len(routers(model)) - 1]
    return {"command": command, "model": model_spec, "adapter": adapter, "data": data, "seq_len": seq_len,
            "windows": windows, **stats, "top_tokens": top_tokens(model, tok, w, layers)}
