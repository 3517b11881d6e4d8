"""scripts/partition_oracle.py: the partition fit finds a planted partition and never exceeds the group cap."""
import importlib.util
from pathlib import Path

import numpy as np

spec = importlib.util.spec_from_file_location(
    "partition_oracle", Path(__file__).resolve().parents[2] / "scripts" / "partition_oracle.py")
po = importlib.util.module_from_spec(spec)
spec.loader.exec_module(po)


def _planted(t=64, k=4, m=6, seed=0):
    """Each query attends only to earlier tokens of its own residue class mod k (a planted symmetric partition)."""
    rng = np.random.default_rng(seed)
    idx = np.full((t, m), -1)
    w = np.zeros((t, m))
    for i in range(t):
        same = [j for j in range(i) if j % k == i % k]
        if same:
            pick = rng.choice(same, size=min(m, len(same)), replace=False)
            idx[i, :len(pick)], w[i, :len(pick)] = pick, rng.random(len(pick)) + 0.1
    return idx, w


def test_fill_respects_the_cap_and_prefers_the_best_group():
    gain = np.array([[3.0, 1.0], [2.0, 0.0], [1.0, 0.5]])
    out = po._fill(gain, cap=2)
    assert np.bincount(out, minlength=2).max() <= 2
    assert list(out) == [0, 0, 1]  # the third row loses its best group to the two larger gains


def test_fit_recovers_a_planted_partition():
    t, k = 64, 4
    idx, w = _planted(t, k)
    rows, cols, vals = po._sparse(idx, w)
    init = np.random.default_rng(1).integers(0, k, t)
    start = po._mass(init, init, rows, cols, vals)
    for sym in (True, False):
        qg, kg = po.fit(rows, cols, vals, t, k, int(1.5 * t / k), init, iters=20, symmetric=sym)
        kept = po._mass(qg, kg, rows, cols, vals)
        assert kept >= start and kept > 0.9
        assert np.bincount(kg, minlength=k).max() <= int(1.5 * t / k)


def test_budget_is_the_share_of_distant_keys_in_the_query_group():
    rng = np.random.default_rng(0)
    t, window, sink = 40, 3, 2
    qg, kg = rng.integers(0, 4, t), rng.integers(0, 4, t)
    direct = np.mean([(kg[sink:i - window] == qg[i]).mean() for i in range(window + sink + 1, t)])
    assert abs(po._budget(qg, kg, t, window, sink) - direct) < 1e-12
    assert po._budget(qg[:5], kg[:5], 5, 8, 1) == 0.0  # no query has a distant key
