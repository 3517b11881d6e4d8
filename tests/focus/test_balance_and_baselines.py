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
    with pytest.raises(ValueError, match="rebalance_warm.*set rebalance"):
        fa.FocusConfig(rebalance_warm=True)
    with pytest.raises(ValueError, match="rebalance_warm"):
        fa.FocusConfig(rebalance=8, rebalance_warm=1)


def _sharp_logits(t: int = 2048, k: int = 8) -> torch.Tensor:
    """Low-rank logits with a large scale, like a trained router's ``(W_g h) C^T / tau``: nearly hard assignments."""
    g = torch.Generator().manual_seed(0)
    return (torch.randn(t, 4, generator=g) @ (torch.randn(4, k, generator=g) * 60))[None]


def _group_cost(logits, offsets, lo: int) -> float:
    """Group-part cost of the hard top-1 assignment of tokens ``lo..`` over the balanced one (1 = balanced)."""
    top = (logits + offsets).argmax(-1)[0, lo:]
    c = torch.bincount(top, minlength=logits.shape[-1]).double()
    return float((c ** 2).sum() / (top.numel() ** 2 / logits.shape[-1]))


def test_warm_rebalancing_balances_nearly_hard_assignments_where_cold_starts_do_not():
    """The reason for ``rebalance_warm``: at the same Sinkhorn iterations per re-estimate, starting from zero leaves
    a sharp router far from balanced, a chain of warm starts reaches it."""
    from focusattn.focus.router import online_offsets

    x, base = _sharp_logits(), torch.zeros(1, 8)
    cold = online_offsets(x, base, 64, 10)
    warm = online_offsets(x, base, 64, 10, warm=True)
    assert _group_cost(x, cold, 1024) > 2.0
    assert _group_cost(x, warm, 1024) < 1.2
    torch.testing.assert_close(warm[:, :64], base[:, None].expand(1, 64, 8))  # before the first boundary


def test_warm_rebalancing_is_a_causal_chain_and_steps_equal_the_prefill():
    """Boundary c starts from boundary c-1's potentials (nothing else); decode steps with an empty memo rebuild the
    chain from the earlier tokens and give the prefill's offsets, and later tokens change nothing before them."""
    from focusattn.focus.router import online_offsets
    from focusattn.focus.sinkhorn import sinkhorn_potentials

    x, base, every = _sharp_logits(640), torch.zeros(1, 8), 64
    whole = online_offsets(x, base, every, 4, warm=True)
    pot = None
    for c in range(1, 10):
        pot = sinkhorn_potentials(x[:, :c * every], 4, init=pot)
        torch.testing.assert_close(whole[:, c * every], pot)
    for start in (64, 300, 639):  # a step at a boundary, inside an interval, the last token; no memo given
        step = online_offsets(x[:, start:start + 1], base, every, 4, start=start, past=x[:, :start], warm=True)
        torch.testing.assert_close(step, whole[:, start:start + 1])
    y = x.clone()
    y[:, 400:] = -y[:, 400:]
    changed = online_offsets(y, base, every, 4, warm=True)
    torch.testing.assert_close(changed[:, :448], whole[:, :448])  # 448: the first boundary after position 400
    assert not torch.allclose(changed[:, 448:], whole[:, 448:])
