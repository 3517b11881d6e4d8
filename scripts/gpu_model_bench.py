"""The whole model on a GPU with **random weights of real shapes** (issue 24, item 4): SmolLM2-135M's architecture
with its positions extended to 32K, and a 1B-class GQA config (Llama-3.2-1B's shapes: 16 layers, d = 2048, 32 query /
8 KV heads, head dim 64). The real weights are too large to take to a GPU machine; shapes are not, and speed depends
on shapes only. Prefill (one forward, ``logits_to_keep=1``) and cached decode steps, the original model (SDPA) against
Focus top-1 / top-2 (K = 8, w = 128, one sink, online rebalancing every 256 tokens: balanced routing from untrained
routers), alternated in one process; peak memory of each prefill. Rows go to the JSON as they are measured, and the
run stops starting new rows after ``--budget-s`` seconds, so it fits ``scripts/gpu_check.sh``'s time.

    python scripts/gpu_model_bench.py --out runs/gpu_check/gpu_model_bench.json [--backends auto flex-sorted]
    python scripts/gpu_model_bench.py --dry-run --out /tmp/gmb.json     # tiny lengths, 2 layers, on the CPU
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "scripts"))

from focusattn._io import write_json  # noqa: E402
from gpu_bench import _event_time, alternate, peak_extra  # noqa: E402  (this folder: timing, peak memory)

# Random weights, real shapes. SmolLM2-135M: its config (hidden 576, 30 layers, 9/3 heads, MLP 1536, vocab 49152,
# RoPE base 100000) with max positions 32K; Llama-3.2-1B: its published shapes (RoPE scaling left out: speed only).
SHAPES = {
    "smollm2-135m-32k": dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                             intermediate_size=1536, vocab_size=49152, rope_theta=100000.0,
                             max_position_embeddings=32768, tie_word_embeddings=True),
    "llama-3.2-1b-shape": dict(hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                               intermediate_size=8192, vocab_size=128256, rope_theta=500000.0,
                               max_position_embeddings=131072, tie_word_embeddings=True),
}
# the target row (the 1B shape at 64K) first: a run cut short by its time budget still has it
LENGTHS = {"smollm2-135m-32k": [32768, 8192], "llama-3.2-1b-shape": [65536, 16384]}


def build(name: str, dev, dtype, layers: int | None, backends: list[str]) -> dict:
    """``{"original": model, "top1": ..., "top2": ..., "top1@flex-sorted": ...}``: the same random weights; Focus
    composed with untrained routers (one model per top-k and backend: a model's routing cache belongs to its last
    prefill, and decode steps are interleaved); the first backend's variants are named by top-k alone."""
    import transformers as tr

    import focusattn as fa

    kw = dict(SHAPES[name])
    if layers:
        kw["num_hidden_layers"] = layers
    cfg = tr.LlamaConfig(**kw, attn_implementation="sdpa")
    torch.manual_seed(0)
    base = tr.LlamaForCausalLM(cfg).to(dev, dtype).eval()
    out = {"original": base}
    for i, backend in enumerate(backends):
        for k in (1, 2):
            focus = tr.LlamaForCausalLM(copy.deepcopy(cfg)).to(dev, dtype)  # compose changes its config's attention
            focus.load_state_dict(base.state_dict())
            torch.manual_seed(1)  # the same routers for all
            fa.compose(focus, fa.FocusConfig(num_groups=8, window=128, top_k=k, sink_tokens=1, rebalance=256,
                                             backend=backend))
            out[f"top{k}" if i == 0 else f"top{k}@{backend}"] = focus.eval()
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", nargs="+", default=["llama-3.2-1b-shape", "smollm2-135m-32k"], choices=list(SHAPES))
    ap.add_argument("--backends", nargs="+", default=["auto"],
                    help="Focus kernel backends, each a top-1 and a top-2 variant (auto, decomposed, flex-sorted)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--decode-steps", type=int, default=8)
    ap.add_argument("--budget-s", type=float, default=150.0, help="start no new row after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="2 layers, tiny lengths, on the CPU: checks the script")
    args = ap.parse_args(argv)
    import focusattn as fa

    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("gpu_model_bench: no CUDA device (use --dry-run to check the script on the CPU)")
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t_start, rows = time.perf_counter(), []
    doc = {"schema": "focusattn.gpu_model_bench/1", "weights": "random (real shapes)",
           "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu (dry run)",
           "torch": torch.__version__, "dtype": str(dtype).replace("torch.", ""), "backends": args.backends,
           "focus": "K=8, w=128, 1 sink, rebalance 256, untrained routers", "time_utc":
           time.strftime("%Y-%m-%dT%H:%M:%SZ"), "command": "python scripts/gpu_model_bench.py " + " ".join(
               argv if argv is not None else sys.argv[1:]), "complete": False, "results": rows}
    for name in args.shapes:
        variants = build(name, dev, dtype, 2 if args.dry_run else None, args.backends)
        vocab = variants["original"].config.vocab_size
        for t in ([256, 512] if args.dry_run else LENGTHS[name]):
            if time.perf_counter() - t_start > args.budget_s:
                doc["stopped"] = f"time budget {args.budget_s:g}s spent before {name} T={t}"
                break
            x = torch.randint(0, vocab, (1, t), generator=torch.Generator().manual_seed(t)).to(dev)

            def prefill(model, cache=False):
                return model(x, use_cache=cache, logits_to_keep=1)

            row = {"model": name, "T": t, "prefill_s": {}, "peak_bytes": {}, "decode_ms": {}}
            try:
                with torch.no_grad():
                    row["prefill_s"] = alternate({v: (lambda m=m: prefill(m)) for v, m in variants.items()},
                                                 args.repeats)
                    row["peak_bytes"] = {v: peak_extra(lambda: prefill(m)) if dev.type == "cuda" else None
                                         for v, m in variants.items()}
                    states = {}
                    for v, m in variants.items():
                        out = prefill(m, cache=True)
                        states[v] = [out.past_key_values, out.logits[:, -1:].argmax(-1)]
                    steps = {v: [] for v in variants}
                    for s in range(args.decode_steps + 1):  # steps interleaved across variants; the first is warm-up
                        for v, m in variants.items():
                            cache, tok = states[v]
                            res = {}
                            dt = _event_time(lambda: res.setdefault("o", m(tok, past_key_values=cache, use_cache=True)))
                            states[v] = [res["o"].past_key_values, res["o"].logits[:, -1:].argmax(-1)]
                            if s:
                                steps[v].append(dt)
                    row["decode_ms"] = {v: 1e3 * statistics.median(ts) for v, ts in steps.items()}
                    del states
            except Exception as exc:  # noqa: BLE001 - report the row's failure, keep the others
                row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
            p, dms = row["prefill_s"], row["decode_ms"]
            row["prefill_speedup"] = {v: p["original"] / p[v] for v in p if v != "original"} if p else {}
            row["decode_speedup"] = {v: dms["original"] / dms[v] for v in dms if v != "original"} if dms else {}
            rows.append(row)
            print(row, flush=True)
            doc["wall_s"] = time.perf_counter() - t_start
            write_json(args.out, doc)
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        del variants
    doc["complete"] = "stopped" not in doc
    write_json(args.out, doc)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
