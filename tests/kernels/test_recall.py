"""Attention recall math against the plainest statement of it: full [H, T, T] probabilities, masks written pair by
pair."""
import torch
from hypothesis import given, settings, strategies as st

from focusattn.kernels import recall as R
from focusattn.kernels.reference import focus_allowed, masked_attention
from tests.conftest import assert_close, focus_case


def _full_probs(q, k):
    t = k.shape[2]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    s = (q @ R.expand_kv(k, q.shape[1]).transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(s.masked_fill(~causal, float("-inf")), -1)


def _kinds(t, window, sink):
    local, sinks, distant = (torch.zeros(t, t, dtype=torch.bool) for _ in range(3))
    for i in range(t):
        for j in range(i + 1):
            if i - j <= window:
                local[i, j] = True
            elif j < sink:
                sinks[i, j] = True
            else:
                distant[i, j] = True
    return local, sinks, distant


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), t=st.integers(1, 40), window=st.integers(0, 8), sink=st.integers(0, 2),
       top_k=st.integers(1, 2), rows=st.integers(1, 16), hkv=st.sampled_from([1, 2]))
def test_layer_recall_matches_pairwise_sums(seed, t, window, sink, top_k, rows, hkv):
    q, k, _, member = focus_case(seed, 2, 4, hkv, t, t, 4, top_k)
    got = R.layer_recall(q, k, {"m": R.shared_group_keep(member)}, window=window, sink=sink, oracle_of=("m",),
                         windows={"w": window + 3}, rows=rows)
    p = _full_probs(q, k).double()
    local, sinks, distant = _kinds(t, window, sink)
    for name, m in (("local", local), ("sink", sinks), ("distant", distant)):
        assert_close(got["mass"][name], (p * m).sum((0, 2, 3)), atol=1e-5, name=name)
    # the Focus mask's distant pairs are exactly the reference mask's pairs that are neither local nor sinks
    ref = focus_allowed(member, window, t, torch.arange(t)[None] < sink) & distant
    assert_close(got["kept"]["m"], (p * ref[:, None]).sum((0, 2, 3)), atol=1e-5, name="kept")
    assert got["keys"]["m"] == int(ref.sum())
    wide = distant & (torch.arange(t)[:, None] - torch.arange(t)[None] <= window + 3)
    assert_close(got["kept"]["w"], (p * wide).sum((0, 2, 3)), atol=1e-5, name="window")
    # the oracle keeps the same number of keys per query, and at least as much head-mean mass as any such choice
    pbar = p.mean(1)
    budget = ref.sum(-1)
    assert got["keys"]["oracle@m"] == int(budget.sum())
    best = sum(float(torch.sort(pbar[b, i][distant[i]], descending=True).values[:int(budget[b, i])].sum())
               for b in range(2) for i in range(t))
    assert abs(float(got["kept"]["oracle@m"].sum()) / 4 - best) < 1e-5
    assert float(got["kept"]["oracle@m"].sum()) >= float(got["kept"]["m"].sum()) - 1e-6


def test_summary_shares_and_full_mask():
    q, k, _, member = focus_case(3, 1, 2, 1, 32, 32, 4, 1)
    everything = torch.ones(1, 32, 4, dtype=torch.bool)  # every token in every group: nothing dropped
    s = R.summarize_recall(R.layer_recall(q, k, {"all": R.shared_group_keep(everything),
                                                 "top1": R.shared_group_keep(member)}, window=4, sink=1))
    assert abs(sum(s["share"].values()) - 1) < 1e-6
    assert s["masks"]["all"]["dropped_distant"] < 1e-9
    assert 0 < s["masks"]["top1"]["dropped_distant"] < 1
    assert len(s["masks"]["top1"]["dropped_distant_per_head"]) == 2
    assert abs(s["distant_keys_per_query"] - s["masks"]["all"]["keys_per_query"]) < 1e-9


