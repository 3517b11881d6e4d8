"""``FocusConfig.query_proj``: the query role's own projection onto the same centroids. The config validates it, an
untrained router serves the symmetric groups, a trained one serves two memberships exactly (prefill, decode steps,
dense reference), the attention objective trains both projections, adapters round-trip it and refuse symmetric
serving, recall and the command line know it."""
import dataclasses
import json

import pytest
import torch

import focusattn as fa
from focusattn.eval.recall import measure_recall, served_keep
from focusattn.focus.router import FocusRouter
from focusattn.hf import last_routing, routers, routing_caches, save_adapter, update_config
from focusattn.hf.kv import cache_kwargs, output_cache
from focusattn.kernels import recall as R
from focusattn.kernels.common import topk_membership
from focusattn.kernels.soft import soft_focus_attention
from focusattn.train.objectives import LayerTargets, router_attention_loss
from tests.conftest import V, tiny_model

CFG = fa.FocusConfig(num_groups=4, window=3, top_k=1, key_top_k=2, query_proj=True, rebalance=7,
                     rebalance_warm=True)


def _ids(b=2, t=40, seed=1):
    return torch.randint(1, V, (b, t), generator=torch.Generator().manual_seed(seed))


def _perturb(rs, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for r in rs:
            r.proj_q.weight.add_(torch.randn(r.proj_q.weight.shape, generator=g) * r.proj_q.weight.std() * 2)


def _model(cfg=CFG, perturb=True):
    m = fa.compose(tiny_model("llama"), cfg)
    for r in routers(m):  # offsets learned (as after training), so evaluation is causal from the first token
        r.offsets_ready.fill_(True)
    if perturb:
        _perturb(routers(m))
    return m.eval()


@pytest.mark.parametrize("changes,match", [
    (dict(query_proj=1), r"query_proj=1: allowed True or False \(FocusConfig.query_proj\)"),
    (dict(top_k=2, query_proj=True), "query_proj=True: allowed False with top_k=2 .*top_k=1"),
    (dict(top_k=1, query_proj=True, routing="sequence"), "query_proj=True: allowed False with routing='sequence'"),
])
def test_config_refuses_what_it_cannot_serve_in_one_line(changes, match):
    with pytest.raises(ValueError, match=match) as e:
        fa.FocusConfig(num_groups=4, **changes)
    assert "\n" not in str(e.value)


def test_config_roles_and_key_top_k():
    assert fa.FocusConfig(top_k=1, query_proj=True).roles and fa.FocusConfig(top_k=1, query_proj=True) \
        .served_key_top_k == 1
    assert not fa.FocusConfig(query_proj=True).roles  # the soft gate: no hard memberships
    assert CFG.roles and CFG.served_key_top_k == 2 and fa.FocusConfig.from_dict(CFG.to_dict()) == CFG
    assert fa.FocusConfig(top_k=1, query_proj=True, global_rate=0.1).query_proj  # global keys stay allowed
    assert not fa.FocusConfig().query_proj


@pytest.mark.parametrize("rebalance", [0, 7])
def test_untrained_router_serves_the_symmetric_groups(rebalance):
    cfg = dataclasses.replace(CFG, rebalance=rebalance, rebalance_warm=bool(rebalance))
    r = FocusRouter(16, cfg).eval()
    assert torch.equal(r.proj_q.weight, r.proj.weight)
    sym = FocusRouter(16, dataclasses.replace(cfg, query_proj=False)).eval()
    sym.load_state_dict({k: v for k, v in r.state_dict().items() if k not in ("proj_q.weight", "q_offsets")})
    h = torch.randn(2, 30, 16)
    a, s = r(h), sym(h)
    assert torch.equal(a.membership, s.membership) and torch.equal(a.groups, s.groups)
    assert torch.equal(a.query_membership, topk_membership(s.groups, 1))
    assert torch.equal(a.query_membership, s.query_membership) and torch.equal(a.query_groups, s.groups)
    r.train(), sym.train()
    r(h), sym(h)
    r.flush_offsets(), sym.flush_offsets()
    assert torch.equal(r.q_offsets, r.offsets) and torch.equal(r.offsets, sym.offsets)  # learned alike


def test_trained_query_projection_gives_its_own_query_groups():
    r = FocusRouter(16, CFG).eval()
    _perturb([r])
    h = torch.randn(2, 30, 16)
    a = r(h)
    assert a.membership.sum(-1).eq(2).all() and a.query_membership.sum(-1).eq(1).all()
    assert not torch.equal(a.query_membership, topk_membership(a.groups, 1))
    assert torch.equal(a.query_membership, topk_membership(a.query_groups, 1))
    assert (a.query_membership & ~a.membership).any()  # a query group outside its key groups: no shared ranking
    torch.testing.assert_close(a.query_groups.sum(-1), torch.ones(2, 30))


def test_prefill_plus_decode_steps_equal_one_prefill_and_the_dense_reference(monkeypatch):
    """A prefill and 20 single-token decode steps (the lean step where it applies, rebalancing boundaries through
    ``forward``) route and predict like one prefill, which equals the dense reference fed the two memberships."""
    lean = []
    real = fa.FocusRouter.decode
    monkeypatch.setattr(fa.FocusRouter, "decode", lambda self, *a: lean.append(real(self, *a)) or lean[-1])
    m = _model()
    x = _ids()
    with torch.no_grad():
        whole = m(x).logits
        want = [(r.membership, r.query_membership) for r in last_routing(m)]
        steps = _prefill_then_steps(m, x, 20)
        got = [(r.membership, r.query_membership) for r in last_routing(m)]
        update_config(m, backend="dense")
        dense = m(x).logits
    for (km, qm), (gkm, gqm) in zip(want, got):
        assert torch.equal(km, gkm) and torch.equal(qm, gqm) and (qm & ~km).any()
    torch.testing.assert_close(steps, whole, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dense, whole, atol=1e-5, rtol=1e-5)
    taken = sum(r is not None for r in lean)  # steps at 21, 28, 35 start a rebalancing interval
    assert taken == len(routing_caches(m)) * (20 - 3)
    assert all(r.query_groups is not None for r in lean if r is not None)


def _prefill_then_steps(m, x, split: int) -> torch.Tensor:
    """Logits of a prefill of ``x[:, :split]`` and then one decode step per remaining token, concatenated."""
    out = m(x[:, :split], use_cache=True)
    steps, cache = [out.logits], output_cache(out)
    for i in range(split, x.shape[1]):
        out = m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True)
        steps.append(out.logits)
        cache = output_cache(out)
    return torch.cat(steps, 1)


