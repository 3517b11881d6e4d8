"""``focusattn bench-dispatch``: measure the break-evens ``backend="auto"`` reads (:mod:`..kernels.dispatch`).

On the model's attention shapes (default SmolLM2-135M: 9 query heads, 3 k/v heads, head dim 64; window 128, one
sink) and the routing a trained adapter learned (a captured routing file, every ``layer_step``-th layer, tiled past
its length), alternating the variants in one process:

* **prefill** at each length and top-k: the ``masked`` branch (one fused call with the Focus mask, in row chunks)
  against the ``decomposed`` engine, plain causal SDPA alongside for scale; the break-even is the shortest measured
  length from which ``decomposed`` is faster at that and every longer length;
* **decode step** at each cache length and top-k: one fused call with the step's mask against gathering the keys through
  the group index (cycling over the layers' caches, as a model does); the break-even likewise.

Decided on thread CPU time on the CPU (one torch thread: unaffected by other jobs on a shared machine) and on
CUDA-event time on a GPU (``device="cuda"``, bf16 inputs: what a GPU serves). Writes ``dispatch_bench.json`` (every
timing) and, with ``install``, this device type's thresholds into the packaged ``dispatch.json`` (the other device
types' entries kept).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from .._io import write_json
from ..kernels import dispatch
from ..kernels.api import focus_attention
from ..kernels.common import default_scale
from ..kernels.decode import gather_branch
from ..kernels.group_index import GroupIndex
from .common import captured_membership, env, load_captured, random_membership, timed_on

SCHEMA = "focusattn.dispatch_bench/1"
DISPATCH_SCHEMA = "focusattn.dispatch/1"


def _memberships(top_groups, t, k_groups, top_k, layers, seed):
    """One ``[1, t, K]`` membership per layer: captured (tiled when ``t`` exceeds its length) or random balanced."""
    if top_groups is None:
        return [random_membership(t, k_groups, top_k, seed + i) for i in range(len(layers))]
    n = top_groups.shape[1]
    reps = -(-t // n)
    tiled = top_groups.repeat(1, reps, 1)[:, :t] if reps > 1 else top_groups
    return [captured_membership(tiled, t, k_groups, top_k, layer) for layer in layers]


def _token_major(b, t, h, d, gen, device="cpu"):
    """``[B, H, T, D]`` seen through a transpose of ``[B, T, H, D]``: the layout a Hugging Face model hands over
    (bf16 on a GPU)."""
    x = torch.randn(b, t, h, d, generator=gen)
    return (x if device == "cpu" else x.to(device, torch.bfloat16)).transpose(1, 2)


def _metric(device: str) -> str:
    """The time a device's break-evens are decided on: thread CPU seconds on the CPU, CUDA-event seconds on a GPU."""
    return "cpu_s" if device == "cpu" else "gpu_s"


def _first_win(rows, key, loser, winner, metric="cpu_s"):
    """Smallest ``key`` from which ``winner``'s time (``metric``) is below ``loser``'s at that and every larger
    ``key`` (the largest measured ``key`` + 1 when it never wins there: the loser up to every measured length)."""
    rows = sorted(rows, key=lambda r: r[key])
    best = rows[-1][key] + 1
    for r in reversed(rows):
        if r[winner][metric] < r[loser][metric]:
            best = r[key]
        else:
            break
    return best


def _median(xs, metric="cpu_s"):
    return {metric: statistics.median(x[1] for x in xs), "wall_s": statistics.median(x[0] for x in xs)}


@torch.no_grad()
def prefill_rows(lengths, top_ks, memberships_for, *, heads, kv_heads, head_dim, window, sink, repeats, seed=0,
                 device="cpu"):
    """Per (T, top-k): median time of the whole set of layers' calls for ``masked``, ``decomposed`` and ``causal``."""
    rows = []
    scale = default_scale(head_dim)
    for t in lengths:
        gen = torch.Generator().manual_seed(seed + t)
        q, k, v = (_token_major(1, t, h, head_dim, gen, device) for h in (heads, kv_heads, kv_heads))
        for top_k in top_ks:
            ms = [m.to(device) for m in memberships_for(t, top_k)]
            fns = {
                "masked": lambda: [dispatch.dense_branch(q, k, v, m, window, sink=sink, scale=scale,
                                                         causal_only=False) for m in ms],
                "decomposed": lambda: [focus_attention(q, k, v, m, window, sink=sink, backend="decomposed")
                                       for m in ms],
                "causal": lambda: [torch.nn.functional.scaled_dot_product_attention(
                    q, k, v, is_causal=True, enable_gqa=True) for _ in ms],
            }
            row = {"T": t, "top_k": top_k, "layers": len(ms), **_alternated(fns, repeats, device)}
            rows.append(row)
    return rows


