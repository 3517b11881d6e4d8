"""In-process A/B of the shipped g2 adapter's decode step: the one-token host paths of 67bebdf (the cap decided on the
host, global keys listed from the host record, dense heads' direct fused call) on ("new") and off ("old": the
tensor paths, and the group index's ``last_keys`` of the revision before, loaded from a worktree of it), alternating
step by step with the original model's step, so other jobs on the machine slow all three alike (issue 23).

    git worktree add /tmp/old f9b5301
    python scripts/decode_ab.py 600 --old-src /tmp/old/src    # cached tokens; prints the three medians

``--lean``: instead, "old" is this checkout without the lean one-token attention (``attend_one_token``: the
general ``attend`` runs every step), "new" with it; ``--adapter`` picks the adapter (default the shipped g2).
``--route``: "old" without the group index's one-token append of groups decided on the host
(``GroupIndex.append`` without the ``groups`` the router decided: the row read back), "new" with them.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time

import torch


def main() -> None:
    import focusattn as fa
    from focusattn.hf.compose import set_top_k

    torch.set_num_threads(1)
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("length", type=int, help="cached tokens before the timed steps")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--old-src", help="src/ of a worktree at the revision before the host paths")
    ap.add_argument("--lean", action="store_true", help="A/B the lean one-token attention instead")
    ap.add_argument("--route", action="store_true", help="A/B the one-token index append instead")
    ap.add_argument("--adapter", default="smollm2-135m-focus-g2")
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--label", default=None, help="the row's label in --out (default: lean / host-paths)")
    ap.add_argument("--out", default=None, help="a JSON file: this row replaces the one of the same label, "
                    "adapter and length (docs/results/decode_ab.json is rendered in RESULTS)")
    args = ap.parse_args()
    if not (args.lean or args.route) and not args.old_src:
        raise SystemExit("--old-src is required (or --lean, --route)")
    T, n = args.length, args.steps
    if args.lean:
        AF = importlib.import_module("focusattn.hf.attention_fn")
        lean = AF.attend_one_token

        def mode(new: bool) -> None:
            AF.attend_one_token = lean if new else (lambda *a, **k: None)
    elif args.route:
        from focusattn.kernels.group_index import GroupIndex
        append = GroupIndex.append

        def mode(new: bool) -> None:
            GroupIndex.append = append if new else (lambda self, m, groups=None: append(self, m))
    else:
        mode = _host_paths(args.old_src)
    models = {}
    for name in ("original", "old", "new"):
        m, _ = fa.load_model("smollm2-135m")
        if name != "original":
            fa.load_adapter(m, args.adapter); set_top_k(m, args.top_k)
        models[name] = m.eval()
    torch.manual_seed(0); ids = torch.randint(100, 20000, (1, T))
    state = {}
    with torch.no_grad():
        for name, m in models.items():
            if name != "original": mode(name == "new")
            out = m(ids, use_cache=True); state[name] = [out.past_key_values, out.logits[:, -1:].argmax(-1)]
        ts = {k: [] for k in models}
        for i in range(n):
            for name, m in models.items():
                if name != "original": mode(name == "new")
                pkv, nxt = state[name]
                t0 = time.thread_time()
                out = m(nxt, past_key_values=pkv, use_cache=True)
                ts[name].append(time.thread_time() - t0)
                state[name] = [out.past_key_values, out.logits[:, -1:].argmax(-1)]
        same = torch.equal(state["old"][1], state["new"][1])
    med = {k: statistics.median(v[4:]) * 1e3 for k, v in ts.items()}
    print(f"T={T}: original {med['original']:.1f} ms, old {med['old']:.1f} ms ({med['original']/med['old']:.3f}x), "
          f"new {med['new']:.1f} ms ({med['original']/med['new']:.3f}x); same next token: {same}")
    if args.out:
        label = args.label or ("lean" if args.lean else "route" if args.route else "host-paths")
        _record(args, {"label": label, "adapter": args.adapter,
                       "top_k": args.top_k, "T": T, "steps": n, "ms": med, "old_x": med["original"] / med["old"],
                       "new_x": med["original"] / med["new"], "same_next_token": same})


def _record(args, row: dict) -> None:
    """Merge ``row`` into ``args.out`` (written whole, atomically), with the command that made it."""
    import json
    from pathlib import Path

    from focusattn._io import write_json

    p = Path(args.out)
    doc = json.loads(p.read_text()) if p.exists() else {"rows": []}
    row["command"] = "python scripts/decode_ab.py " + " ".join(sys.argv[1:])
    key = lambda r: (r["label"], r["adapter"], r.get("top_k", 1), r["T"])  # noqa: E731
    doc["rows"] = sorted([r for r in doc["rows"] if key(r) != key(row)] + [row], key=key)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_json(p, doc)


def _host_paths(old_src: str):
    """The toggle of the host paths of 67bebdf: on, or the old module's code from ``old_src``."""
    R = importlib.import_module("focusattn.focus.router")
    A = importlib.import_module("focusattn.focus.attend")
    GI = importlib.import_module("focusattn.kernels.group_index")
    # load the old module inside the package namespace so its relative imports resolve
    spec = importlib.util.spec_from_file_location("focusattn.kernels._old_gi",
                                                  f"{old_src}/focusattn/kernels/group_index.py")
    old = importlib.util.module_from_spec(spec)
    old.__package__ = "focusattn.kernels"
    sys.modules["focusattn.kernels._old_gi"] = old
    old.__spec__.loader.exec_module(old)
    old._Host = GI._Host
    new_lk, old_lk = GI.GroupIndex.last_keys, old.GroupIndex.last_keys
    new_otm, new_fok = R.one_token_groups, A._fused_ok
    def mode(new: bool) -> None:
        R.one_token_groups = new_otm if new else (lambda *a, **k: None)
        A._fused_ok = new_fok if new else (lambda *a, **k: False)
        GI.GroupIndex.last_keys = new_lk if new else old_lk
    return mode


if __name__ == "__main__":
    main()
