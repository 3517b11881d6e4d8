"""``focusattn sinks``: sink mass per layer and perplexity under fixed masks, on the tiny local model."""
import json

import pytest

from focusattn.cli import main


def test_sink_probe(tmp_path, tiny_dir):
    # (--windows: the old, hidden spelling of --eval-windows, still accepted)
    rc = main(["sinks", "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"), "--out",
               str(tmp_path), "--seq-len", "48", "--windows", "1", "--window", "8", "--groups", "3"])
    assert rc == 0
    res = json.loads((tmp_path / "sink_probe.json").read_text())
    assert len(res["perplexity"]) == 5 and all(v > 1 for v in res["perplexity"].values())
    assert len(res["sink_mass_per_layer"]) == 2 and all(0 <= m <= 1 for m in res["sink_mass_per_layer"])
    # softmax rows sum to 1: the share of the row's mass is the weight itself, per head
    for m, s in zip(res["sink_mass_per_head"], res["sink_share_per_head"]):
        assert s == pytest.approx(m, rel=1e-5)
    assert [sum(h) / len(h) for h in res["sink_mass_per_head"]] == pytest.approx(res["sink_mass_per_layer"])
    assert (tmp_path / "sink_probe.png").stat().st_size > 1000


def test_zero_tiles_counts_causal_blocks_that_are_entirely_zero():
    import torch

    from focusattn.eval.lazy_probe import zero_tiles

    a = torch.rand(1, 2, 8, 8).tril()
    a[0, 0, 4:, :4] = 0  # head 0: the one below-diagonal block of 4 x 4 tiles is zero
    got = zero_tiles(a, tile=4)  # causal tiles: (0,0), (1,0), (1,1)
    assert torch.allclose(got, torch.tensor([1 / 3, 0.0], dtype=torch.float64))
    assert torch.allclose(zero_tiles(torch.zeros(1, 1, 5, 5), tile=4), torch.tensor([1.0], dtype=torch.float64))
