"""Crash safety, for real: a training process killed with SIGKILL mid-run and restarted with ``--resume`` continues
from its last committed checkpoint, and its metrics.jsonl then equals an uninterrupted run's (same seed) exactly,
except the wall-clock fields (``loop.TIMING_FIELDS``); so does its final result."""
import json
import os
import signal
import subprocess
import sys
import time

from focusattn.train.loop import TIMING_FIELDS


def _cmd(tiny_dir, out, *extra):
    return [sys.executable, "-m", "focusattn", "train-lm", "--attention", "lazy", "--preset", "tiny", "--data",
            str(tiny_dir / "corpus"), "--steps", "40", "--checkpoint-every", "5", "--seed", "3", "--out", str(out),
            "--no-progress", *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _metrics(run):
    recs = [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in recs]


def test_sigkill_then_resume_equals_an_uninterrupted_run(tmp_path, tiny_dir):
    full, crash = tmp_path / "full", tmp_path / "crash"
    ref = subprocess.Popen(_cmd(tiny_dir, full), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    victim = subprocess.Popen(_cmd(tiny_dir, crash), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and victim.poll() is None:  # kill once a few checkpoints are committed
        rec = crash / "checkpoint.json"
        if rec.exists() and json.loads(rec.read_text())["step"] >= 10:
            victim.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    if victim.poll() is None:
        victim.kill()  # the deadline passed: do not leave it running
    assert victim.wait() == -signal.SIGKILL, "the run ended before it could be killed"
    assert not (crash / "result.json").exists()
    committed = json.loads((crash / "checkpoint.json").read_text())["step"]
    assert 10 <= committed < 40
    assert subprocess.run(_cmd(tiny_dir, crash, "--resume"), env=_env(), capture_output=True).returncode == 0
    assert ref.wait() == 0, ref.stderr.read().decode()
    a, b = _metrics(full), _metrics(crash)
    assert [r["step"] for r in b] == list(range(2, 41, 2))  # no record lost or duplicated by the crash
    assert a == b  # bit-identical losses, learning rates and evaluations before and after the crash
    ra, rb = (json.loads((r / "result.json").read_text()) for r in (full, crash))
    assert ra["val_loss_by_length"] == rb["val_loss_by_length"] and ra["tau"] == rb["tau"]
