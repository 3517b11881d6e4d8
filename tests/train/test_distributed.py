"""Two CPU processes over gloo, launched for real by torchrun (``-m focusattn``): 2 processes x batch b train like
one process x batch 2b (loss curves within a stated tolerance, the same checkpoint / adapter), rank 0 alone writes,
FSDP2 sharding of the frozen base changes nothing but the memory, and a 2-process run killed with SIGKILL resumes to
exactly the uninterrupted 2-process run. ``make test-dist`` (``.ci/run`` runs it).

Tolerance: the same samples make the same global batch, so the only difference is float summation order (a mean of
two per-rank means and an all-reduce instead of one mean): relative 1e-5 on losses, absolute 1e-5 on weights. The
routers' load-balance loss is a nonlinear statistic of each rank's batch (as in Switch-style MoE training), so it
is logged as the mean over ranks and not compared.
"""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from focusattn.train.loop import TIMING_FIELDS

pytestmark = [pytest.mark.slow, pytest.mark.dist]
RTOL, ATOL = 1e-5, 1e-5


def _launch(nproc, args, launcher="torchrun", **kw):
    pre = [sys.executable, "-m", "focusattn"] if nproc == 1 else {
        "torchrun": [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"],
        "accelerate": [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes",
                       str(nproc), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"],
    }[launcher] + ["-m", "focusattn"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(pre + [str(a) for a in args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, **kw)


def _run(nproc, args, launcher="torchrun"):
    p = _launch(nproc, args, launcher)
    try:
        out = p.communicate(timeout=1200)[0].decode()
    finally:
        if p.poll() is None:  # a failed test leaves no launcher or rank behind
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode == 0, out[-3000:]
    return out


def _metrics(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def _same_curve(a, b):
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert [r["global_batch"] for r in a] == [r["global_batch"] for r in b]
    for ra, rb in zip(a, b):
        assert rb["loss"] == pytest.approx(ra["loss"], rel=RTOL), (ra["step"], ra["loss"], rb["loss"])
        assert rb["lr"] == ra["lr"]


def _checkpoint(run):
    rec = json.loads((run / "checkpoint.json").read_text())
    return torch.load(run / rec["file"], weights_only=True)["trainable"]


def _close(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k].float(), b[k].float(), rtol=0, atol=ATOL), (k, (a[k] - b[k]).abs().max())


def _lab(tiny_dir, out, batch, *extra):
    return ["train-lm", "--attention", "lazy", "--preset", "tiny", "--data", tiny_dir / "corpus", "--seed", 2,
            "--batch-size", batch, "--out", out, "--no-progress", *extra]


def test_lab_two_processes_equal_one_with_the_double_batch_and_resume_exactly(tmp_path, tiny_dir):
    one, two, crash = tmp_path / "one", tmp_path / "two", tmp_path / "crash"
    long = ["--steps", 40, "--checkpoint-every", 5]
    _run(1, _lab(tiny_dir, one, 4, *long))
    _run(2, _lab(tiny_dir, two, 2, *long))
    _same_curve(_metrics(one), _metrics(two))
    assert _metrics(two)[0]["global_batch"] == 4
    _close(_checkpoint(one), _checkpoint(two))
    r1, r2 = (json.loads((r / "result.json").read_text()) for r in (one, two))
    assert r2["distributed"] == {"world_size": 2, "batch_size_per_rank": 2, "global_batch": 4, "fsdp": False}
    assert r2["val_loss"] == pytest.approx(r1["val_loss"], rel=RTOL)
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())  # rank 1 wrote nothing else

    # SIGKILL the whole 2-process job (launcher and both ranks) mid-run, resume it on 2 processes
    victim = _launch(2, _lab(tiny_dir, crash, 2, *long))
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and victim.poll() is None:
        rec = crash / "checkpoint.json"
        if rec.exists() and json.loads(rec.read_text())["step"] >= 10:
            os.killpg(victim.pid, signal.SIGKILL)
            break
        time.sleep(0.01)
    if victim.poll() is None:
        os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL and not (crash / "result.json").exists()
    _run(2, _lab(tiny_dir, crash, 2, *long, "--resume"))
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(_metrics(crash)) == strip(_metrics(two))  # same seed, machine and process count: identical
    assert json.loads((crash / "result.json").read_text())["val_loss_by_length"] == r2["val_loss_by_length"]


def test_lab_fsdp_equals_one_process_and_resumes_exactly(tmp_path, tiny_dir):
    """``train-lm --fsdp``: every weight sharded over 2 processes (FSDP2 reduce-scatters the gradients) trains like
    one process with the double batch; checkpoints hold whole tensors; a run stopped and resumed (optimizer state
    gathered, then scattered back) equals the uninterrupted sharded run."""
    one, fsdp, stop = tmp_path / "one", tmp_path / "fsdp", tmp_path / "stop"
    long = ["--steps", 20, "--checkpoint-every", 5]
    _run(1, _lab(tiny_dir, one, 4, *long))
    _run(2, _lab(tiny_dir, fsdp, 2, *long, "--fsdp"))
    _same_curve(_metrics(one), _metrics(fsdp))
    _close(_checkpoint(one), _checkpoint(fsdp))
    r1, rf = (json.loads((r / "result.json").read_text()) for r in (one, fsdp))
    assert rf["distributed"]["fsdp"] is True and rf["val_loss"] == pytest.approx(r1["val_loss"], rel=RTOL)
    _run(2, _lab(tiny_dir, stop, 2, *long, "--fsdp", "--stop-at", 10))
    assert not (stop / "result.json").exists()
    _run(2, _lab(tiny_dir, stop, 2, *long, "--fsdp", "--resume"))
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(_metrics(stop)) == strip(_metrics(fsdp))
    _close(_checkpoint(stop), _checkpoint(fsdp))


def test_accelerate_launch_runs_the_same_job_as_torchrun(tmp_path, tiny_dir):
    """``accelerate launch --multi_gpu`` starts the processes through torchrun's machinery (gloo here, no GPU):
    the same process group, the same global batch, the same run."""
    pytest.importorskip("accelerate")
    short = ["--steps", 6, "--checkpoint-every", 3]
    _run(2, _lab(tiny_dir, tmp_path / "torchrun", 2, *short))
    _run(2, _lab(tiny_dir, tmp_path / "accelerate", 2, *short), launcher="accelerate")
    strip = lambda rs: [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in rs]  # noqa: E731
    assert strip(_metrics(tmp_path / "accelerate")) == strip(_metrics(tmp_path / "torchrun"))
    _close(_checkpoint(tmp_path / "torchrun"), _checkpoint(tmp_path / "accelerate"))


def test_retrofit_two_processes_and_fsdp_equal_one_with_the_double_batch(tmp_path, tiny_dir):
    base = ["retrofit", "--model", tiny_dir / "model", "--data", tiny_dir / "corpus", "--ood-data", "none",
            "--seq-len", 48, "--groups", 4, "--window", 8, "--eval-windows", 2, "--eval-top-k", 1, "--steps", 4,
            "--warmup", 1, "--checkpoint-every", 2]
    runs = {"one": (1, 2, []), "ddp": (2, 1, []), "fsdp": (2, 1, ["--fsdp"])}
    for name, (nproc, batch, extra) in runs.items():
        _run(nproc, base + ["--batch-size", batch, "--out", tmp_path / name, *extra])
    ref = _metrics(tmp_path / "one")
    adapters = {n: load_file(str(tmp_path / n / "adapter" / "adapter.safetensors")) for n in runs}
    for name in ("ddp", "fsdp"):
        _same_curve(ref, _metrics(tmp_path / name))
        _close(_checkpoint(tmp_path / "one"), _checkpoint(tmp_path / name))
        _close(adapters["one"], adapters[name])  # router weights and the synced routing offsets
        s = json.loads((tmp_path / name / "summary.json").read_text())
        assert s["distributed"] == {"world_size": 2, "batch_size_per_rank": 1, "global_batch": 2,
                                    "fsdp": name == "fsdp"}
    s1, s2 = (json.loads((tmp_path / n / "summary.json").read_text()) for n in ("one", "fsdp"))
    after1, after2 = s1["perplexity"]["after"]["domain"], s2["perplexity"]["after"]["domain"]
    assert after2 == pytest.approx(after1, rel=RTOL)
