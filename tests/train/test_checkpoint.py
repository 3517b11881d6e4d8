"""Checkpoints are committed atomically and verified on load: a truncated, corrupted, foreign or pickle-bearing file,
a broken record or a different run is a clear error naming the file, never a partial load."""
import json
import os
import pickle

import pytest
import torch

from focusattn.train.checkpoint import RECORD, check_trainable, has_checkpoint, load_checkpoint, save_checkpoint


def _save(out, step=3, **kw):
    w = torch.nn.Parameter(torch.randn(4, 3))
    opt = torch.optim.AdamW([w])
    w.grad = torch.ones_like(w)
    opt.step()
    return save_checkpoint(out, step=step, trainable={"w": w, "b": torch.zeros(2, dtype=torch.bfloat16)},
                           optimizer_state=opt.state_dict(), extra={"elapsed_s": 1.5}, meta={"model": "m"}, **kw)


def test_round_trip_and_only_the_last_is_kept(tmp_path):
    assert not has_checkpoint(tmp_path)
    _save(tmp_path, step=2)
    data = _save(tmp_path, step=4)
    assert sorted(p.name for p in tmp_path.iterdir()) == [data.name, RECORD]
    rec = json.loads((tmp_path / RECORD).read_text())
    assert rec["step"] == 4 and rec["trainable"] == {"w": [[4, 3], "float32"], "b": [[2], "bfloat16"]}
    state = load_checkpoint(tmp_path, meta={"model": "m"})
    assert state["step"] == 4 and state["trainable"]["b"].dtype == torch.bfloat16
    assert state["extra"]["elapsed_s"] == 1.5 and "rng" in state and state["optimizer"]["state"]


def test_truncated_corrupted_and_missing_files_are_named(tmp_path):
    data = _save(tmp_path)
    raw = data.read_bytes()
    data.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match=f"checkpoint {data} is truncated"):
        load_checkpoint(tmp_path)
    flipped = bytearray(raw)
    flipped[len(raw) // 2] ^= 0xFF
    data.write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match=f"checkpoint {data} is corrupt: its sha256"):
        load_checkpoint(tmp_path)
    data.unlink()
    with pytest.raises(ValueError, match="which is missing"):
        load_checkpoint(tmp_path)
    (tmp_path / RECORD).write_text('{"file": ')
    with pytest.raises(ValueError, match=f"checkpoint record {tmp_path / RECORD} is corrupt"):
        load_checkpoint(tmp_path)
    (tmp_path / RECORD).unlink()
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path)
    (tmp_path / "checkpoint.pt").write_bytes(b"old")
    with pytest.raises(ValueError, match="earlier version"):
        load_checkpoint(tmp_path)


def test_a_crash_before_the_record_keeps_the_previous_checkpoint(tmp_path):
    """A data file written but never committed (killed before the record) is ignored: the last commit loads."""
    _save(tmp_path, step=2)
    (tmp_path / "checkpoint-0000004.pt").write_bytes(b"half a checkpoint")
    (tmp_path / ".checkpoint.json.x.tmp").write_text("{")  # a record being written when the process died
    assert load_checkpoint(tmp_path)["step"] == 2


class _Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_pickled_code_is_refused_even_with_a_valid_checksum(tmp_path):
    data = _save(tmp_path)
    torch.save({"step": 3, "trainable": {}, "x": _Evil()}, data)  # a forged file whose record matches it
    from focusattn._io import sha256_file as sha256

    rec = json.loads((tmp_path / RECORD).read_text())
    rec.update(bytes=data.stat().st_size, sha256=sha256(data))
    (tmp_path / RECORD).write_text(json.dumps(rec))
    with pytest.raises(ValueError, match=f"checkpoint {data} is unreadable"):
        load_checkpoint(tmp_path)
    data.write_bytes(pickle.dumps({"step": 3}))
    rec.update(bytes=data.stat().st_size, sha256=sha256(data))
    (tmp_path / RECORD).write_text(json.dumps(rec))
    with pytest.raises(ValueError, match="unreadable"):
        load_checkpoint(tmp_path)


def test_another_run_or_model_is_refused(tmp_path):
    _save(tmp_path)
    with pytest.raises(ValueError, match="saved for model='m', not 'other'"):
        load_checkpoint(tmp_path, meta={"model": "other"})
    state = load_checkpoint(tmp_path)
    check_trainable(state, {"w": torch.zeros(4, 3), "b": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path)
    with pytest.raises(ValueError, match=r"does not fit this model: 1 tensor\(s\) differ .*first: w"):
        check_trainable(state, {"w": torch.zeros(4, 4), "b": torch.zeros(2, dtype=torch.bfloat16)}, tmp_path)
    with pytest.raises(ValueError, match="first: b"):
        check_trainable(state, {"w": torch.zeros(4, 3), "b": torch.zeros(2)}, tmp_path)
