"""``FocusConfig.capacity``: hard top-k never fills a group past its cap of the earlier tokens, causally, and a
prefill and the decode steps after it route alike."""
import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import focusattn as fa
from focusattn._errors import InputError
from focusattn.focus import router as R
from focusattn.focus.config import FocusConfig
from focusattn.hf import last_routing
from focusattn.hf.kv import cache_kwargs, output_cache
from tests.conftest import V, tiny_model


def _reference(groups, cfg, mask, block):
    """Token by token: a token of block ``[s, s + block)`` ranks only the groups whose key-membership count over the
    real tokens before ``s`` is at most ``capacity`` times the balanced share of that count."""
    b, t, k = groups.shape
    out = torch.zeros(b, t, k, dtype=torch.bool)
    for row in range(b):
        for p in range(t):
            s = p // block * block
            counts = out[row, :s][mask[row, :s]].sum(0).float() if s else torch.zeros(k)
            full = counts > cfg.capacity * counts.sum() / k
            score = groups[row, p].masked_fill(full, -1.0)
            out[row, p, score.topk(cfg.served_key_top_k).indices] = True
    return out


@settings(max_examples=40, deadline=None)
@given(t=st.integers(1, 40), k=st.integers(2, 6), top_k=st.integers(1, 2), cap=st.floats(1.0, 3.0),
       block=st.integers(1, 9), pad=st.integers(0, 5), seed=st.integers(0, 99))
def test_served_memberships_match_the_token_by_token_reference(t, k, top_k, cap, block, pad, seed):
    top_k = min(top_k, k - 1)
    cap = max(cap, k / (k - top_k + 1))
    cfg = FocusConfig(num_groups=k, top_k=top_k, capacity=cap)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, t, k, generator=g) + torch.tensor([3.0] + [0.0] * (k - 1))  # one group everyone wants
    groups = torch.softmax(logits, -1)
    mask = torch.ones(2, t, dtype=torch.bool)
    mask[1, :min(pad, t)] = False  # left padding stays out of the counts
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "CAPACITY_BLOCK", block)
        mem, qmem = R.served_memberships(groups, cfg, mask=mask)
    assert qmem is None
    assert torch.equal(mem, _reference(groups, cfg, mask, block))
    assert (mem.sum(-1) == top_k).all()


def test_no_group_grows_past_its_cap_plus_one_block():
    cfg = FocusConfig(num_groups=8, top_k=1, capacity=1.5)
    logits = torch.randn(1, 3000, 8, generator=torch.Generator().manual_seed(0)) + torch.tensor([4.0] + [0.0] * 7)
    mem, _ = R.served_memberships(torch.softmax(logits, -1), cfg)
    uncapped = R.hard_memberships(torch.softmax(logits, -1), cfg)[0]
    counts = mem[0].cumsum(0).float()  # per position: each group's tokens so far
    n = torch.arange(1, 3001)[:, None]
    assert (counts <= 1.5 * n / 8 + R.CAPACITY_BLOCK).all()
    assert uncapped[0].sum(0).max() > 2000  # the cap, not the scores, kept the groups this small


def test_roles_rank_the_capped_scores_and_a_query_group_stays_one_of_the_key_groups():
    cfg = FocusConfig(num_groups=6, top_k=1, key_top_k=2, capacity=1.5)
    groups = torch.softmax(torch.randn(1, 500, 6) + torch.tensor([3.0, 2.0, 0, 0, 0, 0]), -1)
    key, query = R.served_memberships(groups, cfg)
    assert (key.sum(-1) == 2).all() and (query.sum(-1) == 1).all()
    assert (query <= key).all()
    assert key[0].sum(0).max() <= 1.5 * 2 * 500 / 6 + 2 * R.CAPACITY_BLOCK


