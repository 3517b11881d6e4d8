"""Trained Focus adapters shipped inside the package, loadable by name (``fa.load_adapter(model, NAME)``).

Each is a folder beside this file holding ``adapter_config.json`` + ``adapter.safetensors`` (what ``save_adapter``
writes) and a ``README.md`` model card (how it was trained, the command, its measured table).
"""
from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def shipped() -> list[str]:
    """Names of the adapters shipped with this installation."""
    return sorted(p.name for p in HERE.iterdir() if (p / "adapter_config.json").is_file())


def resolve(spec: str | os.PathLike) -> Path:
    """A shipped adapter's name or a folder path -> the adapter folder. Unknown names list the shipped ones."""
    p = Path(spec)
    if p.is_dir():
        return p
    if isinstance(spec, str) and (HERE / spec / "adapter_config.json").is_file() and "/" not in spec:
        return HERE / spec
    names = shipped()
    raise ValueError(f"adapter {str(spec)!r} is neither a folder nor a shipped adapter; shipped: "
                     f"{', '.join(names) if names else '(none)'}")
