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
    """A shipped adapter's name, an adapter folder or a retrofit run folder -> the adapter folder. Unknown names list
    the shipped ones."""
    p = Path(spec).expanduser()
    if (p / "adapter_config.json").is_file():
        return p
    if (p / "adapter" / "adapter_config.json").is_file():  # a `focusattn retrofit --out` run folder
        return p / "adapter"
    if p.is_dir():
        raise ValueError(f"adapter {str(spec)!r}: missing adapter_config.json (expected a folder written by "
                         "`focusattn retrofit`: RUN/adapter)")
    if isinstance(spec, str) and (HERE / spec / "adapter_config.json").is_file() and "/" not in spec:
        return HERE / spec
    names = shipped()
    raise ValueError(f"adapter {str(spec)!r}: no such adapter folder, and not a shipped adapter (shipped: "
                     f"{', '.join(names) if names else 'none'})")
