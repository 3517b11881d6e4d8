"""Why Focus needs sink tokens on pretrained models: attention-sink mass per layer, and perplexity under fixed masks.

Static masks are passed to the unmodified model as a 4-D boolean ``attention_mask`` (transformers uses a 4-D mask
as given), so this measures the mask alone, with no router involved: full causal, local window, window + the first
``n`` tokens, random balanced groups + window (what untrained top-1 routing looks like), and that plus the sink.
"""
from __future__ import annotations

import math
import time

import numpy as np
import torch
from tqdm.auto import tqdm

from .._io import atomic_path, pyplot, write_json
from ..kernels.common import in_window


def static_masks(t: int, window: int, groups: int, sink: int, seed: int = 0) -> dict[str, torch.Tensor]:
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None]
    causal = j <= i
    local = in_window(i - j, window)
    g = torch.randint(0, groups, (t,), generator=torch.Generator().manual_seed(seed))
    grouped = local | (causal & (g[:, None] == g[None]))
    first = causal & (j < sink)
    return {
        "full causal": causal,
        f"window {window}": local,
        f"window {window} + first {sink}": local | first,
        f"random {groups} groups + window": grouped,
        f"random {groups} groups + window + first {sink}": grouped | first,
    }


@torch.no_grad()
def sink_report(model, windows: np.ndarray, min_distance: int) -> dict:
    """Attention on the window's first token over queries at least ``min_distance`` tokens after it (the ones a Focus
    window cannot reach), per layer and head, averaged over windows: ``mass`` (the absolute weight) and ``share``
    (its share of the row's total weight, ``lazy.metrics.sink_share``: equal to ``mass`` for softmax rows, the
    like-for-like number when rows keep less than 1)."""
    from ..lazy.metrics import sink_share

    impl = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the only implementation that returns weights
    try:
        mass = share = None
        for w in windows:
            out = model(torch.as_tensor(np.asarray(w))[None].long(), output_attentions=True)
            m = torch.stack([a[0, :, min_distance:, 0].double().mean(-1) for a in out.attentions])  # [L, H]
            s = torch.stack([sink_share(a.float(), min_distance) for a in out.attentions])
            mass, share = (m, s) if mass is None else (mass + m, share + s)
    finally:
        model.set_attn_implementation(impl)
    mass, share = mass / len(windows), share / len(windows)
    return {"mass_per_head": mass.tolist(), "share_per_head": share.tolist(),
            "mass_per_layer": mass.mean(-1).tolist(), "share_per_layer": share.mean(-1).tolist()}


def sink_mass(model, windows: np.ndarray, min_distance: int) -> list[float]:
    """Mean attention weight on the window's first token, per layer (see :func:`sink_report`)."""
    return sink_report(model, windows, min_distance)["mass_per_layer"]


@torch.no_grad()
def masked_perplexity(model, windows: np.ndarray, mask: torch.Tensor) -> float:
    nll, n = 0.0, 0
    for w in windows:
        x = torch.as_tensor(np.asarray(w))[None].long()
        logits = model(x, attention_mask=mask[None, None]).logits[0, :-1].float()
        nll += torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item()
        n += x.shape[1] - 1
    return math.exp(nll / n)


def run_sink_probe(model_spec: str, data: str, out: str, *, seq_len: int = 512, windows: int = 4, window: int = 128,
                   groups: int = 8, sink: int = 1, command: str | None = None) -> dict:
    from ..data.corpora import load_corpus
    from ..data.tokens import eval_windows, tokenize
    from ..hf.loading import load_model

    model, tok = load_model(model_spec)
    _, val = tokenize(load_corpus(data), tok, tokenizer_id=model_spec)
    w = eval_windows(val, seq_len, windows)
    t0 = time.time()
    masks = static_masks(seq_len, window, groups, sink)
    ppl = {name: masked_perplexity(model, w, m) for name, m in tqdm(masks.items(), desc="masks", unit="mask")}
    rep = sink_report(model, w, window + 1)
    mass = rep["mass_per_layer"]
    res = {"command": command, "model": model_spec, "data": data, "seq_len": seq_len, "windows": windows,
           "window": window, "groups": groups, "sink": sink, "perplexity": ppl, "sink_mass_per_layer": mass,
           "sink_mass_per_head": rep["mass_per_head"], "sink_share_per_layer": rep["share_per_layer"],
           "sink_share_per_head": rep["share_per_head"],
           "uniform_weight": float(np.mean([1 / (i + 1) for i in range(window + 1, seq_len)])),
           "seconds": time.time() - t0}
    write_json(f"{out}/sink_probe.json", res)
    _plot(res, f"{out}/sink_probe.png")
    return res


def _plot(res: dict, path: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.2))
    mass = res["sink_mass_per_layer"]
    ax.bar(range(len(mass)), mass, color="tab:red")
    ax.axhline(res["uniform_weight"], color="k", ls="--", lw=1, label="uniform weight (1/i)")
    ax.set_xlabel("layer")
    ax.set_ylabel("attention on first token")
    ax.set_title(f"{res['model']}: attention-sink mass (queries > {res['window']} tokens away)")
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def render_markdown(res: dict) -> str:
    lines = [f"Command: `{res.get('command')}`", "",
             f"{res['model']} on {res['windows']} held-out {res['data']} windows of {res['seq_len']} tokens. "
             "Fixed masks applied to the unmodified model (no routers):", "",
             "| mask | perplexity |", "|---|---|"]
    lines += [f"| {k} | {v:.2f} |" for k, v in res["perplexity"].items()]
    mass = res["sink_mass_per_layer"]
    lines += ["", f"Mean attention weight on the first token, for queries more than {res['window']} tokens after it: "
              f"{np.mean(mass):.3f} averaged over layers (max {max(mass):.3f} in layer {int(np.argmax(mass))}), "
              f"against {res['uniform_weight']:.4f} for uniform attention."]
    if "sink_share_per_head" in res:
        u = res["uniform_weight"]
        heads = res["sink_share_per_head"]
        lines += ["", "Like for like (share of each row's total weight on the first token; softmax rows sum to 1, so it "
                  "equals the weight here), as multiples of uniform: per layer mean / largest head: "
                  + "; ".join(f"L{i} {sum(h) / len(h) / u:.1f}x / {max(h) / u:.1f}x" for i, h in enumerate(heads))]
    lines += ["", "![sink mass](results/sink_probe.png)"]
    return "\n".join(lines)
