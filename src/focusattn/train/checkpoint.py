"""Atomic, verified, resumable checkpoints.

A run folder holds ``checkpoint-<step>.pt`` (trainable tensors, optimizer state, step, RNG state: ``torch.save`` of
plain tensors and containers, read back with ``weights_only=True``, so never unpickling code) and ``checkpoint.json``,
the commit record written after it: the data file's name, size and sha256, the step, each trainable tensor's shape
and dtype, and ``meta`` (what the run trains, e.g. the base model id). Both are written atomically (temp file, fsync,
rename) and older data files are removed only once the new record is in place, so a crash at any instant leaves
the last committed checkpoint whole. Loading checks the record, size, checksum, tensors and ``meta``; any mismatch
is an error naming the file, never a partial load.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from .._io import atomic_path, sha256_file, write_json

RECORD = "checkpoint.json"
LEGACY = "checkpoint.pt"  # single-file checkpoints of earlier versions (no record, no checksum): refused


def _spec(t: torch.Tensor) -> list:
    return [list(t.shape), str(t.dtype).removeprefix("torch.")]


def has_checkpoint(out_dir: str | os.PathLike) -> bool:
    return (Path(out_dir) / RECORD).is_file()


def save_checkpoint(out_dir: str | os.PathLike, *, step: int, trainable: dict, optimizer_state: dict,
                    extra: dict | None = None, meta: dict | None = None, rng: bool = True) -> Path:
    """Write step ``step``'s checkpoint into ``out_dir`` and commit it; returns the data file's path."""
    out = Path(out_dir)
    state = {
        "step": step,
        "trainable": {k: v.detach().cpu() for k, v in trainable.items()},
        "optimizer": optimizer_state,
        "extra": extra or {},
    }
    if rng:
        state["rng"] = torch.get_rng_state()
    data = out / f"checkpoint-{step:07d}.pt"
    with atomic_path(data) as tmp:
        torch.save(state, tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        digest, size = sha256_file(tmp), tmp.stat().st_size
    write_json(out / RECORD, {"file": data.name, "bytes": size, "sha256": digest, "step": step,
                              "trainable": {k: _spec(v) for k, v in state["trainable"].items()},
                              "meta": meta or {}})
    for old in out.glob("checkpoint-*.pt"):
        if old.name != data.name:
            old.unlink(missing_ok=True)
    return data


def load_checkpoint(out_dir: str | os.PathLike, *, meta: dict | None = None) -> dict:
    """The committed checkpoint of ``out_dir``, verified: record readable, data file of the recorded size and
    sha256, loadable without unpickling, tensors as recorded, and each ``meta`` item equal to the recorded one."""
    out = Path(out_dir)
    rec_path = out / RECORD
    if not rec_path.is_file():
        if (out / LEGACY).is_file():
            raise ValueError(f"{out / LEGACY} is an unverifiable checkpoint of an earlier version (no {RECORD}); "
                             "start fresh in another folder")
        raise FileNotFoundError(f"no checkpoint at {rec_path}: start fresh instead of resuming")
    try:
        rec = json.loads(rec_path.read_text())
        data = out / rec["file"]
        size, digest, specs = int(rec["bytes"]), str(rec["sha256"]), dict(rec["trainable"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"checkpoint record {rec_path} is corrupt ({e!r}); delete the folder or start fresh") from e
    if Path(rec["file"]).name != rec["file"] or not data.is_file():
        raise ValueError(f"checkpoint record {rec_path} names {data}, which is missing")
    if data.stat().st_size != size:
        raise ValueError(f"checkpoint {data} is truncated or altered: {data.stat().st_size} bytes, "
                         f"{size} recorded in {rec_path}")
    if sha256_file(data) != digest:
        raise ValueError(f"checkpoint {data} is corrupt: its sha256 differs from the one recorded in {rec_path}")
    try:
        state = torch.load(data, map_location="cpu", weights_only=True)
    except Exception as e:  # foreign or pickle-bearing file (weights_only refuses code)
        raise ValueError(f"checkpoint {data} is unreadable ({e}); delete it or start fresh") from e
    got = {k: _spec(v) for k, v in state.get("trainable", {}).items()}
    if got != specs or state.get("step") != rec["step"]:
        raise ValueError(f"checkpoint {data} does not hold what {rec_path} records (tensors or step differ)")
    for k, v in (meta or {}).items():
        if rec.get("meta", {}).get(k) != v:
            raise ValueError(f"checkpoint {data} was saved for {k}={rec.get('meta', {}).get(k)!r}, "
                             f"not {v!r}: resume with the same {k} or choose another folder")
    return state


def check_trainable(state: dict, current: dict, source: str | os.PathLike) -> None:
    """The checkpoint's trainable tensors have the names, shapes and dtypes of the model's (before loading any)."""
    want = {k: _spec(v) for k, v in current.items()}
    got = {k: _spec(v) for k, v in state["trainable"].items()}
    if want != got:
        diff = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
        raise ValueError(f"checkpoint {source} does not fit this model: {len(diff)} tensor(s) differ in name, shape "
                         f"or dtype (first: {diff[0]}: saved {got.get(diff[0])}, model {want.get(diff[0])})")
