"""Model-level benchmark: the original model (SDPA) against the same model with a trained Focus adapter, on held-out
real text, with the routing the adapter really learned.

Per length T, in one process and alternating the variants (``original``, then ``top1``, ``top2`` ...) each repeat:

* **prefill** as ``generate`` does it: the whole prompt with a KV cache, logits of the last token only;
* **decode**: median latency of one new token at that context (KV cache, ``decode_tokens`` greedy steps), each
  Focus variant's steps interleaved with the original's from the same prompt, and its ratio taken to those;
* **attention share**: seconds spent inside the registered attention function over the prefill's total, and the
  same for a decode step (``1 / (1 - share)`` bounds what any faster attention can win there);
* **peak memory** of a prefill (rise of peak RSS, see ``bench.memory``), in a last pass after every timing;
* **routing**: per layer, the largest group's share of tokens and the group-part cost ``sum_g n_g(n_g+1)/2`` over the
  balanced value, and the cost-model ratio ``T(T+1)/2 / (sum_g n_g(n_g+1)/2 + T*w)`` of the learned routing;
* **kernel at real vs random routing**: the attention kernel alone on the model's shapes, once with every layer's
  learned membership and once with random balanced membership of the same K and top-k (same q/k/v), so the loss
  from imbalance is measured, not guessed.
"""
from __future__ import annotations

import logging
import platform
import statistics
import time
from pathlib import Path

import torch

from .._io import write_json
from ..hf.kv import cache_kwargs, output_cache
from ..kernels.dispatch import PICKS
from ..analysis.balance import routing_stats
from .common import cpu_model, random_membership
from .memory import PeakRSS
from .report import plot_model_bench

log = logging.getLogger("focusattn")
SCHEMA = "focusattn.model_bench/1"


class _AttentionClock:
    """Wraps an attention function and adds up the seconds spent in it (CPU: synchronous, so wall time is right)."""

    def __init__(self, fn):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        out = self.fn(*args, **kwargs)
        if out[0].is_cuda:
            torch.cuda.synchronize()
        self.seconds += time.perf_counter() - t0
        return out


def _install_clock(model, name: str, fn) -> _AttentionClock:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    clock = _AttentionClock(fn)
    AttentionInterface.register(name, clock)
    AttentionMaskInterface.register(name, sdpa_mask)
    model.set_attn_implementation(name)
    return clock


class _Decoder:
    """One variant's greedy decoding from a prefill, a step at a time, so the compared variants' steps can be
    interleaved (a slow moment of a shared machine then hits both sides of a ratio, not one variant's block)."""

    def __init__(self, model, x, clock: _AttentionClock):
        self.model, self.clock = model, clock
        clock.seconds = 0.0
        before = dict(PICKS)
        t0, c0 = time.perf_counter(), time.process_time()
        out = model(x, use_cache=True, logits_to_keep=1)
        self.prefill, self.prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
        self.attention = clock.seconds
        self.prefill_picks, self.picks = _picked(before), {}
        self.cache, self.tok = output_cache(out), out.logits[:, -1:].argmax(-1)
        self.steps, self.cpu_steps, self.attn_steps = [], [], []

    def step(self) -> None:
        self.clock.seconds = 0.0
        before = dict(PICKS)
        t0, c0 = time.perf_counter(), time.process_time()
        out = self.model(self.tok, use_cache=True, **cache_kwargs(self.model, self.cache))
        self.steps.append(time.perf_counter() - t0)
        self.cpu_steps.append(time.process_time() - c0)
        self.attn_steps.append(self.clock.seconds)
        self.cache, self.tok = output_cache(out), out.logits[:, -1:].argmax(-1)
        for k, n in _picked(before).items():  # this model's branches only (the other's steps run in between)
            self.picks[k] = self.picks.get(k, 0) + n

    def record(self) -> dict:
        med = lambda xs: statistics.median(xs) if xs else None  # noqa: E731
        # process CPU time beside wall time: unaffected by other jobs on a shared machine (with one thread it is the
        # time the work took; with several it is their sum)
        return {"prefill_s": self.prefill, "attention_s": self.attention, "decode_s": med(self.steps),
                "decode_attention_s": med(self.attn_steps), "peak_bytes": None,
                "prefill_cpu_s": self.prefill_cpu, "decode_cpu_s": med(self.cpu_steps),
                "prefill_branches": self.prefill_picks, "decode_branches": dict(self.picks)}


