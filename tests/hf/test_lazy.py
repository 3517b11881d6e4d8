"""Elastic-Softmax on the six tiny pretrained architectures (``hf/lazy.py``): tau = 0 is the original model, the
thresholds are causal and follow the model's padding and windows, generate equals a full recompute, adapters round
trip strictly, ``unload`` gives the original back, and Focus and Lazy refuse each other."""
import pytest
import torch

import focusattn as fa
from focusattn.hf.lazy import (compose_lazy, is_lazy, lazy_parameters, lazy_state, recording, save_lazy_adapter,
                               taus)
from focusattn.lazy import ElasticConfig

from tests.conftest import V, tiny_configs, tiny_model

ARCHS = sorted(tiny_configs())
ZERO = ElasticConfig(tau_init=0.0, tau_mode="free", train_tau=False)


def _ids(b=2, t=40, seed=1):
    return torch.randint(1, V, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ARCHS)
def test_tau_zero_is_the_original_and_unload_restores_it(arch):
    m = tiny_model(arch)
    x = _ids()
    with torch.no_grad():
        ref = m(x).logits
    impl = m.config._attn_implementation
    compose_lazy(m, ZERO)
    assert m.config._attn_implementation == "lazy"
    with torch.no_grad():
        assert (m(x).logits - ref).abs().max().item() <= 1e-4
    fa.unload(m)
    assert not is_lazy(m) and m.config._attn_implementation == impl
    with torch.no_grad():
        assert torch.equal(m(x).logits, ref)