@pytest.mark.parametrize("rebalance,warm,rate", [(0, False, 0.0), (7, True, 0.0), (0, False, 0.2)])
def test_prefill_plus_decode_steps_equal_one_prefill(rebalance, warm, rate, monkeypatch):
    """With the cap, decode steps (the lean step, and the general one where an interval starts) continue the
    prefill's counts: memberships and logits equal one full forward's, left padding included."""
    monkeypatch.setattr(R, "CAPACITY_BLOCK", 5)
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, capacity=1.2, rebalance=rebalance,
                                 rebalance_warm=warm, global_rate=rate)).eval()
    x = torch.randint(1, V, (2, 40))
    mask = torch.ones(2, 40, dtype=torch.long)
    mask[0, :4] = 0
    with torch.no_grad():
        full = m(x, attention_mask=mask).logits
        whole = [r.membership.clone() for r in last_routing(m)]
        out = m(x[:, :17], attention_mask=mask[:, :17], use_cache=True)
        cache, logits = output_cache(out), [out.logits]
        for i in range(17, 40):
            out = m(x[:, i:i + 1], attention_mask=mask[:, :i + 1], **cache_kwargs(m, cache), use_cache=True)
            cache = output_cache(out)
            logits.append(out.logits)
    for layer, r in enumerate(last_routing(m)):
        assert torch.equal(r.membership, whole[layer])
    torch.testing.assert_close(torch.cat(logits, 1)[1], full[1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(torch.cat(logits, 1)[0, 4:], full[0, 4:], atol=1e-4, rtol=1e-4)


@settings(max_examples=40, deadline=None)
@given(t=st.integers(2, 60), k=st.integers(2, 6), top_k=st.integers(1, 2), cap=st.sampled_from([0.0, 1.0, 1.5, 3.0]),
       block=st.integers(1, 9), ties=st.booleans(), seed=st.integers(0, 99))
def test_one_token_steps_on_the_host_equal_the_tensor_path(t, k, top_k, cap, block, ties, seed):
    """The decode steps of one sequence decided on the host (:func:`one_token_groups`) continue a prefill's
    memberships and counts exactly like the tensor path, ties (underflowed probabilities) and block starts
    included, and hand their counts back to it."""
    top_k = min(top_k, k - 1)
    cap = cap and max(cap, k / (k - top_k + 1))
    cfg = FocusConfig(num_groups=k, top_k=top_k, capacity=cap)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1, t, k, generator=g) * (60.0 if ties else 1.0) + torch.tensor([3.0] + [0.0] * (k - 1))
    groups = torch.softmax(logits, -1)  # x 60: most probabilities underflow to 0, so top-2 ties often
    start = max(1, t // 3)
    host = 0
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(R, "CAPACITY_BLOCK", block)
        whole, _ = R.served_memberships(groups, cfg)
        memo: dict = {}
        rows = [R.served_memberships(groups[:, :start], cfg, memo=memo)[0]]
        for i in range(start, t):
            gs = R.one_token_groups(groups[:, i:i + 1], cfg, start=i, memo=memo)
            mem = None if gs is None else R._row(k, gs, groups.device)
            host += mem is not None
            if mem is None:
                mem = R.served_memberships(groups[:, i:i + 1], cfg, start=i, memo=memo)[0]
            rows.append(mem)
    assert torch.equal(torch.cat(rows, 1), whole)
    if not cap and not ties and top_k == 1:
        assert host == t - start  # nothing to send to the tensor path


def test_one_token_steps_of_a_served_model_take_the_host_path(monkeypatch):
    """One sequence's decode steps with the cap, online rebalancing and global keys: most steps decided on the
    host, and the logits and memberships those of one prefill."""
    monkeypatch.setattr(R, "CAPACITY_BLOCK", 5)
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, capacity=1.2, rebalance=7, rebalance_warm=True,
                                 global_rate=0.2)).eval()
    calls = []
    real = R.one_token_groups
    monkeypatch.setattr(R, "one_token_groups", lambda *a, **kw: calls.append(real(*a, **kw)) or calls[-1])
    x = torch.randint(1, V, (1, 40))
    with torch.no_grad():
        full = m(x).logits
        whole = [r.membership.clone() for r in last_routing(m)]
        out = m(x[:, :17], use_cache=True)
        cache, logits = output_cache(out), [out.logits]
        for i in range(17, 40):
            out = m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True)
            cache = output_cache(out)
            logits.append(out.logits)
    for layer, r in enumerate(last_routing(m)):
        assert torch.equal(r.membership, whole[layer])
    torch.testing.assert_close(torch.cat(logits, 1), full, atol=1e-4, rtol=1e-4)
    assert sum(c is not None for c in calls) > len(calls) / 2


def test_a_step_without_the_earlier_counts_is_an_error():
    cfg = FocusConfig(num_groups=4, top_k=1, capacity=1.5)
    r = R.FocusRouter(16, cfg).eval()
    with torch.no_grad(), pytest.raises(ValueError, match="capacity needs the group counts of the 10 earlier"):
        r(torch.randn(1, 1, 16), start=10, memo={})


def test_the_cap_changes_groups_only_where_the_uncapped_ones_overflow():
    cfg = FocusConfig(num_groups=4, top_k=1, capacity=1.5)
    r = R.FocusRouter(16, cfg).eval()
    h = torch.randn(1, 300, 16)
    with torch.no_grad():
        capped = r(h).membership
        r.cfg = dataclasses.replace(cfg, capacity=0.0)
        plain = r(h).membership
    assert torch.equal(capped[:, :R.CAPACITY_BLOCK], plain[:, :R.CAPACITY_BLOCK])  # nothing counted before 64
    assert capped[0].sum(0).max() <= plain[0].sum(0).max()


@pytest.mark.parametrize("bad,match", [
    (dict(capacity=-1.0), "capacity"),
    (dict(capacity=0.5), "capacity.*float >= 1"),
    (dict(capacity=True), "capacity"),
    (dict(capacity=1.5, routing="sequence"), "capacity.*causal"),
    (dict(capacity=1.1, top_k=2), r"capacity.*1.143 = K / \(K - k \+ 1\)"),
    (dict(capacity=1.2, top_k=1, key_top_k=3), r"capacity.*1.333"),
])
def test_bad_capacity_is_one_line_naming_the_field(bad, match):
    with pytest.raises(InputError, match=match):
        FocusConfig(num_groups=8, **bad)


def test_retrofit_cli_takes_the_cap():
    import argparse

    from focusattn.train.cli import add_focus_args, focus_from_args

    p = argparse.ArgumentParser()
    add_focus_args(p)
    assert focus_from_args(p.parse_args(["--capacity", "1.5"])).capacity == 1.5
    assert focus_from_args(p.parse_args([])).capacity == 0