def test_soft_gate_uses_the_query_groups_and_trains_the_query_projection():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 12, 8, generator=g) for _ in range(3))
    groups = torch.softmax(torch.randn(1, 12, 4, generator=g), -1)
    same = soft_focus_attention(q, k, v, groups, 2, lam=10.0, query_groups=groups.clone())
    torch.testing.assert_close(same, soft_focus_attention(q, k, v, groups, 2, lam=10.0))
    other = torch.softmax(torch.randn(1, 12, 4, generator=g), -1)
    assert not torch.allclose(soft_focus_attention(q, k, v, groups, 2, lam=10.0, query_groups=other), same)
    m = _model(dataclasses.replace(CFG, top_k=None, rebalance=0, rebalance_warm=False))
    x = _ids(b=1, t=20)
    m(x).logits.logsumexp(-1).sum().backward()
    assert all(float(r.proj_q.weight.grad.abs().sum()) > 0 for r in routers(m))
    with torch.no_grad():
        whole = m(x).logits
        steps = _prefill_then_steps(m, x, 12)
    torch.testing.assert_close(steps, whole, atol=1e-4, rtol=1e-4)


def _targets(t=24, m=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    idx = torch.full((1, t, m), -1, dtype=torch.int32)
    for i in range(9, t):  # distant keys 1 .. i - 5 (window 3, sink 1)
        idx[0, i] = torch.randperm(i - 5, generator=g)[:m].to(torch.int32) + 1
    w = torch.rand(1, t, m, generator=g) * (idx >= 0)
    return LayerTargets(torch.randn(1, t, 16, generator=g), idx, w, w.sum(-1))


def test_attention_loss_trains_both_projections_and_equals_the_symmetric_one_for_equal_groups():
    tg = _targets()
    r = FocusRouter(16, dataclasses.replace(CFG, top_k=None, rebalance=0, rebalance_warm=False)).train()
    _perturb([r])
    routing = r(tg.h.float())
    loss, kept = router_attention_loss(routing.groups, tg, window=3, sink=1, query_groups=routing.query_groups,
                                       key_top_k=2)
    loss.backward()
    assert float(r.proj.weight.grad.abs().sum()) > 0 and float(r.proj_q.weight.grad.abs().sum()) > 0
    assert 0 <= kept <= 1
    groups = torch.softmax(torch.randn(1, 24, 4), -1)
    sym, sym_kept = router_attention_loss(groups, tg, window=3, sink=1)
    asym, asym_kept = router_attention_loss(groups, tg, window=3, sink=1, query_groups=groups)
    assert torch.equal(sym, asym) and sym_kept == asym_kept
    # kept: the key holds the query's top group among its key_top_k groups
    wide = router_attention_loss(groups, tg, window=3, sink=1, query_groups=groups, key_top_k=2)[1]
    assert wide >= sym_kept and router_attention_loss(groups, tg, window=3, sink=1, query_groups=groups,
                                                      key_top_k=4)[1] == pytest.approx(1.0)


def _round_trip(m, path):
    """Save ``m``'s adapter to ``path``, load it into a fresh model, check it predicts the same; (meta, loaded)."""
    x = _ids(b=1)
    with torch.no_grad():
        want = m(x).logits
    save_adapter(m, path)
    meta = json.loads((path / "adapter_config.json").read_text())
    loaded = fa.load_adapter(tiny_model("llama"), path).eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(x).logits, want)
    return meta, loaded


