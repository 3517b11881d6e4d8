"""``focusattn retrofit``: train Focus routers on a frozen pretrained LM (the report commands live in analysis/)."""
from __future__ import annotations

import argparse

from ..focus.config import ROUTINGS, FocusConfig
from ..kernels.backends import BACKENDS
from ..kernels.soft import GATES
from ..lazy.config import TAU_MODES, ElasticConfig
from .._cli_common import HelpFormatter, set_threads
from ..analysis.report import retrofit_table
from . import dist
from .objectives import ATTN_LOSSES, OBJECTIVES
from .retrofit import METHODS, RetrofitConfig, retrofit


def add_focus_args(p: argparse.ArgumentParser) -> None:
    d = FocusConfig()
    g = p.add_argument_group("Focus")
    g.add_argument("--groups", type=int, default=d.num_groups, help="K, number of groups")
    g.add_argument("--group-dim", type=int, default=d.group_dim, help="d_g, router projection size")
    g.add_argument("--window", type=int, default=d.window, help="w, local window that always attends")
    g.add_argument("--tau", type=float, default=d.tau, help="Sinkhorn temperature of the group assignment")
    g.add_argument("--sinkhorn-iters", type=int, default=d.sinkhorn_iters,
                   help="Sinkhorn normalisation iterations (balances the groups)")
    g.add_argument("--gate", choices=GATES, default=d.gate,
                   help="soft training gate: log (tends to the hard mask) or multiplicative (the paper's Eq. 2)")
    g.add_argument("--lam", type=float, default=d.lam, help="gate sharpness lambda")
    g.add_argument("--gate-offset", type=float, default=d.gate_offset,
                   help="group affinity at which the soft gate is one half")
    g.add_argument("--routing", choices=ROUTINGS, default=d.routing,
                   help="causal (a token's group depends on it alone), sequence (the paper's, sees the future) or "
                        "random (a baseline)")
    g.add_argument("--backend", choices=BACKENDS, default=d.backend, help="kernel for hard top-k")
    g.add_argument("--sink-tokens", type=int, default=d.sink_tokens,
                   help="first n tokens always visible (attention sinks); 0 = the paper's mask")
    g.add_argument("--rebalance", type=int, default=d.rebalance,
                   help="causal online rebalancing: re-estimate the group offsets from the sequence's own earlier "
                        "tokens every N tokens (0 = the offsets learned in training only)")
    g.add_argument("--rebalance-warm", action="store_true",
                   help="start each online re-estimate from the previous one's potentials (balanced at few Sinkhorn "
                        "iterations; FocusConfig.rebalance_warm)")
    g.add_argument("--capacity", type=float, default=d.capacity,
                   help="cap every group at this multiple of the balanced share of the earlier tokens at hard top-k "
                        "(FocusConfig.capacity, e.g. 1.5; 0 = off): the evaluations and the adapter serve it")
    g.add_argument("--query-proj", action="store_true",
                   help="give the query role its own projection onto the same centroids (served at top-1 only; "
                        "FocusConfig.query_proj)")
    g.add_argument("--router-hidden", type=int, default=d.router_hidden,
                   help="hidden width of a small MLP beside the router's linear projection (starts at the linear "
                        "router's groups; FocusConfig.router_hidden); 0 = linear, the paper's router")
    g.add_argument("--global-rate", type=float, default=d.global_rate,
                   help="share of tokens the router makes global keys, visible to every later query (chosen by "
                        "each key's own layer input; trained by --objective attention); 0 = off")


def focus_from_args(a) -> FocusConfig:
    return FocusConfig(num_groups=a.groups, group_dim=a.group_dim, window=a.window, tau=a.tau,
                       sinkhorn_iters=a.sinkhorn_iters, gate=a.gate, lam=a.lam, gate_offset=a.gate_offset,
                       routing=a.routing, backend=a.backend, sink_tokens=a.sink_tokens,
                       rebalance=a.rebalance, rebalance_warm=a.rebalance_warm, global_rate=a.global_rate,
                       query_proj=a.query_proj, capacity=a.capacity,
                       router_hidden=a.router_hidden)


def add_lazy_args(p: argparse.ArgumentParser) -> None:
    d = ElasticConfig()
    g = p.add_argument_group("Lazy (--method lazy, lazy+lora)")
    g.add_argument("--tau-init", type=float, default=d.tau_init,
                   help="starting Elastic-Softmax threshold of every head (threshold tau/n; 1 = the uniform weight)")
    g.add_argument("--tau-mode", choices=TAU_MODES, default=d.tau_mode,
                   help="nonneg: tau = softplus(theta) >= 0; free: the paper's unconstrained tau")
    g.add_argument("--freeze-tau", action="store_true", help="keep tau at --tau-init (train only LoRA / the table)")
    g.add_argument("--lazy-bias", action="store_true",
                   help="add the Lazy per-head distance-bias table (zero at the start) on top of the model's positions")
    g.add_argument("--bias-window", type=int, default=d.bias_window, help="distance-bias table width W (--lazy-bias)")
    g.add_argument("--threshold-len", type=int, default=d.threshold_len,
                   help="cap n at this length in the threshold tau/min(n, L) (default: no cap, the paper's rule)")


