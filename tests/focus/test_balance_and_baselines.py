import pytest
import torch

import focusattn as fa
from focusattn.focus.router import FocusRouter, balance_loss
from focusattn.hf import last_routing, routers
from focusattn.train.retrofit import RetrofitConfig, _lam

from tests.conftest import V, tiny_model


def test_balance_loss_is_one_when_balanced_and_k_when_collapsed():
    k = 4
    balanced = torch.eye(k).repeat(1, 8, 1)  # [1, 32, 4]: every group gets 8 one-hot tokens
    assert balance_loss(balanced).item() == pytest.approx(1.0)
    collapsed = torch.zeros(1, 32, k)
    collapsed[..., 2] = 1
    assert balance_loss(collapsed).item() == pytest.approx(k)
    mask = balanced[..., 0] == 0  # group 0's tokens are padding: not counted, the other three share equally
    assert balance_loss(balanced, mask).item() == pytest.approx(4 * 3 * (1 / 3) ** 2)


def test_balance_loss_gradient_moves_tokens_out_of_the_largest_group():
    torch.manual_seed(0)
    # no Sinkhorn offsets (sinkhorn_iters=0): they balance too and would mask the loss's own effect
    r = FocusRouter(16, fa.FocusConfig(num_groups=4, group_dim=8, sinkhorn_iters=0)).train()
    h = torch.randn(2, 64, 16)
    opt = torch.optim.SGD(r.parameters(), lr=0.5)
    with torch.no_grad():
        r.centroids[0] += 3 * r.centroids[0].norm()  # start imbalanced
    shares = []
    for _ in range(40):
        r(h)
        shares.append(r.largest_share)
        r.balance.backward()
        opt.step()
        opt.zero_grad()
    assert shares[-1] < shares[0]


def test_lambda_schedule_is_geometric_and_reaches_its_end():
    cfg = RetrofitConfig(steps=11, lam_final=40.0)
    assert _lam(cfg, 0) == pytest.approx(10.0)
    assert _lam(cfg, 10) == pytest.approx(40.0)
    assert _lam(cfg, 5) == pytest.approx(20.0)
    assert _lam(RetrofitConfig(), 7) == 10.0
    with pytest.raises(ValueError, match="lam_final"):
        RetrofitConfig(lam_final=0.0)
    with pytest.raises(ValueError, match="balance_loss"):
        RetrofitConfig(balance_loss=-1.0)


def test_random_routing_is_per_position_causal_and_decodes_like_prefill():
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=4, routing="random", top_k=1))
    x = torch.randint(1, V, (1, 60))
    with torch.no_grad():
        m(x)
    first = last_routing(m)[0].membership.clone()
    assert first.sum(-1).eq(1).all()
    share = first[0].float().mean(0)
    assert share.max() < 0.5  # drawn uniformly: no group takes most tokens
    y = x.clone()
    y[:, 30:] = (y[:, 30:] + 5) % (V - 1) + 1
    with torch.no_grad():
        a, b = m(x).logits, m(y).logits
        m(y)
    assert torch.equal(last_routing(m)[0].membership, first)  # groups depend on position only
    assert (a[:, :30] - b[:, :30]).abs().max() < 1e-5
    with torch.no_grad():
        got = m.generate(x[:, :40], max_new_tokens=5, do_sample=False, pad_token_id=0)
        full = m(got[:, :-1], use_cache=False).logits[:, 39:].argmax(-1)
    assert torch.equal(full, got[:, 40:])


def test_sliding_sink_baseline_matches_its_mask():
    from focusattn.hf.baselines import pairs_kept_sliding, restore, sliding_sink, window_for_budget

    m = tiny_model("llama")
    x = torch.randint(1, V, (1, 50))
    with torch.no_grad():
        ref = m(x).logits
        sliding_sink(m, window=100, sinks=1)  # window covers the sequence: identical to full attention
        same = m(x).logits
        sliding_sink(m, window=5, sinks=1)
        narrow = m(x).logits
        restore(m)
        back = m(x).logits
    assert (same - ref).abs().max() < 1e-4
    assert (narrow - ref).abs().max() > 1e-3
    assert torch.equal(back, ref)
    t = 64
    assert pairs_kept_sliding(t, t) == pytest.approx(1.0)
    w = window_for_budget(t, 0.5)
    assert pairs_kept_sliding(t, w) >= 0.5 > pairs_kept_sliding(t, w - 1)
    # direct check of the kept pairs: window 3 + one sink at T = 6
    keep = torch.tensor([[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                         [1, 1, 1, 1, 1, 0], [1, 0, 1, 1, 1, 1]], dtype=torch.bool)
    assert pairs_kept_sliding(6, 3) == pytest.approx(keep.sum().item() / 21)


def test_online_rebalancing_balances_a_collapsed_router_and_stays_causal():
    """Learned offsets that favour one group (text unlike the training corpus) are corrected from the sequence's
    own earlier tokens: every chunk after the first is near balanced, and no token depends on a later one."""
    torch.manual_seed(0)
    cfg = fa.FocusConfig(num_groups=4, group_dim=8, top_k=1, rebalance=64)
    r = FocusRouter(16, cfg).eval()
    with torch.no_grad():
        r.offsets.copy_(torch.tensor([15.0, -5.0, -5.0, -5.0]))  # stale offsets: group 0 takes nearly every token
        r.offsets_ready.fill_(True)
    h = torch.randn(1, 512, 16)
    plain = FocusRouter(16, fa.FocusConfig(num_groups=4, group_dim=8, top_k=1)).eval()
    plain.load_state_dict(r.state_dict())
    share = lambda routing: routing.membership[0, 64:].float().mean(0).max().item()  # noqa: E731
    assert share(plain(h)) > 0.9
    assert share(r(h)) < 2 / 4
    full = r(h).groups
    h2 = h.clone()
    h2[:, 300:] = torch.randn(1, 212, 16)
    torch.testing.assert_close(r(h2).groups[:, :300], full[:, :300])  # causal
    assert not torch.allclose(r(h2).groups[:, 320:], full[:, 320:])


def test_rebalance_needs_causal_routing_and_an_int():
    with pytest.raises(ValueError, match="rebalance"):
        fa.FocusConfig(routing="sequence", rebalance=64)
    with pytest.raises(ValueError, match="rebalance"):
        fa.FocusConfig(rebalance=-1)
