"""``FocusConfig.router_hidden``: a small MLP beside the router's linear projection. The config validates it, an
untrained MLP serves the linear router's groups (so a linear adapter continues exactly), a trained one is served
exactly (prefill, decode steps, dense reference), the attention objective trains it, adapters round-trip it and
refuse a model composed without it, and the command line knows it."""
import dataclasses

import pytest
import torch

import focusattn as fa
from focusattn.focus.router import FocusRouter
from focusattn.hf import last_routing, routers, save_adapter, update_config
from focusattn.train.objectives import LayerTargets, router_attention_loss
from tests.conftest import tiny_model
from tests.focus import test_query_proj as qp
from tests.focus.test_query_proj import _ids, _prefill_then_steps

CFG = fa.FocusConfig(num_groups=4, window=3, top_k=1, router_hidden=8, rebalance=7, rebalance_warm=True)


def _perturb(rs, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in rs:
            r.mlp[2].weight.normal_(generator=g)


def _model(cfg=CFG, perturb=True):
    m = qp._model(cfg, perturb=False)  # composed, offsets learned, evaluation mode
    if perturb:
        _perturb(routers(m))
    return m


@pytest.mark.parametrize("value", [-1, True, 1.5, "8"])
def test_config_validates_router_hidden(value):
    with pytest.raises(ValueError, match=rf"router_hidden={value!r}: allowed an integer >= 0 .*"
                                         r"\(FocusConfig.router_hidden\)"):
        fa.FocusConfig(router_hidden=value)
    assert fa.FocusConfig().router_hidden == 0 and fa.FocusConfig(router_hidden=4).router_hidden == 4


@pytest.mark.parametrize("query_proj", [False, True])
def test_untrained_mlp_serves_the_linear_groups_and_a_trained_one_does_not(query_proj):
    cfg = dataclasses.replace(CFG, query_proj=query_proj)
    r = FocusRouter(16, cfg).eval()
    lin = FocusRouter(16, dataclasses.replace(cfg, router_hidden=0)).eval()
    lin.load_state_dict({k: v for k, v in r.state_dict().items() if not k.startswith("mlp.")})
    h = torch.randn(2, 30, 16)
    a, s = r(h), lin(h)
    assert torch.equal(a.groups, s.groups) and torch.equal(a.membership, s.membership)
    if query_proj:
        assert torch.equal(a.query_groups, s.query_groups)
    _perturb([r])
    b = r(h)
    assert not torch.equal(b.membership, s.membership)
    want = (r.proj.weight @ h.transpose(1, 2)).transpose(1, 2) + r.mlp(h)  # the submodules' own __call__
    torch.testing.assert_close(r.scores(h), want @ r.centroids.t() / cfg.tau)


def test_prefill_plus_decode_steps_equal_one_prefill_and_the_dense_reference():
    m = _model()
    x = _ids()
    with torch.no_grad():
        whole = m(x).logits
        want = [r.membership for r in last_routing(m)]
        steps = _prefill_then_steps(m, x, 20)
        got = [r.membership for r in last_routing(m)]
        update_config(m, backend="dense")
        dense = m(x).logits
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    torch.testing.assert_close(steps, whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dense, whole, atol=1e-5, rtol=1e-5)


def test_attention_objective_trains_the_mlp():
    g = torch.Generator().manual_seed(0)
    t = 24
    idx = torch.randint(0, 16, (1, t, 4), generator=g).to(torch.int32)
    idx[:, :8] = -1
    tg = LayerTargets(torch.randn(1, t, 16, generator=g).bfloat16(), idx, torch.rand(1, t, 4, generator=g),
                      torch.rand(1, t, generator=g))
    r = FocusRouter(16, dataclasses.replace(CFG, top_k=None, rebalance=0, rebalance_warm=False)).train()
    loss, _ = router_attention_loss(r(tg.h.float()).groups, tg, window=3, sink=1)
    loss.backward()
    assert float(r.mlp[2].weight.grad.abs().sum()) > 0  # W_2 at zero: W_1 learns from the next step on
    assert float(r.proj.weight.grad.abs().sum()) > 0


def test_adapter_round_trips_and_refuses_a_model_without_the_mlp(tmp_path):
    meta, loaded = qp._round_trip(_model(), tmp_path / "a")
    assert meta["focus_config"]["router_hidden"] == 8
    assert meta["trainable_parameters"] == 2 * (64 * 16 + 4 * 16 + 64 * 8 + 8 + 8 * 16)
    linear = fa.compose(tiny_model("llama"), dataclasses.replace(CFG, router_hidden=0))
    with pytest.raises(ValueError, match="router_hidden=8 .* router_hidden=0") as e:
        fa.load_adapter(linear, tmp_path / "a")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="router_hidden"):
        update_config(loaded, router_hidden=4)


def test_a_linear_adapter_starts_an_mlp_router_where_it_was(tmp_path):
    """``retrofit --router-hidden --init-adapter`` of a linear adapter: the MLP adds zero until trained."""
    lin = _model(dataclasses.replace(CFG, router_hidden=0), perturb=False)
    with torch.no_grad():
        for r in routers(lin):
            r.offsets.normal_()
    save_adapter(lin, tmp_path / "s")
    m = fa.load_adapter(fa.compose(tiny_model("llama"), CFG), tmp_path / "s").eval()
    x = _ids(b=1)
    with torch.no_grad():
        torch.testing.assert_close(m(x).logits, lin(x).logits)
    assert all(r.mlp is not None and not r.mlp[2].weight.any() for r in routers(m))


def test_cli_flag():
    import argparse

    from focusattn.train.cli import add_focus_args, focus_from_args

    p = argparse.ArgumentParser()
    add_focus_args(p)
    assert focus_from_args(p.parse_args(["--router-hidden", "32"])).router_hidden == 32
    assert focus_from_args(p.parse_args([])).router_hidden == 0
