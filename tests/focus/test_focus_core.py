import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.focus import FocusConfig, FocusRouter, sinkhorn, sinkhorn_potentials


def paper_sinkhorn(logits, iters):
    """The paper's loop verbatim: Q <- exp(S); repeat: Q /= sum_tokens Q; Q /= sum_groups Q."""
    q = torch.exp(logits)
    for _ in range(iters):
        q = q / q.sum(dim=1, keepdim=True)
        q = q / q.sum(dim=2, keepdim=True)
    return q


@settings(max_examples=25, deadline=None)
@given(t=st.integers(2, 40), k=st.integers(1, 9), iters=st.integers(1, 12), seed=st.integers(0, 10_000))
def test_log_domain_sinkhorn_equals_paper_loop(t, k, iters, seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(2, t, k, generator=g, dtype=torch.float64) * 3
    assert torch.allclose(sinkhorn(logits, iters), paper_sinkhorn(logits, iters), atol=1e-9)


def test_sinkhorn_balances_columns_and_ignores_padding():
    logits = torch.randn(1, 64, 4) * 5 + torch.tensor([4.0, 0, 0, 0])  # biased towards group 0
    q = sinkhorn(logits, 50)
    assert torch.allclose(q.sum(-1), torch.ones(1, 64), atol=1e-5)
    assert torch.allclose(q.sum(1), torch.full((1, 4), 16.0), atol=1e-2)
    mask = torch.ones(1, 64, dtype=torch.bool)
    mask[:, 40:] = False
    b_masked = sinkhorn_potentials(logits, 20, mask)
    assert torch.allclose(b_masked, sinkhorn_potentials(logits[:, :40], 20), atol=1e-5)


def test_config_validation_names_the_argument():
    for kwargs, name in [({"num_groups": 0}, "num_groups"), ({"window": -1}, "window"), ({"group_dim": 0}, "group_dim"),
                         ({"top_k": 9}, "top_k"), ({"gate": "x"}, "gate"), ({"routing": "x"}, "routing"),
                         ({"tau": 0}, "tau")]:
        with pytest.raises(ValueError, match=name):
            FocusConfig(**kwargs)
    assert FocusConfig.from_dict(FocusConfig(top_k=2).to_dict()) == FocusConfig(top_k=2)
    with pytest.raises(ValueError, match="unknown"):
        FocusConfig.from_dict({"bogus": 1})


def test_router_parameter_count_matches_paper_formula():
    # GPT-2 124M, d_g=16, K=4: 12 x (768*16 + 4*16) = 148,224 (paper: "148K")
    total = sum(FocusRouter(768, FocusConfig(num_groups=4)).num_parameters() for _ in range(12))
    assert total == 148_224


def test_causal_router_is_per_token_and_topk_membership():
    r = FocusRouter(16, FocusConfig(num_groups=5, top_k=2))
    r.train()
    r(torch.randn(3, 20, 16))  # learns offsets
    r.eval()
    h = torch.randn(1, 12, 16)
    full = r(h)
    for t in (1, 5, 12):
        assert torch.allclose(r(h[:, :t]).groups, full.groups[:, :t], atol=1e-6)
    assert full.membership.dtype == torch.bool and (full.membership.sum(-1) == 2).all()
    top = full.groups.topk(2, -1).indices
    assert full.membership.gather(-1, top).all()


def test_causal_offsets_track_sinkhorn_balance():
    """After training-mode forwards, causal assignments reproduce the sequence Sinkhorn on the same batch."""
    torch.manual_seed(0)
    r = FocusRouter(8, FocusConfig(num_groups=4, offset_momentum=0.0))
    h = torch.randn(1, 256, 8) + torch.tensor([2.0] + [0.0] * 7)
    r.train()
    r(h)
    r(h)
    r.eval()
    causal = r(h).groups
    seq = sinkhorn(r.scores(h), r.cfg.sinkhorn_iters)
    assert torch.allclose(causal, seq, atol=1e-4)


def test_top_k_above_half_keeps_every_pair():
    """Why evaluation stops at K/2: two k-subsets of K groups always intersect when 2k > K."""
    from focusattn.kernels import focus_allowed

    K = 8
    scores = torch.randn(1, 200, K)
    for k in range(1, K + 1):
        member = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, scores.topk(k, -1).indices, True)
        full = bool(focus_allowed(member, 0)[0].eq(torch.ones(200, 200, dtype=torch.bool).tril()).all())
        assert full == (2 * k > K)


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_sink_tokens_validation(bad):
    import focusattn as fa

    with pytest.raises(ValueError, match="sink_tokens"):
        fa.FocusConfig(sink_tokens=bad)
