"""The decode path's gather workspace: the same rows as a plain ``index_select``, reused across calls, and plain
allocation for gathers beyond its cap."""
import torch

import focusattn.kernels.decode as decode


def test_gather_workspace_is_reused_and_capped(monkeypatch):
    src = torch.randn(50, 8)
    a, b = torch.tensor([3, 1, 4, 1, 5]), torch.tensor([9, 2, 6])
    first = decode._gather_rows(src, a, 0)
    assert torch.equal(first, src.index_select(0, a))
    ptr = first.data_ptr()
    second = decode._gather_rows(src, b, 0)  # smaller: the same buffer, now holding b's rows
    assert second.data_ptr() == ptr and torch.equal(second, src.index_select(0, b))
    assert torch.equal(decode._gather_rows(src, a, 1), src.index_select(0, a))  # the value slot is separate
    monkeypatch.setattr(decode, "WORKSPACE_ELEMS", 16)
    big = decode._gather_rows(src, torch.arange(10), 0)  # 80 elements > 16: a fresh tensor
    assert big.data_ptr() != ptr and torch.equal(big, src[:10])