@torch.no_grad()
def _prefill_decode(model, x, decode_tokens: int, clock: _AttentionClock):
    d = _Decoder(model, x, clock)
    for _ in range(decode_tokens):
        d.step()
    return d.record()


@torch.no_grad()
def _interleaved(base, x, decode_tokens: int, base_clock, variants, pair_prefills: bool = True) -> dict:
    """One repeat: the original's prefill, then per Focus variant its prefill and its decode steps alternated
    step by step with the original's (each variant against its own copy of the original's cache after the prompt,
    so both decode at the same contexts). Returns ``{name: record}``; the original's decode record pools its steps
    and ``decode_pairs`` keeps, per variant, the original's steps that ran beside it. ``pair_prefills``: each
    variant's prefill also has an original's prefill run just before it (``prefill_pairs``; the first variant's is
    the repeat's own), so its ratio compares two adjacent runs: this machine's speed drifts by 10-30% over minutes,
    and a ratio to a prefill run a variant's decode steps earlier carried that drift."""
    import copy

    from ..hf import set_top_k

    ref = _Decoder(base, x, base_clock)
    start = (ref.cache, ref.tok)
    out, pairs, pooled, prefills = {}, {}, [], {}
    for i, (name, m, clock, k) in enumerate(variants):
        set_top_k(m, k)
        if pair_prefills:
            adj = ref if i == 0 else _Decoder(base, x, base_clock)
            prefills[name] = {"prefill_s": adj.prefill, "prefill_cpu_s": adj.prefill_cpu}
        var = _Decoder(m, x, clock)
        ref.cache, ref.tok = copy.deepcopy(start[0]), start[1]
        ref.steps, ref.cpu_steps, ref.attn_steps = [], [], []
        for _ in range(decode_tokens):
            ref.step()
            var.step()
        pairs[name] = ref.record()
        pooled.append((list(ref.steps), list(ref.cpu_steps), list(ref.attn_steps)))
        out[name] = var.record()
    ref.steps, ref.cpu_steps, ref.attn_steps = (sum((p[i] for p in pooled), []) for i in range(3))
    out["original"] = ref.record()
    out["original"]["decode_pairs"] = pairs
    out["original"]["prefill_pairs"] = prefills
    return out


def _picked(before: dict) -> dict:
    """The ``backend="auto"`` branches taken since ``before`` (a copy of ``kernels.dispatch.PICKS``)."""
    return {b: n - before.get(b, 0) for b, n in PICKS.items() if n != before.get(b, 0)}


@torch.no_grad()
def _kernel_real_vs_random(model, t: int, repeats: int, seed: int = 0) -> dict:
    """The Focus kernel alone on the model's attention shapes: learned membership of every layer vs random."""
    from ..hf import focus_config, last_routing
    from ..kernels.api import focus_attention

    cfg = focus_config(model)
    c = model.config
    hq, hkv = c.num_attention_heads, getattr(c, "num_key_value_heads", c.num_attention_heads)
    d = getattr(c, "head_dim", None) or c.hidden_size // hq
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(1, h, t, d, generator=g) for h in (hq, hkv, hkv))
    real = [routing.membership[:1, :t].clone() for routing in last_routing(model)]
    rand = [random_membership(t, cfg.num_groups, cfg.top_k, seed + i) for i in range(len(real))]
    times = {"real": [], "random": []}
    for _ in range(repeats):
        for name, ms in (("real", real), ("random", rand)):
            t0 = time.perf_counter()
            for m in ms:
                # the sparse engine itself (auto would take the masked branch at short T, blind to imbalance)
                focus_attention(q, k, v, m, cfg.window, sink=cfg.sink_tokens, backend="decomposed")
            times[name].append(time.perf_counter() - t0)
    real_s, rand_s = statistics.median(times["real"]), statistics.median(times["random"])
    return {"real_s": real_s, "random_s": rand_s, "real_over_random_speed": rand_s / real_s}


