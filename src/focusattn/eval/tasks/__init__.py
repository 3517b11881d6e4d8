"""Offline lm-eval tasks shipped as package data (``focusattn eval --tasks offline``).

``offline/*.yaml`` are ordinary lm-evaluation-harness task configs (pass ``OFFLINE_DIR`` as ``include_path``); their
documents are the JSONL files in ``offline/data/``, built by ``python -m focusattn.eval.tasks.build`` and read by
:func:`load_offline` (no ``datasets`` download, no network, no cache).
"""
from __future__ import annotations

import json
from pathlib import Path

OFFLINE_DIR = Path(__file__).parent / "offline"
OFFLINE_GROUP = "offline"
OFFLINE_TASKS = ("focus_cloze_short", "focus_cloze_long", "focus_nextsent_short", "focus_nextsent_long",
                 "focus_passkey")


def read_docs(name: str) -> list[dict]:
    path = OFFLINE_DIR / "data" / f"{name}.jsonl"
    if not path.is_file():
        raise FileNotFoundError(f"offline task data {path} is missing (rebuild: python -m focusattn.eval.tasks.build)")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_offline(file: str | None = None, **_ignored):
    """lm-eval ``custom_dataset`` hook: the task's JSONL as a ``DatasetDict`` with one ``test`` split."""
    import datasets

    if not file:
        raise ValueError("offline task config needs dataset_kwargs.file")
    return datasets.DatasetDict({"test": datasets.Dataset.from_list(read_docs(Path(file).stem))})
