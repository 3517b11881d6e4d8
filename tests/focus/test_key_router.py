"""The key-space router (``FocusConfig.router_input="keys"``): its budget rule against a one-query-at-a-time
reference, causal (chunked prefill = one prefill), padding-invariant, and the config's errors."""
from unittest.mock import patch

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn._errors import InputError
from focusattn.focus.config import FocusConfig
from focusattn.focus import key_router
from focusattn.focus.key_router import KeyRouter, key_features


def _router(k_groups, width, window, sink, budget, seed=0, key_scores="centroids", rank_block=0, rank_own=0,
            union_block=0, min_keys=0):
    cfg = FocusConfig(num_groups=k_groups, group_dim=width, window=window, sink_tokens=sink, router_input="keys",
                      top_k=1, budget=budget, key_scores=key_scores, rank_block=rank_block,
                      rank_own=rank_own, union_block=union_block, min_keys=min_keys)
    r = KeyRouter(width, cfg)
    r.centroids.copy_(torch.randn(k_groups, width, generator=torch.Generator().manual_seed(seed)))
    return r


def _features(seed, b, t, width, padded):
    """Router inputs ``[b, t, 2 * width]`` and their real tokens (left padding when ``padded``). Integer-valued
    features plus a small jitter: no near-ties between scores, so the reference's order is the router's."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(-4, 5, (b, t, 2 * width), generator=g).float() + torch.rand(b, t, 2 * width, generator=g) / 8
    valid = torch.ones(b, t, dtype=torch.bool)
    if padded:
        valid[:, : int(torch.randint(0, t, (1,), generator=g))] = False
    return h, valid


def _reference(r: KeyRouter, h: torch.Tensor, valid: torch.Tensor):
    """One query at a time, with plain Python: its distant keys (real, not among the first ``sink`` real tokens,
    distance > window) per group, then groups holding some of them in descending score until the budget (the
    share, at least ``min_keys`` or all of them; the crossing one when nearer), at least the best one. Scores: the
    query against the centroids, or with ``key_scores="means"`` against the mean of each group's real, non-sink
    keys before ``lim`` (the query's position less the window, rounded down to ``MEANS_BLOCK``, at least 0), the
    centroid counted as one more key.
    With ``rank_block = B`` a query in the ``n``-th block of ``B`` real tokens (n > 0) ranks by the mean of those
    scores over the real queries of block ``n - 1``, after its own best ``rank_own`` groups. With ``union_block = B``
    a query then also keeps the groups of the real queries of its block of ``B`` real tokens up to it and of the
    block before."""
    cfg, w = r.cfg, r.width
    c = r.centroids
    b, t, _ = h.shape
    ids = ((h[..., :w, None] - c.t()[None, None]) ** 2).sum(-2).argmin(-1)  # nearest centroid
    scores = h[..., w:] @ c.t()
    out = torch.zeros(b, t, cfg.num_groups, dtype=torch.bool)
    for bi in range(b):
        rank = torch.cumsum(valid[bi].long(), 0)
        for i in range(t):
            if cfg.key_scores == "means":
                lim = max(0, (i - cfg.window) // key_router.MEANS_BLOCK * key_router.MEANS_BLOCK)
                for g in range(cfg.num_groups):
                    members = [j for j in range(lim) if valid[bi, j] and rank[j] > cfg.sink_tokens
                               and int(ids[bi, j]) == g]
                    mean = (c[g] + sum((h[bi, j, :w] for j in members), torch.zeros(w))) / (len(members) + 1)
                    scores[bi, i, g] = h[bi, i, w:] @ mean
        lead = [[] for _ in range(t)]
        if cfg.rank_block:
            block = [max(0, (int(rank[i]) - 1) // cfg.rank_block) for i in range(t)]
            own = scores[bi].clone()
            for i in range(t):
                prev = [j for j in range(t) if valid[bi, j] and block[j] == block[i] - 1]
                if prev:
                    scores[bi, i] = (sum(own[j].double() for j in prev) / len(prev)).float()
                    lead[i] = sorted(range(cfg.num_groups), key=lambda g: -float(own[i, g]))[:cfg.rank_own]
        for i in range(t):
            counts = [0] * cfg.num_groups
            for j in range(t):
                if j < i - cfg.window and valid[bi, j] and rank[j] > cfg.sink_tokens:
                    counts[int(ids[bi, j])] += 1
            want = max(round(cfg.budget * sum(counts)), min(cfg.min_keys, sum(counts)))
            order = lead[i] + [g for g in sorted(range(cfg.num_groups), key=lambda g: -float(scores[bi, i, g]))
                               if g not in lead[i]]
            before = 0
            for g in order:
                after = before + counts[g]
                if counts[g] and before < want and (after <= want or after - want <= want - before):
                    out[bi, i, g] = True
                before = after
            if not out[bi, i].any():
                out[bi, i, order[0]] = True
        if cfg.union_block:
            block = [max(0, (int(rank[i]) - 1) // cfg.union_block) for i in range(t)]
            own = out[bi].clone()
            for i in range(t):
                for j in range(t):
                    if valid[bi, j] and (block[j] == block[i] - 1 or (block[j] == block[i] and j <= i)):
                        out[bi, i] |= own[j]
    return ids, out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), t=st.integers(1, 40), k_groups=st.integers(1, 6),
       window=st.sampled_from([0, 1, 3, 8]), sink=st.sampled_from([0, 1, 2]),
       budget=st.sampled_from([0.05, 0.3, 0.5, 1.0]), padded=st.booleans(), split=st.integers(0, 40),
       min_keys=st.sampled_from([0, 0, 2, 7]))
def test_budget_rule_matches_the_one_query_reference_and_is_causal(seed, b, t, k_groups, window, sink, budget,
                                                                    padded, split, min_keys):
    """``min_keys``: a floor under the share (all of a query's distant keys when it has fewer)."""
    width = 4
    h, valid = _features(seed, b, t, width, padded)
    r = _router(k_groups, width, window, sink, budget, seed, min_keys=min_keys)
    ids, want = _reference(r, h, valid)
    routing = r(h, mask=valid if padded else None, memo={})
    assert torch.equal(routing.membership, torch.nn.functional.one_hot(ids, k_groups).bool())
    rows = valid[..., None]  # padded queries see nothing real: their groups do not matter
    assert torch.equal(routing.query_membership & rows, want & rows)
    # causal: a prefill of the first `split` tokens, then the rest as steps, gives the same memberships
    split = min(split, t - 1)
    if split > 0:
        memo = {}
        first = r(h[:, :split], mask=valid[:, :split] if padded else None, memo=memo)
        rest = r(h[:, split:], mask=valid[:, split:] if padded else None, start=split, memo=memo)
        got = torch.cat([first.query_membership, rest.query_membership], 1)
        assert torch.equal(got & rows, routing.query_membership & rows)


def _served_reference_steps(r, h, valid, padded, split, block):
    """``(served, reference, stepped)`` query memberships on real rows: the one prefill, :func:`_reference`, and a
    prefill of ``split`` tokens then one-token steps (``MEANS_BLOCK`` patched to ``block``)."""
    t = h.shape[1]
    rows = valid[..., None]
    with patch.object(key_router, "MEANS_BLOCK", block):
        ids, want = _reference(r, h, valid)
        routing = r(h, mask=valid if padded else None, memo={})
        split = min(split, t - 1)
        memo, got = {}, []
        if split > 0:
            got.append(r(h[:, :split], mask=valid[:, :split] if padded else None, memo=memo).query_membership)
        for i in range(split, t):
            got.append(r(h[:, i:i + 1], mask=valid[:, i:i + 1] if padded else None, start=i,
                         memo=memo).query_membership)
    return routing.query_membership & rows, want & rows, torch.cat(got, 1) & rows


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), t=st.integers(1, 40), k_groups=st.integers(1, 6),
       window=st.sampled_from([0, 1, 3, 8]), sink=st.sampled_from([0, 1, 2]), block=st.sampled_from([1, 3, 4]),
       budget=st.sampled_from([0.05, 0.3, 0.5, 1.0]), padded=st.booleans(), split=st.integers(0, 40))
