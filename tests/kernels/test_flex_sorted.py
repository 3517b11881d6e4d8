"""The group-sorted FlexAttention prefill (kernels/flex_sorted.py): exact against the dense reference, and, counted
on the CPU through a dispatch mode, free of device-to-host reads and of work that grows with K, top-k or T."""
import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import focusattn.kernels.flex_sorted as fs
from focusattn.kernels.api import focus_attention
from focusattn.kernels.flex_sorted import sorted_flex_focus_attention, sorted_layout
from focusattn.kernels.reference import dense_focus_attention
from tests.conftest import focus_case

# ops that read a device value back to the host (a sync on a GPU) or whose output size depends on the data
SYNC_OPS = ("_local_scalar_dense", "item", "nonzero", "masked_select", "unique", "_unique2", "is_nonzero", "equal",
            "repeat_interleave")
REAL_FLEX_CALL = fs._flex_call
VIEWS = {"view", "expand", "unsqueeze", "slice", "select", "_unsafe_view", "t", "transpose", "permute",
         "as_strided", "alias", "squeeze", "detach", "lift_fresh", "_reshape_alias"}


class Ops(TorchDispatchMode):
    """Counts every aten op a call issues (on a GPU each is a launch, or a sync for ``SYNC_OPS``)."""

    def __init__(self):
        super().__init__()
        self.count = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))

    def syncs(self) -> dict:
        return {k: n for k, n in self.count.items() if k in SYNC_OPS}


def _case(seed, b, hq, hkv, t, k, top_k, pad, glob):
    q, kk, v, member = focus_case(seed, b, hq, hkv, t, t, k, top_k)
    kpm = None
    if pad:
        kpm = torch.ones(b, t, dtype=torch.bool)
        kpm[0, : t // 3] = False  # left padding in the first row
    sink = 1 + seed % 2
    if glob:  # global keys: any key mask every later query sees
        sink = torch.rand(b, t, generator=torch.Generator().manual_seed(seed)) < 0.15
    return q, kk, v, member, kpm, sink


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), gqa=st.sampled_from([(2, 1), (4, 2), (2, 2)]),
       t=st.integers(1, 48), k=st.sampled_from([1, 2, 4, 8]), window=st.integers(0, 6), pad=st.booleans(),
       glob=st.booleans())
def test_sorted_flex_equals_dense(seed, b, gqa, t, k, window, pad, glob):
    top_k = 1 + seed % k
    q, kk, v, member, kpm, sink = _case(seed, b, gqa[0], gqa[1], t, k, top_k, pad, glob)
    ref, ref_lse = dense_focus_attention(q, kk, v, member, window, key_padding_mask=kpm, sink=sink, return_lse=True)
    out, lse = sorted_flex_focus_attention(q, kk, v, member, window, key_padding_mask=kpm, sink=sink,
                                           return_lse=True, top_k=top_k)
    assert (out - ref).abs().max().item() <= 1e-5
    assert torch.equal(torch.isfinite(lse), torch.isfinite(ref_lse))
    fin = torch.isfinite(ref_lse)
    assert (lse[fin] - ref_lse[fin]).abs().max().item() <= 1e-5 if fin.any() else True


def test_sorted_flex_through_the_api_and_its_errors():
    q, kk, v, member, kpm, _ = _case(5, 2, 4, 2, 30, 4, 2, True, False)
    ref = dense_focus_attention(q, kk, v, member, 3, key_padding_mask=kpm, sink=1)
    out = focus_attention(q, kk, v, member, 3, key_padding_mask=kpm, sink=1, backend="flex-sorted")
    assert (out - ref).abs().max().item() <= 1e-5
    step = focus_attention(q[:, :, -1:], kk, v, member, 3, key_padding_mask=kpm, sink=1, backend="flex-sorted")
    assert (step - ref[:, :, -1:]).abs().max().item() <= 1e-5  # a decode step takes the decode path
    with pytest.raises(ValueError, match="top_k=9: allowed 1 .. K=4"):
        sorted_flex_focus_attention(q, kk, v, member, 3, top_k=9)
    with pytest.raises(ValueError, match="top_k=1: a token is in 2 groups"):
        sorted_flex_focus_attention(q, kk, v, member, 3, top_k=1)
    with pytest.raises(ValueError, match="prefill"):
        sorted_flex_focus_attention(q[:, :, -1:], kk, v, member, 3, top_k=2)


def test_sorted_layout_puts_each_group_together_by_position():
    member = torch.tensor([[[1, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1]]], dtype=torch.bool)
    src, grp, inv = sorted_layout(member, 2)
    assert grp.tolist() == [[0, 0, 1, 2, 2, 3, 3, 3]]  # group 3 = the invalid copies of one-group tokens
    assert src[0, :5].tolist() == [0, 2, 1, 0, 3]
    assert (src.gather(1, inv.view(1, -1)) == torch.arange(4).repeat_interleave(2)).all()


def _ops(monkeypatch, t, k, top_k, sink, with_top_k=True):
    """The ops of one call; each FlexAttention call counts once (one compiled kernel on a GPU; on the CPU it runs
    eagerly, outside the count)."""
    q, kk, v, member, kpm, _ = _case(1, 1, 4, 2, t, k, top_k, False, False)
    real = REAL_FLEX_CALL

    def one_launch(*a):
        ops.count["flex_attention"] += 1
        with _disable_current_modes():
            return real(*a)

    monkeypatch.setattr(fs, "_flex_call", one_launch)
    with Ops() as ops:
        sorted_flex_focus_attention(q, kk, v, member, 4, sink=sink, key_padding_mask=kpm, return_lse=True,
                                    top_k=top_k if with_top_k else None, validate=False)
    assert ops.count["flex_attention"] == 2
    return ops


def test_sorted_flex_reads_nothing_back_and_issues_the_same_ops_whatever_k_and_t(monkeypatch):
    """Issue 24: no host sync (the layout's size is the static top_k the caller passes) and a number of ops that
    does not grow with K or T (past one 128-token block) or with top_k beyond 2 (top-k > 1 adds the fixed
    lowest-shared-group test), so a launch storm or a sync cannot come back unnoticed. Views are metadata, not
    launches, and are not counted. Without top_k the one read is that bound itself."""
    def launches(ops):
        return sum(n for name, n in ops.count.items() if name not in VIEWS)

    one = [_ops(monkeypatch, t, k, 1, 1) for t, k in ((200, 8), (300, 4), (700, 16))]
    more = [_ops(monkeypatch, t, k, top, 1) for t, k, top in ((200, 8, 2), (300, 16, 3))]
    for ops in one + more:
        assert ops.syncs() == {}, ops.syncs()
    assert len({launches(o) for o in one}) == 1 and len({launches(o) for o in more}) == 1
    assert launches(one[0]) <= 200 and launches(more[0]) - launches(one[0]) <= 16
    assert _ops(monkeypatch, 200, 8, 1, 1, with_top_k=False).syncs() == {"_local_scalar_dense": 1}
    assert _ops(monkeypatch, 200, 8, 1, torch.zeros(1, 200, dtype=torch.bool)).syncs() == {}  # global keys
