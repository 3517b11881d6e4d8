"""The attention objective: targets from the frozen model's own attention, the router loss, and a retrofit that
trains routers with it (no backward through the model)."""
import json

import pytest
import torch

import focusattn as fa
from focusattn._errors import InputError
from focusattn.hf import router_parameters, routers
from focusattn.kernels import recall as R
from focusattn.train.objectives import (AttentionObjective, LayerTargets, attention_targets, distant_sums,
                                        layer_targets, router_attention_loss)
from focusattn.train.retrofit import RetrofitConfig, retrofit
from tests.conftest import focus_case, tiny_model


def test_distant_sums_match_the_loop():
    g = torch.softmax(torch.randn(2, 17, 3), -1)
    for window, sink in ((0, 0), (2, 1), (4, 3), (20, 1)):
        s = distant_sums(g, window, sink)
        for i in range(17):
            want = sum((g[:, j] for j in range(sink, 17) if i - j > window), torch.zeros(2, 3))
            torch.testing.assert_close(s[:, i], want, atol=1e-6, rtol=1e-6)


def test_layer_targets_are_the_top_distant_keys_of_the_head_mean():
    q, k, _, _ = focus_case(1, 1, 4, 2, 30, 30, 4, 1)
    tg = layer_targets(torch.randn(1, 30, 5), q, k, window=3, sink=1, top_m=4)
    p = R.causal_probs(q, k, 0, 30).mean(1)[0]
    _, _, distant = R.pair_kinds(0, 30, 30, 3, 1)
    for i in range(30):
        d = (p[i] * distant[i])
        torch.testing.assert_close(tg.mass[0, i], d.sum(), atol=1e-6, rtol=1e-6)
        n = int(distant[i].sum())
        got = set(tg.idx[0, i][tg.idx[0, i] >= 0].tolist())
        assert got == set(d.topk(min(4, n)).indices.tolist()) if n else not got
        assert all(distant[i, j] for j in got)


def test_layer_targets_with_dense_heads_follow_the_routed_heads():
    q, k, _, _ = focus_case(2, 1, 6, 3, 30, 30, 4, 1)  # GQA: 6 query heads on 3 KV heads
    dense = torch.tensor([False, False, True, True, False, False])  # KV head 1
    tg = layer_targets(torch.randn(1, 30, 5), q, k, window=3, sink=1, top_m=4, dense=dense)
    want = layer_targets(torch.randn(1, 30, 5), q[:, [0, 1, 4, 5]], k[:, [0, 2]], window=3, sink=1, top_m=4)
    assert torch.equal(tg.idx, want.idx) and torch.allclose(tg.mass, want.mass)
    every = layer_targets(torch.randn(1, 30, 5), q, k, window=3, sink=1, top_m=4, dense=torch.ones(6, dtype=bool))
    plain = layer_targets(torch.randn(1, 30, 5), q, k, window=3, sink=1, top_m=4)
    assert torch.equal(every.idx, plain.idx) and not torch.equal(tg.mass, plain.mass)


def test_router_loss_prefers_groups_that_follow_the_attention():
    # queries at even positions attend distant even keys, odd ones odd keys
    t, window = 24, 1
    idx = torch.full((1, t, 4), -1, dtype=torch.int32)
    for i in range(t):
        keys = [j for j in range(i - window - 1, -1, -1) if j % 2 == i % 2][:4]
        idx[0, i, :len(keys)] = torch.tensor(keys, dtype=torch.int32)
    tg = LayerTargets(torch.zeros(1, t, 1), idx, (idx >= 0).float(), (idx >= 0).any(-1).float())
    parity = torch.nn.functional.one_hot(torch.arange(t) % 2, 2).float()[None] * 0.98 + 0.01
    mixed = torch.full((1, t, 2), 0.5)
    one = torch.tensor([0.99, 0.01]).expand(1, t, 2)
    good, kept = router_attention_loss(parity, tg, window=window, sink=0)
    assert kept == 1.0
    assert good < router_attention_loss(mixed, tg, window=window, sink=0)[0]
    assert good < router_attention_loss(one, tg, window=window, sink=0)[0]  # one group for all is no answer
    logits = torch.randn(1, t, 2, generator=torch.Generator().manual_seed(0)).requires_grad_()  # not the saddle
    router_attention_loss(torch.softmax(logits, -1), tg, window=window, sink=0)[0].backward()
    assert logits.grad.abs().sum() > 0