def run_model_bench(out_dir, *, model: str = "smollm2-135m", adapter: str, lengths=(2048, 4096, 8192), top_ks=(1, 2),
                    data: str = "shakespeare", repeats: int = 2, decode_tokens: int = 8, kernel_repeats: int = 1,
                    threads: int | None = None, rebalance: int | None = None,
                    rebalance_warm: bool | None = None, dense_heads=None, capacity: float | None = None,
                    window: int | None = None, budget: float | None = None, key_scores: str | None = None,
                    rank_block: int | None = None, rank_own: int | None = None, union_block: int | None = None,
                    min_keys: int | None = None, command: str | None = None,
                    progress: bool = True, decode_lengths=()) -> dict:
    """Write ``model_bench.json`` (+ ``.png``) into ``out_dir``; returns the JSON dict. Bad input writes nothing.

    ``decode_lengths``: further contexts measured for the decode step only (one prefill per variant builds the
    cache; rows marked ``decode_only``, no routing or kernel statistics): a long prefill repeated per variant costs
    minutes on a CPU, the step after it milliseconds."""
    from tqdm.auto import tqdm

    from ..data.corpora import load_corpus
    from ..data.tokens import tokenize
    from ..hf import focus_config, set_top_k
    from ..hf.attention_fn import focus_attention_forward
    from ..hf.pair import load_pair

    decode_only = sorted(set(int(t) for t in decode_lengths) - set(int(t) for t in lengths))
    pair = load_pair(model, adapter, lengths=[*lengths, *decode_only], top_ks=top_ks, threads=threads,
                     rebalance=rebalance, rebalance_warm=rebalance_warm, dense_heads=dense_heads,
                     capacity=capacity, window=window, budget=budget, key_scores=key_scores,
                     rank_block=rank_block, rank_own=rank_own, union_block=union_block, min_keys=min_keys)
    base, focus, tok = pair.base, pair.focus, pair.tokenizer
    lengths = sorted(set(int(t) for t in lengths))
    _, val = tokenize(load_corpus(data), tok, tokenizer_id=model)
    if len(val) < pair.lengths[-1]:
        raise ValueError(f"{data} validation split has {len(val)} tokens, fewer than length {pair.lengths[-1]}")
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    base_clock = _install_clock(base, "sdpa-timed", sdpa_attention_forward)
    focus_clock = _install_clock(focus, "focus-timed", focus_attention_forward)
    variants = [("original", base, base_clock, None)] + [(f"top{k}", focus, focus_clock, int(k)) for k in top_ks]
    results = []
    warm = torch.as_tensor(val[:min(lengths[0], 256)][None].astype("int64"))
    for name, m, clock, k in variants:  # first calls allocate and dispatch for the first time: not measured
        if k is not None:
            set_top_k(m, k)
        _prefill_decode(m, warm, 1, clock)
    for t in [*lengths, *decode_only]:
        only = t in decode_only
        x = torch.as_tensor(val[:t][None].astype("int64"))
        runs = {name: [] for name, *_ in variants}
        routing, kernel = {}, {}
        bar = tqdm(range(1 if only else repeats), desc=f"bench-model T={t}", disable=not progress)
        for rep in bar:
            recs = _interleaved(base, x, decode_tokens, base_clock, variants[1:], pair_prefills=not only)
            for name, m, clock, k in variants:
                runs[name].append(recs[name])
                if rep == 0 and k is not None and not only:
                    set_top_k(m, k)  # a fresh prefill leaves the learned routing of exactly T tokens
                    with torch.no_grad():
                        m(x, use_cache=True, logits_to_keep=1)
                    routing[name] = routing_stats(m, t)
                    kernel[name] = _kernel_real_vs_random(m, t, kernel_repeats)
        base_row = _summarise(runs["original"])
        for name, *_ in variants:
            row = {"T": t, "variant": name, **_summarise(runs[name]), **({"decode_only": True} if only else {})}
            row["prefill_speedup"] = base_row["prefill_s"] / row["prefill_s"]
            row["prefill_cpu_speedup"] = base_row["prefill_cpu_s"] / row["prefill_cpu_s"]
            adjacent = [(r["prefill_pairs"].get(name), v) for r, v in zip(runs["original"], runs[name])]
            if name != "original" and all(a is not None for a, _ in adjacent):  # the median of adjacent pairs
                for key in ("prefill", "prefill_cpu"):
                    row[f"{key}_speedup"] = statistics.median(a[f"{key}_s"] / v[f"{key}_s"] for a, v in adjacent)
                row["prefill_paired"] = True
            beside = base_row  # the original's steps that ran interleaved with this variant's
            if name != "original":
                beside = _summarise([r["decode_pairs"][name] for r in runs["original"]])
            row["decode_speedup"] = (beside["decode_s"] / row["decode_s"]) if row["decode_s"] else None
            row["attention_speedup"] = base_row["attention_s"] / row["attention_s"] if row["attention_s"] else None
            row["decode_cpu_speedup"] = (beside["decode_cpu_s"] / row["decode_cpu_s"]) if row["decode_cpu_s"] else None
            if name in routing:
                row["routing"] = routing[name]
                row["kernel"] = kernel[name]
            results.append(row)
    _peak_pass(results, variants, val, progress)
    doc = {"schema": SCHEMA, "command": command, "model": model, "adapter": str(adapter), "data": data,
           "focus_config": focus_config(focus).to_dict(), "repeats": repeats, "decode_tokens": decode_tokens,
           "decode_interleaved": True,
           "threads": torch.get_num_threads(), "torch": torch.__version__, "platform": platform.platform(),
           "processor": platform.processor() or platform.machine(), "cpu": cpu_model(), "results": results}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "model_bench.json", doc)
    plot_model_bench(doc, out / "model_bench.png")
    return doc


