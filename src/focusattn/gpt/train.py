"""Training loop of the lab LM: AdamW + cosine LR, tqdm progress, atomic checkpoints, ``--resume``, metrics.jsonl.

Output directory layout: ``config.json`` (what was run), ``metrics.jsonl`` (one record per log/eval step),
``checkpoint.pt`` (latest, atomic), ``result.json`` (final evaluation; its presence marks a finished run).
"""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from .. import _io
from ..lazy.metrics import attention_report
from ..train.checkpoint import load_checkpoint, save_checkpoint
from ..train.schedule import cosine_lr
from .config import ModelConfig, TrainConfig, model_config_from_dict
from .data import LMData
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
def evaluate(model: GPT, data: LMData, t: int, n: int, batch: int = 8) -> float:
    """Mean next-token loss (nats) over ``n`` fixed validation windows of length ``t``."""
    model.eval()
    x, y = data.val_windows(t, n)
    total = 0.0
    for i in range(0, n, batch):
        _, loss = model(x[i:i + batch], y[i:i + batch])
        total += loss.item() * len(x[i:i + batch])
    model.train()
    return total / n


@torch.no_grad()
def final_report(model: GPT, data: LMData, cfg: ModelConfig, tcfg: TrainConfig) -> dict:
    val = {f"{m}x": evaluate(model, data, m * cfg.block_size, max(2, tcfg.eval_windows // m)) for m in EXTRAPOLATION}
    model.eval()
    x, _ = data.val_windows(cfg.block_size, METRIC_WINDOWS)
    metrics = attention_report(model.attention_weights(x))
    model.train()
    return {"val_loss": val["1x"], "val_loss_by_length": val, "attention": metrics, "tau": model.taus()}


@torch.no_grad()
def _attention_snapshot(model: GPT, data: LMData, t: int) -> dict:
    """Cheap per-eval view of how the sink and the sparsity develop during training (means and worst head)."""
    model.eval()
    rep = attention_report(model.attention_weights(data.val_windows(t, 4)[0]))
    model.train()
    heads = [h for layer in rep["per_head"]["sink_mass"] for h in layer]
    return {"sink_mass": rep["mean"]["sink_mass"], "sink_mass_max_head": max(heads),
            "sparsity": rep["mean"]["sparsity"], "surviving_mass": rep["mean"]["surviving_mass"]}


def _truncate_jsonl(path: Path, last_step: int) -> None:
    """Drop records after the checkpoint so a resumed run does not duplicate them."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= last_step]
    _io.write_text(path, "".join(ln + "\n" for ln in keep))


def train_lm(cfg: ModelConfig, tcfg: TrainConfig, *, data: str | LMData = "shakespeare", seed: int = 0,
             out_dir: str | Path, resume: bool = False, stop_at: int | None = None, progress: bool = True) -> dict:
    """Train one model; return (and write) ``result.json``'s content, or ``{"stopped_at": step}`` with ``stop_at``.

    ``stop_at``: save a checkpoint after that step and return, as if interrupted (time-sliced runs on a shared
    machine; the resumed run is identical to an uninterrupted one). Refuses to overwrite an existing run unless
    ``resume``.
    """
    out = Path(out_dir)
    ckpt_path, log_path = out / "checkpoint.pt", out / "metrics.jsonl"
    if not resume and (ckpt_path.exists() or (out / "result.json").exists()):
        raise FileExistsError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    torch.set_num_threads(tcfg.threads)
    data = LMData.load(data) if isinstance(data, str) else data
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = torch.optim.AdamW(_param_groups(model, tcfg.weight_decay), lr=tcfg.lr, betas=(0.9, 0.95))
    run_cfg = {"model": cfg.to_dict(), "train": tcfg.to_dict(), "data": data.name, "seed": seed,
               "parameters": model.num_parameters()}
    start, history = 0, {"elapsed_s": 0.0}
    if resume:
        state = load_checkpoint(ckpt_path)
        saved = state["extra"].get("config", {})
        if saved.get("model") != run_cfg["model"] or saved.get("train") != run_cfg["train"] or saved.get("seed") != seed:
            raise ValueError(f"--resume: the run in {out} was started with a different configuration "
                             f"({saved}); resume with the same settings or choose another --out")
        model.load_state_dict(state["trainable"])
        opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start, history = state["step"], {"elapsed_s": state["extra"].get("elapsed_s", 0.0)}
        _truncate_jsonl(log_path, start)
    else:
        out.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)
    _io.write_json(out / "config.json", run_cfg)

    def checkpoint(step):
        save_checkpoint(ckpt_path, step=step, trainable=model.state_dict(), optimizer=opt,
                        extra={"config": run_cfg, "elapsed_s": history["elapsed_s"]})

    tokens_per_step = tcfg.batch_size * cfg.block_size
    bar = tqdm(range(start, tcfg.steps), initial=start, total=tcfg.steps, disable=not progress,
               desc=f"{cfg.attention} s{seed}", dynamic_ncols=True)
    t_last, n_last = time.perf_counter(), 0
    model.train()
    for step in bar:
        lr = cosine_lr(step, lr=tcfg.lr, warmup=tcfg.warmup, total=tcfg.steps, min_ratio=tcfg.min_lr_ratio)
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = data.batch(seed, step, tcfg.batch_size, cfg.block_size)
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        opt.step()
        if not math.isfinite(loss.item()):
            raise FloatingPointError(f"{cfg.attention}: loss became {loss.item()} at step {step + 1}")
        done = step + 1
        n_last += 1
        if done % tcfg.log_interval == 0 or done == tcfg.steps:
            now = time.perf_counter()
            history["elapsed_s"] += now - t_last
            tok_s = n_last * tokens_per_step / max(now - t_last, 1e-9)
            t_last, n_last = now, 0
            rec = {"step": done, "loss": loss.item(), "lr": lr, "tok_s": tok_s, "elapsed_s": history["elapsed_s"]}
            if done % tcfg.eval_interval == 0 or done == tcfg.steps:
                rec["val_loss"] = evaluate(model, data, cfg.block_size, tcfg.eval_windows)
                rec.update(_attention_snapshot(model, data, cfg.block_size))
                t_last = time.perf_counter()  # evaluation time is not training throughput
            _io.append_jsonl(log_path, rec)
            bar.set_postfix(loss=f"{loss.item():.3f}", tok_s=f"{tok_s:,.0f}")
        if done % tcfg.ckpt_interval == 0 or done == tcfg.steps or done == stop_at:
            checkpoint(done)
        if stop_at is not None and done >= stop_at and done < tcfg.steps:
            bar.close()
            return {"stopped_at": done}
    bar.close()
    result = {"config": run_cfg, "steps": tcfg.steps, "tokens": tcfg.steps * tokens_per_step,
              "train_time_s": history["elapsed_s"], **final_report(model, data, cfg, tcfg)}
    _io.write_json(out / "result.json", result)
    return result


def load_result(run_dir: str | Path) -> dict | None:
    p = Path(run_dir) / "result.json"
    return json.loads(p.read_text()) if p.exists() else None


def read_metrics(run_dir: str | Path) -> list[dict]:
    p = Path(run_dir) / "metrics.jsonl"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []


__all__ = ["evaluate", "final_report", "load_result", "model_config_from_dict", "read_metrics", "train_lm"]
