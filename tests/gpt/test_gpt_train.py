"""train-lm end to end on the tiny preset: outputs, resume equals an uninterrupted run, CLI errors, compare."""
import argparse
import json

import pytest
import torch

from focusattn.gpt.cli import register
from focusattn.gpt.compare import render_markdown
from focusattn.gpt.data import LMData
from focusattn.gpt.tokenizer import BOS, encode

TEXT = ("ROMEO. But soft, what light through yonder window breaks? It is the east, and Juliet is the sun. " * 40)


@pytest.fixture(scope="module")
def data():
    return LMData("toy", encode(TEXT), encode(TEXT[::-1]))


def _cli(argv, monkeypatch, data):
    # The corpus loader is swapped for an in-memory one so the test needs no corpus download.
    monkeypatch.setattr(LMData, "load", classmethod(lambda cls, name: data))
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_batches_are_deterministic_and_bos_led(data):
    x1, y1 = data.batch(3, 17, 4, 16)
    x2, y2 = data.batch(3, 17, 4, 16)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert (x1[:, 0] == BOS).all() and torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(data.batch(3, 18, 4, 16)[0], x1)


def test_train_resume_matches_uninterrupted(tmp_path, monkeypatch, data):
    base = ["train-lm", "--attention", "lazy", "--preset", "tiny", "--seed", "1", "--no-progress"]
    assert _cli(base + ["--out", str(tmp_path / "full")], monkeypatch, data) == 0
    assert _cli(base + ["--out", str(tmp_path / "split"), "--stop-at", "3"], monkeypatch, data) == 0
    assert not (tmp_path / "split" / "result.json").exists()
    assert _cli(base + ["--out", str(tmp_path / "split"), "--resume"], monkeypatch, data) == 0
    full = json.loads((tmp_path / "full" / "result.json").read_text())
    split = json.loads((tmp_path / "split" / "result.json").read_text())
    assert full["val_loss_by_length"] == split["val_loss_by_length"]
    assert set(full["val_loss_by_length"]) == {"1x", "2x", "4x"}
    assert len(full["attention"]["per_head"]["sink_mass"]) == 2  # layers
    logs = [json.loads(ln) for ln in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logs] == [2, 4, 6, 8]  # no duplicates after resuming
    assert all(r["loss"] > 0 and r["tok_s"] > 0 for r in logs)


def test_cli_errors(tmp_path, monkeypatch, data, capsys):
    out = str(tmp_path / "r")
    assert _cli(["train-lm", "--attention", "standard", "--preset", "tiny", "--out", out, "--resume",
                 "--no-progress"], monkeypatch, data) == 2
    assert "no checkpoint" in capsys.readouterr().err
    assert _cli(["train-lm", "--attention", "standard", "--preset", "tiny", "--out", out, "--steps", "2",
                 "--no-progress"], monkeypatch, data) == 0
    assert _cli(["train-lm", "--attention", "standard", "--preset", "tiny", "--out", out, "--no-progress"],
                monkeypatch, data) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert _cli(["compare", "--attention", "standard,softmax2", "--preset", "tiny", "--out", out],
                monkeypatch, data) == 2
    assert "valid: standard, lazy" in capsys.readouterr().err


def test_compare_writes_json_table_and_plots(tmp_path, monkeypatch, data):
    out = tmp_path / "cmp"
    argv = ["compare", "--attention", "standard,elastic-only", "--seeds", "2", "--preset", "tiny", "--steps", "4",
            "--out", str(out), "--no-progress"]
    assert _cli(argv, monkeypatch, data) == 0
    cj = json.loads((out / "compare.json").read_text())
    assert set(cj["summary"]) == {"standard", "elastic-only"} and cj["seeds"] == [0, 1]
    s = cj["summary"]["standard"]["val_loss"]
    vals = [r["val_loss"] for r in cj["runs"]["standard"]]
    assert s["mean"] == pytest.approx(sum(vals) / 2) and s["n"] == 2
    assert cj["summary"]["standard"]["surviving_mass"]["mean"] == pytest.approx(1.0)
    md = render_markdown(cj)
    assert f"{s['mean']:.3f} ± {s['std']:.3f}" in md and "| elastic-only |" in md
    for png in ("loss_curves.png", "attention_layers.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Re-running reuses finished runs instead of retraining.
    mtime = (out / "standard" / "seed0" / "result.json").stat().st_mtime_ns
    assert _cli(argv, monkeypatch, data) == 0
    assert (out / "standard" / "seed0" / "result.json").stat().st_mtime_ns == mtime


def test_compare_on_a_task_reports_accuracy_and_reach(tmp_path, monkeypatch, data):
    """--data mqar: accuracy beside loss (answers only), the distance argument recorded, sink share per layer."""
    out = tmp_path / "mqar"
    argv = ["compare", "--attention", "standard,lazy", "--seeds", "2", "--preset", "tiny", "--steps", "2",
            "--data", "mqar", "--out", str(out), "--no-progress"]
    assert _cli(argv, monkeypatch, data) == 0
    cj = json.loads((out / "compare.json").read_text())
    assert cj["task"] == {"min_distance": {"1x": 17, "2x": 49, "4x": 113}, "sliding_reach": 14, "sliding_blind": True}
    for name in ("standard", "lazy"):
        s = cj["summary"][name]
        assert 0 <= s["val_acc"]["mean"] <= 1 and s["val_acc"]["n"] == 2 and "val_acc_4x" in s
        assert len(cj["per_layer"][name]["sink_share"]) == 2 and "empty_rows" in cj["per_layer"][name]
    assert cj["summary"]["standard"]["empty_rows"]["mean"] == 0.0
    res = json.loads((out / "lazy" / "seed0" / "result.json").read_text())
    assert set(res["val_acc_by_length"]) == {"1x", "2x", "4x"}
    md = render_markdown(cj)
    assert "`mqar` task" in md and "val acc" in md and "at chance by construction" in md and "sink share" in md
