"""``long-eval`` for a Lazy (Elastic-Softmax) adapter: the original model and the adapter on the same inputs at each
length — perplexity on held-out windows, repeat-copy perplexity and passkey accuracy (``eval/probes.py``), written
in ``long_eval.json``'s schema (variants ``original`` and ``lazy``). The Focus-only parts of ``long-eval`` (top-k,
baselines at a kept-pair budget, attention recall) have no meaning here: Elastic-Softmax keeps every pair it can."""
from __future__ import annotations

from pathlib import Path

import torch

from .._io import write_json
from .longctx import SCHEMA, probe_inputs
from .perplexity import perplexity
from .probes import passkey_accuracy, repeat_copy_ppl


def run_long_eval_lazy(out_dir, *, model: str = "smollm2-135m", adapter: str, lengths=(2048, 4096, 8192),
                       data: str = "shakespeare", ood_data: str | None = "lee-news", ppl_windows: int = 4,
                       ppl_max_len: int = 2048, passkey_depths=(0.1, 0.5, 0.9), passkey_per_depth: int = 1,
                       repeat_n: int = 2, repeat_distance: int = 1024, threads: int | None = None,
                       command: str | None = None, progress: bool = True) -> dict:
    from ..adapters import resolve
    from ..data.corpora import load_corpus
    from ..data.tokens import check_length, tokenize
    from ..hf.lazy import elastic_config, load_lazy_adapter, read_lazy_config, taus
    from ..hf.loading import load_model

    adapter_dir = resolve(adapter)
    read_lazy_config(adapter_dir)  # a corrupt adapter fails before any model is loaded
    if threads is not None:
        torch.set_num_threads(int(threads))
    base, tok = load_model(model)
    lengths = sorted(set(int(t) for t in lengths))
    max_pos = getattr(base.config, "max_position_embeddings", None)
    if max_pos is not None and lengths[-1] > max_pos:
        raise ValueError(f"length {lengths[-1]} exceeds the model's {max_pos} positions")
    lazy, _ = load_model(model)
    load_lazy_adapter(lazy, adapter_dir)
    base.eval()
    lazy.eval()
    corpora = {"domain": data} | ({"ood": ood_data} if ood_data else {})
    val = {}
    for split, name in corpora.items():
        val[split] = tokenize(load_corpus(name), tok, tokenizer_id=model)[1]
        check_length(val[split], lengths[-1], f"{name} validation split")
    rows = []
    for t in lengths:
        tests = probe_inputs(val, tok, t, ppl_max_len=ppl_max_len, ppl_windows=ppl_windows,
                             passkey_depths=passkey_depths, passkey_per_depth=passkey_per_depth,
                             repeat_distance=repeat_distance, repeat_n=repeat_n)
        for name, m in (("original", base), ("lazy", lazy)):
            row = {"T": t, "variant": name}
            for key, inputs in tests.items():
                desc = f"T={t} {name} {key}"
                if key.startswith("ppl_"):
                    row[key] = perplexity(m, inputs, desc=desc, progress=progress)["ppl"]
                elif key == "passkey":
                    row["passkey"] = passkey_accuracy(m, inputs, desc=desc, progress=progress)
                else:
                    row["repeat_ppl"] = repeat_copy_ppl(m, inputs, desc=desc, progress=progress)["ppl"]
            rows.append(row)
            if progress:
                print({k: v for k, v in row.items() if k != "passkey"} | {"passkey": row["passkey"]["accuracy"]},
                      flush=True)
    doc = {"schema": SCHEMA, "command": command, "model": model, "adapter": str(adapter),
           "lazy_config": elastic_config(lazy).to_dict(), "tau": taus(lazy), "corpora": corpora,
           "ppl_windows": ppl_windows,
           "passkey": {"depths": list(passkey_depths), "per_depth": passkey_per_depth,
                       "filler": corpora.get("ood", data)},
           "repeat": {"n": repeat_n, "distance": repeat_distance}, "results": rows}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "long_eval.json", doc)
    return doc
