"""Errors reach the command-line user as one line and nothing half-written: an unwritable --out (refused before any
work), a full disk during a write, a tokenizer that does not fit the model, a malformed adapter_config.json."""
import errno
import os
from pathlib import Path

import pytest

from focusattn.cli import main


def assert_one_line(capsys, rc, *must):
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    for m in must:
        assert m in err, err
    return err


def test_out_inside_a_file_is_refused_before_any_work(tmp_path, tiny_dir, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    rc = main(["retrofit", "--model", str(tiny_dir / "model"), "--data", str(tiny_dir / "corpus"),
               "--out", str(blocker / "run")])
    assert_one_line(capsys, rc, "--out", "is a file, not a folder")
    assert blocker.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["file"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into a read-only folder")
def test_out_in_a_read_only_folder_is_refused(tmp_path, tiny_dir, capsys):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    rc = main(["report", "--results", str(tmp_path), "--out", str(ro / "RESULTS.md")])
    assert_one_line(capsys, rc, "--out", "no write permission")


def test_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys):
    results = Path(__file__).parents[1] / "docs" / "results"  # read only: the report is written to tmp_path
    out = tmp_path / "docs" / "RESULTS.md"
    out.parent.mkdir()

    def enospc(self, *a, **k):
        with open(self, "w") as f:
            f.write("half")  # what a full disk leaves behind in the temp file
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(type(out), "write_text", enospc)
    rc = main(["report", "--results", str(results), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "No space left on device" in err or "error" in err
    assert os.listdir(out.parent) == []  # neither the file nor its temp


def test_mismatched_tokenizer_is_one_line(tmp_path, tiny_dir, capsys):
    import transformers as tr

    from tests.conftest import char_tokenizer

    d = tmp_path / "m"
    cfg = tr.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=48, vocab_size=40, max_position_embeddings=64)
    tr.AutoModelForCausalLM.from_config(cfg).save_pretrained(d)
    char_tokenizer().save_pretrained(d)
    capsys.readouterr()  # the setup's progress bars
    rc = main(["retrofit", "--model", str(d), "--data", str(tiny_dir / "corpus"), "--out", str(tmp_path / "run"),
               "--seq-len", "32"])
    assert_one_line(capsys, rc, "--model", "tokenizer belongs to another model")


def test_malformed_adapter_config_is_one_line(tmp_path, tiny_dir, capsys):
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "adapter_config.json").write_text('{"focus_config": {}, "hidden_size": "64"')
    rc = main(["groups", "--model", str(tiny_dir / "model"), "--adapter", str(ad), "--data",
               str(tiny_dir / "corpus"), "--out", str(tmp_path / "g"), "--seq-len", "32"])
    assert_one_line(capsys, rc, "--adapter", str(ad / "adapter_config.json"), "corrupt JSON")
