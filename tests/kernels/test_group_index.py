"""GroupIndex: incremental == from scratch, and decoding through it == the dense reference (values, LSE, grads)."""
import pytest
import torch

import focusattn.kernels as fa_kernels
from focusattn.kernels import GroupIndex, dense_focus_attention, focus_attention
from focusattn.kernels import dispatch
from tests.conftest import assert_close, random_membership


def _assert_same_index(a, b):
    pa, ca = a.group_lists()
    pb, cb = b.group_lists()
    assert len(a) == len(b) and torch.equal(ca, cb) and torch.equal(pa, pb)
    assert torch.equal(a.membership, b.membership)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_prefill_plus_appends_equals_from_scratch(top_k):
    m = random_membership(2, 300, 4, top_k, seed=top_k)
    idx = GroupIndex(m[:, :5])  # small start: forces several capacity doublings
    for a, b in [(5, 6), (6, 40), (40, 41), (41, 41), (41, 250), (250, 300)]:
        idx.append(m[:, a:b])
        _assert_same_index(idx, GroupIndex(m[:, :b]))
    pos, cnt = idx.group_lists()
    for b in range(2):  # the lists are what they claim: each group's positions, ascending
        for g in range(4):
            assert pos[b, g, :cnt[b, g]].tolist() == torch.nonzero(m[b, :, g]).flatten().tolist()
    _assert_same_index(idx.crop(123), GroupIndex(m[:, :123]))
    _assert_same_index(idx.append(m[:, 123:200]), GroupIndex(m[:, :200]))
    _assert_same_index(GroupIndex(m[:, :0]).append(m[:, :77]), GroupIndex(m[:, :77]))
    beams = torch.tensor([1, 1, 0])  # beam search: reorder (and repeat) batch rows, then keep appending
    _assert_same_index(GroupIndex(m[:, :50]).reorder(beams).append(m[beams, 50:90]), GroupIndex(m[beams, :90]))


@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("window", [0, 5, 400])
@pytest.mark.parametrize("tq", [1, 3])
def test_indexed_decode_matches_dense(top_k, window, tq):
    torch.manual_seed(100 * top_k + window + tq)
    b, hq, hkv, t, d, k = 2, 4, 2, 192, 8, 16
    m = random_membership(b, t, k, top_k, seed=window + top_k)
    assert top_k * int(m.sum(1).max()) < t  # the lists are shorter than Tk: the index is used, not the scan
    kpm = torch.ones(b, t, dtype=torch.bool)
    kpm[1, :11] = False  # left padding in the second row
    kpm[0, 40] = False
    q = torch.randn(b, hq, tq, d, requires_grad=True)
    kk = torch.randn(b, hkv, t, d, requires_grad=True)
    v = torch.randn(b, hkv, t, d, requires_grad=True)
    idx = GroupIndex(m[:, :t - 20])
    for a in range(t - 20, t, 5):  # the decode loop: append, then attend
        idx.append(m[:, a:a + 5])
    out, lse = focus_attention(q, kk, v, m, window, key_padding_mask=kpm, group_index=idx, return_lse=True,
                               backend="decomposed")
    ref, ref_lse = dense_focus_attention(q, kk, v, m, window, key_padding_mask=kpm, return_lse=True)
    assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)
    go = torch.randn_like(out)
    g1 = torch.autograd.grad((out * go).sum() + lse.sum(), (q, kk, v))
    g2 = torch.autograd.grad((ref * go).sum() + ref_lse.sum(), (q, kk, v))
    for a, r in zip(g1, g2):
        assert_close(a, r, atol=1e-5, rtol=1e-5)
    # the index's own membership view can stand in for the concatenated one (and padding needs no other input)
    out2 = focus_attention(q, kk, v, idx.membership, window, key_padding_mask=kpm, group_index=idx)
    assert_close(out2, ref, atol=1e-5, rtol=1e-5)


