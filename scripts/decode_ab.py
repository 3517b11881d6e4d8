"""In-process A/B of the shipped g2 adapter's decode step: the one-token host paths of 67bebdf (the cap decided on the
host, global keys listed from the host record, dense heads' direct fused call) on ("new") and off ("old": the
tensor paths, and the group index's ``last_keys`` of the revision before, loaded from a worktree of it), alternating
step by step with the original model's step, so other jobs on the machine slow all three alike (issue 23).

    git worktree add /tmp/old f9b5301
    python scripts/decode_ab.py 600 --old-src /tmp/old/src    # cached tokens; prints the three medians
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
    ap.add_argument("--old-src", required=True, help="src/ of a worktree at the revision before the host paths")
    args = ap.parse_args()
    T, n = args.length, args.steps
    R = importlib.import_module("focusattn.focus.router")
    A = importlib.import_module("focusattn.focus.attend")
    GI = importlib.import_module("focusattn.kernels.group_index")
    # load the old module inside the package namespace so its relative imports resolve
    spec = importlib.util.spec_from_file_location("focusattn.kernels._old_gi",
                                                  f"{args.old_src}/focusattn/kernels/group_index.py")
    old = importlib.util.module_from_spec(spec)
    old.__package__ = "focusattn.kernels"
    sys.modules["focusattn.kernels._old_gi"] = old
    old.__spec__.loader.exec_module(old)
    old._Host = GI._Host
    new_lk, old_lk = GI.GroupIndex.last_keys, old.GroupIndex.last_keys
    new_otm, new_fok = R.one_token_membership, A._fused_ok
    def mode(new: bool) -> None:
        R.one_token_membership = new_otm if new else (lambda *a, **k: None)
        A._fused_ok = new_fok if new else (lambda *a, **k: False)
        GI.GroupIndex.last_keys = new_lk if new else old_lk
    models = {}
    for name in ("original", "old", "new"):
        m, _ = fa.load_model("smollm2-135m")
        if name != "original":
            fa.load_adapter(m, "smollm2-135m-focus-g2"); set_top_k(m, 1)
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


if __name__ == "__main__":
    main()