def _alternated(fns: dict, rounds: int, device: str = "cpu") -> dict:
    """Median time of each of ``fns`` over ``rounds`` rounds, called in alternating order after one warm-up call
    each (first calls allocate), so a drifting host affects every variant alike."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for r in range(rounds):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            times[name].append(timed_on(fns[name], device)[1:])
    return {name: _median(ts, _metric(device)) for name, ts in times.items()}


@torch.no_grad()
def decode_rows(lengths, top_ks, memberships_for, *, heads, kv_heads, head_dim, window, sink, steps, seed=0,
                device="cpu"):
    """Per (Tk, top-k): median time of one decode step over every layer's cache, ``decode-masked`` vs ``gather``
    (the group index built once per layer, as generation keeps it), plain SDPA over all keys alongside."""
    rows = []
    scale = default_scale(head_dim)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16

    def rand(*shape, gen):
        return torch.randn(*shape, generator=gen).to(device, dtype)

    for tk in lengths:
        gen = torch.Generator().manual_seed(seed + tk)
        for top_k in top_ks:
            ms = [m.to(device) for m in memberships_for(tk, top_k)]
            caches = [(rand(1, kv_heads, tk, head_dim, gen=gen), rand(1, kv_heads, tk, head_dim, gen=gen), m,
                       GroupIndex(m)) for m in ms]
            q = rand(1, heads, 1, head_dim, gen=gen)
            fns = {
                "decode-masked": lambda: [dispatch.dense_branch(q, k, v, m, window, sink=sink, scale=scale,
                                                                causal_only=False) for k, v, m, _ in caches],
                "gather": lambda: [gather_branch(q, k, v, m, window, sink=sink, group_index=i)
                                   for k, v, m, i in caches],
                "causal": lambda: [torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                                   for k, v, _, _ in caches],
            }
            row = {"Tk": tk, "top_k": top_k, "layers": len(ms), **_alternated(fns, steps, device)}
            rows.append(row)
    return rows


def run_dispatch_bench(out_dir, *, prefill_lengths=(256, 512, 768, 1024, 1536, 2048, 3072, 4096),
                       decode_lengths=(256, 512, 1024, 2048, 4096, 8192), top_ks=(1, 2, 3), decode_top_ks=(1, 2),
                       groups: int = 8, window: int = 128, sink: int = 1, heads: int = 9, kv_heads: int = 3,
                       head_dim: int = 64, routing_file=None, layer_step: int = 5, repeats: int = 3,
                       decode_steps: int = 30, threads: int | None = 1, install: bool = False,
                       command: str | None = None, device: str = "cpu") -> dict:
    """Measure, write ``dispatch_bench.json`` into ``out_dir`` (and ``dispatch.json``: the thresholds), and with
    ``install`` replace the packaged thresholds for this device type (``device``: "cpu" or "cuda"; the other
    device types' thresholds are kept). Returns the bench document."""
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device={device!r}: allowed 'cpu', 'cuda'")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda': no CUDA device visible to torch")
    if threads is not None:
        torch.set_num_threads(threads)
    for name, xs in (("prefill_lengths", prefill_lengths), ("decode_lengths", decode_lengths), ("top_ks", top_ks),
                     ("decode_top_ks", decode_top_ks)):
        if not xs or any(x < 1 for x in xs):
            raise ValueError(f"{name} must be positive integers, got {list(xs)}")
    if max(max(top_ks), max(decode_top_ks)) * 2 > groups:
        raise ValueError(f"top_ks must be at most groups/2 = {groups // 2} (above it every pair shares a group: "
                         "the causal branch, no break-even)")
    top_groups = None
    if routing_file is not None:
        top_groups, _ = load_captured(routing_file)
        if max(max(top_ks), max(decode_top_ks)) > top_groups.shape[2]:
            raise ValueError(f"top_ks exceed the captured ranking depth {top_groups.shape[2]} of {routing_file}")
    layers = list(range(0, 30 if top_groups is None else top_groups.shape[0], layer_step))
    mfor = lambda t, k: _memberships(top_groups, t, groups, k, layers, 0)  # noqa: E731
    shape = dict(heads=heads, kv_heads=kv_heads, head_dim=head_dim, window=window, sink=sink)
    pre = prefill_rows(prefill_lengths, top_ks, mfor, repeats=repeats, device=device, **shape)
    dec = decode_rows(decode_lengths, decode_top_ks, mfor, steps=decode_steps, device=device, **shape)
    metric = _metric(device)
    prefill_min = {str(k): _first_win([r for r in pre if r["top_k"] == k], "T", "masked", "decomposed", metric)
                   for k in top_ks}
    decode_min = {str(k): _first_win([r for r in dec if r["top_k"] == k], "Tk", "decode-masked", "gather", metric)
                  for k in decode_top_ks}
    meta = {"command": command, "env": env(), "groups": groups, "routing_file": None if routing_file is None
            else str(routing_file), "layers": layers, **shape}
    entry = {"prefill_decomposed_min_tokens": prefill_min, "decode_gather_min_tokens": decode_min,
             "command": command, "time_utc": meta["env"].get("time_utc")}  # each device type's own provenance
    if device != "cpu":
        entry["measured_on"] = torch.cuda.get_device_name(0)
    thresholds = {"schema": DISPATCH_SCHEMA, **meta, "devices": {device: entry}}
    doc = {"schema": SCHEMA, **meta, "device": device, "repeats": repeats, "decode_steps": decode_steps,
           "thresholds": thresholds["devices"], "prefill": pre, "decode": dec}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "dispatch_bench.json", doc)
    write_json(out / "dispatch.json", thresholds)
    if install:  # this device type's entry replaced, the others kept (with the file's header from this run)
        old = json.loads(dispatch.DATA_FILE.read_text()).get("devices", {}) if dispatch.DATA_FILE.exists() else {}
        write_json(dispatch.DATA_FILE, {**thresholds, "devices": {**old, device: entry}})
        dispatch.load_breakevens(dispatch.DATA_FILE)  # it must read back
        dispatch._packaged.cache_clear()
    return doc


