"""Lab probes (extrapolation interventions, empty rows) on tiny trained runs: the interventions really change what
they claim and nothing else, and the empty-row accounting matches the attention weights."""
import pytest
import torch

from focusattn.gpt.config import get_preset
from focusattn.gpt.data import LMData
from focusattn.gpt.probes import (INTERVENTIONS, empty_rows_probe, extrapolation, lazy_override, load_run,
                                  render_markdown, token_losses)
from focusattn.gpt.tokenizer import encode
from focusattn.gpt.train import train_lm
from focusattn.lazy.attention import LazyAttention

TEXT = ("ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. " * 60)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    data = LMData("toy", encode(TEXT), encode(TEXT[::-1]))
    root = tmp_path_factory.mktemp("probes")
    out = {}
    for att in ("standard", "lazy"):
        mcfg, tcfg = get_preset("tiny", att)
        train_lm(mcfg, tcfg, data=data, seed=0, out_dir=root / att, progress=False)
        out[att] = load_run(root / att)
    return data, out


def test_interventions_change_only_past_the_training_length(runs):
    data, models = runs
    lazy = models["lazy"]
    t0 = lazy.cfg.block_size
    for t in (t0, 4 * t0):
        x, y = data.val_windows(t, 2)
        base = token_losses(lazy, x, y)
        with lazy_override(lazy, threshold_len=t0) as n:
            capped = token_losses(lazy, x, y)
        assert n == lazy.cfg.n_layer
        if t == t0:  # n_i <= T_train everywhere: the cap is the paper's threshold
            assert torch.allclose(base, capped)
        else:
            assert torch.allclose(base[:, :t0], capped[:, :t0]) and not torch.allclose(base, capped)
    assert all(m.cfg.threshold_len is None for m in lazy.modules() if isinstance(m, LazyAttention))  # restored


def test_extrapolation_rows_and_empty_rows(runs):
    data, models = runs
    rows = extrapolation(models, {"toy": data}, windows=2)
    assert {r["intervention"] for r in rows if r["model"] == "lazy"} == set(INTERVENTIONS)
    assert {r["intervention"] for r in rows if r["model"] == "standard"} == {"as trained"}
    assert all(torch.isfinite(torch.tensor(r["loss"])) for r in rows)
    probe = empty_rows_probe(models, data, windows=2)
    assert all(l["first_query"] == 0 and l["later_rows"] == 0 for l in probe["standard"]["empty_rows"])
    tau = min(float(m.tau.min()) for m in models["lazy"].modules() if isinstance(m, LazyAttention))
    if tau >= 1:  # row 0 holds one weight p = 1, thresholded by tau / 1
        assert all(l["first_query"] == 1 for l in probe["lazy"]["empty_rows"])
    assert probe["standard"]["delta_first_query"] == 0 and "delta_later" in probe["lazy"]
    doc = {"command": "x", "preset": "tiny", "block_size": 32, "seeds": [0], "windows": 2, "variants": list(models),
           "extrapolation": rows, "empty_rows": {k: [v] for k, v in probe.items()}}
    md = render_markdown(doc)
    assert "| lazy | threshold cap |" in md and "| standard |" in md
