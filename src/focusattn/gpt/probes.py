"""Probes of trained lab models for the open Lazy findings: why Lazy extrapolates worse than standard attention, and
whether rows with no surviving weight (the first query when tau >= 1) hurt.

* **Extrapolation** (``extrapolation``): validation loss at 1x, 2x and 4x the training length, for models trained
  with one factor changed at a time (``standard``: softmax, base 10^4; ``elastic-only``: Elastic-Softmax, same base;
  ``lazy-no-bias``: base 10^5; ``lazy``: + the distance-bias table), and evaluation-time interventions on each
  Elastic model that isolate the two factors that depend on the length: the bias table past its width W
  (``bias clamp``: the last entry instead of 0) and the threshold ``tau / n_i`` (``threshold cap``: ``n_i`` capped at
  the training length, so thresholds keep the scale they were trained at).
* **Empty rows** (``empty_rows_probe``): per-position loss at the first query and after it, the share of rows whose
  every weight is thresholded away, and the loss on the tokens whose row is empty in some head, each against the
  standard model on the same tokens (the same validation windows).
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..lazy.attention import LazyAttention
from ..train.checkpoint import load_checkpoint
from .config import model_config_from_dict
from .model import GPT
from .tasks import IGNORE

MULTIPLES = (1, 2, 4)
INTERVENTIONS = ("as trained", "bias clamp", "threshold cap", "both")


def load_run(run_dir: str | Path) -> GPT:
    """A lab run folder (``config.json`` + verified checkpoint) as an evaluation-mode ``GPT``."""
    d = Path(run_dir)
    cfg = json.loads((d / "config.json").read_text())["model"]
    model = GPT(model_config_from_dict(cfg))
    model.load_state_dict(load_checkpoint(d)["trainable"])
    return model.eval()


@contextmanager
def lazy_override(model: GPT, **changes):
    """Evaluate with other ``LazyConfig`` settings (e.g. ``bias_beyond``, ``threshold_len``) on every Lazy layer."""
    layers = [m for m in model.modules() if isinstance(m, LazyAttention)]
    saved = [m.cfg for m in layers]
    try:
        for m in layers:
            m.cfg = replace(m.cfg, **changes)
        yield len(layers)
    finally:
        for m, c in zip(layers, saved):
            m.cfg = c


def _changes(name: str, block_size: int) -> dict:
    return {"as trained": {}, "bias clamp": {"bias_beyond": "clamp"},
            "threshold cap": {"threshold_len": block_size},
            "both": {"bias_beyond": "clamp", "threshold_len": block_size}}[name]


@torch.no_grad()
def token_losses(model: GPT, x: torch.Tensor, y: torch.Tensor, batch: int = 4) -> torch.Tensor:
    """Next-token loss per position ``[N, T]`` (NaN where the target is ``IGNORE``)."""
    out = []
    for i in range(0, len(x), batch):
        logits, _ = model(x[i:i + batch])
        tgt = y[i:i + batch]
        loss = F.cross_entropy(logits.float().flatten(0, 1), tgt.clamp_min(0).flatten(), reduction="none")
        out.append(loss.view(tgt.shape).masked_fill(tgt == IGNORE, float("nan")))
    return torch.cat(out)


def extrapolation(models: dict[str, GPT], datas: dict, windows: int) -> list[dict]:
    """Mean loss per (corpus, model, intervention, length multiple). ``models`` share one training length."""
    rows = []
    for corpus, data in datas.items():
        for name, model in models.items():
            t0 = model.cfg.block_size
            has_lazy = any(isinstance(m, LazyAttention) for m in model.modules())
            for iv in INTERVENTIONS if has_lazy else INTERVENTIONS[:1]:
                with lazy_override(model, **_changes(iv, t0)):
                    for mult in MULTIPLES:
                        x, y = data.val_windows(mult * t0, windows)
                        rows.append({"corpus": corpus, "model": name, "intervention": iv, "multiple": mult,
                                     "T": mult * t0, "loss": float(token_losses(model, x, y).nanmean())})
    return rows


@torch.no_grad()
def empty_rows_probe(models: dict[str, GPT], data, windows: int, reference: str = "standard") -> dict:
    """Per model: loss at the first query (position 0) and after it, the share of empty rows (all weights 0) at
    position 0 and after it, per layer, and the loss on tokens whose row is empty in some head of some layer, next
    to the ``reference`` model's loss on the same tokens."""
    t = next(iter(models.values())).cfg.block_size
    x, y = data.val_windows(t, windows)
    losses = {name: token_losses(m, x, y) for name, m in models.items()}
    ref = losses.get(reference)
    out = {}
    for name, model in models.items():
        la = losses[name]
        empty_any = torch.zeros(x.shape, dtype=torch.bool)
        per_layer = []
        for a in model.attention_weights(x):  # [B, H, T, T]
            empty = a.sum(-1) == 0  # [B, H, T]
            per_layer.append({"first_query": float(empty[:, :, 0].float().mean()),
                              "later_rows": float(empty[:, :, 1:].float().mean())})
            empty_any |= empty.any(1)
        later = empty_any.clone()
        later[:, 0] = False  # rows after the first
        rec = {"loss_first_query": float(la[:, 0].nanmean()), "loss_later": float(la[:, 1:].nanmean()),
               "empty_rows": per_layer, "tokens_with_an_empty_row_later": float(later[:, 1:].float().mean())}
        if ref is not None:
            rec["reference"] = reference
            rec["delta_first_query"] = float((la[:, 0] - ref[:, 0]).nanmean())
            rec["delta_later"] = float((la[:, 1:] - ref[:, 1:]).nanmean())
            if later.any():
                rec["delta_on_empty_rows"] = float((la - ref)[later].nanmean())
                rec["delta_on_other_rows"] = float((la - ref)[~later & (torch.arange(t) > 0)].nanmean())
        out[name] = rec
    return out


