"""Atomic file writes: a crash never leaves a half-written file (write to a temp file, then rename)."""
from __future__ import annotations

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


def pyplot():
    """``matplotlib.pyplot`` on the file-only Agg backend; matplotlib is an optional extra (``focusattn[plot]``)."""
    try:
        import matplotlib
    except ImportError as e:
        raise RuntimeError("plots need matplotlib: pip install 'focusattn[plot]'") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
