"""Lab LM: every attention variant runs forward/backward on the tiny preset; configs and names are validated."""
import pytest
import torch

from focusattn.gpt.config import ATTENTIONS, ModelConfig, TrainConfig, get_preset
from focusattn.gpt.model import GPT
from focusattn.gpt.tokenizer import BOS, decode, encode


@pytest.mark.parametrize("name", ATTENTIONS)
def test_variant_forward_backward_and_weights(name):
    torch.manual_seed(0)
    cfg, _ = get_preset("tiny", name)
    m = GPT(cfg)
    idx = torch.randint(0, cfg.vocab_size, (2, cfg.block_size))
    logits, loss = m(idx, idx)
    assert logits.shape == (2, cfg.block_size, cfg.vocab_size) and torch.isfinite(loss)
    loss.backward()
    missing = [n for n, p in m.named_parameters() if p.grad is None]
    assert not missing, f"{name}: no gradient for {missing}"
    w = m.attention_weights(idx)
    assert len(w) == cfg.n_layer and w[0].shape == (2, cfg.n_head, cfg.block_size, cfg.block_size)
    assert (w[0].triu(1) == 0).all()  # causal
    if name in ("standard", "sliding", "focus"):
        assert torch.allclose(w[0].sum(-1), torch.ones(()), atol=1e-5)
    else:
        assert (w[0].sum(-1) <= 1 + 1e-5).all()  # tau >= 0 (nonneg): mass only removed


def test_sliding_window_zeroes_distant_keys():
    cfg, _ = get_preset("tiny", "sliding")
    w = GPT(cfg).attention_weights(torch.randint(0, 256, (1, cfg.block_size)))[0]
    i = torch.arange(cfg.block_size)
    far = (i[:, None] - i[None, :]) >= cfg.window
    assert (w[..., far] == 0).all() and (w[..., ~far & (i[:, None] >= i[None, :])] > 0).all()


def test_extrapolation_lengths_fit_the_rope_cache_and_not_beyond():
    cfg, _ = get_preset("tiny", "lazy")
    m = GPT(cfg)
    m(torch.zeros(1, 4 * cfg.block_size, dtype=torch.long))
    with pytest.raises(ValueError, match="exceeds the RoPE cache"):
        m(torch.zeros(1, 4 * cfg.block_size + 1, dtype=torch.long))


def test_rope_base_defaults_and_override():
    assert get_preset("tiny", "lazy")[0].base == 100000.0
    assert get_preset("tiny", "elastic-only")[0].base == 10000.0
    assert get_preset("tiny", "lazy", rope_base=500.0)[0].base == 500.0


def test_unknown_names_list_valid_ones():
    with pytest.raises(ValueError, match="valid: standard, lazy, lazy-no-bias, elastic-only, focus, sliding"):
        get_preset("tiny", "linear")
    with pytest.raises(ValueError, match="unknown preset 'huge'; valid: tiny, lab, lab-long, lab-sink, mqar, passkey, small"):
        get_preset("huge", "lazy")


@pytest.mark.parametrize("kw, match", [
    ({"d_model": 30, "n_head": 4}, "d_model"),
    ({"tau_mode": "abs"}, r"tau_mode='abs' is invalid: allowed \('nonneg', 'free'\)"),
    ({"max_seq_len": 8, "block_size": 16}, "max_seq_len"),
    ({"lazy_impl": "triton"}, "lazy_impl"),
])
def test_model_config_validation(kw, match):
    with pytest.raises(ValueError, match=match):
        ModelConfig(**kw)


def test_train_config_validation():
    with pytest.raises(ValueError, match="TrainConfig.lr"):
        TrainConfig(lr=0.0)


def test_byte_tokenizer_roundtrip():
    text = "To be, or not to be — that is the question"
    ids = encode(text)
    assert ids.max() < BOS and decode(ids) == text


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_first_query_is_a_constant_and_empty_when_tau_at_least_one(impl):
    """The first-query question (issue 13): row 0 sees only BOS, so what it computes is the same for every input;
    with tau >= 1 Elastic-Softmax empties it (p = 1 <= tau / 1) in both kernel paths. An empty row 0 therefore
    changes a constant of the model, never what it can tell apart."""
    torch.manual_seed(0)
    m = GPT(ModelConfig(attention="lazy", n_layer=2, n_head=2, d_model=16, block_size=8, lazy_impl=impl,
                        tau_mode="free")).eval()
    x = torch.randint(0, 256, (3, 8))
    x[:, 0] = BOS
    with torch.no_grad():
        for blk in m.blocks:
            blk.attn.tau_raw.fill_(1.0)  # free mode: tau = 1 exactly, row 0's threshold is 1 / 1
        logits, _ = m(x)
        h = m.tok_emb(x)
        for blk in m.blocks:
            out = blk.attn(blk.ln1(h))
            assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0]))  # o_proj has no bias: exactly zero
            assert out[:, 1:].abs().sum() > 0
            h = blk(h)
    assert torch.allclose(logits[0, 0], logits[1, 0]) and torch.allclose(logits[0, 0], logits[2, 0])
