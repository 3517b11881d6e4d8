"""The shipped offline task data: deterministic, well formed, short/long split around the 128-token window."""
import hashlib
import json

import pytest

from focusattn.eval.tasks import OFFLINE_DIR, OFFLINE_TASKS, read_docs
from focusattn.eval.tasks import build


def test_shipped_data_is_what_the_generator_builds():
    m = json.loads((OFFLINE_DIR / "data" / "MANIFEST.json").read_text())
    if build.manifest({})["source_sha256"] != m["source_sha256"]:
        pytest.skip(f"this Python's pydoc_data.topics differs from the one the data was built from ({m['python']})")
    data = build.build()
    assert set(data) == set(OFFLINE_TASKS)
    for name, docs in data.items():
        assert (OFFLINE_DIR / "data" / f"{name}.jsonl").read_text() == build._jsonl(docs), name
    for name in OFFLINE_TASKS:
        text = (OFFLINE_DIR / "data" / f"{name}.jsonl").read_bytes()
        assert m["files"][name]["sha256"] == hashlib.sha256(text).hexdigest()


@pytest.mark.parametrize("name", OFFLINE_TASKS)
def test_docs_well_formed(name):
    docs = read_docs(name)
    assert len(docs) >= 50
    assert (OFFLINE_DIR / f"{name}.yaml").is_file()
    for d in docs:
        words = len(d["context"].split())
        if name.endswith("_short"):
            assert words <= build.SHORT_WORDS[1]
        elif name.endswith("_long"):
            assert build.LONG_WORDS[0] <= words <= build.LONG_WORDS[1]
        if "choices" in d:
            assert len(d["choices"]) == 4 and len(set(d["choices"])) == 4 and 0 <= d["label"] < 4
        if name.startswith("focus_cloze"):
            assert d["target"].lower() in d["context"].lower()
        if name == "focus_cloze_long":  # the only earlier occurrence lies beyond the local window
            tail = [build._norm(w) for w in d["context"].split()[-build.LONG_GAP:]]
            assert d["target"].lower() not in tail
        if name == "focus_passkey":
            assert d["context"].count(d["choices"][d["label"]]) == 2
    if name == "focus_passkey":  # --limit 5 already covers every depth
        assert {d["depth"] for d in docs[:5]} == set(build.DEPTHS)

