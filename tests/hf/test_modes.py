"""Routers follow the host model's train/eval mode; evaluation never changes state (issue: routers left in training
mode after compose/load_adapter made outputs drift between calls and leak the future)."""
import pytest
import torch

import focusattn as fa
from focusattn.hf import routers

from tests.conftest import V, tiny_configs, tiny_model

ARCHS = sorted(tiny_configs())
CFG = fa.FocusConfig(num_groups=4, group_dim=8, window=4)


def _ids(b=2, t=48, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(1, V, (b, t), generator=g)


def _trained(arch):
    """A composed model whose routers took two optimizer steps (offsets learned), returned in eval mode."""
    m = tiny_model(arch)
    fa.compose(m, CFG)
    m.train()
    opt = torch.optim.AdamW(fa.hf.router_parameters(m), lr=5e-2)
    for s in range(2):
        x = _ids(seed=10 + s)
        m(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    return m.eval()


def _snapshot(m):
    return {k: v.detach().clone() for k, v in m.state_dict().items()}


def _logits(m, x, k):
    fa.set_top_k(m, k)
    with torch.no_grad():
        return m(x).logits


def test_issue_repro_llama_eval_compose_is_deterministic():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=512)
    m = fa.compose(LlamaForCausalLM(cfg).eval(), fa.FocusConfig(num_groups=4, group_dim=8, window=4))
    assert [r.training for r in routers(m)] == [False, False]
    ids = torch.randint(0, 256, (2, 96))
    for k in (None, 1):
        a, b = _logits(m, ids, k), _logits(m, ids, k)
        assert torch.equal(a, b), f"top_k={k}: outputs differ between identical calls"


@pytest.mark.parametrize("arch", ARCHS)
def test_routers_follow_the_host_mode(arch):
    m = fa.compose(tiny_model(arch), CFG)  # tiny_model returns a model in eval mode
    assert not any(r.training for r in routers(m))
    m.train()
    assert all(r.training for r in routers(m))
    m.eval()
    assert not any(r.training for r in routers(m))
    t = tiny_model(arch).train()
    fa.compose(t, CFG)
    assert all(r.training for r in routers(t))


@pytest.mark.parametrize("arch", ARCHS)
def test_eval_forwards_are_repeatable_and_change_no_state(arch):
    for m in (fa.compose(tiny_model(arch), CFG), _trained(arch)):
        x = _ids()
        before = _snapshot(m)
        for k in (None, 1, 2):
            assert torch.equal(_logits(m, x, k), _logits(m, x, k)), (arch, k)
        after = _snapshot(m)
        assert before.keys() == after.keys()
        for key in before:
            assert torch.equal(before[key], after[key]), f"{arch}: eval forward changed {key}"


@pytest.mark.parametrize("arch", ARCHS)
def test_loaded_adapter_is_causal_and_reproduces_the_saved_model(arch, tmp_path):
    src = _trained(arch)
    assert all(bool(r.offsets_ready) for r in routers(src))
    fa.save_adapter(src, tmp_path / "a")
    x = _ids()
    y = x.clone()
    cut = 30
    y[:, cut:] = (y[:, cut:] + 7) % (V - 1) + 1  # different tokens after position cut
    loaded = fa.load_adapter(tiny_model(arch), tmp_path / "a")  # a fresh model in eval mode, as a user does
    assert not any(r.training for r in routers(loaded))
    for k in (None, 1, 2):
        ref = _logits(src, x, k)
        got = _logits(loaded, x, k)
        assert (got - ref).abs().max().item() <= 1e-5, (arch, k)
        changed = _logits(loaded, y, k)
        assert (changed[:, :cut] - got[:, :cut]).abs().max().item() <= 1e-5, f"{arch} top_k={k}: future leaked"


@pytest.mark.parametrize("arch", ARCHS)
def test_generate_from_a_freshly_loaded_adapter(arch, tmp_path):
    src = _trained(arch)
    fa.save_adapter(src, tmp_path / "a")
    x = _ids(b=1, t=40)
    for k in (None, 1):
        loaded = fa.load_adapter(tiny_model(arch), tmp_path / "a")
        fa.set_top_k(src, k)
        fa.set_top_k(loaded, k)
        kw = dict(max_new_tokens=6, do_sample=False, pad_token_id=0)
        with torch.no_grad():
            want = src.generate(x, **kw)
            got = loaded.generate(x, **kw)
        assert torch.equal(got, want), (arch, k)
        with torch.no_grad():  # the KV-cached decode equals a full recompute without cache, token for token
            full = loaded(got[:, :-1], use_cache=False).logits[:, x.shape[1] - 1:].argmax(-1)
        assert torch.equal(full, got[:, x.shape[1]:]), (arch, k)
