"""The decode path: its two engines (gathered lists, one masked pass) against the dense reference, and the gather
workspace (the same rows as a plain ``index_select``, reused across calls, plain allocation beyond its cap)."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import focusattn.kernels.decode as decode
from focusattn.kernels import GroupIndex
from focusattn.kernels.api import focus_attention
from focusattn.kernels.reference import dense_focus_attention
from tests.conftest import focus_case


def test_gather_workspace_is_reused_and_capped(monkeypatch):
    src = torch.randn(50, 8)
    a, b = torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6])
    first = decode._gather_rows(src, a, 0)
    assert torch.equal(first, src.index_select(0, a))
    ptr = first.data_ptr()
    second = decode._gather_rows(src, b, 0)  # smaller: the same buffer, now holding b's rows
    assert second.data_ptr() == ptr and torch.equal(second, src.index_select(0, b))
    assert torch.equal(decode._gather_rows(src, a, 1), src.index_select(0, a))  # the value slot is separate
    monkeypatch.setattr(decode, "WORKSPACE_ELEMS", 16)
    big = decode._gather_rows(src, torch.arange(10), 0)  # 80 elements > 16: a fresh tensor
    assert big.data_ptr() != ptr and torch.equal(big, src[:10])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), tq=st.integers(1, 3), tk=st.integers(4, 48),
       k=st.integers(1, 4), window=st.integers(0, 6), sink=st.integers(0, 2), pad=st.booleans(),
       indexed=st.booleans())
def test_masked_pass_and_gather_agree(monkeypatch, seed, b, tq, tk, k, window, sink, pad, indexed):
    """Long lists take one masked pass over every key, short ones are gathered: forced either way, both give the
    dense reference's outputs, LSE and gradients (index or scan, sinks, padding, several queries)."""
    q, kk, v, member = focus_case(seed, b, 4, 2, tq, tk, k, 1 + seed % k, dtype=torch.float64)
    kpm = None
    if pad:
        kpm = torch.ones(b, tk, dtype=torch.bool)
        kpm[-1, : tk // 3] = False
    ref, ref_lse = dense_focus_attention(q, kk, v, member, window, sink=sink, key_padding_mask=kpm, return_lse=True)
    used = []
    masked_pass = decode._masked_pass
    monkeypatch.setattr(decode, "_masked_pass", lambda *a: used.append(1) or masked_pass(*a))
    for frac in (0.0, 1.0):  # 0: every list counts as long; 1: none does
        monkeypatch.setattr(decode, "DENSE_DECODE_FRACTION", frac)
        used.clear()
        ts = [t.clone().requires_grad_() for t in (q, kk, v)]
        out, lse = focus_attention(*ts, member, window, sink=sink, key_padding_mask=kpm, return_lse=True,
                                   group_index=GroupIndex(member) if indexed else None, backend="decomposed")
        assert bool(used) == (frac == 0.0)
        rows = torch.ones(b, tq, dtype=torch.bool) if kpm is None else kpm[:, tk - tq:]
        sel = rows[:, None, :].expand_as(lse)
        assert torch.allclose(out[sel], ref[sel], atol=1e-8) and torch.equal(lse.isinf(), ref_lse.isinf())
        assert torch.allclose(lse[sel & ~lse.isinf()], ref_lse[sel & ~lse.isinf()], atol=1e-8)
        with torch.no_grad():  # inference: the masked pass's in-place form (no -inf), same answers
            out_ng, lse_ng = focus_attention(q, kk, v, member, window, sink=sink, key_padding_mask=kpm,
                                             return_lse=True, group_index=GroupIndex(member) if indexed else None,
                                             backend="decomposed")
        assert torch.allclose(out_ng[sel], ref[sel], atol=1e-8) and torch.equal(lse_ng.isinf(), ref_lse.isinf())
        assert torch.allclose(lse_ng[sel & ~lse_ng.isinf()], ref_lse[sel & ~lse_ng.isinf()], atol=1e-8)
        (out[sel] * 0.5).sum().backward()
        gq = ts[0].grad
        ts2 = [t.clone().requires_grad_() for t in (q, kk, v)]
        r = dense_focus_attention(*ts2, member, window, sink=sink, key_padding_mask=kpm)
        (r[sel] * 0.5).sum().backward()
        assert torch.allclose(gq, ts2[0].grad, atol=1e-8)
        assert torch.allclose(ts[1].grad, ts2[1].grad, atol=1e-8) and torch.allclose(ts[2].grad, ts2[2].grad, atol=1e-8)


def test_masked_pass_keeps_kept_keys_far_below_a_masked_one():
    """The inference form normalises by the largest score over all keys; when every kept key scores ~200 nats below
    a masked one, their weights would underflow, so that row is recomputed with -inf masking: still exact."""
    torch.manual_seed(0)
    tk, d = 64, 8
    q = torch.zeros(1, 2, 1, d)
    q[..., 0] = 1.0
    k = torch.randn(1, 1, tk, d) * 0.1
    v = torch.randn(1, 1, tk, d)
    k[0, 0, 5, 0] = 1600.0  # scale 1/sqrt(8): a score of ~566 on a masked key
    allowed = torch.zeros(1, 1, tk, dtype=torch.bool)
    allowed[..., 10:] = True
    with torch.no_grad():
        out, lse = decode._masked_pass(q, k, v, allowed, d ** -0.5, None)
    s = (q[0, :, 0] @ k[0, 0, 10:].T) * d ** -0.5
    ref = torch.softmax(s, -1) @ v[0, 0, 10:]
    assert torch.isfinite(out).all() and torch.allclose(out[0, :, 0], ref, atol=1e-6)
    assert torch.allclose(lse[0, :, 0], torch.logsumexp(s, -1), atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(1, 5), top_k=st.integers(1, 3), window=st.integers(0, 12),
       sink=st.integers(0, 3), roles=st.booleans(), start=st.integers(1, 30), glob=st.booleans())
def test_one_sequence_steps_through_the_host_record_equal_the_reference(seed, k, top_k, window, sink, roles, start,
                                                                         glob):
    """A decode step of one sequence (the ``gather`` branch's fast path: ``GroupIndex.last_keys`` +
    ``gathered_step``) equals the dense reference step by step, outputs and LSE: top-k > 1 (keys listed once), sinks
    in and out of the query's groups and window, global keys (``glob``: a sink key mask, first tokens or not),
    query and key roles, GQA; and again after a crop and a reorder (the host record is rebuilt)."""
    from focusattn.kernels import dispatch
    from focusattn.kernels.dispatch import BreakEvens
    from tests.conftest import random_membership

    top_k = min(top_k, k)
    t = start + 40
    gen = torch.Generator().manual_seed(seed)
    memb = random_membership(1, t, k, top_k, gen=gen)
    qmem = None
    if roles and top_k > 1:  # the query's one group is one of its key groups (hard_memberships' rule)
        first = torch.where(memb, torch.rand(memb.shape, generator=gen), -1.0).argmax(-1, keepdim=True)
        qmem = torch.zeros_like(memb).scatter_(-1, first, True)
    q, kk, v = (torch.randn(1, h, t, 8, generator=gen) for h in (4, 2, 2))
    marks = torch.rand(1, t, generator=gen) < 0.2  # global keys
    marks[:, :sink] = True
    fast = []
    real = decode.gathered_step

    def counted(*a, **kw):
        fast.append(1)
        return real(*a, **kw)

    index = GroupIndex(memb[:, :start])
    before = dispatch.PICKS["gather"]
    with torch.no_grad(), dispatch.using({"cpu": BreakEvens(prefill={}, decode={1: 0})}), \
            _patch(decode, "gathered_step", counted):
        for i in range(start, t):
            if i == start + 20:  # a rollback and a (trivial) reorder: the host record is rebuilt from the index
                index.crop(i - 3).append(memb[:, i - 3:i]).reorder(torch.tensor([0]))
            index.append(memb[:, i:i + 1])
            kw = dict(sink=marks[:, :i + 1] if glob else sink, return_lse=True,
                      query_membership=None if qmem is None else qmem[:, i:i + 1])
            out, lse = focus_attention(q[:, :, i:i + 1], kk[:, :, :i + 1], v[:, :, :i + 1], index.membership,
                                       window, group_index=index, **kw)
            ref, ref_lse = dense_focus_attention(q[:, :, i:i + 1], kk[:, :, :i + 1], v[:, :, :i + 1],
                                                 memb[:, :i + 1], window, **kw)
            assert (out - ref).abs().max() <= 1e-5, i
            assert (lse - ref_lse).abs().max() <= 1e-4, i
    assert len(fast) == dispatch.PICKS["gather"] - before  # every gathered step took it
    if 2 * top_k <= k and window < start:
        assert fast  # and it was taken (the other steps are plain causal: every pair kept)


def test_last_keys_lists_each_allowed_key_once():
    """The host record's key list is exactly the reference mask's row for the last token, each key once."""
    from focusattn.kernels.common import sink_key_mask
    from focusattn.kernels.reference import focus_allowed
    from tests.conftest import random_membership

    memb = random_membership(1, 300, 6, 2, seed=3)
    index = GroupIndex(memb[:, :100])
    for i in range(100, 300):
        index.append(memb[:, i:i + 1])
        keys = index.last_keys(17, 2).tolist()
        assert len(keys) == len(set(keys))
        row = focus_allowed(memb[:, :i + 1], 17, 1, sink_key_mask(i + 1, 2, None, memb.device))[0, -1]
        assert sorted(keys) == row.nonzero()[:, 0].tolist(), i
    assert GroupIndex(random_membership(2, 10, 4, 1)).last_keys(3) is None  # a batch: the general path
    marks = torch.rand(1, 300, generator=torch.Generator().manual_seed(0)) < 0.1  # global keys, listed once too
    index = GroupIndex(memb[:, :100])
    for i in range(100, 300):
        index.append(memb[:, i:i + 1])
        extra = marks[0, :i + 1].nonzero()[:, 0].to(torch.int32)
        keys = index.last_keys(17, 2, extra=extra).tolist()
        assert len(keys) == len(set(keys))
        row = focus_allowed(memb[:, :i + 1], 17, 1, sink_key_mask(i + 1, 2, None, memb.device) | marks[:, :i + 1])
        assert sorted(keys) == row[0, -1].nonzero()[:, 0].tolist(), i


class _patch:
    """``setattr`` for a block (the hypothesis test cannot take pytest's function-scoped monkeypatch)."""

    def __init__(self, obj, name, value):
        self.obj, self.name, self.value = obj, name, value

    def __enter__(self):
        self.old = getattr(self.obj, self.name)
        setattr(self.obj, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.obj, self.name, self.old)
