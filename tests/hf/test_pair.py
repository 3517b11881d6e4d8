import pytest

from tests.conftest import V, char_tokenizer, tiny_model


def _model_dir(tmp_path):
    import transformers as tr

    d = tmp_path / "tiny"
    cfg = tr.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=48, vocab_size=V, max_position_embeddings=64)
    tr.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    char_tokenizer().save_pretrained(d)
    return d


def test_window_and_capacity_overrides_reach_the_served_copy_only(tmp_path):
    """``long-eval --window`` / ``bench-model --window``: the adapter's copy serves the new window (what the
    budget-matched baselines then match), the original keeps its own attention, the adapter on disk is unchanged."""
    import focusattn as fa
    from focusattn.hf import focus_config, pair
    from focusattn.hf.io import read_adapter_config

    d = _model_dir(tmp_path)
    m, _ = fa.load_model(str(d))
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1))
    adapter = fa.save_adapter(m, tmp_path / "ad")
    p = pair.load_pair(str(d), adapter, lengths=[16], top_ks=[1], window=8, capacity=1.5)
    assert focus_config(p.focus).window == 8 and p.cfg.window == 8 and p.cfg.capacity == 1.5
    assert read_adapter_config(adapter)["focus_config"]["window"] == 3
    with pytest.raises(ValueError):
        focus_config(p.base)  # the original has no Focus layers


def test_a_budget_override_serves_a_key_space_adapter_at_its_new_budget(tmp_path, monkeypatch):
    """``--budget``: a key-space adapter's copy fills the new share of each query's distant keys (its centroids
    unchanged); on a hidden-state adapter, which has no budget, it is a one-line error naming the field before any
    model loads."""
    import focusattn as fa
    from focusattn.hf import focus_config, loading, pair, routers
    from focusattn.hf.io import read_adapter_config

    d = _model_dir(tmp_path)
    m, _ = fa.load_model(str(d))
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, router_input="keys", top_k=1, budget=0.3))
    adapter = fa.save_adapter(m, tmp_path / "keys")
    p = pair.load_pair(str(d), adapter, lengths=[16], top_ks=[1], budget=0.1)
    assert p.cfg.budget == 0.1 and focus_config(p.focus).budget == 0.1
    assert all(r.cfg.budget == 0.1 for r in routers(p.focus))
    assert read_adapter_config(adapter)["focus_config"]["budget"] == 0.3
    h = tiny_model("llama")
    fa.compose(h, fa.FocusConfig(num_groups=4, window=3))
    hidden = fa.save_adapter(h, tmp_path / "hidden")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ValueError, match="budget") as e:
        pair.load_pair("any", hidden, lengths=[16], top_ks=[1], budget=0.1)
    assert "\n" not in str(e.value)


def test_a_bad_window_is_a_one_line_error_before_any_model_loads(tmp_path, monkeypatch):
    import focusattn as fa
    from focusattn.hf import loading, pair

    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3))
    adapter = fa.save_adapter(m, tmp_path / "ad")
    monkeypatch.setattr(loading, "load_model", lambda *a, **k: pytest.fail("loaded a model"))
    with pytest.raises(ValueError, match="window") as e:
        pair.load_pair("any", adapter, lengths=[16], top_ks=[1], window=-1)
    assert "\n" not in str(e.value)