def test_add_recall_is_a_sum():
    q, k, _, member = focus_case(5, 2, 2, 2, 24, 24, 4, 2)
    masks = {"m": R.shared_group_keep(member)}
    both = R.layer_recall(q, k, masks, window=3, sink=1, oracle_of=("m",))
    first = R.layer_recall(q[:1], k[:1], {"m": R.shared_group_keep(member[:1])}, window=3, sink=1, oracle_of=("m",))
    second = R.layer_recall(q[1:], k[1:], {"m": R.shared_group_keep(member[1:])}, window=3, sink=1,
                            oracle_of=("m",))
    total = R.add_recall(first, second)
    assert total["queries"] == both["queries"] and total["keys"] == both["keys"]
    assert_close(total["kept"]["oracle@m"], both["kept"]["oracle@m"], name="oracle")


def test_oracle_keep_counts_and_choice():
    pbar = torch.tensor([[[0.1, 0.5, 0.2, 0.2, 0.0], [0.3, 0.1, 0.4, 0.05, 0.15]]])
    distant = torch.tensor([[True, True, True, False, False], [True, True, True, True, False]])
    keep = R.oracle_keep(pbar, distant, torch.tensor([[2, 0]]))
    assert keep.tolist() == [[[False, True, True, False, False], [False] * 5]]
    keep = R.oracle_keep(pbar, distant, torch.tensor([[9, 3]]))  # more than exist: all of them
    assert keep[0, 0].tolist() == [True, True, True, False, False]
    assert keep[0, 1].tolist() == [True, True, True, False, False]  # 0.4, 0.3, 0.1 of the four distant


def test_kmeans_clusters_separate_blobs_and_score_queries():
    g = torch.Generator().manual_seed(0)
    k = torch.cat([torch.randn(1, 1, 32, 8, generator=g) + 20, torch.randn(1, 1, 32, 8, generator=g) - 20], 2)
    q = torch.randn(1, 2, 64, 8, generator=g)
    cluster, scores = R.kmeans_key_clusters(q, k, 2)
    assert cluster.shape == (1, 64) and scores.shape == (1, 64, 2)
    assert len(set(cluster[0, :32].tolist())) == 1 and len(set(cluster[0, 32:].tolist())) == 1
    assert cluster[0, 0] != cluster[0, 32]
    cents = torch.stack([k[0, 0, :32].mean(0), k[0, 0, 32:].mean(0)])[cluster[0, [0, 32]]]
    want = q[0].mean(0) @ cents.t()  # the KV group's mean query against each cluster's mean key
    assert_close(scores[0], want, atol=1e-4, name="scores")
    c2, s2 = R.kmeans_key_clusters(q, k, centroids=cents)  # given centroids are used as they are
    assert torch.equal(c2[0], torch.tensor([0] * 32 + [1] * 32)) and torch.allclose(s2[0], want, atol=1e-4)
    c3, _ = R.kmeans_key_clusters(q[:, :, :3], k[:, :, :3], 8)  # fewer keys than clusters
    assert c3.shape == (1, 3)
    assert R.kmeans_key_clusters(q, k)[1].shape[-1] == 64 // R.KMEANS_CLUSTER_KEYS  # one per 16 keys by default


def _budget_reference(cluster, scores, want, window, sink):
    """One query at a time: its distant keys per cluster, clusters by score, the one crossing the budget taken
    when that lands nearer it."""
    b, t = cluster.shape
    keep = torch.zeros(b, t, t, dtype=torch.bool)
    for bi in range(b):
        for i in range(t):
            distant = [j for j in range(sink, t) if i - j > window]
            count = {c: sum(1 for j in distant if cluster[bi, j] == c) for c in range(scores.shape[-1])}
            got, chosen = 0, set()
            for c in sorted(count, key=lambda c: -float(scores[bi, i, c])):
                w = int(want[bi, i])
                if got >= w or (got + count[c] > w and got + count[c] - w > w - got):
                    break
                chosen.add(c)
                got += count[c]
            for j in distant:
                keep[bi, i, j] = int(cluster[bi, j]) in chosen
    return keep


