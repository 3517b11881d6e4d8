"""The one training loop, used by the router retrofit (``train/retrofit.py``) and the from-scratch lab
(``gpt/train.py``): AdamW, the cosine LR schedule, gradient accumulation, clipping, tqdm progress (loss, tokens/s),
``metrics.jsonl``, atomic verified checkpoints every ``checkpoint_every`` steps and exact ``resume`` (trainable
tensors, optimizer, step, torch's RNG state, training time), data parallelism over ``train.dist`` (each rank its
slice of the global batch, gradients averaged once per step; rank 0 alone logs and writes).

Determinism: same seed, machine and process count give the same ``metrics.jsonl`` except ``TIMING_FIELDS``.

What is specific to a job stays in its file and comes in as callables: the micro-batch of a step, the loss of a
batch (and the scalars to log with it), what to do before a step, and the record to log after it.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterable

import torch
from tqdm.auto import tqdm

from .. import _io
from .._errors import InputError
from . import dist
from .checkpoint import check_trainable, save_checkpoint
from .schedule import cosine_lr

BETAS = (0.9, 0.95)
TIMING_FIELDS = ("tokens_per_s", "tok_s", "elapsed_s")  # wall-clock fields of a record: the only ones that vary


def _int_at_least(cls: str, name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise InputError(name, value, f"allowed an integer >= {low} ({cls}.{name})")


@dataclass(frozen=True)
class TrainConfig:
    """The training fields every job shares (a job's config inherits them and may change the defaults).

    steps: optimizer steps. batch_size: sequences per micro-batch and process (the global batch is
    ``world * batch_size * grad_accum``); grad_accum: micro-batches per step.
    lr, warmup, min_lr_ratio: peak rate, linear warmup steps, cosine floor as a share of ``lr`` (``cosine_lr``).
    weight_decay: AdamW's (a job may give some parameter groups none). clip: gradient-norm clipping threshold.
    seed: the job's seed (batches and initialisation). checkpoint_every: save every N steps (and at the end).
    resume: continue from the output folder's checkpoint.
    """

    steps: int = 100
    batch_size: int = 1
    grad_accum: int = 1
    lr: float = 1e-3
    warmup: int = 0
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    seed: int = 0
    checkpoint_every: int = 100
    resume: bool = False

    def __post_init__(self):
        c = type(self).__name__
        for name in ("steps", "batch_size", "grad_accum", "checkpoint_every"):
            _int_at_least(c, name, getattr(self, name), 1)
        _int_at_least(c, "warmup", self.warmup, 0)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise InputError("seed", self.seed, f"allowed an integer ({c}.seed)")
        if not self.lr > 0:
            raise InputError("lr", self.lr, f"allowed a float > 0 ({c}.lr)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise InputError("min_lr_ratio", self.min_lr_ratio, f"allowed a float in [0, 1] ({c}.min_lr_ratio)")
        if not self.weight_decay >= 0:
            raise InputError("weight_decay", self.weight_decay, f"allowed a float >= 0 ({c}.weight_decay)")
        if not self.clip > 0:
            raise InputError("clip", self.clip, f"allowed a float > 0 ({c}.clip)")
        if not isinstance(self.resume, bool):
            raise InputError("resume", self.resume, f"allowed True or False ({c}.resume)")

    def to_dict(self) -> dict:
        return asdict(self)


def adamw(params, cfg: TrainConfig) -> torch.optim.AdamW:
    """The optimizer of every job: AdamW at ``cfg.lr`` (set per step by the schedule), ``cfg.weight_decay`` unless a
    parameter group sets its own."""
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay, betas=BETAS)


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop records after ``last_step`` (the checkpoint) so a resumed run does not duplicate them."""
    if not path.exists():
        return
    keep = [ln for ln in path.read_text().splitlines() if ln.strip() and json.loads(ln)["step"] <= last_step]
    _io.write_text(path, "".join(ln + "\n" for ln in keep))


@dataclass
class LoopResult:
    step: int  # last step done
    elapsed_s: float  # training time (forward, backward, optimizer; not evaluation or checkpoints), resumes included
    stopped: bool  # returned at ``stop_at`` before ``cfg.steps``


def train_loop(
    cfg: TrainConfig,
    *,
    out: str | Path,
    optimizer: torch.optim.Optimizer,
    next_batch: Callable[[int, int], Any],
    loss_of: Callable[[Any], torch.Tensor | tuple[torch.Tensor, dict]],
    trainable: Callable[[], dict],
    load_trainable: Callable[[dict], None],
    checkpoint: dict | None = None,
    clip_params: Iterable[torch.nn.Parameter] | None = None,
    before_step: Callable[[int], None] | None = None,
    record: Callable[[int, dict], dict | None] | None = None,
    extra_state: Callable[[], dict] | None = None,
    optimizer_state: Callable[[], dict] | None = None,
    load_optimizer_state: Callable[[dict], None] | None = None,
    tokens_per_step: int,
    meta: dict | None = None,
    stop_at: int | None = None,
    desc: str = "train",
    progress: bool = True,
) -> LoopResult:
    """Train from step 0, or from ``checkpoint`` (a ``load_checkpoint`` dict: trainable tensors, optimizer, RNG,
    step) to ``cfg.steps``; rank 0 writes ``out/metrics.jsonl`` and the checkpoints (``train.checkpoint``).

    next_batch(step, micro): this rank's micro-batch ``micro`` (0 .. grad_accum - 1) of step ``step`` (0-based); a
        deterministic function of its arguments (and the rank, see ``dist.sample_range``) keeps a resumed run
        identical to an uninterrupted one.
    loss_of(batch): the objective to minimise, or ``(objective, scalars)``; ``scalars`` (floats, default
        ``{"loss": objective}``) are averaged over the micro-batches and must hold ``"loss"``.
    trainable() / load_trainable(tensors): the tensors a checkpoint keeps, and how a resume puts them back.
    before_step(step): job-specific changes before a step (e.g. a schedule of its own).
    record(step_done, rec): the record to log for a finished step, or None to log nothing. ``rec`` holds
        ``step`` (1-based), the scalars averaged over micro-batches and ranks, ``lr``, ``grad_norm``,
        ``global_batch`` (sequences per step over all ranks), ``tokens_per_s`` (since the last logged record) and
        ``elapsed_s``; the default logs it as it is. Every rank calls it (an evaluation may need all of them); rank 0
        writes it. Time spent in ``record`` (evaluation) is not training time.
    extra_state(): more to keep in each checkpoint's ``extra`` (the loop adds ``elapsed_s``).
    optimizer_state() / load_optimizer_state(state): the optimizer's state as a checkpoint keeps it (default its
        ``state_dict``); a sharded model gathers whole tensors here (``dist.full_optimizer_state``). Like
        ``trainable()``, called on every rank.
    tokens_per_step: tokens one step trains on over all ranks (for ``tokens_per_s``).
    meta: what the checkpoints are for (e.g. the base model id); ``load_checkpoint(meta=...)`` checks it on resume.
    stop_at: checkpoint after that step and return as if interrupted (``resume`` continues exactly).
    """
    out = Path(out)
    log_path = out / "metrics.jsonl"
    main = dist.is_main()
    params = [p for g in optimizer.param_groups for p in g["params"]]
    clip_params = list(clip_params) if clip_params is not None else params
    global_batch = cfg.batch_size * cfg.grad_accum * dist.world()
    start, elapsed = 0, 0.0
    if checkpoint is not None:
        check_trainable(checkpoint, trainable(), out)
        load_trainable(checkpoint["trainable"])
        (load_optimizer_state or optimizer.load_state_dict)(checkpoint["optimizer"])
        if "rng" in checkpoint:
            torch.set_rng_state(checkpoint["rng"])
        start, elapsed = checkpoint["step"], checkpoint.get("extra", {}).get("elapsed_s", 0.0)
        if main:
            truncate_metrics(log_path, start)
    elif main:
        out.mkdir(parents=True, exist_ok=True)
        log_path.unlink(missing_ok=True)

    def save(step: int) -> None:
        state, ostate = trainable(), (optimizer_state or optimizer.state_dict)()  # collectives when sharded
        if main:
            save_checkpoint(out, step=step, trainable=state, optimizer_state=ostate, meta=meta,
                            extra={**(extra_state() if extra_state else {}), "elapsed_s": elapsed})

    bar = tqdm(range(start, cfg.steps), initial=start, total=cfg.steps, desc=desc, disable=not (progress and main),
               dynamic_ncols=True)
    window_s, window_steps = 0.0, 0  # training time and steps since the last logged record
    done = start
    try:
        for step in bar:
            t0 = time.perf_counter()
            lr = cosine_lr(step, lr=cfg.lr, warmup=cfg.warmup, total=cfg.steps, min_ratio=cfg.min_lr_ratio)
            for g in optimizer.param_groups:
                g["lr"] = lr
            if before_step is not None:
                before_step(step)
            sums: dict[str, float] = {}
            for micro in range(cfg.grad_accum):
                res = loss_of(next_batch(step, micro))
                objective, scalars = res if isinstance(res, tuple) else (res, None)
                (objective / cfg.grad_accum).backward()
                for k, v in (scalars if scalars is not None else {"loss": objective.item()}).items():
                    sums[k] = sums.get(k, 0.0) + v
            dist.average_gradients(params)
            grad_norm = dist.scalar(torch.nn.utils.clip_grad_norm_(clip_params, cfg.clip))
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            done = step + 1
            dt = time.perf_counter() - t0
            elapsed, window_s, window_steps = elapsed + dt, window_s + dt, window_steps + 1
            means = dist.mean_scalars({k: v / cfg.grad_accum for k, v in sums.items()})
            if not math.isfinite(means["loss"]):
                raise FloatingPointError(f"{desc}: loss became {means['loss']} at step {done}; "
                                         "the last good checkpoint is kept")
            rec = {"step": done, **means, "lr": lr, "grad_norm": grad_norm, "global_batch": global_batch,
                   "tokens_per_s": window_steps * tokens_per_step / max(window_s, 1e-9), "elapsed_s": elapsed}
            rec = record(done, rec) if record is not None else rec
            if rec is not None:
                if main:
                    _io.append_jsonl(log_path, rec)
                bar.set_postfix(loss=f"{means['loss']:.3f}",
                                tok_s=f"{window_steps * tokens_per_step / max(window_s, 1e-9):,.0f}")
                window_s, window_steps = 0.0, 0
            if done % cfg.checkpoint_every == 0 or done == cfg.steps or done == stop_at:
                save(done)
            if stop_at is not None and stop_at <= done < cfg.steps:
                break
    finally:
        bar.close()
    # No rank leaves (and tears the process group down) while rank 0 still writes the checkpoint: a rank that did
    # made gloo abort the other ("terminate called without an active exception", seen in CI after --stop-at).
    dist.barrier()
    return LoopResult(done, elapsed, done < cfg.steps)
