"""Elastic-Softmax on the pretrained model: the sink / perplexity trade-off over tau, and what the exact zeros buy.

Each point is the frozen model with thresholds ``tau / n`` on every head: the original (tau = 0, exactly softmax),
fixed tau values (training-free), and trained Lazy adapters (``focusattn retrofit --method lazy``). Per point and
length: perplexity on each split, and from the dense Elastic-Softmax weights of every layer (one layer at a time):

* first-token share (``lazy.metrics.sink_share``, rows ``i >= 1``; like for like when rows keep less than 1), and the
  same over queries farther than ``far`` tokens from it, each beside its uniform level;
* exact zeros (share of causal pairs), surviving mass, empty rows;
* **zero tiles**: the share of causal ``tile x tile`` blocks (query block, key block at or below the diagonal) whose
  every weight is exactly 0. A block-skipping kernel can only save work on those, and only in its second pass (the
  first pass needs every block for the row log-sum-exp), so this share bounds what such a kernel would pay.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from .._io import write_json
from ..lazy.metrics import empty_rows, sink_share, sparsity, surviving_mass, uniform_sink_mass

TILE = 64
FAR = 129  # queries beyond Focus's default window + 1: the level docs/results/sink_probe.json reports


def zero_tiles(a: torch.Tensor, tile: int = TILE) -> torch.Tensor:
    """Per-head share of causal ``tile x tile`` blocks of ``a`` ``[B, H, T, T]`` that are entirely 0: ``[H]``."""
    b, h, t, _ = a.shape
    n = -(-t // tile)
    pad = n * tile - t
    z = torch.nn.functional.pad(a == 0, (0, pad, 0, pad), value=True)
    z = z.view(b, h, n, tile, n, tile).all(5).all(3)  # [B, H, n, n]
    causal = torch.ones(n, n, dtype=torch.bool, device=a.device).tril()
    return (z & causal).sum((-1, -2)).double().div(causal.sum()).mean(0)


METRICS = {"sink_share": lambda a: sink_share(a), "sparsity": sparsity, "surviving_mass": surviving_mass,
           "empty_rows": empty_rows, "zero_tiles": zero_tiles}


@torch.no_grad()
def elastic_stats(model, windows, *, far: int = FAR) -> dict:
    """Per layer and head, averaged over ``windows`` (token arrays of one length), the metrics of the module docstring
    for a model with Elastic-Softmax thresholds (``hf.lazy``); the original model is the tau = 0 point."""
    from ..hf.lazy import recording
    from ..hf.specs import attention_modules

    index = {id(m): i for i, m in enumerate(attention_modules(model))}
    sums: dict[str, list] = {}

    def take(module, a):
        li = index[id(module)]
        a = a.float()
        vals = {name: fn(a) for name, fn in METRICS.items()}
        if a.shape[-1] > far:
            vals["sink_share_far"] = sink_share(a, far)
        for name, v in vals.items():
            per = sums.setdefault(name, [None] * len(index))
            per[li] = v if per[li] is None else per[li] + v

    with recording(model, take):
        for w in windows:
            model(torch.as_tensor(np.asarray(w))[None].long())
    t = len(windows[0])
    per_head = {k: [(x / len(windows)).tolist() for x in v] for k, v in sums.items()}
    per_layer = {k: [float(np.nanmean(h)) for h in v] for k, v in per_head.items()}
    return {"T": t, "windows": len(windows), "tile": TILE, "far": far, "uniform_sink_mass": uniform_sink_mass(t),
            "uniform_far": float(np.mean([1 / (i + 1) for i in range(far, t)])) if t > far else None,
            "per_head": per_head, "per_layer": per_layer,
            "mean": {k: float(np.nanmean(v)) for k, v in per_layer.items()}}


def run_lazy_probe(out: str | Path, *, model: str = "smollm2-135m", data: str = "shakespeare",
                   ood_data: str | None = "lee-news", taus=(0.5, 1.0, 2.0, 4.0), adapters=(), lengths=(512, 2048),
                   ppl_windows: int = 4, stat_windows: int = 1, command: str | None = None,
                   progress: bool = True) -> dict:
    """Write ``lazy_probe.json`` into ``out`` (rewritten after every point, so a killed run keeps what it finished)."""
    from ..adapters import resolve
    from ..data.corpora import load_corpus
    from ..data.tokens import check_length, eval_windows, tokenize
    from ..hf import unload
    from ..hf.lazy import compose_lazy, is_lazy_adapter, load_lazy_adapter, taus as read_taus
    from ..hf.loading import load_model
    from ..lazy.config import ElasticConfig
    from .perplexity import perplexity

    bad = [a for a in adapters if not is_lazy_adapter(resolve(a))]
    if bad:
        raise ValueError(f"--adapters {bad}: not Lazy adapters (written by `focusattn retrofit --method lazy`)")
    if any(not t > 0 for t in taus):
        raise ValueError(f"--taus {list(taus)}: each must be > 0 (tau = 0 is the original, always measured)")
    base, tok = load_model(model)
    base.eval()
    lengths = sorted(set(int(t) for t in lengths))
    corpora = {"domain": data} | ({"ood": ood_data} if ood_data else {})
    val = {}
    for split, name in corpora.items():
        val[split] = tokenize(load_corpus(name), tok, tokenizer_id=model)[1]
        check_length(val[split], lengths[-1], f"{name} validation split")
    points = [("original", lambda: compose_lazy(base, ElasticConfig(tau_init=0.0, tau_mode="free", train_tau=False)))]
    points += [(f"tau={t:g}", lambda t=t: compose_lazy(base, ElasticConfig(tau_init=float(t), train_tau=False)))
               for t in taus]
    points += [(str(a), lambda a=a: load_lazy_adapter(base, a)) for a in adapters]
    doc = {"command": command, "model": model, "corpora": corpora, "lengths": lengths, "ppl_windows": ppl_windows,
           "stat_windows": stat_windows, "points": []}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    for name, setup in tqdm(points, desc="lazy probe", unit="point", disable=not progress):
        setup()
        tau = read_taus(base)
        row = {"point": name, "tau": tau, "tau_mean": float(np.mean(tau)), "rows": []}
        for t in lengths:
            r = {"T": t}
            for split in val:
                w = eval_windows(val[split], t, ppl_windows)
                r[f"ppl_{split}"] = perplexity(base, w, desc=f"{name} T={t} {split}", progress=progress)["ppl"]
            r["attention"] = elastic_stats(base, eval_windows(val["domain"], t, stat_windows))
            row["rows"].append(r)
        unload(base)
        doc["points"].append(row)
        doc["seconds"] = time.time() - t0
        write_json(out / "lazy_probe.json", doc)
    return doc