def lazy_from_args(a) -> ElasticConfig:
    return ElasticConfig(tau_init=a.tau_init, tau_mode=a.tau_mode, train_tau=not a.freeze_tau, use_bias=a.lazy_bias,
                         bias_window=a.bias_window, threshold_len=a.threshold_len)


def _retrofit(a) -> int:
    cfg = RetrofitConfig(
        model=a.model, data=a.data, ood_data=None if a.ood_data == "none" else a.ood_data, out=a.out, steps=a.steps,
        seq_len=a.seq_len, batch_size=a.batch_size, grad_accum=a.grad_accum, lr=a.lr, warmup=a.warmup, seed=a.seed,
        eval_windows=a.eval_windows, ood_eval_windows=a.ood_eval_windows,
        eval_top_ks=tuple(int(x) for x in a.eval_top_k.split(",")) if a.eval_top_k else None,
        checkpoint_every=a.checkpoint_every, grad_checkpointing=a.grad_checkpointing, resume=a.resume, fsdp=a.fsdp,
        balance_loss=a.balance_loss, lam_final=a.lam_final, method=a.method, lora_rank=a.lora_rank,
        lora_alpha=a.lora_alpha, distill=a.distill, init_adapter=a.init_adapter,
        repeat_prob=a.repeat_prob, objective=a.objective, attn_keys=a.attn_keys, attn_loss=a.attn_loss,
        pool=a.pool, targets_cache=a.targets_cache, dense_heads=a.dense_heads, eval_every=a.eval_every,
        focus=focus_from_args(a), lazy=lazy_from_args(a),
    )
    set_threads(a.threads)
    summary = retrofit(cfg, command=a.command_line)
    if dist.is_main():
        print(retrofit_table(summary))
        print(f"\nwrote {a.out}/summary.json")
    return 0


def register(sub) -> None:
    d = RetrofitConfig()
    p = sub.add_parser("retrofit", help="train Focus routers on a frozen pretrained LM and evaluate before/after",
                       formatter_class=HelpFormatter)
    p.add_argument("--model", default=d.model, help="alias (smollm2-135m), hub id, or local folder")
    p.add_argument("--data", default=d.data, help="shakespeare | lee-news | hf:<dataset> | path to .txt file/folder")
    p.add_argument("--ood-data", default=d.ood_data, help="second corpus for the out-of-domain check ('none' = skip)")
    p.add_argument("--out", default=d.out, help="run folder: metrics, checkpoint, adapter/ and summary.json")
    p.add_argument("--steps", type=int, default=d.steps, help="optimizer steps")
    p.add_argument("--seq-len", type=int, default=d.seq_len, help="tokens per training and evaluation window")
    p.add_argument("--batch-size", type=int, default=d.batch_size, help="windows per micro-batch")
    p.add_argument("--grad-accum", type=int, default=d.grad_accum, help="micro-batches accumulated per step")
    p.add_argument("--lr", type=float, default=d.lr, help="peak learning rate (AdamW, after warm-up)")
    p.add_argument("--warmup", type=int, default=d.warmup, help="linear learning-rate warm-up steps")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of initialisation and data order")
    p.add_argument("--eval-windows", type=int, default=d.eval_windows, help="validation windows of --seq-len")
    p.add_argument("--ood-eval-windows", type=int, default=d.ood_eval_windows,
                   help="windows of --ood-data for the out-of-domain check (0 = skip)")
    p.add_argument("--eval-top-k", default="", help="comma list of hard top-k to evaluate (default 1..K/2: above "
                   "K/2 every pair shares a group)")
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every,
                   help="steps between checkpoints (--resume continues from the last)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's setting)")
    p.add_argument("--grad-checkpointing", action="store_true", help="activation checkpointing for long sequences")
    p.add_argument("--resume", action="store_true", help="continue from OUT's checkpoint (checkpoint.json)")
    p.add_argument("--fsdp", action="store_true",
                   help="under torchrun: shard the frozen base over the processes with FSDP2 (routers stay whole)")
    p.add_argument("--balance-loss", type=float, default=d.balance_loss,
                   help="weight of the routers' load-balance loss (keeps groups, and sparse-kernel cost, balanced)")
    p.add_argument("--lam-final", type=float, default=d.lam_final,
                   help="anneal the gate sharpness lambda geometrically to this value (train for the hard mask)")
    p.add_argument("--distill", type=float, default=d.distill,
                   help="weight of distillation from the original model: loss = (1-d) LM + d KL(original || focus)")
    p.add_argument("--objective", choices=OBJECTIVES, default=d.objective,
                   help="lm: the LM loss (with --distill); attention: each router against its own layer's attention "
                        "in the frozen model (one no-grad forward a batch, no backward through the model)")
    p.add_argument("--attn-keys", type=int, default=d.attn_keys,
                   help="--objective attention: the most attended distant keys per query that make the target")
    p.add_argument("--attn-loss", choices=ATTN_LOSSES, default=d.attn_loss,
                   help="--objective attention: ce (cross-entropy to the routing's affinity) or mass (the expected "
                        "kept mass under window-balanced soft groups: groups must get better, not bigger)")
    p.add_argument("--targets-cache", default=None,
                   help="--objective attention: a folder keeping each window's targets (the frozen model's attention "
                        "never changes), so later runs on the same windows skip the capture forwards")
    p.add_argument("--pool", type=int, default=d.pool,
                   help="train on this many fixed windows, reused step after step (attention targets computed once "
                        "each); 0 = fresh windows every step")
    p.add_argument("--repeat-prob", type=float, default=d.repeat_prob,
                   help="share of training windows whose second half repeats the first (long-range copying)")
    p.add_argument("--init-adapter", default=d.init_adapter,
                   help="start the routers from this adapter (shipped name or folder) and continue training")
    p.add_argument("--eval-every", type=int, default=d.eval_every,
                   help="every N steps, held-out top-1 perplexity (and, --objective attention, the held-out mass kept) "
                        "in metrics.jsonl: the run's quality curve; 0 = off")
    p.add_argument("--dense-heads", default=None,
                   help="serve these KV heads dense while training and in the adapter ('none', 'layer:kv_head,...' or "
                        "scored 'induction:N+duplicate:M'); --objective attention then trains for the routed heads")
    g = p.add_argument_group("method")
    g.add_argument("--method", choices=METHODS, default=d.method,
                   help="focus: train the routers; lora: the baseline, LoRA on the attention projections (q,k,v,o) "
                   "with the same data, steps, seed, schedule and evaluation (peft format in OUT/adapter); lazy: "
                   "Elastic-Softmax thresholds on the frozen model; lazy+lora: thresholds and LoRA on q,k")
    g.add_argument("--lora-rank", type=int, default=d.lora_rank, help="LoRA rank r (--method lora, lazy+lora)")
    g.add_argument("--lora-alpha", type=float, default=d.lora_alpha, help="LoRA alpha (scale alpha/r; default 2r)")
    add_focus_args(p)
    add_lazy_args(p)
    # library argument -> flag in errors (FocusConfig.num_groups is --groups)
    p.set_defaults(func=_retrofit, flags={"eval_top_ks": "--eval-top-k", "num_groups": "--groups"})
    register_fit_keys(sub)


