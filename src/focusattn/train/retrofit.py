"""Centroid-only Focus retrofit: freeze a pretrained LM, train only the routers, evaluate before and after.

``method="lora"`` trains the paper's baseline instead, LoRA on the attention projections (``hf/lora.py``), through the
same path: same data, batches, seed, schedule, loop and evaluation, so the two compare on one table.

Under torchrun (``train/dist.py``) every rank holds the frozen base (whole, or sharded by FSDP2 with ``fsdp``) and a
replica of the routers, trains on its slice of each global batch, and evaluates the same windows; rank 0 alone writes.
"""
from __future__ import annotations

import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from .._errors import InputError
from .._io import write_json
from ..analysis.groups import group_stats
from ..data.corpora import load_corpus
from ..data.sampler import EpochWindows
from ..data.tokens import check_length, eval_windows, tokenize
from ..eval.perplexity import perplexity
from ..focus.config import FocusConfig
from ..lazy.config import ElasticConfig
from ..hf import compose, load_model, router_parameters, routers, save_adapter, set_top_k
from ..adapters import resolve as resolve_adapter
from ..hf.compose import focus_config, original_attention, update_config
from ..hf.heads import parse_dense_heads, scored_heads
from ..hf.io import adapter_state, load_adapter, load_adapter_state, read_adapter_config
from ..hf.lazy import compose_lazy, lazy_parameters, lazy_state, load_lazy_state, save_lazy_adapter, taus
from ..hf.lora import add_lora, load_lora_state, lora_parameters, lora_state, save_lora
from . import dist
from .checkpoint import load_checkpoint
from .loop import TrainConfig, adamw, train_loop
from .objectives import ATTN_LOSSES, OBJECTIVES, AttentionObjective

log = logging.getLogger("focusattn")

METHODS = ("focus", "lora", "lazy", "lazy+lora")
LAZY_METHODS = ("lazy", "lazy+lora")


