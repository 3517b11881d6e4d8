"""Where the group-sorted FlexAttention prefill (``kernels/flex_sorted.py``) departs from the dense reference on a
GPU: the same problem through each piece in turn, each one's largest error against the float32 dense reference
(one line each, in the order printed, so a run cut short still says the most).

- ``lse``: one compiled FlexAttention call (causal, no block sparsity to speak of) against SDPA's output and a
  logsumexp of the scores: does the compiled kernel return the natural-log LSE the merge assumes?
- ``dense-blocks``: the prefill with every causal block listed as partial (block masks that skip nothing): the
  layout, the two flex calls and the merge, without the block structure.
- ``flex-only``: the production fallback (eager layout and block masks, the two flex calls compiled).
- ``no-full``: the same with no block marked full (``mask_mod`` everywhere listed).
- ``whole-graph``: the whole prefill under one ``torch.compile`` (``whole_graph=True``).

Then, with ``--time-length T`` (default 32768, bf16; 0 = skip), where the default's time goes: the plan (layout and
block masks, eager), each FlexAttention call alone on a prebuilt plan, and the whole call, against SDPA (on the
2026-12-04 H200 run the whole call took 16.6 ms at 32K top-1, SDPA 2.8 ms).

    python scripts/flex_sorted_diag.py [--length 2048] [--dtype float32] [--time-length 32768]
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import focusattn.kernels.flex_sorted as fs  # noqa: E402
from focusattn.bench.common import random_membership  # noqa: E402
from focusattn.kernels.reference import dense_focus_attention  # noqa: E402


def _err(out, lse, ref, ref_lse) -> str:
    fin = torch.isfinite(ref_lse)
    e_out = float((out.float() - ref).abs().max())
    e_lse = float((lse.float()[fin] - ref_lse[fin]).abs().max()) if fin.any() else 0.0
    ratio = float((lse.float()[fin] / ref_lse[fin]).median()) if fin.any() else 1.0
    return f"out {e_out:.2e}, lse {e_lse:.2e} (median lse / reference {ratio:.4f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--time-length", type=int, default=32768)
    args = ap.parse_args(argv)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    t, kk, window = args.length, 8, 128
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, 9, t, 64, generator=gen).to(dev, dtype)
    k, v = (torch.randn(1, 3, t, 64, generator=gen).to(dev, dtype) for _ in "kv")
    print(f"device {dev}, torch {torch.__version__}, T={t}, {args.dtype}", flush=True)

    from torch.nn.attention.flex_attention import AuxRequest, create_block_mask, flex_attention

    t0 = time.perf_counter()
    try:  # the LSE of one compiled call, against SDPA and logsumexp of the causal scores (float32)
        n = min(512, t)
        qs, ks, vs = q[:, :3, :n].float(), k[:, :, :n].float(), v[:, :, :n].float()
        bm = create_block_mask(lambda b, h, i, j: j <= i, 1, None, n, n, device=dev)
        fn = fs._compiled_flex() if dev.type == "cuda" else flex_attention
        out, aux = fn(qs, ks, vs, block_mask=bm, return_aux=AuxRequest(lse=True))
        s = (qs @ ks.transpose(-1, -2)) / 8.0
        s = s.masked_fill(~torch.ones(n, n, dtype=torch.bool, device=dev).tril(), -math.inf)
        ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
        print(f"lse: {_err(out, aux.lse, ref, torch.logsumexp(s, -1))} [{time.perf_counter() - t0:.0f}s]", flush=True)
    except Exception as exc:  # noqa: BLE001
        print(f"lse: failed {type(exc).__name__}: {str(exc)[:300]}", flush=True)

    for top_k in (1, 2):
        memb = random_membership(t, kk, top_k, 80 + top_k).to(dev)
        ref, ref_lse = dense_focus_attention(q.float(), k.float(), v.float(), memb, window, return_lse=True)
        real_sorted, real_band = fs.sorted_blocks, fs.band_blocks

        def run(name, whole_graph, sorted_blocks=real_sorted, band_blocks=real_band):
            t0 = time.perf_counter()
            fs.sorted_blocks, fs.band_blocks = sorted_blocks, band_blocks
            fs._WHOLE_GRAPH_FAILED.clear()
            try:
                out, lse = fs.sorted_flex_focus_attention(q, k, v, memb, window, top_k=top_k, validate=False,
                                                          return_lse=True, whole_graph=whole_graph)
                torch.cuda.synchronize() if dev.type == "cuda" else None
                note = f" (fell back: {fs._WHOLE_GRAPH_FAILED[0][:200]})" if fs._WHOLE_GRAPH_FAILED else ""
                print(f"top-{top_k} {name}: {_err(out, lse, ref, ref_lse)}{note} [{time.perf_counter() - t0:.0f}s]",
                      flush=True)
            except Exception as exc:  # noqa: BLE001
                print(f"top-{top_k} {name}: failed {type(exc).__name__}: {str(exc)[:300]}", flush=True)
            finally:
                fs.sorted_blocks, fs.band_blocks = real_sorted, real_band

        def all_blocks(*a, **kw):  # every causal block listed, none full
            cand, _ = (real_sorted if len(a) > 4 else real_band)(*a, **kw)
            nb = cand.shape[-1]
            causal = torch.ones(nb, nb, dtype=torch.bool, device=cand.device).tril()[None].expand_as(cand)
            return causal.contiguous(), torch.zeros_like(cand)

        def no_full(*a, **kw):
            cand, full = real_sorted(*a, **kw)
            return cand, torch.zeros_like(full)

        def band_no_full(*a, **kw):
            cand, full = real_band(*a, **kw)
            return cand, torch.zeros_like(full)

        run("dense-blocks", False, all_blocks, all_blocks)
        run("flex-only", False)
        run("no-full", False, no_full, band_no_full)
        run("whole-graph", True)
    if args.time_length:
        time_pieces(args.time_length, dev)
    return 0


def time_pieces(t: int, dev) -> None:
    """Milliseconds of the default path's pieces at ``t`` tokens, bf16, K = 8, top-1 and top-2 (module docstring)."""
    import statistics

    from torch.nn.attention.flex_attention import AuxRequest

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 9, t, 64, generator=gen).to(dev, dtype)
    k, v = (torch.randn(1, 3, t, 64, generator=gen).to(dev, dtype) for _ in "kv")
    sinks = torch.zeros(1, t, dtype=torch.bool, device=dev)
    keys_ok = torch.ones(1, t, dtype=torch.bool, device=dev)
    fn = fs._compiled_flex() if dev.type == "cuda" else None
    if fn is None:
        print("time: needs CUDA (the compiled FlexAttention)", flush=True)
        return

    def ms(f, n=7):
        f()
        torch.cuda.synchronize()
        ts = []
        for _ in range(n):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            torch.cuda.synchronize()
            ts.append(a.elapsed_time(b))
        return statistics.median(ts)

    with torch.no_grad():
        for top_k in (1, 2):
            memb = random_membership(t, 8, top_k, 80 + top_k).to(dev)
            src, inv, mask_a, mask_b = fs.sorted_plan(memb, sinks, keys_ok, 128, top_k)
            qa, ka, va = (fs._gather_time(x, src) for x in (q, k, v))
            res = {"sdpa": ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)),
                   "plan": ms(lambda: fs.sorted_plan(memb, sinks, keys_ok, 128, top_k)),
                   "part A call": ms(lambda: fn(qa, ka, va, block_mask=mask_a, enable_gqa=True,
                                                return_aux=AuxRequest(lse=True))),
                   "part B call": ms(lambda: fn(q, k, v, block_mask=mask_b, enable_gqa=True,
                                                return_aux=AuxRequest(lse=True))),
                   "whole call": ms(lambda: fs.sorted_flex_focus_attention(q, k, v, memb, 128, top_k=top_k,
                                                                          validate=False))}
            blocks = int(mask_a.kv_num_blocks.sum() + (mask_a.full_kv_num_blocks.sum()
                                                       if mask_a.full_kv_num_blocks is not None else 0))
            print(f"time T={t} top-{top_k} ms: " + ", ".join(f"{n} {x:.2f}" for n, x in res.items())
                  + f"; part A lists {blocks} blocks", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