def _fit_keys(a) -> int:
    from .key_fit import KeyFitConfig, fit_keys

    focus = FocusConfig(num_groups=a.groups, window=a.window, sink_tokens=a.sink_tokens, router_input="keys",
                        top_k=1, budget=a.budget, backend=a.backend)
    cfg = KeyFitConfig(model=a.model, corpora=tuple(a.corpora), windows=a.windows, length=a.length, focus=focus,
                       dense_heads=a.dense_heads, iters=a.iters, seed=a.seed, out=a.out)
    set_threads(a.threads)
    s = fit_keys(cfg, command=a.command_line)
    print(f"fitted {a.groups} key centroids per layer on {s['keys_per_layer']} keys in {s['fit_seconds']:.0f} s; "
          f"wrote {s['adapter']} and {a.out}/summary.json")
    return 0


def register_fit_keys(sub) -> None:
    from .key_fit import KeyFitConfig

    d = KeyFitConfig()
    p = sub.add_parser("fit-keys", help="a key-space Focus adapter: k-means centroids of the frozen model's own keys "
                       "on training text (FocusConfig.router_input='keys'; no gradient)", formatter_class=HelpFormatter)
    p.add_argument("--model", default=d.model, help="alias, hub id or local folder")
    p.add_argument("--corpora", nargs="+", default=list(d.corpora), help="registers whose train splits fit it")
    p.add_argument("--windows", type=int, default=d.windows, help="training windows per corpus")
    p.add_argument("--length", type=int, default=d.length,
                   help="tokens per window (default: the model's positions, at most 8192; fit at the longest length "
                        "you serve: keys at positions never fitted on fall into a few groups)")
    p.add_argument("--groups", type=int, default=d.focus.num_groups, help="K, centroids per layer")
    p.add_argument("--budget", type=float, default=d.focus.budget,
                   help="share of each query's distant keys its groups hold (FocusConfig.budget)")
    p.add_argument("--window", type=int, default=d.focus.window, help="w, local window that always attends")
    p.add_argument("--sink-tokens", type=int, default=d.focus.sink_tokens, help="first n tokens always visible")
    p.add_argument("--backend", choices=BACKENDS, default=d.focus.backend, help="kernel for the hard mask")
    p.add_argument("--dense-heads", default=None,
                   help="serve these KV heads dense in the adapter ('none', 'layer:kv_head,...' or scored "
                        "'induction:N+duplicate:M', measured on the model)")
    p.add_argument("--iters", type=int, default=d.iters, help="Lloyd iterations of the k-means")
    p.add_argument("--seed", type=int, default=d.seed, help="seed of the k-means' starting centroids")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--out", default=d.out, help="run folder: OUT/adapter and OUT/summary.json")
    p.set_defaults(func=_fit_keys, flags={"num_groups": "--groups"})
