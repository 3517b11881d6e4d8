"""Global keys: a learned scorer makes some tokens visible to every later query (FocusConfig.global_rate). Causal,
served exactly (prefill = decode = the dense reference), saved with the adapter, trained by the attention objective."""
import pytest
import torch

import focusattn as fa
from focusattn._errors import InputError
from focusattn.hf import focus_config, last_routing, routers
from focusattn.kernels.reference import focus_allowed
from tests.conftest import V, tiny_model


def _model(top_k=1, backend="auto", rate=0.2):
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=top_k, backend=backend, global_rate=rate))
    for r in routers(m):  # a threshold learned from one batch, then frozen
        r.train()
    with torch.no_grad():
        m(torch.randint(1, V, (2, 40), generator=torch.Generator().manual_seed(9)))
    return m.eval()


def _ids(t=30, seed=0):
    return torch.randint(1, V, (1, t), generator=torch.Generator().manual_seed(seed))


def test_threshold_is_learned_at_the_rate_and_keys_are_causal():
    m = _model()
    x = _ids(t=60)
    with torch.no_grad():
        m(x)
    for routing in last_routing(m):
        share = routing.global_keys.float().mean().item()
        assert 0.0 < share < 0.6  # the training batch's 20% quantile, on other text
    y = x.clone()
    y[:, 40:] = torch.randint(1, V, (1, 20))
    with torch.no_grad():
        a, b = m(x).logits, m(y).logits
        ga = [r.global_keys[:, :40].clone() for r in last_routing(m)]
        m(x)
        gb = [r.global_keys[:, :40] for r in last_routing(m)]
    assert torch.allclose(a[:, :40], b[:, :40], atol=1e-5)
    assert all(torch.equal(p, q) for p, q in zip(ga, gb))


@pytest.mark.parametrize("top_k", [1, 2])
def test_generation_fast_equals_dense_and_full_recompute(top_k):
    m = _model(top_k=top_k, backend="decomposed")
    x = _ids(t=24)
    with torch.no_grad():
        fast = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        fa.set_top_k(m, top_k, backend="dense")
        dense = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        seq = x
        for _ in range(10):
            seq = torch.cat([seq, m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(fast, dense) and torch.equal(dense, seq)


def test_global_keys_change_the_mask_and_are_what_is_served():
    m = _model()
    x = _ids(t=40)
    with torch.no_grad():
        out = m(x).logits
    r0 = last_routing(m)[0]
    first = torch.zeros(1, 40, dtype=torch.bool)
    first[:, 0] = True
    with_global = focus_allowed(r0.membership, 3, 40, r0.global_keys | first)
    without = focus_allowed(r0.membership, 3, 40, first)
    assert with_global.sum() > without.sum()
    m2 = _model(rate=0.2)
    for r in routers(m2):
        r.global_threshold.fill_(1e9)  # nothing global: the plain Focus mask
    plain = tiny_model("llama")
    fa.compose(plain, fa.FocusConfig(num_groups=4, window=3, top_k=1))
    plain.load_state_dict(m2.state_dict(), strict=False)
    with torch.no_grad():
        assert torch.allclose(m2(x).logits, plain.eval()(x).logits, atol=1e-5)
        assert not torch.allclose(m2(x).logits, out, atol=1e-4)  # same routers, global keys on: another answer


def test_adapter_round_trip_and_strict_shapes(tmp_path):
    m = _model()
    path = fa.save_adapter(m, tmp_path / "a")
    other = tiny_model("llama")
    fa.load_adapter(other, path)
    x = _ids()
    with torch.no_grad():
        assert torch.allclose(other.eval()(x).logits, m(x).logits, atol=1e-6)
    assert focus_config(other).global_rate == 0.2


def test_config_validation():
    for bad in (-0.1, 1.0, True):
        with pytest.raises(InputError, match="global_rate"):
            fa.FocusConfig(global_rate=bad)
    with pytest.raises(InputError, match="global_rate"):
        fa.FocusConfig(global_rate=0.1, routing="sequence")


def test_decode_steps_take_the_lean_step_and_keep_the_global_keys(monkeypatch):
    """``FocusRouter.decode`` serves global keys too (the learned threshold): every step takes it, and a prefill plus
    steps leaves the global keys and memberships of one prefill."""
    from focusattn.hf import routing_caches
    from focusattn.hf.kv import cache_kwargs, output_cache

    lean = []
    real = fa.FocusRouter.decode
    monkeypatch.setattr(fa.FocusRouter, "decode", lambda self, *a: lean.append(real(self, *a)) or lean[-1])
    m = _model()
    x = _ids(t=40)
    with torch.no_grad():
        m(x)
        whole = [(r.global_keys.clone(), r.membership.clone()) for r in last_routing(m)]
        cache = output_cache(m(x[:, :20], use_cache=True))
        for i in range(20, 40):
            cache = output_cache(m(x[:, i:i + 1], **cache_kwargs(m, cache), use_cache=True))
    assert sum(r is not None for r in lean) == len(routing_caches(m)) * 20
    for (glob, memb), r in zip(whole, last_routing(m)):
        assert torch.equal(r.global_keys, glob) and torch.equal(r.membership, memb)
    assert any(bool(g.any()) for g, _ in whole)