def test_attention_targets_come_from_the_original_model():
    model = fa.compose(tiny_model("llama"), fa.FocusConfig(num_groups=4, group_dim=8, window=3)).eval()
    x = torch.randint(0, 90, (1, 20))
    tgs = attention_targets(model, x, top_m=5)
    assert len(tgs) == 2 and tgs[0].h.shape == (1, 20, 64) and tgs[1].idx.shape == (1, 20, 5)
    assert (tgs[0].mass[0, :4] == 0).all() and (tgs[0].mass[0, 5:] > 0).all()  # no distant key before i > w


def test_objective_memo_and_gradients_reach_only_the_routers():
    model = fa.compose(tiny_model("llama"), fa.FocusConfig(num_groups=4, group_dim=8, window=3)).eval()
    for r in routers(model):
        r.train()
    obj = AttentionObjective(model, top_m=5, balance_loss=0.1, memo=True)
    x = torch.randint(0, 90, (1, 20))
    loss, logs = obj(x)
    loss.backward()
    assert set(logs) >= {"loss", "attn_ce", "balance", "kept_top1"} and len(obj.memo) == 1
    obj(x)
    assert len(obj.memo) == 1
    assert all(p.grad is not None for p in router_parameters(model))
    assert all(p.grad is None for n, p in model.named_parameters() if "focus_router" not in n)


def test_targets_cache_on_disk_is_reused(tmp_path):
    model = fa.compose(tiny_model("llama"), fa.FocusConfig(num_groups=4, group_dim=8, window=3)).eval()
    x = torch.randint(0, 90, (1, 20))
    first = AttentionObjective(model, top_m=5, cache_dir=tmp_path).targets(x)
    assert len(list(tmp_path.glob("*.safetensors"))) == 1 and not list(tmp_path.glob("*.tmp"))
    again = AttentionObjective(model, top_m=5, cache_dir=tmp_path)
    import focusattn.train.objectives as obj_mod

    real, obj_mod.attention_targets = obj_mod.attention_targets, None  # a second capture would fail
    try:
        second = again.targets(x)
    finally:
        obj_mod.attention_targets = real
    assert all(torch.equal(a.idx, b.idx) and torch.equal(a.h, b.h) and torch.equal(a.mass, b.mass)
               and torch.equal(a.attraction.isnan(), b.attraction.isnan()) for a, b in zip(first, second))
    AttentionObjective(model, top_m=6, cache_dir=tmp_path).targets(x)  # another M: another entry
    assert len(list(tmp_path.glob("*.safetensors"))) == 2


def test_retrofit_with_the_attention_objective(tmp_path, tiny_dir):
    cfg = RetrofitConfig(model=str(tiny_dir / "model"), data=str(tiny_dir / "corpus"), ood_data=None,
                         out=str(tmp_path / "run"), steps=4, seq_len=48, eval_windows=1, eval_top_ks=(1,),
                         objective="attention", attn_keys=8, pool=2, balance_loss=0.1, lr=0.05, eval_every=2,
                         focus=fa.FocusConfig(num_groups=4, window=8))
    s = retrofit(cfg, progress=False)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in recs] == [1, 2, 3, 4] and all("kept_top1" in r and "attn_ce" in r for r in recs)
    curve = [r for r in recs if "heldout_top1" in r]  # the held-out curve, every eval_every steps
    assert [r["step"] for r in curve] == [2, 4] and all(0 <= r["heldout_kept_top1"] <= 1 for r in curve)
    assert all(0 < r["heldout_budget_top1"] <= 1 for r in curve)  # beside the mass: the keys kept for it
    assert s["heldout_start"]["step"] == 0 and s["heldout_start"]["heldout_top1"] > 1  # the curve's step 0
    assert s["config"]["objective"] == "attention" and "top1" in s["perplexity"]["after"]["domain"]
    assert (tmp_path / "run" / "adapter" / "adapter.safetensors").exists()


def test_retrofit_serves_and_stores_its_dense_heads(tmp_path, tiny_dir):
    from focusattn.hf.io import read_adapter_config

    cfg = RetrofitConfig(model=str(tiny_dir / "model"), data=str(tiny_dir / "corpus"), ood_data=None,
                         out=str(tmp_path / "run"), steps=2, seq_len=48, eval_windows=1, eval_top_ks=(1,),
                         objective="attention", attn_keys=8, pool=1, lr=0.05, dense_heads="1:0",
                         targets_cache=str(tmp_path / "tg"), focus=fa.FocusConfig(num_groups=4, window=8))
    retrofit(cfg, progress=False)
    assert read_adapter_config(tmp_path / "run" / "adapter")["focus_config"]["dense_heads"] == [[1, 0]]
    scored = RetrofitConfig(**{**cfg.__dict__, "out": str(tmp_path / "run2"), "dense_heads": "induction:1",
                               "init_adapter": str(tmp_path / "run" / "adapter")})
    retrofit(scored, progress=False)
    assert len(read_adapter_config(tmp_path / "run2" / "adapter")["focus_config"]["dense_heads"]) == 1


