"""Shared test helpers: random memberships, tiny models of every supported architecture, a tiny local model folder
with a corpus (for CLI runs), and an ``assert_close`` that reports the relative error.

Tests import the helpers with ``from tests.conftest import ...``; fixtures are found by pytest.
"""
import os

import pytest
import torch

# Keep CI deterministic and light on 2 cores.
torch.manual_seed(0)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

V = 97  # vocabulary of the tiny HF models


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# ------------------------------------------------------------------------------------------------ tensors
def random_membership(b, t, k_groups, top_k, seed=0, *, gen=None):
    """Bool ``[b, t, k_groups]``: each token in exactly ``top_k`` distinct random groups (top-k routing). Draws
    from ``gen`` when given (advancing it), else from a generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed) if gen is None else gen
    order = torch.rand(b, t, k_groups, generator=gen).argsort(-1)[..., :top_k]
    return torch.zeros(b, t, k_groups, dtype=torch.bool).scatter_(-1, order, True)


def assert_close(actual, expected, *, atol=1e-5, rtol=1e-5, name="tensor"):
    """Equal shapes, and ``|a - e| <= atol + rtol |e|`` everywhere; a failure reports the largest absolute and
    relative errors and where they are."""
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().double(), expected.detach().double()
    same_inf = torch.isinf(a) & torch.isinf(e) & (a == e)
    err = torch.where(same_inf, torch.zeros_like(a), (a - e).abs())
    bad = err > atol + rtol * e.abs().nan_to_num(0.0, posinf=0.0, neginf=0.0)
    if bool(bad.any()) or bool(err.isnan().any()):
        rel = err / e.abs().clamp_min(1e-12)
        i = int(err.nan_to_num(float("inf")).flatten().argmax())
        where = tuple(int(x) for x in torch.unravel_index(torch.tensor(i), err.shape))
        raise AssertionError(f"{name}: {int(bad.sum())} of {err.numel()} elements differ; max abs error "
                             f"{err.max().item():.3e} at {where}, max relative error {rel.max().item():.3e} "
                             f"(atol={atol}, rtol={rtol})")


def focus_case(seed, b, hq, hkv, tq, tk, k, top_k, dtype=torch.float32):
    """Random q ``[b, hq, tq, 8]``, k/v ``[b, hkv, tk, 8]`` and top-``top_k`` of ``k`` membership from one seed."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, 8, generator=g, dtype=dtype)
    kk = torch.randn(b, hkv, tk, 8, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, tk, 8, generator=g, dtype=dtype)
    scores = torch.randn(b, tk, k, generator=g)
    member = torch.zeros(b, tk, k, dtype=torch.bool).scatter_(-1, scores.topk(top_k, -1).indices, True)
    return q, kk, v, member


# ------------------------------------------------------------------------------------------------ HF models
def tiny_configs():
    """Tiny random configs of every supported architecture."""
    import transformers as tr

    common = dict(num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=V, max_position_embeddings=256)
    return {
        "gpt2": tr.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=V, n_positions=256, bos_token_id=0,
                              eos_token_id=0, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0),
        "llama": tr.LlamaConfig(**common),
        "mistral": tr.MistralConfig(**common, sliding_window=None),
        "qwen2": tr.Qwen2Config(**common),
        "olmo2": tr.Olmo2Config(**common),
        # interleaved sliding window (8) shorter than the test sequences, and logit softcapping
        "gemma2": tr.Gemma2Config(**common, head_dim=16, sliding_window=8, attn_logit_softcapping=5.0,
                                  final_logit_softcapping=None),
    }


def tiny_model(name):
    """A tiny random causal LM of architecture ``name`` (see :func:`tiny_configs`), in eval mode."""
    import transformers as tr

    torch.manual_seed(0)
    m = tr.AutoModelForCausalLM.from_config(tiny_configs()[name])
    for n in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(m.config, n, None) is not None and getattr(m.config, n) >= V:
            setattr(m.config, n, 0)
    return m.eval()


def composed(cfg, arch="llama"):
    """A tiny model of ``arch`` with Focus routers whose causal offsets count as learned (as after training), so
    evaluation is causal from the first token; in eval mode."""
    import focusattn as fa

    m = tiny_model(arch)
    fa.compose(m, cfg)
    for r in fa.hf.routers(m):
        r.offsets_ready.fill_(True)
    return m.eval()


def token_ids(b=1, t=40, seed=1):
    """Random token ids [b, t] of the tiny models' vocabulary, seeded."""
    return torch.randint(1, V, (b, t), generator=torch.Generator().manual_seed(seed))


def assert_round_trip(m, path, arch="llama"):
    """Save ``m``'s adapter under ``path``, load it into a fresh tiny ``arch`` model, check the logits agree; return
    the loaded model."""
    import focusattn as fa

    x = token_ids()
    with torch.no_grad():
        want = m(x).logits
    fa.save_adapter(m, path)
    loaded = fa.load_adapter(tiny_model(arch), path).eval()
    with torch.no_grad():
        assert_close(loaded(x).logits, want, atol=1e-5, name="round trip")
    return loaded


def char_tokenizer():
    """A character-level tokenizer whose ids (0..96) fit the tiny models' vocabulary ``V``: no files, no network."""
    from tokenizers import Regex, Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {chr(i): i - 32 for i in range(32, 127)}
    vocab.update({"[UNK]": 95, "[EOS]": 96})
    t = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="[EOS]", unk_token="[UNK]")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A saved tiny Llama with a char-level tokenizer (``model/``) and a local text corpus (``corpus/``)."""
    tok = char_tokenizer()
    d = tmp_path_factory.mktemp("tiny")
    model = tiny_model("llama")
    model.save_pretrained(d / "model")
    tok.save_pretrained(d / "model")
    corpus = d / "corpus"
    corpus.mkdir()
    g = torch.Generator().manual_seed(0)
    words = ["the", "king", "queen", "sword", "crown", "night", "love", "war", "and", "of"]
    for i in range(6):
        idx = torch.randint(0, len(words), (600,), generator=g)
        (corpus / f"doc{i}.txt").write_text(" ".join(words[j] for j in idx))
    return d
