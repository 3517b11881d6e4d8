"""scripts/cache_targets.py: a new window that shares a run of text with a held-out one is recognised from layer 0's
inputs (token-wise rows) wherever the run sits."""
import importlib.util
from pathlib import Path

import torch

_path = Path(__file__).resolve().parents[2] / "scripts" / "cache_targets.py"
spec = importlib.util.spec_from_file_location("cache_targets", _path)
ct = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ct)


def test_shared_runs_are_found_at_any_offset_and_short_ones_are_not():
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(50, 8, generator=g)  # a vocabulary of 50 tokens
    a = torch.randint(0, 50, (200,), generator=g)
    b = torch.randint(0, 50, (200,), generator=g)
    shifted = torch.cat([b[:70], a[10:10 + ct.RUN + 5], b[70 + ct.RUN + 5:]])
    short = torch.cat([b[:70], a[10:10 + ct.RUN - 1], b[70 + ct.RUN - 1:]])
    held = ct._runs(emb[a][None])
    assert ct._runs(emb[shifted][None]) & held
    assert not ct._runs(emb[short][None]) & held
    assert not ct._runs(emb[b][None]) & held
