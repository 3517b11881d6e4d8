"""The front door and the recorded results: README and docs/ stay runnable as written on any clone (no path of the
machine they were measured on, every local link resolves), README stays short with its generated table, and new runs
record checkout-relative paths."""
import json
import os
import re
from pathlib import Path

import pytest

from focusattn import cli

ROOT = Path(__file__).resolve().parents[1]
# An absolute path of some machine: a filesystem root a checkout, a cache or a temp folder lives under.
MACHINE_PATH = re.compile(r"(?<![\w.~-])/(?:work|tmp|root|home|Users|mnt|scratch|var/folders)/[\w.-]")


def _documents() -> list[Path]:
    docs = [ROOT / "README.md", *sorted((ROOT / "src" / "focusattn" / "adapters").glob("*/README.md"))]
    docs += sorted(p for p in (ROOT / "docs").rglob("*") if p.suffix in {".md", ".json", ".txt"})
    return docs


def _strings(x):
    if isinstance(x, str):
        yield x
    elif isinstance(x, dict):
        for v in x.values():
            yield from _strings(v)
    elif isinstance(x, list):
        for v in x:
            yield from _strings(v)


@pytest.mark.parametrize("path", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_absolute_machine_path(path):
    """README, docs/ (Markdown, result JSON and its recorded commands) and shipped model cards name files relative to
    the checkout, so every recorded command runs as written on a fresh clone."""
    if path.suffix == ".json":
        found = [s for s in _strings(json.loads(path.read_text())) if MACHINE_PATH.search(s)]
    else:
        found = [line for line in path.read_text().splitlines() if MACHINE_PATH.search(line)]
    assert not found, f"{path.relative_to(ROOT)}: absolute machine path in {found[0][:200]!r}"


def test_the_path_check_catches_what_it_should():
    assert MACHINE_PATH.search("--out /work/main/runs/e2e/k8")
    assert MACHINE_PATH.search("`/home/me/x`") and MACHINE_PATH.search("cache in /tmp/abc")
    assert not MACHINE_PATH.search("--out runs/e2e/k8 docs/results/x.json ~/.cache/focusattn src/focusattn/tmp/x")


def _local_links(path: Path):
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
        if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
            yield target.split("#")[0]


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_every_local_link_resolves(path):
    missing = [t for t in _local_links(path) if not (path.parent / t).exists()]
    assert not missing, f"{path.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_readme_is_a_front_door():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    assert "make demo" in text and "make test" in text
    assert "<!-- pareto:begin -->" in text and "<!-- pareto:end -->" in text  # the generated table's place
    block = text.split("<!-- pareto:begin -->")[1].split("<!-- pareto:end -->")[0]
    assert "| configuration |" in block
    assert text.count("docs/results/pareto.png") == 1  # the plot once, inside the generated block
    assert "docs/DESIGN.md" in text  # the living design description (../shared/design/ARCHITECTURE.md)


def test_readme_usage_runs_as_written():
    """The README's Python example uses no name it does not define (running it needs the model: tests/adapters)."""
    import ast
    import builtins

    text = (ROOT / "README.md").read_text()
    for code in re.findall(r"```python\n(.*?)```", text, re.S):
        tree = ast.parse(code)
        bound = set(dir(builtins))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound |= {(a.asname or a.name).split(".")[0] for a in node.names}
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                bound.add(node.id)
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        assert used <= bound, f"README's example uses undefined {sorted(used - bound)}"


def test_new_runs_record_checkout_relative_paths(tmp_path, monkeypatch):
    """`focusattn ... --out /checkout/runs/x` records `--out runs/x` (command line and the path arguments a result
    writes as its "adapter"); paths outside the checkout and other values are left alone."""
    monkeypatch.chdir(tmp_path)
    here = os.getcwd()
    argv = ["long-eval", "--adapter", f"{here}/runs/k8/adapter", "--out", f"{here}/runs/le", "--lengths", "64"]
    args = cli.build_parser().parse_args(argv)
    cli.record_relative(args, argv)
    assert args.command_line == "focusattn long-eval --adapter runs/k8/adapter --out runs/le --lengths 64"
    assert (args.adapter, args.out) == ("runs/k8/adapter", "runs/le")
    assert cli.checkout_relative(f"--out={here}/runs/x") == "--out=runs/x"
    assert cli.checkout_relative(f"softmax={here}/runs/a") == "softmax=runs/a"
    assert cli.checkout_relative("/elsewhere/runs/x") == "/elsewhere/runs/x"
    assert cli.checkout_relative(f"{here}x/runs") == f"{here}x/runs"  # a sibling folder is not inside
    assert cli.checkout_relative("smollm2-135m-focus-k8") == "smollm2-135m-focus-k8"