@pytest.mark.parametrize("arch", ARCHS)
def test_thresholds_are_causal_make_zeros_and_follow_padding(arch):
    m = tiny_model(arch)
    compose_lazy(m, ElasticConfig(tau_init=1.0))
    x = _ids(1, 32)
    y = x.clone()
    y[0, 20:] = (y[0, 20:] + 7) % (V - 1) + 1  # change the future only
    with torch.no_grad():
        a, b = m(x).logits, m(y).logits
    assert torch.allclose(a[0, :20], b[0, :20], atol=1e-5)
    seen = []
    with torch.no_grad(), recording(m, lambda mod, w: seen.append(w)):
        m(x)
    assert len(seen) == m.config.num_hidden_layers and all(bool((w == 0).any()) for w in seen)
    assert all(bool((w.triu(1) == 0).all()) for w in seen)
    # left padding: the padded row's real tokens get what the unpadded sequence gets (n counts real keys only)
    xs = _ids(2, 24, seed=3)
    am = torch.ones_like(xs)
    am[1, :6] = 0
    with torch.no_grad():
        padded = m(xs, attention_mask=am).logits[1, 6:]
        alone = m(xs[1:, 6:]).logits[0]
    if arch != "gpt2":  # GPT-2's learned positions are absolute: a shifted sequence is another input
        assert torch.allclose(padded, alone, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gpt2"])
def test_generate_equals_full_recompute(arch):
    m = tiny_model(arch)
    compose_lazy(m, ElasticConfig(tau_init=0.5))
    x = _ids(1, 12)
    g = m.generate(x, max_new_tokens=6, do_sample=False)
    with torch.no_grad():
        full = m(g).logits[0, x.shape[1] - 1:-1].argmax(-1)
    assert torch.equal(g[0, x.shape[1]:], full)


@pytest.mark.parametrize("arch", ARCHS)
def test_only_thresholds_train_and_adapter_round_trips(arch, tmp_path):
    m = tiny_model(arch)
    before = {n: p.detach().clone() for n, p in m.named_parameters()}
    compose_lazy(m, ElasticConfig(tau_init=0.5, use_bias=True, bias_window=16))
    params = lazy_parameters(m)
    assert len(params) == 2 * m.config.num_hidden_layers
    opt = torch.optim.AdamW(params, lr=5e-2)
    x = _ids()
    for _ in range(2):
        m(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    for n, p in m.named_parameters():
        if n in before:
            assert torch.equal(p, before[n]), n
    assert any(abs(t - 0.5) > 1e-4 for layer in taus(m) for t in layer)
    with torch.no_grad():
        want = m(x).logits
    save_lazy_adapter(m, tmp_path / "ad")
    fa.unload(m)
    assert {n for n, _ in m.named_parameters()} == set(before)
    fa.load_adapter(m, tmp_path / "ad")  # the Focus entry point loads either kind
    with torch.no_grad():
        assert torch.equal(m(x).logits, want)
    assert fa.hf.io.verify_adapter(tmp_path / "ad")["adapter_type"] == "lazy"


def test_lora_beside_the_thresholds_trains_saves_and_unloads(tmp_path):
    pytest.importorskip("peft")
    m = tiny_model("llama")
    x = _ids()
    with torch.no_grad():
        ref = m(x).logits
    compose_lazy(m, ElasticConfig(tau_init=0.5), lora_rank=2)
    names = [n for n, p in m.named_parameters() if p.requires_grad]
    assert any("lora_A" in n for n in names) and any("tau_raw" in n for n in names)
    assert not any("v_proj" in n or "o_proj" in n for n in names)  # LoRA on q and k only
    opt = torch.optim.AdamW(lazy_parameters(m), lr=5e-2)
    for _ in range(2):
        m(x, labels=x).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        want = m(x).logits
    assert any(k.startswith("lora.") for k in lazy_state(m))
    save_lazy_adapter(m, tmp_path / "ad")
    fa.unload(m)
    with torch.no_grad():
        assert torch.equal(m(x).logits, ref)
    fa.load_adapter(m, tmp_path / "ad")
    with torch.no_grad():
        assert torch.allclose(m(x).logits, want, atol=1e-6)


def test_focus_and_lazy_refuse_each_other(tmp_path):
    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=4))
    fa.save_adapter(m, tmp_path / "focus")
    with pytest.raises(ValueError, match="Focus routers"):
        compose_lazy(m)
    fa.unload(m)
    compose_lazy(m, ElasticConfig(tau_init=0.5))
    save_lazy_adapter(m, tmp_path / "lazy")
    with pytest.raises(ValueError, match="cannot be combined"):
        fa.compose(m)
    with pytest.raises(ValueError, match="cannot be combined"):
        fa.load_adapter(m, tmp_path / "focus")
    with pytest.raises(ValueError, match="cannot be combined"):
        fa.load_adapter(m, tmp_path / "lazy")
    fa.unload(m)
    fa.load_adapter(m, tmp_path / "focus")
    with pytest.raises(ValueError, match="cannot be combined"):
        fa.load_adapter(m, tmp_path / "lazy")
    # commands that need a Focus adapter name the Lazy one
    from focusattn.hf.io import read_adapter_config
    with pytest.raises(ValueError, match="Lazy .* adapter"):
        read_adapter_config(tmp_path / "lazy")


def test_corrupt_lazy_adapter_is_one_line_error(tmp_path):
    m = tiny_model("llama")
    compose_lazy(m, ElasticConfig(tau_init=0.5))
    save_lazy_adapter(m, tmp_path / "ad")
    fa.unload(m)
    f = tmp_path / "ad" / "adapter.safetensors"
    f.write_bytes(f.read_bytes()[:-8])
    with pytest.raises(ValueError, match="sha256") as e:
        fa.load_adapter(m, tmp_path / "ad")
    assert "\n" not in str(e.value) and not is_lazy(m)
    other = tiny_model("gpt2")
    with pytest.raises(ValueError, match="was made for"):
        fa.load_adapter(other, tmp_path / "ad")


def test_unsupported_architecture_names_the_supported_ones():
    import transformers as tr

    m = tr.AutoModelForCausalLM.from_config(tr.PhiConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                                         intermediate_size=32, vocab_size=V))
    with pytest.raises(ValueError, match="supports .*llama"):
        compose_lazy(m)


def test_bad_elastic_config_names_the_field():
    with pytest.raises(ValueError, match="tau_init"):
        ElasticConfig(tau_init=0.0)  # softplus cannot reach 0
    with pytest.raises(ValueError, match="tau_mode"):
        ElasticConfig(tau_mode="neg")