def _spy_key_lookups(monkeypatch):
    """Count how each decode step found its keys: through the index, or by scanning every key's membership."""
    import focusattn.kernels.decode as decode_mod

    calls = {"index": 0, "scan": 0}
    index_lookup, scan_lookup = GroupIndex.key_indices, decode_mod._allowed_rows
    host_lookup = GroupIndex.last_keys

    def by_index(self, *a, **kw):
        calls["index"] += 1
        return index_lookup(self, *a, **kw)

    def by_host(self, *a, **kw):  # the one-sequence step's lists (the index's host record)
        calls["index"] += 1
        return host_lookup(self, *a, **kw)

    def by_scan(*a, **kw):
        calls["scan"] += 1
        return scan_lookup(*a, **kw)

    monkeypatch.setattr(GroupIndex, "key_indices", by_index)
    monkeypatch.setattr(GroupIndex, "last_keys", by_host)
    monkeypatch.setattr(decode_mod, "_allowed_rows", by_scan)
    return calls


def test_dense_routing_falls_back_to_the_scan_exactly(monkeypatch):
    """Top-3 of 4 groups: the query's lists are longer than the cache, so the decode path scans instead."""
    torch.manual_seed(1)
    m = random_membership(2, 80, 4, 3, seed=5)
    q, k, v = torch.randn(2, 4, 2, 8), torch.randn(2, 2, 80, 8), torch.randn(2, 2, 80, 8)
    calls = _spy_key_lookups(monkeypatch)
    out = focus_attention(q, k, v, m, 3, group_index=GroupIndex(m), backend="decomposed")  # auto: causal
    assert calls == {"index": 0, "scan": 1}  # the index was not read: the scan ran
    scan = focus_attention(q, k, v, m, 3, backend="decomposed")  # no index at all
    assert torch.equal(out, scan)  # exactly the scan's result, bit for bit
    assert_close(out, dense_focus_attention(q, k, v, m, 3), atol=1e-5, rtol=1e-5)


def test_each_allowed_key_listed_once():
    """Top-3 of 4 groups: most keys share two or three groups with the query; the list must hold each once."""
    m = random_membership(1, 200, 4, 3, seed=9)
    idx = GroupIndex(m)
    keys, valid = idx.key_indices(torch.tensor([199]), 7)
    got = keys[valid].tolist()
    assert len(got) == len(set(got))
    dist = 199 - torch.arange(200)
    allowed = (dist >= 0) & ((dist <= 7) | (m[0] & m[0, 199]).any(-1))
    assert sorted(got) == torch.nonzero(allowed).flatten().tolist()


def test_sinks_and_auto_pass_the_index_through(monkeypatch):
    """With sinks and with backend 'auto', a decode step still reads its keys from the index (and is right)."""
    import focusattn.kernels.decode as decode_mod

    monkeypatch.setattr(decode_mod, "DENSE_DECODE_FRACTION", 1.0)  # gather every list (the cache is tiny here)
    torch.manual_seed(0)
    m = random_membership(1, 64, 4, 1, seed=3)
    q, k, v = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 64, 8), torch.randn(1, 2, 64, 8)
    idx = GroupIndex(m)
    ref = dense_focus_attention(q, k, v, m, 4, sink=2)
    calls = _spy_key_lookups(monkeypatch)
    with dispatch.using({"cpu": dispatch.BreakEvens()}):  # auto gathers at any cache length (this one is tiny)
        with_sinks = focus_attention(q, k, v, m, 4, sink=2, group_index=idx)
        assert calls == {"index": 1, "scan": 0}
        assert_close(with_sinks, ref, atol=1e-5, rtol=1e-5)
        auto = focus_attention(q, k, v, m, 4, group_index=idx, backend="auto")
        assert calls == {"index": 2, "scan": 0}
    scanned = focus_attention(q, k, v, m, 4, backend="decomposed")
    assert calls == {"index": 2, "scan": 1}
    assert_close(auto, scanned, atol=1e-6, rtol=1e-6)
    with pytest.warns(DeprecationWarning, match="sink="):  # the old wrapper still works and passes it through too
        old = fa_kernels.focus_attention_with_sinks(q, k, v, m, 4, sink=2, group_index=idx, backend="decomposed")
    assert calls["index"] == 3
    assert_close(old, with_sinks, atol=1e-6, rtol=1e-6)  # the general gather and the one-sequence step agree


