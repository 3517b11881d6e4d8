"""Atomic file writes: a crash never leaves a half-written file (write to a temp file, then rename)."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(path: str | os.PathLike):
    """Yield a temporary path in the same directory; it replaces ``path`` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def check_writable(path: str | os.PathLike, param: str = "out") -> None:
    """InputError (naming ``param``) unless ``path`` (a file or folder, existing or not) could be created/replaced:
    checked up front, so a command fails before any work instead of after it. Leaves nothing behind: a probe file is
    created and removed in the nearest existing folder, because permission bits alone pass where a write fails (root,
    read-only mounts, ``/proc``)."""
    from ._errors import InputError

    p = Path(path).expanduser().absolute()
    probe = p
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if probe != p and not probe.is_dir():
        raise InputError(param, str(path), f"cannot be created: {probe} is a file, not a folder")
    folder = probe if probe.is_dir() else probe.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise InputError(param, str(path), f"cannot be written: no write permission in {folder}")
    try:
        fd, probe_file = tempfile.mkstemp(prefix=".focusattn-probe.", dir=folder)
    except OSError as e:
        raise InputError(param, str(path), f"cannot be written in {folder} ({e.strerror or e})") from None
    os.close(fd)
    os.unlink(probe_file)


def os_error_message(e: OSError) -> str:
    """One line for a failed read/write (full disk, permission, missing file), naming the file when known."""
    what = e.strerror or " ".join(str(e).split())
    return f"{e.filename}: {what}" if e.filename else what


def write_json(path: str | os.PathLike, obj) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=False) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def append_jsonl(path: str | os.PathLike, record: dict) -> None:
    """Append one JSON line (a line is written whole with a single write call, then flushed)."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """Every record of a JSON-lines file (blank lines skipped); a corrupt line is a ValueError naming file and line."""
    rows = []
    for i, line in enumerate(Path(path).read_text().splitlines()):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} line {i + 1}: corrupt JSON ({e})") from e
    return rows


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks (checkpoints and adapters are verified with it)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend; matplotlib is an optional extra (``focusattn[plot]``)."""
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("plots need matplotlib: pip install 'focusattn[plot]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
