"""``focusattn retrofit`` end to end on a tiny random local model (char-level tokenizer) and a local text corpus
(the ``tiny_dir`` fixture), including the ``groups`` report on its adapter."""
import json

import pytest
import torch

from focusattn.cli import main


def _run(tmp_path, tiny_dir, *extra):
    out = tmp_path / "run"
    args = ["retrofit", "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"), "--ood-data",
            str(tiny_dir / "corpus" / "doc0.txt"), "--out", str(out), "--seq-len", "48", "--groups", "4",
            "--window", "8", "--eval-windows", "2", "--ood-eval-windows", "1", "--checkpoint-every", "2", *extra]
    return out, main(args)


def test_retrofit_end_to_end_and_resume(tmp_path, tiny_dir, capsys):
    out, rc = _run(tmp_path, tiny_dir, "--steps", "3")
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["perplexity"]["after"]["domain"]) == {"soft", "top1", "top2"}
    assert s["perplexity"]["before"]["domain"] > 1 and "ood" in s["perplexity"]["after"]
    assert s["parameters"]["router"] == 2 * (64 * 16 + 4 * 16)
    assert len(s["groups"]) == 2 and all(1 / 4 - 1e-6 <= g["dominance"] <= 1 for g in s["groups"])
    assert (out / "adapter" / "adapter.safetensors").exists()
    assert "trainable parameters" in capsys.readouterr().out
    assert set(s["pairs_kept"]) == {"top1", "top2"} and 0 < s["pairs_kept"]["top1"] < s["pairs_kept"]["top2"] <= 1
    rc = main(["groups", "--model", str(tiny_dir / "model"), "--adapter", str(out / "adapter"), "--data",
               str(tiny_dir / "corpus"), "--out", str(out), "--seq-len", "48", "--eval-windows", "1", "--layers", "1",
               "--update-summary", str(out / "summary.json")])
    g = json.loads((out / "groups.json").read_text())
    assert rc == 0 and len(g["top_tokens"]["1"]) == 4 and g["pairs_kept"]["top1"] > 0
    assert json.loads((out / "summary.json").read_text())["pairs_kept_command"].startswith("focusattn groups")
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == [1, 2, 3]
    # resume continues from the saved step to the new total, appending to the metrics
    rc = main(["retrofit", "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"), "--ood-data",
               "none", "--out", str(out), "--seq-len", "48", "--groups", "4", "--window", "8", "--eval-windows", "2",
               "--steps", "5", "--resume"])
    assert rc == 0
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()] == [1, 2, 3, 4, 5]


def test_resume_is_exact(tmp_path, tiny_dir):
    """Stopping at step 2 and resuming to 4 gives the same routers as 4 steps in one go."""
    a, _ = _run(tmp_path / "a", tiny_dir, "--steps", "4", "--eval-top-k", "1")
    b, _ = _run(tmp_path / "b", tiny_dir, "--steps", "2", "--eval-top-k", "1")
    _run(tmp_path / "b", tiny_dir, "--steps", "4", "--eval-top-k", "1", "--resume")
    from safetensors.torch import load_file

    ta, tb = load_file(str(a / "adapter/adapter.safetensors")), load_file(str(b / "adapter/adapter.safetensors"))
    assert all(torch.allclose(ta[k], tb[k], atol=1e-6) for k in ta)


@pytest.mark.parametrize("extra,msg", [
    (["--groups", "0"], "--groups 0"),
    (["--window", "-1"], "--window -1"),
    (["--tau", "0"], "--tau 0"),
    (["--threads", "0"], "--threads 0"),
    (["--eval-top-k", "9"], "top-k"),
    (["--seq-len", "100000"], "positions"),
    (["--model", "./no/such/model"], "no such file"),
])
def test_bad_input_is_one_line_error(tmp_path, tiny_dir, capsys, extra, msg):
    out, rc = _run(tmp_path, tiny_dir, "--steps", "1", *extra)
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert rc == 2 and len(err) == 1 and msg in err[0]
    assert not out.exists()  # nothing written at all


def test_too_short_corpus(tmp_path, tiny_dir, capsys):
    small = tmp_path / "small.txt"
    small.write_text("tiny")
    rc = main(["retrofit", "--model", str(tiny_dir / "model"), "--data", str(small), "--out", str(tmp_path / "o"),
               "--seq-len", "48", "--steps", "1"])
    assert rc == 2 and "too short" in capsys.readouterr().err


def test_resume_without_checkpoint(tmp_path, tiny_dir, capsys):
    out, rc = _run(tmp_path, tiny_dir, "--steps", "1", "--resume")
    assert rc == 2 and "no checkpoint" in capsys.readouterr().err


def test_distill_init_adapter_and_repeats(tmp_path, tiny_dir):
    """--distill logs the KL to the original model, --init-adapter starts from a run's routers (a zero-step
    continuation would give them back unchanged), --repeat-prob trains on repeated halves."""
    a, rc = _run(tmp_path / "a", tiny_dir, "--steps", "2", "--eval-top-k", "1")
    assert rc == 0
    b, rc = _run(tmp_path / "b", tiny_dir, "--steps", "2", "--eval-top-k", "1", "--distill", "0.5",
                 "--repeat-prob", "1", "--init-adapter", str(a), "--lr", "1e-9", "--warmup", "0")
    assert rc == 0
    recs = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    assert all(r["kl"] >= 0 for r in recs)
    from safetensors.torch import load_file

    ta, tb = load_file(str(a / "adapter/adapter.safetensors")), load_file(str(b / "adapter/adapter.safetensors"))
    weights = [k for k in ta if not k.split(".")[-1].startswith("offsets")]
    assert weights and all(torch.allclose(ta[k], tb[k], atol=1e-5) for k in weights)


def test_init_adapter_shape_mismatch_writes_nothing(tmp_path, tiny_dir, capsys):
    a, _ = _run(tmp_path / "a", tiny_dir, "--steps", "1", "--eval-top-k", "1")
    out = tmp_path / "b"
    capsys.readouterr()
    rc = main(["retrofit", "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"), "--out", str(out),
               "--seq-len", "48", "--groups", "6", "--init-adapter", str(a)])
    assert rc == 2 and "--init-adapter" in capsys.readouterr().err and not out.exists()
