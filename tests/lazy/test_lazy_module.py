"""LazyAttention module: config validation, tau parameterisation, RoPE cache limit, kernel agreement, GQA."""
import pytest
import torch

from focusattn.lazy import LazyAttention, LazyConfig
from focusattn.lazy.rope import RotaryEmbedding


def test_config_errors_name_argument_and_allowed_values():
    with pytest.raises(ValueError, match=r"tau_mode=.*allowed \('nonneg', 'free'\)"):
        LazyConfig(n_heads=2, tau_mode="abs")
    with pytest.raises(ValueError, match="bias_window"):
        LazyConfig(n_heads=2, bias_window=0)
    with pytest.raises(ValueError, match="n_kv_heads"):
        LazyConfig(n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="tau_init"):
        LazyConfig(n_heads=2, tau_mode="nonneg", tau_init=-1.0)
    with pytest.raises(ValueError, match="unknown LazyConfig keys"):
        LazyConfig.from_dict({"n_heads": 2, "heads": 3})


def test_tau_init_and_nonneg_constraint():
    m = LazyAttention(16, LazyConfig(n_heads=2))
    assert torch.allclose(m.tau, torch.ones(2))
    with torch.no_grad():
        m.tau_raw.fill_(-50.0)
    assert (m.tau >= 0).all()
    free = LazyAttention(16, LazyConfig(n_heads=2, tau_mode="free"))
    with torch.no_grad():
        free.tau_raw.fill_(-0.5)
    assert torch.allclose(free.tau, torch.full((2,), -0.5))


def test_sequence_longer_than_rope_cache_is_an_error():
    m = LazyAttention(16, LazyConfig(n_heads=2, max_seq_len=8))
    m(torch.randn(1, 8, 16))
    with pytest.raises(ValueError, match="exceeds the RoPE cache"):
        m(torch.randn(1, 9, 16))


def test_rope_preserves_norm_and_relative_dot_products():
    rope = RotaryEmbedding(8, 32, base=100.0)
    x = torch.randn(1, 1, 1, 8).expand(1, 1, 32, 8)
    y = torch.randn(1, 1, 1, 8).expand(1, 1, 32, 8)
    rx, ry = rope(x), rope(y)
    assert torch.allclose(rx.norm(dim=-1), x.norm(dim=-1), atol=1e-5)
    # <R_i x, R_j y> depends on i - j only
    assert torch.allclose((rx[..., 5, :] * ry[..., 2, :]).sum(), (rx[..., 20, :] * ry[..., 17, :]).sum(), atol=1e-4)


@pytest.mark.parametrize("kv", [None, 1])
def test_module_reference_and_chunked_agree_with_grads(kv):
    torch.manual_seed(0)
    cfg = dict(n_heads=4, n_kv_heads=kv, max_seq_len=32, bias_window=8, bias_init="normal", bias_init_std=0.5)
    ref = LazyAttention(32, LazyConfig(impl="reference", **cfg))
    chk = LazyAttention(32, LazyConfig(impl="chunked", block=5, **cfg))
    chk.load_state_dict(ref.state_dict())
    x = torch.randn(2, 19, 32)
    outs = []
    for m in (ref, chk):
        y = m(x)
        y.square().sum().backward()
        outs.append((y, {n: p.grad for n, p in m.named_parameters()}))
    assert torch.allclose(outs[0][0], outs[1][0], atol=1e-5)
    for n, gref in outs[0][1].items():
        assert torch.allclose(gref, outs[1][1][n], atol=1e-4), n
    assert outs[0][1]["bias.table"].abs().sum() > 0 and outs[0][1]["tau_raw"].abs().sum() > 0


def test_attention_weights_match_forward():
    torch.manual_seed(1)
    m = LazyAttention(16, LazyConfig(n_heads=2, max_seq_len=16, bias_window=4, bias_init="normal",
                                     bias_init_std=0.3, tau_init=0.5))
    x = torch.randn(1, 10, 16)
    a = m.attention_weights(x)
    _, _, v = m._qkv(x)
    expected = m.o_proj((a @ v).transpose(1, 2).reshape(1, 10, 16))
    assert torch.allclose(m(x), expected, atol=1e-5)


def test_no_bias_variant_has_no_table_parameter():
    m = LazyAttention(16, LazyConfig(n_heads=2, use_bias=False))
    assert "bias.table" not in dict(m.named_parameters())