def test_errors():
    m = random_membership(2, 32, 4, 1, seed=1)
    q, k, v = torch.randn(2, 2, 1, 8), torch.randn(2, 2, 32, 8), torch.randn(2, 2, 32, 8)
    with pytest.raises(ValueError, match="group_index"):  # one token short: the step's append was forgotten
        focus_attention(q, k, v, m, 4, group_index=GroupIndex(m[:, :31]))
    with pytest.raises(ValueError, match="group_index"):
        focus_attention(q, k, v, m, 4, group_index="index")
    with pytest.raises(ValueError, match="group_index"):  # batch mismatch
        focus_attention(q[:1], k[:1], v[:1], m[:1], 4, group_index=GroupIndex(m))
    other = m.clone()
    other[:, -1] = other[:, -1].roll(1, -1)
    with pytest.raises(ValueError, match="group_index"):  # the newest token's groups disagree
        focus_attention(q, k, v, m, 4, group_index=GroupIndex(other))
    idx = GroupIndex(m)
    with pytest.raises(ValueError, match="membership_new"):
        idx.append(m[:1, :2])  # wrong batch
    with pytest.raises(ValueError, match="membership_new"):
        idx.append(m[:, :2, :3])  # wrong K
    with pytest.raises(ValueError, match="membership_new"):
        idx.append(m[:, :2].float())
    with pytest.raises(ValueError, match="at least one group"):
        idx.append(torch.zeros(2, 1, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="at least one group"):
        GroupIndex(torch.zeros(1, 3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="crop"):
        idx.crop(33)
    assert len(idx) == 32  # failed appends left the index untouched
    _assert_same_index(idx, GroupIndex(m))


def test_group_statistics_the_dispatcher_reads_follow_appends_crops_and_reorders():
    """min_groups / max_groups / one_group_holds_all (what backend='auto' reads instead of scanning the cache)."""
    m = torch.zeros(2, 10, 4, dtype=torch.bool)
    m[:, :, 0] = True  # group 0 holds every token
    m[0, 3, 2] = True  # one token in two groups
    idx = GroupIndex(m)
    assert (idx.min_groups, idx.max_groups, idx.one_group_holds_all) == (1, 2, True)
    step = torch.zeros(2, 1, 4, dtype=torch.bool)
    step[:, 0, 1] = True  # a token outside group 0
    step[1, 0, 3] = True
    idx.append(step)
    assert (idx.min_groups, idx.max_groups, idx.one_group_holds_all) == (1, 2, False)
    assert idx.crop(10).one_group_holds_all and idx.max_groups == 2
    assert not idx.append(step).reorder(torch.tensor([1])).one_group_holds_all
    with pytest.raises(ValueError, match="every token must belong"):
        idx.append(torch.zeros(1, 1, 4, dtype=torch.bool))


@pytest.mark.parametrize("top_k", [1, 2])
def test_one_token_appends_with_host_groups_equal_appends(top_k):
    """``append`` given the rows' groups (a decode step's groups decided on the host) leaves the index, its
    statistics and the host record's key lists exactly as ``append`` of the same rows does, host record built or
    not."""
    m = random_membership(1, 200, 4, top_k, seed=7 + top_k)
    m[:, :30] = False
    m[:, :30, 2] = True  # one group holds every early token: one_group_holds_all must turn off on the way
    a, b = GroupIndex(m[:, :20]), GroupIndex(m[:, :20])
    for t in range(20, 200):
        row = m[:, t:t + 1]
        if t == 21:
            assert a.last_keys(9, 2) is not None and b.last_keys(9, 2) is not None  # builds the host records
        a.append(row)
        b.append(row, groups=[tuple(torch.nonzero(row[0, 0]).flatten().tolist())])
        assert (a.min_groups, a.max_groups, a.one_group_holds_all) == (b.min_groups, b.max_groups,
                                                                        b.one_group_holds_all)
        if t % 17 == 0:
            assert torch.equal(a.last_keys(9, 2, extra=[3, 5]), b.last_keys(9, 2, extra=[3, 5]))
            _assert_same_index(a, b)
    _assert_same_index(a, b)
    _assert_same_index(b, GroupIndex(m))
