"""scripts/keyed_union_probe.py: its counts equal a pair-by-pair count of what each block layout computes and keeps."""
import importlib.util
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location(
    "keyed_union_probe", Path(__file__).resolve().parents[2] / "scripts" / "keyed_union_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def _brute(qmem, gid, window, bq, sub=0, shared=0.0):
    t = len(gid)
    comp = kept = 0
    for b0 in range(0, t, bq):
        qs = range(b0, min(t, b0 + bq))
        lim = max(0, qs[-1] - window)
        joined = qmem[list(qs)].sum(0)
        common = joined >= max(1, round(shared * bq)) if sub else joined > 0
        for j in range(lim):
            g = int(gid[j])
            if common[g]:
                comp += len(qs)
            elif sub:
                comp += sum(len(s) for s in (qs[a:a + sub] for a in range(0, len(qs), sub)) if qmem[list(s), g].any())
        kept += sum(int(qmem[i, gid[j]]) for i in qs for j in range(max(0, i - window)))
    return comp, kept


def test_counts_match_a_pair_by_pair_count():
    g = torch.Generator().manual_seed(0)
    t, k = 90, 7
    qmem = torch.rand(t, k, generator=g) < 0.3
    gid = torch.randint(0, k, (t,), generator=g)
    for bq, sub, shared in [(16, 0, 0.0), (8, 0, 0.0), (16, 4, 0.25), (16, 4, 0.6)]:
        assert probe.counts(qmem, gid, 5, bq, sub, shared) == _brute(qmem, gid, 5, bq, sub, shared)
