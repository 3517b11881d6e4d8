"""No pickle is ever loaded: every ``torch.load`` in the package passes ``weights_only=True``, and nothing imports
pickle (or its relatives) or allows pickles in ``np.load``. Loading a pickle-bearing checkpoint fails:
tests/train/test_checkpoint.py."""
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "focusattn"


def _calls(text: str, name: str):
    """The argument text of every call of ``name(`` (balanced parentheses)."""
    for m in re.finditer(re.escape(name) + r"\(", text):
        depth, i = 1, m.end()
        while depth and i < len(text):
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        yield m.start(), text[m.end():i - 1]


def test_no_unsafe_load_in_the_package():
    files = sorted(SRC.rglob("*.py"))
    assert len(files) > 20
    bad = []
    for f in files:
        text = f.read_text()
        for pos, args in _calls(text, "torch.load"):
            if not re.search(r"weights_only\s*=\s*True", args):
                bad.append(f"{f.relative_to(SRC)}:{text.count(chr(10), 0, pos) + 1}: torch.load without weights_only=True")
        for pos, args in _calls(text, "np.load"):
            if re.search(r"allow_pickle\s*=\s*True", args):
                bad.append(f"{f.relative_to(SRC)}:{text.count(chr(10), 0, pos) + 1}: np.load(allow_pickle=True)")
        for m in re.finditer(r"^\s*(?:import|from)\s+(pickle|cPickle|dill|joblib|cloudpickle|shelve|marshal)\b", text,
                             re.M):
            bad.append(f"{f.relative_to(SRC)}:{text.count(chr(10), 0, m.start()) + 1}: imports {m.group(1)}")
    assert not bad, "\n".join(bad)


def test_the_scan_finds_what_it_looks_for():
    """The scanner is not vacuous: it flags an unsafe load and accepts a safe one."""
    unsafe = "x = torch.load(path, map_location=dict(a=1))"
    safe = "x = torch.load(path, map_location='cpu', weights_only=True)"
    assert [not re.search(r"weights_only\s*=\s*True", a) for _, a in _calls(unsafe, "torch.load")] == [True]
    assert [not re.search(r"weights_only\s*=\s*True", a) for _, a in _calls(safe, "torch.load")] == [False]