def test_adapter_round_trips_and_refuses_symmetric_serving(tmp_path):
    m = _model()
    meta, loaded = _round_trip(m, tmp_path / "a")
    assert meta["focus_config"]["query_proj"] and meta["trainable_parameters"] == 2 * (2 * 64 * 16 + 4 * 16)
    assert fa.hf.focus_config(loaded).query_proj
    for a, b in zip(routers(m), routers(loaded)):
        assert torch.equal(a.proj_q.weight, b.proj_q.weight) and torch.equal(a.q_offsets, b.q_offsets)
    symmetric = fa.compose(tiny_model("llama"), dataclasses.replace(CFG, query_proj=False))
    with pytest.raises(ValueError, match="query_proj=True .* query_proj=False") as e:
        fa.load_adapter(symmetric, tmp_path / "a")
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match=r"top_k=2 .*allowed None or 1") as e:
        fa.set_top_k(loaded, 2)
    assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="query_proj"):
        update_config(loaded, query_proj=False)
    assert fa.set_top_k(loaded, None).query_proj and fa.set_top_k(loaded, 1).top_k == 1
    from focusattn.hf.pair import load_pair  # long-eval / bench-model: refused before any model loads

    with pytest.raises(ValueError, match=r"top-k \[1, 2\]: .*own query projection.*allowed --top-k 1"):
        load_pair("no-such-model", tmp_path / "a", lengths=[64], top_ks=[1, 2])


def test_a_symmetric_adapter_starts_a_query_projection_where_it_was(tmp_path):
    """``retrofit --query-proj --init-adapter`` of a symmetric adapter: W_q and the query offsets start as copies."""
    sym = _model(dataclasses.replace(CFG, query_proj=False), perturb=False)
    with torch.no_grad():
        for r in routers(sym):
            r.offsets.normal_()
    save_adapter(sym, tmp_path / "s")
    m = fa.load_adapter(fa.compose(tiny_model("llama"), CFG), tmp_path / "s").eval()
    x = _ids(b=1)
    with torch.no_grad():
        a, b = m(x).logits, sym(x).logits
        torch.testing.assert_close(a, b)
    for r in routers(m):
        assert torch.equal(r.proj_q.weight, r.proj.weight) and torch.equal(r.q_offsets, r.offsets)


def test_recall_serves_query_top1_only():
    m = _model()
    r = routers(m)[0]
    h = torch.randn(1, 30, 64)
    with pytest.raises(ValueError, match="top_k=2: .*allowed top_k=1"):
        served_keep(r, h, 2)
    keep = served_keep(r, h, 1, 2)
    routing = r(h)
    want = R.shared_group_keep(routing.query_membership, routing.membership)
    assert torch.equal(keep(0, 30), want(0, 30)) and not torch.equal(keep(0, 30), served_keep(r, h, 1)(0, 30))
    with pytest.raises(ValueError, match=r"top_ks=\(1, 2\): .*allowed top_ks=\(1,\)"):
        measure_recall(m, torch.randint(1, V, (1, 20)).numpy(), top_ks=(1, 2), progress=False)


def test_cli_flag():
    import argparse

    from focusattn.train.cli import add_focus_args, focus_from_args

    p = argparse.ArgumentParser()
    add_focus_args(p)
    assert focus_from_args(p.parse_args(["--query-proj"])).query_proj
    assert not focus_from_args(p.parse_args([])).query_proj


def test_retrofit_trains_the_query_projection_and_evaluates_top1(tmp_path, tiny_dir):
    from safetensors.torch import load_file

    from focusattn._errors import InputError
    from focusattn.cli import main
    from focusattn.train.retrofit import RetrofitConfig

    with pytest.raises(InputError, match="eval_top_ks"):
        RetrofitConfig(eval_top_ks=(1, 2), focus=fa.FocusConfig(query_proj=True))
    out = tmp_path / "run"
    rc = main(["retrofit", "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"), "--ood-data", "none",
               "--out", str(out), "--seq-len", "48", "--groups", "4", "--window", "8", "--eval-windows", "1",
               "--steps", "3", "--objective", "attention", "--attn-keys", "8", "--lr", "0.05", "--query-proj"])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["perplexity"]["after"]["domain"]) == {"soft", "top1"} and s["config"]["focus"]["query_proj"]
    t = load_file(str(out / "adapter" / "adapter.safetensors"))
    assert not torch.equal(t["layers.0.proj_q.weight"], t["layers.0.proj.weight"])  # trained apart