@pytest.mark.parametrize("kw,name", [(dict(objective="mse"), "objective"),
                                     (dict(objective="attention", method="lora"), "objective"),
                                     (dict(objective="attention", distill=0.5), "distill"),
                                     (dict(attn_keys=0), "attn_keys"), (dict(pool=-1), "pool"),
                                     (dict(eval_every=-1), "eval_every"),
                                     (dict(dense_heads="induction"), "dense_heads"),
                                     (dict(dense_heads="1:0", method="lora"), "dense_heads"),
                                     (dict(objective="attention", attn_loss="kl"), "attn_loss"),
                                     (dict(attn_loss="mass"), "attn_loss"),
                                     (dict(objective="attention", attn_loss="mass",
                                           focus=fa.FocusConfig(query_proj=True)), "attn_loss")])
def test_bad_objective_settings_name_the_argument(kw, name):
    with pytest.raises(InputError, match=name):
        RetrofitConfig(**kw)


@pytest.mark.parametrize("with_global", [False, True])
def test_top1_budget_is_the_direct_count(with_global):
    """The share of each query's distant keys that share its top-1 group (or are global), by a direct loop."""
    from focusattn.train.objectives import top1_budget

    g = torch.Generator().manual_seed(3)
    groups = torch.softmax(torch.randn(2, 30, 4, generator=g), -1)
    glob = torch.rand(2, 30, generator=g) < 0.2 if with_global else None
    window, sink = 5, 1
    top, shares = groups.argmax(-1), []
    for b in range(2):
        for i in range(30):
            keys = range(sink, i - window)
            if len(keys) == 0:
                continue
            hit = [top[b, j] == top[b, i] or (glob is not None and bool(glob[b, j])) for j in keys]
            shares.append(sum(map(bool, hit)) / len(keys))
    assert top1_budget(groups, window, sink, glob) == pytest.approx(sum(shares) / len(shares))
    one = torch.zeros(1, 30, 4)
    one[..., 0] = 1  # one group: every distant key kept
    assert top1_budget(one, window, sink) == pytest.approx(1.0)
    assert top1_budget(groups[:, :5], window, sink) == 0.0  # no query has distant keys


def test_mass_loss_is_minus_the_kept_share_under_balanced_groups():
    """Hard balanced groups whose targets share the query's group keep everything (loss -1); the same targets
    under another balanced partition keep less; gradients reach the logits; global keys are left out."""
    from focusattn.train.objectives import router_mass_loss

    t, k = 32, 4
    grp = torch.arange(t) % k  # balanced: Sinkhorn's potentials stay ~0
    idx = torch.full((1, t, 3), -1, dtype=torch.int32)
    for i in range(t):
        same = [j for j in range(i - 6) if grp[j] == grp[i]][:3]
        idx[0, i, :len(same)] = torch.tensor(same, dtype=torch.int32)
    tg = LayerTargets(torch.zeros(1, t, 8).bfloat16(), idx, (idx >= 0).float(), torch.ones(1, t))
    good = 30.0 * torch.nn.functional.one_hot(grp, k).float()[None]
    assert float(router_mass_loss(good, tg, iters=10)) == pytest.approx(-1.0, abs=1e-4)
    other = 30.0 * torch.nn.functional.one_hot((torch.arange(t) // 2) % k, k).float()[None]
    assert float(router_mass_loss(other, tg, iters=10)) > -0.9
    logits = torch.randn(1, t, k, requires_grad=True)
    router_mass_loss(logits, tg, iters=10).backward()
    assert float(logits.grad.abs().sum()) > 0
    glob = torch.zeros(1, t, dtype=torch.bool)
    glob[0, :t] = True  # every key global: nothing left for the groups to keep
    assert float(router_mass_loss(good, tg, iters=10, global_keys=glob)) == 0.0


def test_retrofit_with_the_mass_loss(tmp_path, tiny_dir):
    cfg = RetrofitConfig(model=str(tiny_dir / "model"), data=str(tiny_dir / "corpus"), ood_data=None,
                         out=str(tmp_path / "run"), steps=2, seq_len=48, eval_windows=1, eval_top_ks=(1,),
                         objective="attention", attn_loss="mass", attn_keys=8, pool=2, lr=0.05,
                         focus=fa.FocusConfig(num_groups=4, window=8, router_hidden=4))
    s = retrofit(cfg, progress=False)
    recs = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(-1 <= r["loss"] <= 0 and 0 <= r["kept_top1"] <= 1 for r in recs)  # minus a share of the mass
    assert s["config"]["attn_loss"] == "mass" and s["config"]["focus"]["router_hidden"] == 4
