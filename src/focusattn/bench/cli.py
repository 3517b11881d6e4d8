"""``focusattn bench``: parse, call :func:`run_kernel_bench`, print where the results went."""
from __future__ import annotations

from .._cli_common import add_serve_overrides, serve_overrides
from .common import ROUTINGS
from .decode import run_decode_bench
from .prefill import run_kernel_bench
from .report import render_markdown


def _ints(values) -> tuple[int, ...]:
    """Accept ``--lengths 1024 4096`` and ``--lengths 1024,4096`` alike."""
    return tuple(int(x) for v in values for x in str(v).split(",") if x)


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time Focus attention kernels against full SDPA (writes bench.json/png)")
    p.add_argument("--out", required=True, help="output directory for bench.json and bench.png")
    p.add_argument("--quick", action="store_true", help="tiny smoke run (seconds)")
    p.add_argument("--lengths", nargs="+", default=None, help="sequence lengths (default 1024 ... 65536)")
    p.add_argument("--groups", nargs="+", default=None, help="numbers of groups K (default 4 8 16)")
    p.add_argument("--top-k", nargs="+", default=None, help="top-k memberships (default 1 2)")
    p.add_argument("--window", type=int, default=128, help="Focus local window w")
    p.add_argument("--repeats", type=int, default=3, help="timed calls per point (alternated with SDPA)")
    p.add_argument("--decode-len", type=int, default=32768, help="context for the decode-step timing (0 = skip)")
    p.add_argument("--decode-repeats", type=int, default=20, help="alternating repeats of the decode-step timing")
    p.add_argument("--decode-only", action="store_true",
                   help="time only the decode step and merge it into an existing --out/bench.json (prefill kept)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (use 1 on a shared machine; default: torch's setting)")
    p.add_argument("--no-flex", action="store_true", help="skip the FlexAttention comparison")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="input dtype of every backend (decomposed accumulates in float32)")
    p.add_argument("--flex-groups", nargs="+", default=None, help="run flex only for these K (default: all)")
    p.add_argument("--routing", choices=ROUTINGS, default="random",
                   help="memberships: random (balanced), zipf (imbalanced sizes), captured (--routing-file)")
    p.add_argument("--zipf-s", type=float, default=1.0, help="Zipf exponent of the group probabilities")
    p.add_argument("--routing-file", default=None,
                   help="captured routing (scripts/capture_routing.py), e.g. "
                        "docs/results/data/routing-smollm2-135m-focus-k8.safetensors")
    p.add_argument("--routing-layer", type=int, default=None,
                   help="layer of the captured routing (default: the most imbalanced one)")
    p.add_argument("--memory-backward", action="store_true",
                   help="also measure the peak memory of forward + backward (one call per function)")
    p.set_defaults(func=_handler)

    m = subparsers.add_parser("bench-model", help="whole-model prefill/decode speed: original vs a Focus adapter "
                              "with its learned routing (writes model_bench.json/png)")
    m.add_argument("--model", default="smollm2-135m", help="alias, hub id or local folder")
    m.add_argument("--adapter", required=True, help="shipped adapter name or adapter folder")
    m.add_argument("--data", default="shakespeare", help="held-out text: the validation split of this corpus")
    m.add_argument("--lengths", nargs="+", default=["2048", "4096", "8192"], help="prompt lengths (prefill + decode)")
    m.add_argument("--top-k", nargs="+", default=["1", "2"], help="hard top-k routings to time")
    m.add_argument("--repeats", type=int, default=2, help="alternated rounds of every variant")
    m.add_argument("--decode-tokens", type=int, default=8, help="decode steps timed per repeat")
    m.add_argument("--decode-lengths", nargs="+", default=[],
                   help="further contexts timed for the decode step only (one prefill per variant, no repeats)")
    m.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add_serve_overrides(m)
    m.add_argument("--out", required=True, help="folder for model_bench.json and its plot")
    m.set_defaults(func=_model_handler)

    d = subparsers.add_parser("bench-dispatch", help="measure the break-evens backend='auto' reads (masked vs "
                              "decomposed prefill, masked pass vs gathered decode; writes dispatch_bench.json)")
    d.add_argument("--out", required=True, help="output directory for dispatch_bench.json and dispatch.json")
    d.add_argument("--lengths", nargs="+", default=["256", "512", "768", "1024", "1536", "2048", "3072", "4096"],
                   help="prefill lengths")
    d.add_argument("--decode-lengths", nargs="+", default=["256", "512", "1024", "2048", "4096", "8192"],
                   help="cache lengths of the decode break-evens")
    d.add_argument("--top-k", nargs="+", default=["1", "2", "3"], help="prefill top-k")
    d.add_argument("--decode-top-k", nargs="+", default=["1", "2"], help="top-k of the decode break-evens")
    d.add_argument("--groups", type=int, default=8, help="K, groups of the random routing")
    d.add_argument("--window", type=int, default=128, help="Focus local window w")
    d.add_argument("--sink", type=int, default=1, help="sink tokens")
    d.add_argument("--heads", type=int, default=9, help="query heads (SmolLM2-135M: 9)")
    d.add_argument("--kv-heads", type=int, default=3, help="key/value heads (SmolLM2-135M: 3)")
    d.add_argument("--head-dim", type=int, default=64, help="head dimension")
    d.add_argument("--routing-file", default=None,
                   help="captured routing (default: random balanced), e.g. "
                        "docs/results/data/routing-smollm2-135m-focus-k8.safetensors")
    d.add_argument("--repeats", type=int, default=3, help="alternated timings per point")
    d.add_argument("--decode-steps", type=int, default=30, help="decode steps timed per point")
    d.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    d.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                   help="where to measure: cpu (thread CPU time, float32) or cuda (CUDA-event time, bf16; "
                        "e.g. --lengths 4096 8192 16384 32768 65536 --decode-lengths 8192 32768 65536 131072)")
    d.add_argument("--install", action="store_true",
                   help="write this device type's thresholds into the packaged kernels/dispatch.json, keeping the "
                        "other device types' (else point FOCUSATTN_DISPATCH_FILE at OUT/dispatch.json)")
    d.set_defaults(func=_dispatch_handler)


