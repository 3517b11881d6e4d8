"""Old against new: the prefill kernel of a git revision and of the working tree, alternated in one process.

On a shared machine whose speed drifts by tens of percent between runs, two benchmark runs cannot tell a 20% kernel
change from the drift; alternating the two kernels (and SDPA) call by call in one process can. The revision's
``src/focusattn`` is extracted with ``git archive`` into a temporary folder and imported as ``focusattn_rev`` (the
package imports itself relatively, so both versions live side by side).

    python scripts/kernel_ab.py --rev 971d407 --length 2048 --groups 8 --top-k 1 --routing captured --repeats 9

Prints one JSON line (check it with ``--rev HEAD`` on a clean tree: the ratio should be ~1): median thread CPU time (ms) of SDPA, the revision and the working tree, and their ratios.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from focusattn.bench.common import (captured_membership, load_captured, random_membership,  # noqa: E402
                                    worst_layer, zipf_membership)
from focusattn.bench.memory import set_mmap_threshold  # noqa: E402
from focusattn.kernels.decomposed import decomposed_focus_attention  # noqa: E402

ROUTING_FILE = ROOT / "docs/results/data/routing-smollm2-135m-focus-k8.safetensors"


def load_revision(rev: str, into: Path):
    """``focusattn.kernels.decomposed.decomposed_focus_attention`` as of ``rev``."""
    tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "src/focusattn"], check=True,
                         capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=tar, check=True)
    (into / "src/focusattn").rename(into / "focusattn_rev")
    sys.path.insert(0, str(into))
    from focusattn_rev.kernels.decomposed import decomposed_focus_attention as rev_fn
    return rev_fn


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rev", required=True, help="git revision to compare against (e.g. a commit)")
    p.add_argument("--length", type=int, default=2048)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--top-k", type=int, default=1)
    p.add_argument("--routing", choices=("random", "zipf", "captured"), default="random")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--window", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    torch.set_num_threads(1)
    t, kk, tk = a.length, a.groups, a.top_k
    if a.routing == "captured":
        top, _ = load_captured(ROUTING_FILE)
        memb = captured_membership(top, t, kk, tk, worst_layer(top, t, kk))
    else:
        memb = (zipf_membership if a.routing == "zipf" else random_membership)(t, kk, tk, 0)
    gen = torch.Generator().manual_seed(0)
    dt = getattr(torch, a.dtype)
    q = torch.randn(1, 9, t, 64, generator=gen).to(dt)  # SmolLM2-135M's attention shapes
    k, v = (torch.randn(1, 3, t, 64, generator=gen).to(dt) for _ in "kv")
    with tempfile.TemporaryDirectory() as tmp:
        rev_fn = load_revision(a.rev, Path(tmp))
        fns = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
               "rev": lambda: rev_fn(q, k, v, memb, a.window),
               "tree": lambda: decomposed_focus_attention(q, k, v, memb, a.window)}
        times = {name: [] for name in fns}
        # Every temporary >= 128 KiB is fresh pages, as in the prefill bench (bench.memory): left to glibc's dynamic
        # threshold, a kernel called right after the other reuses its freed memory and looks up to 1.6x faster
        # (measured: a revision against an identical working tree). The order also alternates each repeat.
        set_mmap_threshold(128 << 10)
        with torch.no_grad():
            out_rev, out_tree = fns["rev"](), fns["tree"]()
            fns["sdpa"]()
            for i in range(a.repeats):
                for name in ("sdpa", "rev", "tree") if i % 2 == 0 else ("sdpa", "tree", "rev"):
                    c0 = time.thread_time()
                    fns[name]()
                    times[name].append(time.thread_time() - c0)
    med = {name: sorted(ts)[len(ts) // 2] * 1e3 for name, ts in times.items()}
    res = {"rev": a.rev, "T": t, "K": kk, "top_k": tk, "routing": a.routing, "dtype": a.dtype,
           "repeats": a.repeats, "cpu_ms": {n: round(x, 2) for n, x in med.items()},
           "tree_speedup_over_rev": round(med["rev"] / med["tree"], 3),
           "rev_vs_sdpa": round(med["sdpa"] / med["rev"], 3), "tree_vs_sdpa": round(med["sdpa"] / med["tree"], 3),
           "max_abs_diff": float((out_rev.float() - out_tree.float()).abs().max())}
    print(json.dumps(res))
    return res


if __name__ == "__main__":
    main()
