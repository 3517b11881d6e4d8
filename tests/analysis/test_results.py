import json

import pytest

from focusattn.analysis.results import write_results
from focusattn.cli import main


def _summary(gate="log"):
    return {
        "command": "focusattn retrofit --out x",
        "config": {"model": "m", "data": "shakespeare", "ood_data": "lee-news", "steps": 3, "batch_size": 1,
                   "grad_accum": 1, "seq_len": 64,
                   "focus": {"num_groups": 2, "group_dim": 4, "window": 8, "gate": gate, "lam": 10.0,
                             "gate_offset": 0.5, "routing": "causal"}},
        "parameters": {"router": 10, "total": 1000, "percent": 1.0},
        "perplexity": {"before": {"domain": 30.0, "ood": 40.0},
                       "after": {"domain": {"soft": 29.5, "top1": 35.25, "top2": 30.0},
                                 "ood": {"soft": 41.0, "top1": 50.0, "top2": 40.0}}},
        "groups": [{"layer": 0, "dominance": 0.6, "confidence": 0.9, "group_share": [0.6, 0.4]}],
        "adapter": "x/adapter", "wall_seconds": 60.0,
    }


def test_results_are_generated_from_json(tmp_path):
    (tmp_path / "retrofit_default.json").write_text(json.dumps(_summary()))
    (tmp_path / "retrofit_mult.json").write_text(json.dumps(_summary("multiplicative")))
    out = write_results(tmp_path, tmp_path / "RESULTS.md")
    text = out.read_text()
    assert "35.25" in text and "focusattn retrofit --out x" in text and "multiplicative" in text
    assert "Not yet measured" in text  # bench/lab sections without JSON say so instead of inventing numbers


def test_report_cli_errors(tmp_path, capsys):
    assert main(["report", "--results", str(tmp_path / "missing"), "--out", str(tmp_path / "R.md")]) == 2
    assert "no such folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["nonsense-command"])
