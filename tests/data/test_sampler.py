"""Epoch sampling shared across ranks: within an epoch no window is dropped or repeated over all ranks, ranks never
overlap, and any process count with the same global batch sees the same samples."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from focusattn.data.sampler import EpochWindows
from focusattn.train.dist import sample_range


def _rank_starts(s, index, per_rank, world):
    return [s.starts(sample_range(index, per_rank, rank_=r, world_=world)) for r in range(world)]


@settings(max_examples=40, deadline=None)
@given(n_tokens=st.integers(20, 400), seq_len=st.integers(1, 20), world=st.integers(1, 4),
       per_rank=st.integers(1, 5), seed=st.integers(0, 2**16))
def test_every_epoch_is_a_partition_over_all_ranks(n_tokens, seq_len, world, per_rank, seed):
    s = EpochWindows(n_tokens, seq_len, seed)
    n = s.per_epoch
    g = world * per_rank
    steps = -(-2 * n // g) + 1  # past the end of two epochs
    seen = []  # (global sample number, start), in sample order
    for index in range(steps):
        per = _rank_starts(s, index, per_rank, world)
        assert len(set().union(*[set(sample_range(index, per_rank, rank_=r, world_=world)) for r in range(world)])) == g
        for r, starts in enumerate(per):
            for i, st_ in zip(sample_range(index, per_rank, rank_=r, world_=world), starts):
                seen.append((i, int(st_)))
    seen.sort()
    assert [i for i, _ in seen] == list(range(len(seen)))  # every sample number exactly once over the ranks
    for e in range(2):
        starts = [st_ for i, st_ in seen if i // n == e]
        assert len(starts) == n and len(set(starts)) == n  # no window dropped or repeated in the epoch
        starts = sorted(starts)
        assert all(b - a == seq_len for a, b in zip(starts, starts[1:]))  # disjoint windows tiling the stream
        assert 0 <= starts[0] and starts[-1] + seq_len <= n_tokens and n_tokens - n * seq_len < seq_len


def test_process_count_does_not_change_the_samples():
    s = EpochWindows(1000, 7, seed=3)
    for index in range(30):
        one = s.starts(sample_range(index, 8, rank_=0, world_=1))
        two = np.concatenate(_rank_starts(s, index, 4, 2))
        four = np.concatenate(_rank_starts(s, index, 2, 4))
        assert np.array_equal(one, two) and np.array_equal(one, four)


def test_windows_seeds_and_epochs_differ():
    ids = np.arange(500, dtype=np.int32)
    s = EpochWindows(len(ids), 10, seed=0)
    w = s.windows(ids, range(0, 5))
    assert w.shape == (5, 10) and np.all(np.diff(w, axis=1) == 1)
    assert not np.array_equal(s.starts(range(50)), EpochWindows(500, 10, seed=1).starts(range(50)))
    assert not np.array_equal(s.starts(range(50)), s.starts(range(50, 100)))  # epoch 2 is in another order
    with pytest.raises(ValueError, match="fewer than one window"):
        EpochWindows(5, 10, 0)
