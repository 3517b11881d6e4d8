"""Short GPU benchmark of the decomposed Focus kernel against causal SDPA (and compiled FlexAttention, in the
original layout and group-sorted, ``kernels/flex_sorted.py``), for
``scripts/gpu_check.sh``: SmolLM2-135M attention shapes (9 query heads, 3 KV heads, head size 64, window 128),
batch 1; random balanced routing at 4K-64K, the routing a trained adapter learned on real text at 4K (captured
file), Zipf-imbalanced routing at 32K. CUDA-event medians with the compared calls alternated in one process;
forward (inference), forward + backward, and peak extra memory of one forward (``max_memory_allocated`` above
what was allocated before the call). Writes one JSON (``focusattn.gpu_bench/1``)."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from focusattn._io import write_json  # noqa: E402
from focusattn.bench.common import (captured_membership, load_captured, random_membership,  # noqa: E402
                                    theoretical_ratio, timed_on, work_ratio, worst_layer, zipf_membership)
from focusattn.kernels.backends import cuda_fused_available, flash_attn_varlen  # noqa: E402
from focusattn.kernels.decomposed import decomposed_focus_attention  # noqa: E402
from focusattn.kernels.decomposed.driver import CUDA_VARLEN  # noqa: E402
from focusattn.kernels.decomposed.fused import cuda_flash_varlen_status, cuda_fused_status  # noqa: E402

HQ, HKV, D, WINDOW = 9, 3, 64, 128
CAPTURED = ROOT / "docs/results/data/routing-smollm2-135m-focus-k8.safetensors"


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _event_time(fn) -> float:
    """CUDA-event seconds of one call (on a machine without CUDA, the --dry-run: its wall time)."""
    if not torch.cuda.is_available():
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    return timed_on(fn, "cuda")[2]


def alternate(fns: dict, repeats: int) -> dict:
    """Median seconds of each callable: one warm-up each, then ``repeats`` rounds alternating the order."""
    for fn in fns.values():
        fn()
    _sync()
    times = {name: [] for name in fns}
    for r in range(repeats):
        for name in (list(fns) if r % 2 == 0 else list(reversed(fns))):
            times[name].append(_event_time(fns[name]))
    return {name: statistics.median(ts) for name, ts in times.items()}


def peak_extra(fn) -> int:
    if not torch.cuda.is_available():
        fn()
        return 1
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return int(peak)


def _membership(routing, t, kk, top_k, seed, captured):
    if routing == "random":
        return random_membership(t, kk, top_k, seed)
    if routing == "zipf":
        return zipf_membership(t, kk, top_k, seed)
    top_groups, layer = captured
    return captured_membership(top_groups, t, kk, top_k, layer)


def _fwd_bwd(fn, q, k, v, go):
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out = fn(*leaves)
    torch.autograd.backward(out, go)
    return leaves[0].grad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    # the most telling lengths first: a run cut short by its time limit still has them
    ap.add_argument("--lengths", type=int, nargs="+", default=[32768, 16384, 65536, 8192, 4096])
    ap.add_argument("--backward-lengths", type=int, nargs="+", default=[32768, 16384])
    ap.add_argument("--flex-lengths", type=int, nargs="+", default=[],
                    help="lengths that also time FlexAttention in the original layout (measured: 3-4x slower)")
    ap.add_argument("--flex-sorted-lengths", type=int, nargs="+", default=[32768],
                    help="lengths of the group-sorted FlexAttention prefill's rows, timed last: each (length, top-k, "
                         "variant) compiles its own kernels for tens of seconds")
    ap.add_argument("--all-engines", action="store_true",
                    help="also the decomposed kernel's other engines (per part, packed memory-efficient, part A "
                         "alone: measured on the H200, see RESULTS) and K = 16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--profile", action="store_true", help="also write gpu_profile.txt (torch.profiler tables)")
    ap.add_argument("--dry-run", action="store_true", help="tiny lengths on the CPU: checks the script, no numbers")
    args = ap.parse_args(argv)
    for knob in ("recompile_limit", "cache_size_limit"):  # every length and top-k compiles its own flex kernels
        if hasattr(torch._dynamo.config, knob):
            setattr(torch._dynamo.config, knob, 64)
    if args.dry_run:
        args.lengths = args.backward_lengths = [512, 1024]
        args.flex_lengths, args.repeats, args.flex_sorted_lengths = [], 1, [1024]
    elif not torch.cuda.is_available():
        raise SystemExit("gpu_bench: no CUDA device (use --dry-run to check the script on the CPU)")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ok, reason = cuda_fused_status()
    name = torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (dry run)"
    print(f"device {name}, torch {torch.__version__}, mem-efficient engine: {reason}, "
          f"flash-attn varlen: {flash_attn_varlen() is not None}", flush=True)
    captured = None
    if CAPTURED.exists():
        top_groups, _ = load_captured(CAPTURED)
        captured = (top_groups, worst_layer(top_groups, 4096, 8))
    big = args.lengths[-1] if args.dry_run else 16384
    cases = [(t, torch.bfloat16, "random") for t in args.lengths]
    cases += [(2 * big, torch.bfloat16, "zipf")] + ([(big // 4, torch.bfloat16, "captured")] if captured else [])
    if args.all_engines:
        cases.append((big, torch.float32, "random"))
    rows, t_start = [], time.perf_counter()
    doc = {"schema": "focusattn.gpu_bench/1", "device": name, "torch": torch.__version__,
           "mem_efficient_engine": {"ok": ok, "reason": reason, "used": cuda_fused_available()},
           "flash_varlen_engine": dict(zip(("ok", "reason"), cuda_flash_varlen_status())),
           "flash_attn_varlen": flash_attn_varlen() is not None, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ"),
           "method": "CUDA-event medians, compared calls alternated in one process, batch 1, SmolLM2-135M shapes; "
                     "memory: max_memory_allocated above the allocation before one call",
           "command": "scripts/gpu_check.sh (python scripts/gpu_bench.py --out OUT/gpu_bench.json)",
           "complete": False, "results": rows}
    gen = torch.Generator().manual_seed(0)
    for t, dtype, routing in cases:
        q = torch.randn(1, HQ, t, D, generator=gen).to(dev, dtype)
        k, v = (torch.randn(1, HKV, t, D, generator=gen).to(dev, dtype) for _ in "kv")
        go = torch.randn(1, HQ, t, D, generator=gen).to(dev, dtype)

        def sdpa(a, b, c):
            return F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)

        for kk, top_k in ((8, 1), (8, 2), (16, 2)):
            if (routing == "captured" or not args.all_engines) and kk != 8:
                continue
            memb = _membership(routing, t, kk, top_k, kk * 10 + top_k, captured).to(dev)

            def dec(a, b, c, varlen="auto"):
                return decomposed_focus_attention(a, b, c, memb, WINDOW, varlen_fn=varlen)

            fwd = {"sdpa": lambda: sdpa(q, k, v), "decomposed": lambda: dec(q, k, v)}
            if args.all_engines:
                fwd["decomposed_per_part"] = lambda: dec(q, k, v, None)
                fwd["part_a_only"] = lambda: decomposed_focus_attention(q, k, v, memb, 0)  # no window band
                if dtype != torch.float32 and dev.type == "cuda":  # the packed path's other engine
                    fwd["packed_mem_efficient"] = lambda: dec(q, k, v, CUDA_VARLEN)
            flex_note = None
            if dtype != torch.float32 and t in args.flex_lengths and routing == "random":
                try:
                    from focusattn.kernels.flex import flex_focus_attention, focus_block_mask

                    bm = focus_block_mask(memb, WINDOW, t)
                    fwd["flex"] = lambda: flex_focus_attention(q, k, v, memb, WINDOW, block_mask=bm, compile=True)
                except Exception as exc:  # noqa: BLE001 - report, do not abort the other measurements
                    flex_note = f"{type(exc).__name__}: {exc}"
            with torch.no_grad():
                try:
                    times = alternate(fwd, args.repeats)
                except Exception as exc:  # noqa: BLE001
                    if "flex" not in fwd:
                        raise
                    flex_note = f"{type(exc).__name__}: {str(exc)[:300]}"
                    fwd.pop("flex", None)
                    times = alternate(fwd, args.repeats)
                ref = sdpa(q, k, v).float()
                err = float((dec(q, k, v).float() - ref).abs().max())  # not a check: Focus != full attention
                mem = {name: peak_extra(fn) for name, fn in fwd.items()
                       if name not in ("flex", "part_a_only", "packed_mem_efficient")}
            row = {"T": t, "dtype": str(dtype).replace("torch.", ""), "routing": routing, "K": kk, "top_k": top_k,
                   "window": WINDOW, "forward_s": times,
                   "forward_ratio_vs_sdpa": {n: times["sdpa"] / s for n, s in times.items() if n != "sdpa"},
                   "peak_extra_bytes": mem,
                   "memory_ratio_vs_sdpa": {n: m / mem["sdpa"] for n, m in mem.items() if n != "sdpa"},
                   "theoretical_ratio": theoretical_ratio(memb.cpu(), WINDOW),
                   "work_ratio": work_ratio(memb.cpu(), WINDOW), "max_abs_diff_vs_full_sdpa": err}
            if flex_note:
                row["flex_error"] = flex_note
            if t in args.backward_lengths and routing == "random" and dtype == torch.bfloat16:
                try:
                    fb = alternate({"sdpa": lambda: _fwd_bwd(sdpa, q, k, v, go),
                                    "decomposed": lambda: _fwd_bwd(dec, q, k, v, go)}, max(3, args.repeats // 2))
                    row["forward_backward_s"] = fb
                    row["forward_backward_ratio_vs_sdpa"] = fb["sdpa"] / fb["decomposed"]
                    fbm = {"sdpa": peak_extra(lambda: _fwd_bwd(sdpa, q, k, v, go)),
                           "decomposed": peak_extra(lambda: _fwd_bwd(dec, q, k, v, go))}
                    row["forward_backward_peak_extra_bytes"] = fbm
                except Exception as exc:  # noqa: BLE001 - report it; the forward rows still count
                    row["forward_backward_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            doc["wall_s"] = time.perf_counter() - t_start
            write_json(args.out, doc)  # after every row: a run cut short by its time limit still reports
        del q, k, v, go
    doc["decode"] = decode_rows(args, dev, gen, doc)
    doc["flex_sorted"] = flex_sorted_rows(args, dev, gen, doc)
    doc["complete"] = True
    write_json(args.out, doc)
    if args.profile and dev.type == "cuda":
        try:
            _profile(Path(args.out).with_name("gpu_profile.txt"), gen)
        except Exception as exc:  # noqa: BLE001 - the measurements above are already written
            print(f"profile failed: {type(exc).__name__}: {exc}", flush=True)
    return 0


def decode_rows(args, dev, gen, doc) -> list:
    """A cached decode step (one query over a T-token cache: window + same-group keys from the group index + one
    sink) against cached SDPA over every key, bf16, K = 8, top-1 / top-2, at 8K-128K (issue 24, item 3). Rows are
    written into ``doc["decode"]`` as they are measured."""
    from focusattn.kernels.api import focus_attention
    from focusattn.kernels.group_index import GroupIndex

    rows = doc.setdefault("decode", [])
    for t in ([512, 1024] if args.dry_run else [8192, 32768, 65536, 131072]):
        dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
        q = torch.randn(1, HQ, 1, D, generator=gen).to(dev, dtype)
        k, v = (torch.randn(1, HKV, t, D, generator=gen).to(dev, dtype) for _ in "kv")
        for top_k in (1, 2):
            memb = random_membership(t, 8, top_k, 80 + top_k).to(dev)
            index = GroupIndex(memb)
            fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True),
                   "focus": lambda: focus_attention(q, k, v, memb, WINDOW, sink=1, group_index=index)}
            with torch.no_grad():
                times = alternate(fns, max(5, args.repeats))
            row = {"T": t, "K": 8, "top_k": top_k, "dtype": str(dtype).replace("torch.", ""), "step_s": times,
                   "speedup_vs_sdpa": times["sdpa"] / times["focus"]}
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_json(args.out, doc)
        del q, k, v
    return rows


def flex_sorted_rows(args, dev, gen, doc) -> list:
    """The group-sorted FlexAttention prefill (``backend="flex-sorted"``, ``kernels/flex_sorted.py``) against SDPA and
    the decomposed engine in one alternation, bf16, K = 8, top-1 / top-2: the default (the two FlexAttention calls
    compiled, the layout and block masks eager) and, at top-1, the whole prefill under one compile; each variant's
    largest difference from the decomposed engine (the same function: bf16 rounding apart, it should be ~1e-2), and
    the default's forward + backward at top-1. Timed last: every variant compiles for tens of seconds."""
    from focusattn.kernels.flex_sorted import sorted_flex_focus_attention

    rows = doc.setdefault("flex_sorted", [])
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    for t in args.flex_sorted_lengths:
        q = torch.randn(1, HQ, t, D, generator=gen).to(dev, dtype)
        k, v = (torch.randn(1, HKV, t, D, generator=gen).to(dev, dtype) for _ in "kv")
        go = torch.randn(1, HQ, t, D, generator=gen).to(dev, dtype)
        for top_k in (1, 2):
            memb = random_membership(t, 8, top_k, 80 + top_k).to(dev)

            def dec(a, b, c, memb=memb):
                return decomposed_focus_attention(a, b, c, memb, WINDOW)

            def fsorted(a, b, c, memb=memb, top_k=top_k, whole=False):
                return sorted_flex_focus_attention(a, b, c, memb, WINDOW, top_k=top_k, validate=False,
                                                   whole_graph=whole)

            variants = {"flex_sorted": fsorted}
            if top_k == 1:
                variants["flex_sorted_whole_graph"] = lambda a, b, c: fsorted(a, b, c, whole=True)
            row = {"T": t, "K": 8, "top_k": top_k, "dtype": str(dtype).replace("torch.", ""), "window": WINDOW}
            try:
                with torch.no_grad():
                    fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                           "decomposed": lambda: dec(q, k, v)}
                    fns.update({n: (lambda f=f: f(q, k, v)) for n, f in variants.items()})
                    times = alternate(fns, args.repeats)
                    want = dec(q, k, v).float()
                    row["max_abs_diff_vs_decomposed"] = {n: float((f(q, k, v).float() - want).abs().max())
                                                         for n, f in variants.items()}
                    row["peak_extra_bytes"] = {n: peak_extra(fns[n]) for n in ("sdpa", "decomposed", "flex_sorted")}
                row["forward_s"] = times
                row["forward_ratio_vs_sdpa"] = {n: times["sdpa"] / x for n, x in times.items() if n != "sdpa"}
                if top_k == 1:
                    fb = alternate({"sdpa": lambda: _fwd_bwd(lambda a, b, c: F.scaled_dot_product_attention(
                                        a, b, c, is_causal=True, enable_gqa=True), q, k, v, go),
                                    "flex_sorted": lambda: _fwd_bwd(fsorted, q, k, v, go)}, max(3, args.repeats // 2))
                    row["forward_backward_s"] = fb
                    row["forward_backward_ratio_vs_sdpa"] = fb["sdpa"] / fb["flex_sorted"]
            except Exception as exc:  # noqa: BLE001 - report it (FlexAttention has no CPU backward: the dry run)
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
            write_json(args.out, doc)
        del q, k, v, go
    return rows


def _profile(path: Path, gen) -> None:
    """Where a 32K forward (and forward + backward) spends its time: torch.profiler's op table, K=8 top-1/top-2."""
    from torch.profiler import ProfilerActivity, profile

    t = 32768
    q = torch.randn(1, HQ, t, D, generator=gen).to("cuda", torch.bfloat16)
    k, v = (torch.randn(1, HKV, t, D, generator=gen).to("cuda", torch.bfloat16) for _ in "kv")
    go = torch.randn(1, HQ, t, D, generator=gen).to("cuda", torch.bfloat16)
    lines = []
    for top_k in (1, 2):
        memb = random_membership(t, 8, top_k, 80 + top_k).to("cuda")

        def dec(a, b, c):
            return decomposed_focus_attention(a, b, c, memb, WINDOW)

        for name, fn in (("forward", lambda: dec(q, k, v)), ("forward+backward", lambda: _fwd_bwd(dec, q, k, v, go))):
            fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            for key in ("device_time_total", "cpu_time_total"):
                lines.append(f"== T={t} K=8 top-{top_k} {name}, sorted by {key} ==")
                try:
                    lines.append(prof.key_averages().table(sort_by=key, row_limit=18, max_name_column_width=60))
                except Exception as exc:  # noqa: BLE001 - sort keys changed names across torch versions
                    lines.append(f"({type(exc).__name__}: {exc})")
    path.write_text("\n".join(lines))
    print(f"profile written to {path}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