def render_markdown(doc: dict) -> str:
    lines = [f"Command: `{doc['command']}`", "",
             f"Preset `{doc['preset']}` (trained at T = {doc['block_size']}), seeds {doc['seeds']}, "
             f"{doc['windows']} validation windows per length; loss in nats per byte, mean over seeds.", "",
             "**Extrapolation**: loss at 1x / 2x / 4x the training length. One factor changes per trained model "
             "(softmax → Elastic-Softmax → RoPE base 10^5 → distance bias); the interventions change only evaluation: "
             "`bias clamp` uses the table's last entry past W instead of 0, `threshold cap` computes the threshold "
             "as τ/min(n_i, T_train).", ""]
    rows = doc["extrapolation"]
    for corpus in dict.fromkeys(r["corpus"] for r in rows):
        lines += [f"*{corpus}*", "", "| model | intervention | 1x | 2x | 4x |", "|---|---|---|---|---|"]
        keys = dict.fromkeys((r["model"], r["intervention"]) for r in rows if r["corpus"] == corpus)
        for model, iv in keys:
            cells = []
            for mult in MULTIPLES:
                vals = [r["loss"] for r in rows if (r["corpus"], r["model"], r["intervention"], r["multiple"])
                        == (corpus, model, iv, mult)]
                cells.append(f"{sum(vals) / len(vals):.3f}" if vals else "—")
            lines.append(f"| {model} | {iv} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["**Empty rows** (every weight thresholded away; the first query when τ ≥ 1): share of rows per layer "
              "(mean over heads), and loss differences against the standard model on the same tokens.", "",
              "| model | empty: first query | empty: later rows (max layer) | tokens with an empty row | "
              "Δ loss first query | Δ loss later | Δ on empty-row tokens | Δ on the others |",
              "|---|---|---|---|---|---|---|---|"]
    for name, recs in doc["empty_rows"].items():
        def avg(key, recs=recs):
            vals = [r[key] for r in recs if key in r]
            return f"{sum(vals) / len(vals):+.3f}" if vals else "—"
        first = sum(sum(l["first_query"] for l in r["empty_rows"]) / len(r["empty_rows"]) for r in recs) / len(recs)
        later = sum(max(l["later_rows"] for l in r["empty_rows"]) for r in recs) / len(recs)
        tok = sum(r["tokens_with_an_empty_row_later"] for r in recs) / len(recs)
        lines.append(f"| {name} | {first:.2f} | {later:.3f} | {tok:.3f} | {avg('delta_first_query')} | "
                     f"{avg('delta_later')} | {avg('delta_on_empty_rows')} | {avg('delta_on_other_rows')} |")
    if doc.get("findings"):
        lines += ["", *[f"- {f}" for f in doc["findings"]]]
    return "\n".join(lines) + "\n"


__all__ = ["INTERVENTIONS", "MULTIPLES", "empty_rows_probe", "extrapolation", "lazy_override", "load_run",
           "render_markdown", "token_losses"]