@dataclass(frozen=True)
class RetrofitConfig(TrainConfig):
    """Defaults are sized for the offline demo on 2 CPU cores (~15 minutes); the paper trains 4000 steps at 1024.
    The training fields (steps .. resume) are :class:`~focusattn.train.loop.TrainConfig`'s."""

    steps: int = 100
    lr: float = 5e-3
    warmup: int = 10
    checkpoint_every: int = 25
    model: str = "smollm2-135m"
    data: str = "shakespeare"
    ood_data: str | None = "lee-news"
    out: str = "runs/retrofit"
    seq_len: int = 512
    eval_windows: int = 8
    ood_eval_windows: int = 8
    eval_top_ks: tuple[int, ...] | None = None  # None = 1..K/2 (for k > K/2 any two k-subsets intersect; query_proj: 1)
    grad_checkpointing: bool = False
    fsdp: bool = False  # shard the frozen base over the ranks with FSDP2 (train/dist.py); routers stay whole
    balance_loss: float = 0.0  # weight of the routers' load-balance loss (focus.router.balance_loss); 0 = off
    lam_final: float | None = None  # anneal the soft gate's lambda geometrically to this value (train for the hard mask)
    distill: float = 0.0  # loss = (1 - distill) * LM loss + distill * KL(original model || composed), per token
    init_adapter: str | None = None  # start the routers from this adapter (name or folder): continue training
    repeat_prob: float = 0.0  # share of training windows whose second half repeats the first (see repeat_halves)
    objective: str = "lm"  # "lm" (LM loss, with distill) or "attention" (each router against its layer's attention)
    attn_keys: int = 64  # objective "attention": the M most attended distant keys per query that make the target
    attn_loss: str = "ce"  # objective "attention": "ce" (cross-entropy to the routing's affinity) or "mass" (the
    # expected kept mass under window-balanced soft groups; objectives.router_mass_loss)
    eval_every: int = 0  # focus: every N steps, held-out top-1 perplexity (and kept mass) in metrics.jsonl; 0 = off
    pool: int = 0  # train on this many fixed windows, reused (targets computed once each); 0 = fresh windows
    targets_cache: str | None = None  # objective "attention": a folder keeping each window's targets for other runs
    dense_heads: str | None = None  # a --dense-heads spec (hf.heads.parse_dense_heads) served dense while training,
    # stored in the adapter; the attention objective then trains each router for its layer's routed heads only
    method: str = "focus"  # "focus" (routers), "lora" (the baseline), "lazy" (Elastic-Softmax thresholds on the frozen
    # model) or "lazy+lora" (thresholds and LoRA on the query/key projections); the focus fields serve "focus" only
    lora_rank: int = 8
    lora_alpha: float | None = None  # LoRA scale alpha / rank; None = 2 * rank
    focus: FocusConfig = field(default_factory=FocusConfig)
    lazy: ElasticConfig = field(default_factory=ElasticConfig)

    def __post_init__(self):
        super().__post_init__()
        c = "RetrofitConfig"
        for name in ("seq_len", "eval_windows"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise InputError(name, v, f"allowed an integer >= 1 ({c}.{name})")
        if isinstance(self.ood_eval_windows, bool) or not isinstance(self.ood_eval_windows, int) \
                or self.ood_eval_windows < 0:
            raise InputError("ood_eval_windows", self.ood_eval_windows, f"allowed an integer >= 0 ({c}.ood_eval_windows)")
        if not self.balance_loss >= 0:
            raise InputError("balance_loss", self.balance_loss, f"allowed a float >= 0 ({c}.balance_loss)")
        if self.method not in METHODS:
            raise InputError("method", self.method, f"allowed {', '.join(METHODS)} ({c}.method)")
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 1:
            raise InputError("lora_rank", self.lora_rank, f"allowed an integer >= 1 ({c}.lora_rank)")
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise InputError("lora_alpha", self.lora_alpha, f"allowed None or a float > 0 ({c}.lora_alpha)")
        if not isinstance(self.fsdp, bool):
            raise InputError("fsdp", self.fsdp, f"allowed True or False ({c}.fsdp)")
        if not 0 <= self.distill <= 1:
            raise InputError("distill", self.distill, f"allowed a float in [0, 1] ({c}.distill)")
        if not 0 <= self.repeat_prob <= 1:
            raise InputError("repeat_prob", self.repeat_prob, f"allowed a float in [0, 1] ({c}.repeat_prob)")
        if self.objective not in OBJECTIVES:
            raise InputError("objective", self.objective, f"allowed {', '.join(OBJECTIVES)} ({c}.objective)")
        if self.objective == "attention" and self.method != "focus":
            raise InputError("objective", self.objective, f"allowed only with method 'focus' ({c}.objective)")
        if self.method in LAZY_METHODS and self.distill:
            raise InputError("distill", self.distill, f"allowed only with method 'focus' ({c}.distill)")
        if self.method == "lazy" and not (self.lazy.train_tau or self.lazy.use_bias):
            raise InputError("method", self.method, "nothing to train: the thresholds are frozen and there is no "
                             "distance table (train tau, add the table, or use --method lazy+lora)")
        if self.attn_loss not in ATTN_LOSSES:
            raise InputError("attn_loss", self.attn_loss, f"allowed {', '.join(ATTN_LOSSES)} ({c}.attn_loss)")
        if self.attn_loss != "ce" and self.objective != "attention":
            raise InputError("attn_loss", self.attn_loss, f"allowed only with objective 'attention' ({c}.attn_loss)")
        if self.attn_loss == "mass" and self.focus.query_proj:
            raise InputError("attn_loss", self.attn_loss, f"allowed 'ce' with focus.query_proj=True (the mass loss "
                             f"scores one symmetric routing) ({c}.attn_loss)")
        if self.objective == "attention" and self.distill:
            raise InputError("distill", self.distill, "allowed only with objective 'lm' (the attention objective "
                             "has no output-level term; continue with --init-adapter for one)")
        for name in ("attn_keys", "pool", "eval_every"):
            v, low = getattr(self, name), 1 if name == "attn_keys" else 0
            if isinstance(v, bool) or not isinstance(v, int) or v < low:
                raise InputError(name, v, f"allowed an integer >= {low} ({c}.{name})")
        if self.dense_heads is not None:
            if self.method != "focus":
                raise InputError("dense_heads", self.dense_heads, f"allowed only with method 'focus' ({c}.dense_heads)")
            parse_dense_heads(self.dense_heads)  # a bad spec is a one-line error naming the field
        if self.init_adapter is not None and self.method != "focus":
            raise InputError("init_adapter", self.init_adapter, f"allowed only with method 'focus' ({c}.init_adapter)")
        if self.lam_final is not None and not self.lam_final > 0:
            raise InputError("lam_final", self.lam_final, f"allowed None or a float > 0 ({c}.lam_final)")
        if self.eval_top_ks is not None:
            bad = [k for k in self.eval_top_ks if not 1 <= k <= self.focus.num_groups]
            if bad:
                raise InputError("eval_top_ks", ",".join(map(str, self.eval_top_ks)),
                                 f"eval top-k {bad} out of range: allowed 1..{self.focus.num_groups}")
            if self.focus.query_proj and set(self.eval_top_ks) - {1}:
                raise InputError("eval_top_ks", ",".join(map(str, self.eval_top_ks)),
                                 "allowed 1 only with query_proj (the queries' own projection serves query top-1)")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["focus"] = self.focus.to_dict()
        d["lazy"] = self.lazy.to_dict()
        return d


def _checkpointing(model, on: bool) -> None:
    """Activation checkpointing through transformers' public switch (renamed in 5.x; both spellings supported)."""
    if hasattr(model, "activation_checkpointing_enable"):
        if on:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.activation_checkpointing_disable()
    elif on:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_disable()


def _max_positions(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _eval_suite(model, windows, top_ks, desc, progress=True) -> dict:
    res = {"soft": perplexity(model, windows, desc=f"{desc} soft", progress=progress)["ppl"]}
    for k in top_ks:
        set_top_k(model, k)
        res[f"top{k}"] = perplexity(model, windows, desc=f"{desc} top-{k}", progress=progress)["ppl"]
    set_top_k(model, None)
    return res


def retrofit(cfg: RetrofitConfig, *, progress: bool = True, command: str | None = None) -> dict:
    """Run the whole job; writes ``metrics.jsonl``, the checkpoint, ``adapter/`` and ``summary.json`` in ``out``."""
    out = Path(cfg.out)
    t_start = time.time()
    dist.init()
    main, world = dist.is_main(), dist.world()
    progress = progress and main
    if cfg.fsdp and world == 1:
        log.warning("--fsdp shards over the processes of a torchrun launch; in one process it changes nothing")
    torch.manual_seed(cfg.seed)
    model, tok = load_model(cfg.model)
    max_pos = _max_positions(model)
    if max_pos is not None and cfg.seq_len > max_pos:
        raise InputError("seq_len", cfg.seq_len, f"exceeds the model's {max_pos} positions")
    init = _init_adapter(cfg) if cfg.init_adapter else None  # bad adapter: error before any work
    corpus = load_corpus(cfg.data)
    train_ids, val_ids = tokenize(corpus, tok, tokenizer_id=cfg.model)
    check_length(train_ids, cfg.seq_len, f"{cfg.data} train split", need=2)
    check_length(val_ids, cfg.seq_len, f"{cfg.data} validation split")
    val_w = eval_windows(val_ids, cfg.seq_len, cfg.eval_windows)
    ood_w = None
    if cfg.ood_data and cfg.ood_eval_windows:
        ood = load_corpus(cfg.ood_data)
        _, ood_val = tokenize(ood, tok, tokenizer_id=cfg.model)
        ood_w = eval_windows(ood_val, cfg.seq_len, cfg.ood_eval_windows)
    top_ks = list(cfg.eval_top_ks or range(1, max(1, cfg.focus.num_groups // 2) + 1))
    top_ks = [1] if cfg.focus.query_proj else top_ks  # served at query top-1 only (eval_top_ks is checked)
    log.info("%s | %d train / %d val tokens", corpus.describe(), len(train_ids), len(val_ids))

    global_batch = world * cfg.batch_size * cfg.grad_accum
    meta = {"model": cfg.model, "global_batch": global_batch}  # a resume must match these
    log.info("global batch %d = %d process(es) x %d sequences x %d accumulation steps", global_batch, world,
             cfg.batch_size, cfg.grad_accum)
    if main:
        out.mkdir(parents=True, exist_ok=True)  # only once the inputs are known to be good: bad input leaves nothing
    ckpt = load_checkpoint(out, meta=meta) if cfg.resume else None
    before = (ckpt or {}).get("extra", {}).get("before")
    if before is None:
        before = {"domain": perplexity(model, val_w, desc="before: domain", progress=progress)["ppl"]}
        if ood_w is not None:
            before["ood"] = perplexity(model, ood_w, desc="before: ood", progress=progress)["ppl"]

    lora = cfg.method == "lora"
    lazy = cfg.method in LAZY_METHODS
    if lora:
        model = add_lora(model, cfg.lora_rank, cfg.lora_alpha)
        params = lora_parameters(model)
    elif lazy:
        compose_lazy(model, cfg.lazy, lora_rank=cfg.lora_rank if cfg.method == "lazy+lora" else None,
                     lora_alpha=cfg.lora_alpha)
        params = lazy_parameters(model)
    else:
        compose(model, cfg.focus)
        if init is not None:  # the routers' tensors, checked like any adapter load (shapes, checksum, base model)
            load_adapter(model, init)
        if cfg.dense_heads is not None:  # scored heads are measured on this model, with the routers it starts from
            spec = parse_dense_heads(cfg.dense_heads)
            update_config(model, dense_heads=scored_heads(model, spec) if isinstance(spec, dict) else spec)
        params = router_parameters(model)
    n_train = sum(p.numel() for p in params)
    n_total = sum(p.numel() for p in model.parameters())
    model.to(dist.device())
    if cfg.fsdp:
        dist.shard(model, keep_whole=params)
    opt = adamw(params, cfg)
    if ckpt is not None:
        log.info("resuming from %s at step %d", out, ckpt["step"])

    # Frozen model in eval mode (no dropout); routers train (updates the causal offsets). Gradient checkpointing
    # needs the decoder blocks in train mode, so then only dropout modules are kept in eval.
    model.eval()
    if cfg.grad_checkpointing:
        _checkpointing(model, True)
        model.train()
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.eval()
    rs = [] if lora or lazy else routers(model)
    for r in rs:
        r.train()
    device = dist.device()
    sampler = EpochWindows(len(train_ids), cfg.seq_len, cfg.seed)

    def before_step(step: int) -> None:
        lam = _lam(cfg, step)
        if not (lora or lazy) and lam != focus_config(model).lam:
            update_config(model, lam=lam)

    def next_batch(step: int, micro: int) -> torch.Tensor:
        samples = dist.sample_range(step * cfg.grad_accum + micro, cfg.batch_size)
        if cfg.pool:  # the same pool of windows over and over (their attention targets are memoised)
            samples = [s % cfg.pool for s in samples]
        x = repeat_halves(sampler.windows(train_ids, samples), samples, cfg.repeat_prob, cfg.seed)
        return torch.as_tensor(x, dtype=torch.long, device=device)

    attention = None if lora or lazy or cfg.objective != "attention" else \
        AttentionObjective(model, top_m=cfg.attn_keys, balance_loss=cfg.balance_loss, memo=cfg.pool > 0,
                           cache_dir=cfg.targets_cache, loss=cfg.attn_loss)

    def loss_of(x: torch.Tensor):
        if attention is not None:
            return attention(x)
        teacher = None
        if cfg.distill and not lora:
            with torch.no_grad(), original_attention(model):
                teacher = model(x).logits
        out = model(x, labels=x)
        loss, logs = out.loss, {"loss": out.loss.item()}
        if teacher is not None:
            kl = distill_kl(out.logits, teacher)
            logs["kl"] = kl.item()
            loss = (1 - cfg.distill) * loss + cfg.distill * kl
        if lora or lazy:
            return loss, logs
        bal = torch.stack([r.balance for r in rs]).mean()
        return loss + cfg.balance_loss * bal, {**logs, "balance": bal.item()}

    def record(step: int, rec: dict) -> dict:
        common = {"step": step, "loss": rec["loss"], "lr": rec["lr"], "grad_norm": rec["grad_norm"],
                  "global_batch": rec["global_batch"], "tokens_per_s": rec["tokens_per_s"]}
        if lora:
            return common
        if lazy:  # the thresholds' path: where tau goes under the LM loss alone
            t = [x for layer in taus(model) for x in layer]
            return {**common, "tau_mean": sum(t) / len(t), "tau_max": max(t)}
        # largest_share: per layer, the share of the batch's tokens in the largest group (collapse -> 1)
        for key in ("kl", "attn_ce", "kept_top1", "global_bce"):
            if key in rec:
                common[key] = rec[key]
        return {**common, "balance": rec["balance"], "lam": focus_config(model).lam,
                "largest_share": [r.largest_share for r in rs], **held_out(step)}

    def held_out(step: int) -> dict:
        """Every ``eval_every`` steps, the curves of a run: served top-1 perplexity on the first held-out window of
        each split and, with the attention objective, the share of that window's target mass top-1 keeps and the
        share of distant keys it keeps to do so (uncapped top-1: a router that grows its groups keeps more mass by
        keeping more keys)."""
        if not cfg.eval_every or step % cfg.eval_every:
            return {}
        set_top_k(model, 1)
        try:
            res = {"heldout_top1": perplexity(model, val_w[:1], progress=False)["ppl"]}
            if ood_w is not None:
                res["heldout_ood_top1"] = perplexity(model, ood_w[:1], progress=False)["ppl"]
        finally:
            set_top_k(model, None)
        if attention is not None:  # the routers still in evaluation mode: the window teaches them nothing
            res["heldout_kept_top1"], res["heldout_budget_top1"] = attention.kept(
                torch.as_tensor(val_w[:1], device=device))
        for r in rs:  # perplexity() left the whole model in evaluation mode
            r.train()
        return res

    source = f"the checkpoint in {out} (delete it or start without resuming)"
    if lora:
        trainable, load_trainable = (lambda: lora_state(model)), (lambda t: load_lora_state(model, t, source=source))
    elif lazy:
        trainable, load_trainable = (lambda: lazy_state(model)), (lambda t: load_lazy_state(model, t, source=source))
    else:
        trainable = lambda: adapter_state(model)  # noqa: E731
        load_trainable = lambda t: load_adapter_state(model, t, source=source)  # noqa: E731
    start = (ckpt or {}).get("extra", {}).get("heldout_start")  # the curve's step 0: the routers it starts from
    if start is None and cfg.eval_every and not (lora or lazy):
        start = {"step": 0, **held_out(0)}
    train_loop(cfg, out=out, optimizer=opt, next_batch=next_batch, loss_of=loss_of, checkpoint=ckpt,
               trainable=trainable, load_trainable=load_trainable,
               clip_params=params, before_step=before_step, record=record,
               extra_state=lambda: {"before": before, "heldout_start": start},
               tokens_per_step=global_batch * cfg.seq_len, meta=meta, desc="retrofit", progress=progress)
    if cfg.grad_checkpointing:
        _checkpointing(model, False)
    model.eval()
    if lora:
        adapter_dir = save_lora(model, out / "adapter") if main else out / "adapter"
        after = {"domain": {"lora": perplexity(model, val_w, desc="after: domain lora", progress=progress)["ppl"]}}
        if ood_w is not None:
            after["ood"] = {"lora": perplexity(model, ood_w, desc="after: ood lora", progress=progress)["ppl"]}
        stats = {"layers": [], "pairs_kept": {}}
    elif lazy:
        from ..eval.lazy_probe import elastic_stats

        adapter_dir = save_lazy_adapter(model, out / "adapter") if main else out / "adapter"
        after = {"domain": {"lazy": perplexity(model, val_w, desc="after: domain lazy", progress=progress)["ppl"]}}
        if ood_w is not None:
            after["ood"] = {"lazy": perplexity(model, ood_w, desc="after: ood lazy", progress=progress)["ppl"]}
        stats = {"layers": [], "pairs_kept": {}}
        lazy_summary = {"tau": taus(model), "attention": elastic_stats(model, val_w[:1])}
    else:
        update_config(model, lam=_lam(cfg, cfg.steps))
        adapter_dir = save_adapter(model, out / "adapter") if main else out / "adapter"
        after = {"domain": _eval_suite(model, val_w, top_ks, "after: domain", progress)}
        if ood_w is not None:
            after["ood"] = _eval_suite(model, ood_w, top_ks, "after: ood", progress)
        stats = group_stats(model, val_w[: min(2, len(val_w))], top_ks)
    n_key = "lora" if lora else "lazy" if lazy else "router"
    summary = {
        "command": command,
        "method": cfg.method,
        "config": cfg.to_dict(),
        "corpus": corpus.describe(),
        "parameters": {n_key: n_train, "trainable": n_train, "total": n_total, "percent": 100.0 * n_train / n_total},
        "distributed": {"world_size": world, "batch_size_per_rank": cfg.batch_size, "global_batch": global_batch,
                        "fsdp": cfg.fsdp and world > 1},
        "perplexity": {"before": before, "after": after},
        "heldout_start": start,
        "groups": stats["layers"],
        "pairs_kept": stats["pairs_kept"],
        "final_loss": _final_loss(out / "metrics.jsonl"),
        "adapter": str(adapter_dir),
        "wall_seconds": time.time() - t_start,
    }
    if lazy:
        summary["lazy"] = lazy_summary
    if main:
        write_json(out / "summary.json", summary)
    dist.barrier()  # no rank leaves before rank 0 has written everything
    return summary


def repeat_halves(x, samples, prob: float, seed: int):
    """Windows ``x`` [N, T] where, for a share ``prob`` of the samples (drawn per global sample number, so the same
    on any number of processes and on resume), the second half is a copy of the first.

    Why: copying a passage seen ~T/2 tokens earlier is what a sparse mask loses first (the query and the key it
    needs must share a group), and natural training text rarely repeats at that distance. Used with distillation
    the original model's own predictions on the copy are the target; nothing is labelled by hand.
    """
    if prob <= 0:
        return x
    x = x.copy()
    h = x.shape[1] // 2
    for row, s in enumerate(samples):
        if random.Random(seed * 1_000_003 + s).random() < prob:
            x[row, h:2 * h] = x[row, :h]
    return x


def distill_kl(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Mean over next-token positions of KL(teacher || student), both ``[B, T, V]`` logits (the last position
    predicts nothing the LM loss scores, so it is left out here too).

    Why distil: the target is the original model's behaviour, not the data's. The KL scores the whole next-token
    distribution at every position (the LM loss one label), so the routers learn which distant pairs the frozen
    model needs from far fewer tokens, and a perfect router reaches exactly zero.
    """
    v = student.shape[-1]
    s = torch.log_softmax(student[:, :-1].float(), -1).reshape(-1, v)
    t = torch.log_softmax(teacher[:, :-1].float(), -1).reshape(-1, v)
    return torch.nn.functional.kl_div(s, t, log_target=True, reduction="batchmean")


def _init_adapter(cfg: RetrofitConfig) -> Path:
    """The folder of ``cfg.init_adapter``, its config checked against this run's router shapes before any work
    (one-line error naming the flag); ``hf.load_adapter`` loads it once the model is composed."""
    try:
        path = resolve_adapter(cfg.init_adapter)
        meta = read_adapter_config(path)
    except ValueError as e:
        raise InputError("init_adapter", cfg.init_adapter, str(e)) from e
    have = FocusConfig.from_dict(meta["focus_config"])
    if (have.num_groups, have.group_dim) != (cfg.focus.num_groups, cfg.focus.group_dim):
        raise InputError("init_adapter", cfg.init_adapter, f"it has K={have.num_groups}, d_g={have.group_dim}; this "
                         f"run has K={cfg.focus.num_groups}, d_g={cfg.focus.group_dim} (pass --groups/--group-dim)")
    return path


def _lam(cfg: RetrofitConfig, step: int) -> float:
    """The soft gate's sharpness at ``step``: geometric from ``focus.lam`` to ``lam_final`` (constant without it)."""
    if cfg.lam_final is None:
        return cfg.focus.lam
    frac = min(1.0, step / max(1, cfg.steps - 1))
    return float(cfg.focus.lam * (cfg.lam_final / cfg.focus.lam) ** frac)


def _final_loss(path: Path, last: int = 10) -> float | None:
    import json

    if not path.exists():
        return None
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    tail = recs[-last:]
    return sum(r["loss"] for r in tail) / len(tail) if tail else None