@torch.no_grad()
def _peak_pass(results: list[dict], variants, val, progress: bool) -> None:
    """Fill each row's ``peak_bytes`` from one more prefill per variant and length, *after* every timing: the probe
    pins glibc's mmap threshold for the rest of the process (see :class:`.memory.PeakRSS`), which would bias any
    timing taken after it against the code with more medium-sized temporaries."""
    from tqdm.auto import tqdm

    from ..hf import set_top_k

    probe = PeakRSS()
    by_name = {name: (m, k) for name, m, _, k in variants}
    for row in tqdm(results, desc="bench-model peak memory", disable=not progress):
        m, k = by_name[row["variant"]]
        if k is not None:
            set_top_k(m, k)
        x = torch.as_tensor(val[:row["T"]][None].astype("int64"))
        _, row["peak_bytes"] = probe.measure(lambda: m(x, use_cache=True, logits_to_keep=1))


def _summarise(runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs) if runs[0][key] is not None else None  # noqa: E731
    row = {"prefill_s": med("prefill_s"), "attention_s": med("attention_s"), "decode_s": med("decode_s"),
           "attention_share": med("attention_s") / med("prefill_s"), "peak_bytes": runs[0]["peak_bytes"],
           "prefill_cpu_s": med("prefill_cpu_s"), "decode_cpu_s": med("decode_cpu_s"),
           "prefill_branches": runs[0].get("prefill_branches"), "decode_branches": runs[0].get("decode_branches")}
    if runs[0].get("decode_attention_s") is not None:  # the most a faster attention can win per decode step
        row["decode_attention_s"] = med("decode_attention_s")
        row["decode_attention_share"] = row["decode_attention_s"] / row["decode_s"]
    return row
