"""scripts/key_groups_probe.py: its causal groupings and scores are what its docstring says (later keys never move an
earlier key's group; the bound bounds every score it stands for; the Gaussian score without variance is the mean's)."""
import importlib.util
from pathlib import Path

import torch

spec = importlib.util.spec_from_file_location(
    "key_groups_probe", Path(__file__).resolve().parents[2] / "scripts" / "key_groups_probe.py")
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def _data(t=300, w=6, k=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    keys = torch.randn(t, w, generator=g, dtype=torch.float64)
    cent = torch.randn(k, w, generator=g, dtype=torch.float64)
    ok = torch.ones(t, dtype=torch.bool)
    ok[0] = False  # a sink
    return keys, cent, ok, g


def test_online_ids_are_causal_and_join_the_running_means_of_earlier_blocks():
    keys, cent, ok, g = _data()
    ids = probe.online_ids(keys, ok, cent, prior=2.0)
    later = keys.clone()
    later[200:] = torch.randn(100, keys.shape[1], generator=g, dtype=torch.float64) * 5
    assert torch.equal(probe.online_ids(later, ok, cent, prior=2.0)[:192], ids[:192])  # blocks before 192 unmoved
    b = probe.BLOCK  # block 2 by hand: the means of the countable keys of blocks 0 and 1, centroids as 2 keys each
    mu = torch.stack([(2 * cent[c] + keys[:2 * b][(ids[:2 * b] == c) & ok[:2 * b]].sum(0))
                      / (2 + int(((ids[:2 * b] == c) & ok[:2 * b]).sum())) for c in range(len(cent))])
    assert torch.equal(ids[2 * b:3 * b], torch.cdist(keys[2 * b:3 * b], mu).argmin(-1))


def test_capped_groups_never_exceed_the_cap_at_a_block_start():
    keys, cent, ok, _ = _data(t=640)
    ids = probe.online_ids(keys, ok, cent, prior=8.0, alpha=1.5, cmin=4)
    for s in range(probe.BLOCK, len(ids), probe.BLOCK):  # a group over the cap at a block start takes none of it
        cnt = torch.bincount(ids[:s][ok[:s]], minlength=len(cent)).double()
        full = cnt >= max(1.5 * float(cnt.sum()) / len(cent), 4)
        assert not full[ids[s:s + probe.BLOCK]].any()


def test_bound_bounds_every_group_key_before_the_boundary_and_gauss0_is_the_mean():
    keys, cent, ok, g = _data(t=400)
    gid = torch.cdist(keys, cent).argmin(-1)
    q = torch.randn(400, keys.shape[1], generator=g, dtype=torch.float64)
    window = 20
    out = probe.stat_scores(q, keys, gid, ok, cent, window, [0.0])
    for i in (100, 250, 399):
        lim = max(0, (i - window) // probe.BLOCK * probe.BLOCK)
        for c in range(len(cent)):
            members = keys[:lim][(gid[:lim] == c) & ok[:lim]]
            group = torch.cat([members, cent[c][None]])
            assert float(out["bound"][i, c]) >= float((group @ q[i]).max()) - 1e-9
            assert torch.allclose(out["gauss0"][i, c], q[i] @ group.mean(0))
