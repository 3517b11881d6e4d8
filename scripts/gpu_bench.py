"""Short GPU timing of the decomposed Focus kernel against causal SDPA (CUDA events, medians), for
``scripts/gpu_check.sh``. SmolLM2-135M attention shapes, random top-k routing, forward only (the flash-attn varlen
path is inference-only), bf16 and fp32."""
from __future__ import annotations

import argparse
import json
import statistics

import torch
import torch.nn.functional as F


def _time(fn, repeats):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384, 32768])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from focusattn._io import write_json
    from focusattn.bench.common import random_membership, theoretical_ratio
    from focusattn.kernels.backends import flash_attn_varlen
    from focusattn.kernels.decomposed import decomposed_focus_attention

    dev = torch.device("cuda")
    rows = []
    for t in args.lengths:
        for dtype in (torch.bfloat16, torch.float32):
            q = torch.randn(1, 9, t, 64, device=dev, dtype=dtype)
            k, v = (torch.randn(1, 3, t, 64, device=dev, dtype=dtype) for _ in "kv")
            with torch.no_grad():
                sdpa = _time(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                             args.repeats)
            for kk, tk in ((8, 1), (8, 2), (16, 2)):
                m = random_membership(t, kk, tk, kk * 10 + tk).to(dev)
                with torch.no_grad():
                    dt = _time(lambda: decomposed_focus_attention(q, k, v, m, 128), args.repeats)
                rows.append({"T": t, "dtype": str(dtype), "K": kk, "top_k": tk, "sdpa_s": sdpa, "decomposed_s": dt,
                             "ratio_vs_sdpa": sdpa / dt, "theoretical_ratio": theoretical_ratio(m.cpu(), 128)})
                print(json.dumps(rows[-1]))
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
           "flash_attn_varlen": flash_attn_varlen() is not None, "results": rows}
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
