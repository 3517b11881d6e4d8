"""Training of the lab LM on the shared loop (``train/loop.py``: AdamW + cosine LR, progress, atomic checkpoints,
resume, metrics.jsonl); the lab's own parts are here: the model, its batches, evaluation, what a record holds.

Output directory layout: ``config.json`` (what was run), ``metrics.jsonl`` (one record per log/eval step),
``checkpoint.json`` + ``checkpoint-<step>.pt`` (latest, atomic, verified: ``train/checkpoint.py``), ``result.json``
(final evaluation; its presence marks a finished run). Under torchrun every rank trains its slice of the global
batch (``train/dist.py``) and rank 0 alone writes.
"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from .. import _io
from .._errors import InputError
from ..lazy.metrics import attention_report
from ..train import dist
from ..train.checkpoint import has_checkpoint, load_checkpoint
from ..train.loop import adamw, train_loop
from .config import HF_MODEL_TYPE, ModelConfig, TrainConfig, model_config_from_dict
from .data import LMData, load_data
from .tasks import IGNORE
from .model import GPT

EXTRAPOLATION = (1, 2, 4)  # evaluation lengths as multiples of block_size
METRIC_WINDOWS = 8


def _param_groups(model: GPT, weight_decay: float):
    """Decay matrices only; norms, biases, tau and the distance tables are not pulled towards 0."""
    decay, rest = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() == 2 and "bias.table" not in name else rest).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate_metrics(model: GPT, data, t: int, n: int, batch: int = 8) -> dict:
    """Over ``n`` fixed validation windows of length ``t``: mean next-token loss (nats) and top-1 accuracy, both on
    the scored targets (every token for text; the answer tokens of a task, whose other targets are ``IGNORE``)."""
    model.eval()
    x, y = data.val_windows(t, n)
    loss, hits, count = 0.0, 0, 0
    for i in range(0, n, batch):
        logits, _ = model(x[i:i + batch])
        tgt = y[i:i + batch]
        scored = tgt != IGNORE
        loss += F.cross_entropy(logits[scored].float(), tgt[scored], reduction="sum").item()
        hits += int((logits.argmax(-1)[scored] == tgt[scored]).sum())
        count += int(scored.sum())
    model.train()
    return {"loss": loss / count, "acc": hits / count}


def evaluate(model: GPT, data, t: int, n: int, batch: int = 8) -> float:
    """Mean next-token loss (nats) over ``n`` fixed validation windows of length ``t``."""
    return evaluate_metrics(model, data, t, n, batch)["loss"]


@torch.no_grad()
def final_report(model: GPT, data: LMData, cfg: ModelConfig, tcfg: TrainConfig) -> dict:
    ev = {f"{m}x": evaluate_metrics(model, data, m * cfg.block_size, max(2, tcfg.eval_windows // m))
          for m in EXTRAPOLATION}
    val = {k: v["loss"] for k, v in ev.items()}
    model.eval()
    x, _ = data.val_windows(cfg.block_size, METRIC_WINDOWS)
    metrics = attention_report(model.attention_weights(x))
    model.train()
    return {"val_loss": val["1x"], "val_loss_by_length": val, "val_acc": ev["1x"]["acc"],
            "val_acc_by_length": {k: v["acc"] for k, v in ev.items()}, "attention": metrics, "tau": model.taus()}


@torch.no_grad()
def _attention_snapshot(model: GPT, data: LMData, t: int) -> dict:
    """Cheap per-eval view of how the sink and the sparsity develop during training (means and worst head)."""
    model.eval()
    rep = attention_report(model.attention_weights(data.val_windows(t, 4)[0]))
    model.train()
    heads = [h for layer in rep["per_head"]["sink_mass"] for h in layer]
    return {"sink_mass": rep["mean"]["sink_mass"], "sink_mass_max_head": max(heads),
            "sparsity": rep["mean"]["sparsity"], "surviving_mass": rep["mean"]["surviving_mass"]}


def train_lm(cfg: ModelConfig, tcfg: TrainConfig, *, data="shakespeare", seed: int = 0,
             out_dir: str | Path, resume: bool = False, stop_at: int | None = None, progress: bool = True,
             fsdp: bool = False) -> dict:
    """Train one model; return (and write) ``result.json``'s content, or ``{"stopped_at": step}`` with ``stop_at``.

    ``stop_at``: save a checkpoint after that step and return, as if interrupted (time-sliced runs on a shared
    machine; the resumed run is identical to an uninterrupted one). Refuses to overwrite an existing run unless
    ``resume``. ``seed`` and ``resume`` override ``tcfg``'s. ``fsdp``: under torchrun, shard the model with FSDP2
    (``dist.shard``) for models that do not fit one device; checkpoints hold whole tensors either way, so the run,
    its checkpoints and its result equal the unsharded run's (tested with 2 processes).
    """
    tcfg = replace(tcfg, seed=seed, resume=resume)
    out = Path(out_dir)
    dist.init()
    main = dist.is_main()
    if not resume and (has_checkpoint(out) or (out / "result.json").exists()):
        raise InputError("out", str(out), "already holds a run; resume it or choose another folder")
    torch.set_num_threads(tcfg.threads)
    data = load_data(data) if isinstance(data, str) else data
    torch.manual_seed(seed)
    model = GPT(cfg)
    n_params = model.num_parameters()
    if not isinstance(fsdp, bool):
        raise InputError("fsdp", fsdp, "allowed True or False")
    if fsdp:
        dist.shard(model)
    opt = adamw(_param_groups(model, tcfg.weight_decay), tcfg)
    run_cfg = {"model": cfg.to_dict(), "train": tcfg.to_dict(), "data": data.name, "seed": seed,
               "parameters": n_params}
    world = dist.world()
    # Recorded apart from run_cfg (which a resume must match): sizes the run by, not a setting of, the model.
    layout = {"world_size": world, "batch_size_per_rank": tcfg.batch_size,
              "global_batch": world * tcfg.batch_size * tcfg.grad_accum, "fsdp": fsdp and world > 1}
    # A sharded run keeps its optimizer state by parameter name (torch.distributed.checkpoint's layout): resume alike.
    ckpt_meta = {"global_batch": layout["global_batch"], "fsdp": layout["fsdp"]}
    state = None
    if resume:
        state = load_checkpoint(out, meta=ckpt_meta)
        saved = state["extra"].get("config", {})
        if saved.get("model") != run_cfg["model"] or saved.get("train") != run_cfg["train"] or saved.get("seed") != seed:
            raise InputError("out", str(out), f"holds a run started with a different configuration ({saved}); "
                                              "resume with the same settings or choose another folder")
    elif main:
        out.mkdir(parents=True, exist_ok=True)
    if main:
        # model_type: the folder loads with transformers' Auto classes too (hf/lab_model.py)
        _io.write_json(out / "config.json", {**run_cfg, "distributed": layout, "model_type": HF_MODEL_TYPE})

    def next_batch(step: int, micro: int):
        return data.batch(seed, step * tcfg.grad_accum + micro, tcfg.batch_size, cfg.block_size, rank=dist.rank(),
                          world=world)

    def loss_of(batch):
        return model(*batch)[1]

    def record(done: int, rec: dict) -> dict | None:
        if done % tcfg.log_interval and done != tcfg.steps:
            return None
        log = {"step": done, "loss": rec["loss"], "lr": rec["lr"], "global_batch": rec["global_batch"],
               "tok_s": rec["tokens_per_s"], "elapsed_s": rec["elapsed_s"]}
        if done % tcfg.eval_interval == 0 or done == tcfg.steps:
            ev = evaluate_metrics(model, data, cfg.block_size, tcfg.eval_windows)
            log["val_loss"], log["val_acc"] = ev["loss"], ev["acc"]
            log.update(_attention_snapshot(model, data, cfg.block_size))
        return log

    model.train()
    res = train_loop(tcfg, out=out, optimizer=opt, next_batch=next_batch, loss_of=loss_of, checkpoint=state,
                     trainable=lambda: dist.full_state(model), load_trainable=lambda t: dist.load_full_state(model, t),
                     optimizer_state=lambda: dist.full_optimizer_state(model, opt),
                     load_optimizer_state=lambda o: dist.load_full_optimizer_state(model, opt, o),
                     clip_params=list(model.parameters()), record=record, extra_state=lambda: {"config": run_cfg},
                     meta=ckpt_meta,
                     tokens_per_step=layout["global_batch"] * cfg.block_size, stop_at=stop_at,
                     desc=f"{cfg.attention} s{seed}", progress=progress)
    if res.stopped:
        return {"stopped_at": res.step}
    tokens = tcfg.steps * layout["global_batch"] * cfg.block_size
    result = {"config": run_cfg, "distributed": layout, "steps": tcfg.steps, "tokens": tokens,
              "train_time_s": res.elapsed_s, **final_report(model, data, cfg, tcfg)}
    if main:
        _io.write_json(out / "result.json", result)
    return result


def load_result(run_dir: str | Path) -> dict | None:
    p = Path(run_dir) / "result.json"
    return json.loads(p.read_text()) if p.exists() else None


def read_metrics(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []


__all__ = ["evaluate", "evaluate_metrics", "final_report", "load_result", "model_config_from_dict", "read_metrics", "train_lm"]