def _dispatch_handler(args) -> int:
    from .dispatch import render_dispatch_markdown, run_dispatch_bench

    doc = run_dispatch_bench(args.out, prefill_lengths=_ints(args.lengths), decode_lengths=_ints(args.decode_lengths),
                             top_ks=_ints(args.top_k), decode_top_ks=_ints(args.decode_top_k), groups=args.groups,
                             window=args.window, sink=args.sink, heads=args.heads, kv_heads=args.kv_heads,
                             head_dim=args.head_dim, routing_file=args.routing_file, repeats=args.repeats,
                             decode_steps=args.decode_steps, threads=args.threads, install=args.install,
                             command=getattr(args, "command_line", None), device=args.device)
    print(render_dispatch_markdown(doc))
    where = "the packaged kernels/dispatch.json" if args.install else \
        f"{args.out}/dispatch.json (use it: FOCUSATTN_DISPATCH_FILE={args.out}/dispatch.json)"
    print(f"wrote {args.out}/dispatch_bench.json; thresholds in {where}")
    return 0


def _model_handler(args) -> int:
    from .model import run_model_bench
    from .report import render_model_markdown

    doc = run_model_bench(args.out, model=args.model, adapter=args.adapter, lengths=_ints(args.lengths),
                          top_ks=_ints(args.top_k), data=args.data, repeats=args.repeats,
                          decode_tokens=args.decode_tokens, threads=args.threads, **serve_overrides(args),
                          command=getattr(args, "command_line", None), decode_lengths=_ints(args.decode_lengths))
    print(render_model_markdown(doc))
    print(f"wrote {args.out}/model_bench.json and {args.out}/model_bench.png")
    return 0


def _handler(args) -> int:
    # the exact command line, as recorded by focusattn.cli.main (None when the handler is called programmatically)
    command = getattr(args, "command_line", None)
    kw = {}
    if args.groups:
        kw["groups"] = _ints(args.groups)
    if args.top_k:
        kw["top_ks"] = _ints(args.top_k)
    if args.decode_only:
        doc = run_decode_bench(args.out, window=args.window, decode_len=args.decode_len,
                               decode_repeats=args.decode_repeats, threads=args.threads, command=command, **kw)
        print(render_markdown(doc))
        print(f"merged the decode timing into {args.out}/bench.json")
        return 0
    if args.lengths:
        kw["lengths"] = _ints(args.lengths)
    if args.flex_groups:
        kw["flex_groups"] = _ints(args.flex_groups)
    doc = run_kernel_bench(args.out, quick=args.quick, window=args.window, repeats=args.repeats,
                           decode_len=args.decode_len, decode_repeats=args.decode_repeats, flex=not args.no_flex,
                           threads=args.threads, command=command, routing=args.routing, zipf_s=args.zipf_s,
                           routing_file=args.routing_file, routing_layer=args.routing_layer, dtype=args.dtype,
                           memory_backward=args.memory_backward, **kw)
    print(render_markdown(doc))
    print(f"wrote {args.out}/bench.json and {args.out}/bench.png")
    return 0