def render_dispatch_markdown(doc: dict) -> str:
    """The break-even tables: per length and top-k, each branch's time (ms, CPU or GPU, every measured layer's
    call)."""
    device = doc.get("device", "cpu")
    th, metric = doc["thresholds"][device], _metric(device)
    ms = lambda r, name: f"{1e3 * r[name][metric]:.1f}"  # noqa: E731
    lines = [f"Command: `{doc.get('command')}` ({len(doc['layers'])} layers' routing of "
             f"`{doc.get('routing_file') or 'random balanced'}`, K={doc['groups']}, w={doc['window']}, "
             f"sink={doc['sink']}, {doc['heads']}/{doc['kv_heads']} heads x {doc['head_dim']}, "
             + (f"{doc['env']['threads']} thread(s); times are thread CPU ms" if device == "cpu" else
                f"{th.get('measured_on', device)}, bf16; times are CUDA-event ms") + " for all those layers' calls).\n",
             "Prefill: `masked` (one fused call with the Focus mask) vs `decomposed`; `causal` SDPA for scale "
             "(it is exact only where the mask keeps every causal pair).\n",
             "| T | top-k | masked | decomposed | causal SDPA | auto picks |", "|---|---|---|---|---|---|"]
    for r in doc["prefill"]:
        pick = "decomposed" if r["T"] >= int(th["prefill_decomposed_min_tokens"][str(r["top_k"])]) else "masked"
        lines.append(f"| {r['T']} | {r['top_k']} | {ms(r, 'masked')} | {ms(r, 'decomposed')} | {ms(r, 'causal')} "
                     f"| {pick} |")
    lines += ["", "Decode step: one fused call with the step's mask (`decode-masked`) vs gathering the keys through "
              "the group index; SDPA "
              "over every key for scale.\n",
              "| cache | top-k | decode-masked | gather | SDPA | auto picks |", "|---|---|---|---|---|---|"]
    for r in doc["decode"]:
        pick = "gather" if r["Tk"] >= int(th["decode_gather_min_tokens"][str(r["top_k"])]) else "decode-masked"
        lines.append(f"| {r['Tk']} | {r['top_k']} | {ms(r, 'decode-masked')} | {ms(r, 'gather')} | "
                     f"{ms(r, 'causal')} | {pick} |")
    lines += ["", "Break-evens stored in `src/focusattn/kernels/dispatch.json`: prefill decomposed from "
              + ", ".join(f"top-{k}: {v}" for k, v in th["prefill_decomposed_min_tokens"].items())
              + " tokens; decode gathers from "
              + ", ".join(f"top-{k}: {v}" for k, v in th["decode_gather_min_tokens"].items()) + " cached keys."]
    return "\n".join(lines)
