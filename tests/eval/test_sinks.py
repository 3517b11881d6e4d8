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
