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


def test_kmeans_routing_roles_and_budget():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 64, 8, generator=g), torch.randn(2, 2, 64, 8, generator=g)
    mq, mk = R.kmeans_key_routing(q, k, 8, 3)
    assert (mk.sum(-1) == 1).all() and (mq.sum(-1) == 3).all()
    # keys separated into two far-apart blobs land in different clusters
    k2 = torch.cat([torch.randn(1, 1, 32, 8, generator=g) + 20, torch.randn(1, 1, 32, 8, generator=g) - 20], 2)
    _, mk2 = R.kmeans_key_routing(torch.randn(1, 1, 64, 8, generator=g), k2, 2, 1)
    assert not (mk2[0, :32].float().mean(0) * mk2[0, 32:].float().mean(0)).any()
    assert R.kmeans_query_top(8, 1) == 1 and R.kmeans_query_top(8, 2) == 4
    mq3, mk3 = R.kmeans_key_routing(q[:, :, :3], k[:, :, :3], 8, 1)  # fewer keys than clusters
    assert (mk3.sum(-1) == 1).all()


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