def test_mean_scores_match_the_reference_and_steps_give_the_prefill(seed, b, t, k_groups, window, sink, block, budget,
                                                                    padded, split):
    """``key_scores="means"``: the budget rule over the sequence's own group means (the reference, block-granular
    ``lim``); a prefill of ``split`` tokens then one-token steps give the one prefill's groups (the means' state
    crosses block boundaries in the steps)."""
    width = 4
    h, valid = _features(seed, b, t, width, padded)
    r = _router(k_groups, width, window, sink, budget, seed, key_scores="means")
    served, reference, stepped = _served_reference_steps(r, h, valid, padded, split, block)
    assert torch.equal(served, reference)
    assert torch.equal(stepped, served)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), t=st.integers(1, 40), k_groups=st.integers(1, 6),
       window=st.sampled_from([0, 3, 8]), sink=st.sampled_from([0, 1]), rank_block=st.sampled_from([1, 2, 3, 5]),
       rank_own=st.sampled_from([0, 1, 2]),
       key_scores=st.sampled_from(["centroids", "means"]), budget=st.sampled_from([0.05, 0.3, 0.5]),
       padded=st.booleans(), split=st.integers(0, 40))
def test_shared_rankings_match_the_reference_and_steps_give_the_prefill(seed, b, t, k_groups, window, sink,
                                                                        rank_block, rank_own, key_scores, budget,
                                                                        padded, split):
    """``rank_block``: each block of real tokens ranks by the previous block's mean scores, after each query's own
    best ``rank_own`` groups (the reference); a
    prefill of ``split`` tokens then one-token steps give the one prefill's groups, across block boundaries and
    left padding (blocks count real tokens)."""
    width = 4
    h, valid = _features(seed, b, t, width, padded)
    r = _router(k_groups, width, window, sink, budget, seed, key_scores=key_scores, rank_block=rank_block,
                rank_own=rank_own)
    served, reference, stepped = _served_reference_steps(r, h, valid, padded, split, 4)
    assert torch.equal(served, reference)
    assert torch.equal(stepped, served)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), t=st.integers(1, 40), k_groups=st.integers(1, 6),
       window=st.sampled_from([0, 3, 8]), sink=st.sampled_from([0, 1]), union_block=st.sampled_from([1, 2, 3, 5]),
       rank_block=st.sampled_from([0, 3]), key_scores=st.sampled_from(["centroids", "means"]),
       budget=st.sampled_from([0.05, 0.3, 0.5]), padded=st.booleans(), split=st.integers(0, 40))