@settings(max_examples=25, deadline=None)
@given(t=st.integers(1, 24), c=st.integers(1, 6), window=st.integers(0, 5), sink=st.integers(0, 2),
       seed=st.integers(0, 10_000))
def test_cluster_budget_keep_matches_the_one_query_reference(t, c, window, sink, seed):
    g = torch.Generator().manual_seed(seed)
    cluster = torch.randint(0, c, (2, t), generator=g)
    scores = torch.randn(2, t, c, generator=g).double()  # distinct scores: one order
    ref = torch.rand(2, t, t, generator=g) < 0.4
    budget = lambda r0, r1, probs=None: ref[:, r0:r1]  # noqa: E731
    keep = R.cluster_budget_keep(cluster, scores, budget, window=window, sink=sink)
    got = torch.cat([keep(r0, min(t, r0 + 5)) for r0 in range(0, t, 5)], 1)
    distant = R.pair_kinds(0, t, t, window, sink)[2]
    want = _budget_reference(cluster, scores, (ref & distant).sum(-1), window, sink)
    assert torch.equal(got, want)
    assert not (got & ~distant).any()  # distant pairs only, causal


def test_cluster_budget_keep_follows_the_budget():
    # one key per cluster: the selection meets every query's budget exactly
    t = 40
    cluster = torch.arange(t)[None]
    scores = torch.randn(1, t, t, generator=torch.Generator().manual_seed(1))
    distant = R.pair_kinds(0, t, t, 4, 1)[2]
    ref = distant[None] & (torch.rand(1, t, t, generator=torch.Generator().manual_seed(2)) < 0.3)
    keep = R.cluster_budget_keep(cluster, scores, lambda r0, r1, probs=None: ref[:, r0:r1], window=4, sink=1)
    assert torch.equal(keep(0, t).sum(-1), ref.sum(-1))


def test_causal_probs_rows_match_reference():
    q, k, v, _ = focus_case(7, 1, 4, 2, 20, 20, 4, 1)
    p = torch.cat([R.causal_probs(q, k, r, min(20, r + 6)) for r in range(0, 20, 6)], 2)
    assert_close(p, _full_probs(q, k), atol=1e-6, name="probs")
    causal = torch.ones(20, 20, dtype=torch.bool).tril()
    assert_close(p @ R.expand_kv(v, 4), masked_attention(q, k, v, causal), atol=1e-5, name="out")


def test_row_distance_is_rows_of_relative_distance():
    from focusattn.kernels.common import relative_distance, row_distance

    for r0, r1, t in ((0, 5, 9), (3, 9, 9), (4, 4, 9), (0, 9, 9)):
        assert torch.equal(row_distance(r0, r1, t), relative_distance(t, t)[r0:r1])


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), rows=st.integers(1, 30), c=st.integers(1, 700),
       frac=st.sampled_from([0.0, 0.01, 0.12, 0.5, 1.0]), skew=st.booleans(), batch=st.booleans())
def test_fill_budget_partial_ranking_is_the_full_sort(seed, rows, c, frac, skew, batch):
    """The staged top-k of fill_budget gives the full sort's answer, also for rows that need more than one or two
    stages (``skew``: the best-scored clusters are empty, so the budget is reached late; C up to 700 takes the
    32-, 128- and 512-cluster stages), with leading batch dims, on every cluster that holds keys; an empty cluster
    (it adds no key) is never taken."""
    from focusattn.kernels.recall import _fill_sorted, fill_budget

    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(0, 40, (rows, c), generator=g)
    scores = torch.randn(rows, c, generator=g)
    if skew:
        counts = torch.where(scores > 0.5, torch.zeros_like(counts), counts)
    want = torch.round(frac * counts.sum(-1).double()).long()
    full = _fill_sorted(counts, want, scores.argsort(-1, descending=True))
    got = fill_budget(counts[None], scores[None], want[None])[0] if batch else fill_budget(counts, scores, want)
    assert torch.equal(got & (counts > 0), full & (counts > 0)) and not (got & (counts == 0)).any()
