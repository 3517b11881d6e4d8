"""Query and key roles end to end: the config validates them, the router serves both memberships from one ranking,
adapters round-trip them and refuse a symmetric model, decode steps equal the prefill, generate equals recompute."""
import dataclasses

import pytest
import torch

import focusattn as fa
from focusattn.focus.router import FocusRouter
from focusattn.hf import last_routing
from focusattn.hf.kv import cache_kwargs, output_cache
from focusattn.kernels.reference import focus_allowed
from tests.conftest import assert_round_trip, composed, tiny_model, token_ids

CFG = fa.FocusConfig(num_groups=4, window=3, top_k=1, key_top_k=2)


def _ids(b=1, t=40, seed=1):
    return token_ids(b, t, seed)


def _model(cfg=CFG, arch="llama"):
    return composed(cfg, arch)


@pytest.mark.parametrize("changes,match", [
    (dict(top_k=2, key_top_k=3), "key_top_k=3: allowed None with top_k=2"),
    (dict(top_k=3, key_top_k=2), "key_top_k=2: allowed None with top_k=3"),
    (dict(top_k=1, key_top_k=5), r"key_top_k=5: allowed None \(symmetric\) or an integer in 1..num_groups \(4\)"),
    (dict(top_k=1, key_top_k=0), "key_top_k=0"),
    (dict(top_k=1, key_top_k=True), "key_top_k=True"),
])
def test_config_refuses_roles_it_cannot_serve(changes, match):
    with pytest.raises(ValueError, match=match):
        fa.FocusConfig(num_groups=4, **changes)


def test_config_defaults_are_symmetric():
    assert fa.FocusConfig().key_top_k is None and not fa.FocusConfig(top_k=1).roles
    assert not fa.FocusConfig(num_groups=4, top_k=1, key_top_k=1).roles  # the same groups: symmetric
    assert CFG.roles and CFG.served_key_top_k == 2
    assert fa.FocusConfig.from_dict(CFG.to_dict()) == CFG


def test_router_serves_query_groups_inside_key_groups():
    r = FocusRouter(16, CFG).eval()
    h = torch.randn(2, 30, 16)
    routing = r(h)
    assert routing.membership.sum(-1).eq(2).all() and routing.query_membership.sum(-1).eq(1).all()
    assert not (routing.query_membership & ~routing.membership).any()  # a query's group is one of its key groups
    sym = FocusRouter(16, dataclasses.replace(CFG, key_top_k=None)).eval()
    sym.load_state_dict(r.state_dict())
    s = sym(h)
    assert s.query_membership is None and torch.equal(s.membership, routing.query_membership)


def test_random_routing_has_roles_too():
    r = FocusRouter(16, dataclasses.replace(CFG, routing="random")).eval()
    routing = r(torch.randn(1, 20, 16))
    assert not (routing.query_membership & ~routing.membership).any()
    assert routing.membership.sum(-1).eq(2).all()


def test_served_mask_is_the_roles_mask():
    """The composed model's logits are those of the dense reference fed both memberships; a symmetric top-1 or
    top-2 model with the same routers gives other logits."""
    m = _model()
    x = _ids()
    with torch.no_grad():
        fast = m(x).logits
        r0 = last_routing(m)[0]
        assert r0.query_membership is not None and r0.query_membership.shape == r0.membership.shape
        fa.set_top_k(m, 1, backend="dense")
        dense = m(x).logits
        fa.set_top_k(m, 1, key_top_k=None)
        top1 = m(x).logits
        fa.set_top_k(m, 2)
        top2 = m(x).logits
    assert torch.allclose(fast, dense, atol=1e-5)
    assert not torch.allclose(fast, top1, atol=1e-4) and not torch.allclose(fast, top2, atol=1e-4)
    roles = focus_allowed(r0.membership, 3, 40, query_membership=r0.query_membership)
    assert focus_allowed(r0.query_membership, 3, 40).sum() < roles.sum() < focus_allowed(r0.membership, 3, 40).sum()


def test_set_top_k_keeps_roles_or_names_them():
    m = _model()
    with pytest.raises(ValueError, match="key_top_k=2: allowed None with top_k=2"):
        fa.set_top_k(m, 2)
    soft = fa.set_top_k(m, None)  # the soft gate keeps the setting for the next hard top-1
    assert soft.key_top_k == 2 and not soft.roles
    with torch.no_grad():
        m(_ids())
    assert last_routing(m)[0].membership is None
    assert fa.set_top_k(m, 1).key_top_k == 2
    assert fa.set_top_k(m, 2, key_top_k=None).key_top_k is None


def test_decode_steps_equal_one_prefill():
    m = _model()
    x = _ids(b=2)
    with torch.no_grad():
        whole = m(x).logits
        out = m(x[:, :20], use_cache=True)
        steps = [out.logits]
        cache = output_cache(out)
        for i in range(20, 40):
            out = m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True)
            steps.append(out.logits)
            cache = output_cache(out)
    assert torch.allclose(torch.cat(steps, 1), whole, atol=1e-4)
    r = last_routing(m)[0]
    assert r.query_membership.shape == (2, 40, 4) and r.membership.shape == (2, 40, 4)


@pytest.mark.parametrize("backend", ["decomposed", "auto"])
def test_generate_equals_full_recompute(backend):
    m = _model(dataclasses.replace(CFG, backend=backend))
    x = _ids(t=24)
    with torch.no_grad():
        gen = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        seq = x
        for _ in range(10):
            seq = torch.cat([seq, m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(gen, seq)


def test_adapter_round_trips_roles_and_refuses_a_symmetric_model(tmp_path):
    loaded = assert_round_trip(_model(), tmp_path / "a")
    assert fa.hf.focus_config(loaded).key_top_k == 2
    symmetric = tiny_model("llama")
    fa.compose(symmetric, dataclasses.replace(CFG, key_top_k=None))
    with pytest.raises(ValueError, match="key_top_k=2"):
        fa.load_adapter(symmetric, tmp_path / "a")


def test_balance_stats_count_the_roles_cost():
    from focusattn.analysis.balance import routing_stats

    m = _model()
    with torch.no_grad():
        m(_ids(t=64))
    roles = routing_stats(m, 64)
    fa.set_top_k(m, 2, key_top_k=None)
    with torch.no_grad():
        m(_ids(t=64))
    top2 = routing_stats(m, 64)
    assert roles["mean_cost_model_ratio"] > top2["mean_cost_model_ratio"]  # q_g k_g / 2 < k_g (k_g + 1) / 2