def test_block_unions_match_the_reference_and_steps_give_the_prefill(seed, b, t, k_groups, window, sink, union_block,
                                                                     rank_block, key_scores, budget, padded, split):
    """``union_block``: a query keeps its own groups and those of its block's earlier real queries and of the block
    before (the reference); a prefill of ``split`` tokens then one-token steps give the one prefill's groups, across
    block boundaries and left padding (blocks count real tokens)."""
    width = 4
    h, valid = _features(seed, b, t, width, padded)
    r = _router(k_groups, width, window, sink, budget, seed, key_scores=key_scores, rank_block=rank_block,
                union_block=union_block)
    served, reference, stepped = _served_reference_steps(r, h, valid, padded, split, 4)
    assert torch.equal(served, reference)
    assert torch.equal(stepped, served)


def test_block_unions_keep_what_the_keyed_engine_computes():
    """Why ``union_block``: the keyed engine computes, per block of 64 queries, every key of the groups its queries
    joined. With own groups a row keeps a fraction of that; with unions of the same own groups, each block's
    computed groups are its own and the previous block's, and a query keeps most of them."""
    torch.manual_seed(0)
    h = torch.randn(1, 512, 16)
    own = _router(32, 8, 16, 1, 0.05)(h).query_membership[0]
    union = _router(32, 8, 16, 1, 0.05, union_block=64)(h).query_membership[0]
    assert bool((own & ~union).sum() == 0)  # a query's own groups are kept
    for i in range(64, 512, 64):
        blk, prev = own[i:i + 64].any(0), own[i - 64:i].any(0)
        assert torch.equal(union[i:i + 64].any(0), blk | prev)
        assert float(union[i:i + 64].sum()) > 2 * float(own[i:i + 64].sum())


def test_a_prefills_memo_holds_its_last_rows_not_the_whole_prefill():
    """What the memo carries to the next call does not grow with the prompt: the prefill's [B, T, ...] tensors it
    slices are copied, not kept alive by a view (30 layers of them held 600 MiB after an 8192-token prefill)."""
    def held(t):
        memo = {}
        _router(32, 8, 16, 1, 0.05, key_scores="means", union_block=32, min_keys=8)(torch.randn(1, t, 16), memo=memo)
        tensors = [v for part in memo.values() for v in part.values() if isinstance(v, torch.Tensor)]
        return sum(x.untyped_storage().nbytes() for x in tensors)

    assert held(4096) == held(1024)


def test_shared_rankings_make_a_blocks_groups_nested():
    """Why ``rank_block``: queries of one block fill their budgets from one order, so each query's groups are a
    prefix of the block's last query's order, and the block's union is far smaller than with own rankings."""
    torch.manual_seed(0)
    h = torch.randn(1, 512, 16)
    own = _router(32, 8, 16, 1, 0.2)(h).query_membership[0]
    shared = _router(32, 8, 16, 1, 0.2, rank_block=64)(h).query_membership[0]
    u_own = sum(int(own[i:i + 64].any(0).sum()) for i in range(0, 512, 64))
    u_shared = sum(int(shared[i:i + 64].any(0).sum()) for i in range(0, 512, 64))
    assert u_shared < u_own / 2
    for i in range(64, 512, 64):  # within a block, the sets are nested (a query with more distant keys takes more)
        blk = shared[i:i + 64]
        sizes = blk.sum(-1)
        big = blk[sizes.argmax()]
        assert bool((blk & ~big).sum() == 0)


