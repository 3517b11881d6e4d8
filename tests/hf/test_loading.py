"""Loading models safely: a tokenizer that does not fit the model is refused where the model is loaded, and the
offline model's one-time conversion never leaves a partial folder that a later run would take as a model."""
import pytest
import torch

from focusattn._errors import InputError
from focusattn.hf import loading

from tests.conftest import V, char_tokenizer, tiny_model


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache (never the user's ~/.cache/focusattn) with the GGUF read replaced by a tiny model."""
    root = tmp_path / "cache"
    monkeypatch.setenv("FOCUSATTN_CACHE", str(root))
    monkeypatch.setattr(loading, "_read_gguf", lambda alias: (tiny_model("llama"), char_tokenizer()))
    return root


def _mismatched_dir(tmp_path):
    import transformers as tr

    d = tmp_path / "small-vocab"
    cfg = tr.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=48, vocab_size=V // 2, max_position_embeddings=64)
    tr.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    char_tokenizer().save_pretrained(d)  # 97 tokens for a model that embeds 48
    return d


def test_tokenizer_that_does_not_fit_the_model_is_a_one_line_error(tmp_path):
    d = _mismatched_dir(tmp_path)
    with pytest.raises(InputError) as ei:
        loading.load_model(str(d))
    msg = str(ei.value)
    assert "\n" not in msg and f"{V} tokens" in msg and f"only {V // 2} ids" in msg and str(d) in msg


def test_pair_loader_refuses_a_mismatched_tokenizer_before_loading_the_second_copy(tmp_path, monkeypatch):
    import focusattn as fa
    from focusattn.hf import pair

    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3))
    adapter = fa.save_adapter(m, tmp_path / "ad")
    calls = []
    real = loading.load_model
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: calls.append(a) or real(*a, **k))
    with pytest.raises(InputError, match="tokenizer belongs to another model"):
        pair.load_pair(str(_mismatched_dir(tmp_path)), adapter, lengths=[16], top_ks=[1])
    assert len(calls) == 1


def test_smaller_tokenizer_than_embedding_is_fine():
    m = tiny_model("llama")
    m.resize_token_embeddings(V + 31)  # vocabularies padded to a multiple of 64
    loading.check_tokenizer(char_tokenizer(), m)


def test_conversion_is_used_once_complete(cache):
    path = loading.resolve_model_path("smollm2-135m")
    assert loading.is_complete_model_dir(loading.Path(path))
    assert sorted(p.name for p in (cache / "models").iterdir()) == ["smollm2-135m"]  # no temp folder left
    model, tok = loading.load_model("smollm2-135m")
    assert model.config._name_or_path == "smollm2-135m" and len(tok) == V


@pytest.mark.parametrize("exc", [KeyboardInterrupt, OSError(28, "No space left on device")])
def test_interrupted_conversion_leaves_no_model_and_is_redone(cache, monkeypatch, exc):
    """Interrupted after the weights were written, before the tokenizer: nothing in models/ is a model, other
    cache content survives, and the next call converts again."""
    (cache / "assets").mkdir(parents=True)
    (cache / "assets" / "keep.txt").write_text("other cached content")
    tok = char_tokenizer()

    def broken_save(*a, **k):
        raise exc

    monkeypatch.setattr(loading, "_read_gguf", lambda alias: (tiny_model("llama"), tok))
    monkeypatch.setattr(tok, "save_pretrained", broken_save)
    with pytest.raises(KeyboardInterrupt if exc is KeyboardInterrupt else RuntimeError) as ei:
        loading.resolve_model_path("smollm2-135m")
    if exc is not KeyboardInterrupt:
        assert "the cache is unchanged" in str(ei.value) and "\n" not in str(ei.value)
    assert list((cache / "models").iterdir()) == []  # no partial folder, no temp folder
    assert (cache / "assets" / "keep.txt").read_text() == "other cached content"
    monkeypatch.setattr(loading, "_read_gguf", lambda alias: (tiny_model("llama"), char_tokenizer()))
    assert loading.is_complete_model_dir(loading.Path(loading.resolve_model_path("smollm2-135m")))


def test_partial_model_folder_is_not_taken_as_a_model(cache):
    """A folder with a config but truncated weights (e.g. copied or killed by an older version) is redone."""
    out = cache / "models" / "smollm2-135m"
    loading.resolve_model_path("smollm2-135m")
    (out / loading.COMPLETE).unlink()
    assert loading.is_complete_model_dir(out)  # a whole folder from before the marker existed is still used
    w = out / "model.safetensors"
    w.write_bytes(w.read_bytes()[:1000])
    assert not loading.is_complete_model_dir(out)
    loading.resolve_model_path("smollm2-135m")
    assert loading.is_complete_model_dir(out) and (out / loading.COMPLETE).is_file()
    model, _ = loading.load_model("smollm2-135m")
    assert torch.equal(model.model.embed_tokens.weight, tiny_model("llama").model.embed_tokens.weight)
