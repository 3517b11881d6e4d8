"""scripts/head_ranks.py: its needles put the answer's digits where the scores look, its induction score is the
frozen model's own attention at the aligned positions, and its ranks leave the dense heads out."""
import importlib.util
from pathlib import Path

import numpy as np
import torch

import focusattn as fa
from tests.conftest import V, char_tokenizer, composed, tiny_model

spec = importlib.util.spec_from_file_location("head_ranks", Path(__file__).resolve().parents[2] / "scripts"
                                              / "head_ranks.py")
hr = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hr)


def test_needles_put_the_key_digits_where_the_answer_copies_them():
    tok = char_tokenizer()
    ids = np.random.default_rng(0).integers(40, 90, 5000)
    for s in hr.needle_sequences(ids, tok, 240, 2):
        assert len(s["tokens"]) == 240
        got = [s["tokens"][r + 1] for r in s["rows"]]  # what each row predicts
        assert got == [s["tokens"][k] for k in s["keys"]] and len(got) == 6  # the six digits, copied from the needle
        assert all(tok.decode([t]).isdigit() for t in got)


def test_natural_induction_is_the_models_attention_on_the_token_after_the_earlier_copy():
    ids = np.random.default_rng(1).integers(1, V, 3000)
    m = composed(fa.FocusConfig(num_groups=4, window=4))
    got = hr.natural_induction(m, ids, 2, length=120, passage=24, distance=48)
    ref = tiny_model("llama")  # the same weights, without routers
    ref.config._attn_implementation = "eager"
    want = torch.zeros_like(got)
    for x, second in hr.repeat_copy_sequences(ids, 120, passage=24, distance=48, n=2, seed=11):
        p = ref(torch.as_tensor(x[None]), output_attentions=True).attentions  # per layer [1, Hq, T, T]
        rows = torch.arange(second, 119)
        for layer, a in enumerate(p):
            per_q = a[0][:, rows, rows - 48 + 1].mean(-1)  # [Hq]
            want[layer] += per_q.view(got.shape[1], -1).max(-1).values
    torch.testing.assert_close(got, want / 2, atol=1e-5, rtol=1e-4)


def test_ranks_leave_the_dense_heads_out_best_first():
    s = torch.tensor([[0.1, 0.9, 0.3], [0.5, 0.2, 0.8]])
    r = hr.ranks(s, {(0, 1)}, top=2)
    assert r["order"] == ["1:2", "1:0", "0:2", "1:1", "0:0"]
    assert r["top"] == [["1:2", 0.8], ["1:0", 0.5]]


def test_dense_gain_is_the_copy_loss_a_head_served_dense_saves_and_leaves_the_config_as_it_was():
    from focusattn.hf import focus_config, update_config

    ids = np.random.default_rng(2).integers(1, V, 3000)
    m = composed(fa.FocusConfig(num_groups=4, window=4, dense_heads=((1, 0),)))
    seqs = hr.repeat_copy_sequences(ids, 120, passage=24, distance=48, n=2, seed=3)
    g = hr.dense_gain(m, seqs, layers=2)  # every layer's routed heads tried one by one
    assert focus_config(m).dense_heads == ((1, 0),) and g["served"] == hr.copy_loss(m, seqs)
    assert set(g["layers"]) == {0, 1} and g["heads"][1, 0] == float("-inf")  # dense already: not a candidate
    for layer, head in ((0, 0), (0, 1), (1, 1)):
        update_config(m, dense_heads=tuple(sorted(((1, 0), (layer, head)))))
        assert abs(float(g["heads"][layer, head]) - (g["served"] - hr.copy_loss(m, seqs))) < 1e-6
    update_config(m, dense_heads=((0, 0), (0, 1), (1, 0)))  # layer 0's routed heads together
    assert abs(g["layers"][0] - (g["served"] - hr.copy_loss(m, seqs))) < 1e-6
    update_config(m, dense_heads=((0, 0), (0, 1), (1, 0), (1, 1)))  # every head dense: the original model
    assert abs(hr.copy_loss(m, seqs) - g["original"]) < 1e-4
    update_config(m, dense_heads=((1, 0),))
    one = hr.dense_gain(m, seqs, layers=1)  # only the best layer's routed heads
    best = max(one["layers"], key=one["layers"].get)
    assert {tuple(x) for x in torch.isfinite(one["heads"]).nonzero().tolist()} == \
        {(best, h) for h in range(2) if (best, h) != (1, 0)}