def test_random_key_routing_is_a_budget_baseline_of_positions_only():
    """``routing="random"`` (long-eval's random baseline for a key-space adapter): each key a random group and each
    query ranking the groups at random, by absolute position (not the text), filled to the same budget; a prefill
    then steps give the same groups as one prefill."""
    cfg = FocusConfig(num_groups=6, group_dim=4, window=3, sink_tokens=1, router_input="keys", top_k=1,
                      budget=0.3, routing="random")
    r = KeyRouter(4, cfg)
    a, b = torch.randn(1, 50, 8), torch.randn(1, 50, 8)
    ra, rb = r(a), r(b)
    assert torch.equal(ra.membership, rb.membership) and torch.equal(ra.query_membership, rb.query_membership)
    assert ra.membership.sum(-1).eq(1).all() and len(ra.membership[0].float().argmax(-1).unique()) > 1
    memo = {}
    first = r(a[:, :20], memo=memo)
    rest = r(a[:, 20:], start=20, memo=memo)
    assert torch.equal(torch.cat([first.query_membership, rest.query_membership], 1), ra.query_membership)
    # the budget: a late query keeps about 30% of its distant keys (whole groups, the crossing one when nearer)
    ids = ra.membership[0].float().argmax(-1)
    i = 49
    distant = torch.arange(50) < i - 3
    distant[0] = False  # the sink
    kept = ra.query_membership[0, i][ids] & distant
    assert abs(int(kept.sum()) - 0.3 * int(distant.sum())) <= int(torch.bincount(ids[distant]).max())


def test_left_padding_does_not_change_the_real_tokens_groups():
    r = _router(5, 4, 2, 1, 0.3)
    h = torch.randn(1, 30, 8, generator=torch.Generator().manual_seed(3))
    plain = r(h)
    pad = torch.cat([torch.randn(1, 6, 8), h], 1)
    valid = torch.ones(1, 36, dtype=torch.bool)
    valid[:, :6] = False
    padded = r(pad, mask=valid)
    assert torch.equal(padded.query_membership[:, 6:], plain.query_membership)
    assert torch.equal(padded.membership[:, 6:], plain.membership)


def test_a_step_without_the_earlier_groups_is_refused():
    r = _router(4, 4, 2, 1, 0.3)
    with pytest.raises(ValueError, match="groups of the 5 earlier tokens"):
        r(torch.randn(1, 1, 8), start=5, memo={})


def test_key_features_put_keys_then_group_mean_queries():
    q = torch.randn(2, 4, 3, 5)  # Hq = 4, Hkv = 2, 3 new queries
    k = torch.randn(2, 2, 7, 5)  # 7 keys, the last 3 new
    f = key_features(q, k)
    assert f.shape == (2, 3, 20)
    assert torch.equal(f[0, 1, :5], k[0, 0, 5])
    assert torch.equal(f[0, 1, 5:10], k[0, 1, 5])
    torch.testing.assert_close(f[0, 1, 10:15], (q[0, 0, 1] + q[0, 1, 1]) / 2)


@pytest.mark.parametrize("changes, field", [
    (dict(budget=0.0), "budget"),
    (dict(budget=1.5), "budget"),
    (dict(top_k=None), "top_k"),
    (dict(top_k=2), "top_k"),
    (dict(rebalance=64), "rebalance"),
    (dict(capacity=1.5), "capacity"),
    (dict(key_top_k=2), "key_top_k"),
    (dict(routing="sequence"), "routing"),
    (dict(routing="x"), "routing"),
    (dict(router_input="values"), "router_input"),
    (dict(key_scores="medians"), "key_scores"),
    (dict(rank_block=-1), "rank_block"),
    (dict(rank_block=True), "rank_block"),
    (dict(rank_block=1.5), "rank_block"),
    (dict(rank_own=1), "rank_own"),
    (dict(rank_block=64, rank_own=-1), "rank_own"),
    (dict(union_block=-1), "union_block"),
    (dict(union_block=True), "union_block"),
    (dict(min_keys=-1), "min_keys"),
    (dict(min_keys=1.5), "min_keys"),
    (dict(min_keys=True), "min_keys"),
])
def test_bad_key_router_configs_name_the_field(changes, field):
    kw = dict(num_groups=8, router_input="keys", top_k=1, budget=0.2) | changes
    with pytest.raises(InputError) as e:
        FocusConfig(**kw)
    assert e.value.param == field


def test_a_budget_needs_the_key_router():
    with pytest.raises(InputError, match="budget"):
        FocusConfig(budget=0.2)
    with pytest.raises(InputError, match="key_scores"):
        FocusConfig(key_scores="means")
    with pytest.raises(InputError, match="rank_block"):
        FocusConfig(rank_block=64)
    with pytest.raises(InputError, match="union_block"):
        FocusConfig(union_block=64)
    with pytest.raises(InputError, match="min_keys"):
        FocusConfig(min_keys=128)
    assert FocusConfig(num_groups=8, router_input="keys", top_k=1, budget=0.2).roles
