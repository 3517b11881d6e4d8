import pytest


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    """A tiny random Llama with a character-level tokenizer, saved as a local model folder, plus a Focus adapter
    (random routers) made for it and one made for a different architecture."""
    import focusattn as fa
    from tests.conftest import char_tokenizer, tiny_model

    tok = char_tokenizer()
    d = tmp_path_factory.mktemp("tiny_eval")
    for name in ("llama", "gpt2"):
        m = tiny_model(name)
        if name == "llama":  # character tokens: room for a long context (lm-eval truncates to this length)
            m.config.max_position_embeddings = 512
        m.save_pretrained(d / name)
        tok.save_pretrained(d / name)
        model, _ = fa.load_model(str(d / name))
        fa.compose(model, fa.FocusConfig(num_groups=4, group_dim=8, window=8))
        fa.save_adapter(model, d / f"adapter_{name}")
    return d
