"""The decode path: its two engines (gathered lists, one masked pass) against the dense reference, and the gather
workspace (the same rows as a plain ``index_select``, reused across calls, plain allocation beyond its cap)."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import focusattn.kernels.decode as decode
from focusattn.kernels import GroupIndex
from focusattn.kernels.api import focus_attention
from focusattn.kernels.reference import dense_focus_attention
from tests.conftest import focus_case


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


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), tq=st.integers(1, 3), tk=st.integers(4, 48),
       k=st.integers(1, 4), window=st.integers(0, 6), sink=st.integers(0, 2), pad=st.booleans(),
       indexed=st.booleans())
def test_masked_pass_and_gather_agree(monkeypatch, seed, b, tq, tk, k, window, sink, pad, indexed):
    """Long lists take one masked pass over every key, short ones are gathered: forced either way, both give the
    dense reference's outputs, LSE and gradients (index or scan, sinks, padding, several queries)."""
    q, kk, v, member = focus_case(seed, b, 4, 2, tq, tk, k, 1 + seed % k, dtype=torch.float64)
    kpm = None
    if pad:
        kpm = torch.ones(b, tk, dtype=torch.bool)
        kpm[-1, : tk // 3] = False
    ref, ref_lse = dense_focus_attention(q, kk, v, member, window, sink=sink, key_padding_mask=kpm, return_lse=True)
    used = []
    masked_pass = decode._masked_pass
    monkeypatch.setattr(decode, "_masked_pass", lambda *a: used.append(1) or masked_pass(*a))
    for frac in (0.0, 1.0):  # 0: every list counts as long; 1: none does
        monkeypatch.setattr(decode, "DENSE_DECODE_FRACTION", frac)
        used.clear()
        ts = [t.clone().requires_grad_() for t in (q, kk, v)]
        out, lse = focus_attention(*ts, member, window, sink=sink, key_padding_mask=kpm, return_lse=True,
                                   group_index=GroupIndex(member) if indexed else None, backend="decomposed")
        assert bool(used) == (frac == 0.0)
        rows = torch.ones(b, tq, dtype=torch.bool) if kpm is None else kpm[:, tk - tq:]
        sel = rows[:, None, :].expand_as(lse)
        assert torch.allclose(out[sel], ref[sel], atol=1e-8) and torch.equal(lse.isinf(), ref_lse.isinf())
        assert torch.allclose(lse[sel & ~lse.isinf()], ref_lse[sel & ~lse.isinf()], atol=1e-8)
        with torch.no_grad():  # inference: the masked pass's in-place form (no -inf), same answers
            out_ng, lse_ng = focus_attention(q, kk, v, member, window, sink=sink, key_padding_mask=kpm,
                                             return_lse=True, group_index=GroupIndex(member) if indexed else None,
                                             backend="decomposed")
        assert torch.allclose(out_ng[sel], ref[sel], atol=1e-8) and torch.equal(lse_ng.isinf(), ref_lse.isinf())
        assert torch.allclose(lse_ng[sel & ~lse_ng.isinf()], ref_lse[sel & ~lse_ng.isinf()], atol=1e-8)
        (out[sel] * 0.5).sum().backward()
        gq = ts[0].grad
        ts2 = [t.clone().requires_grad_() for t in (q, kk, v)]
        r = dense_focus_attention(*ts2, member, window, sink=sink, key_padding_mask=kpm)
        (r[sel] * 0.5).sum().backward()
        assert torch.allclose(gq, ts2[0].grad, atol=1e-8)
        assert torch.allclose(ts[1].grad, ts2[1].grad, atol=1e-8) and torch.allclose(ts[2].grad, ts2[2].grad, atol=1e-8)


def test_masked_pass_keeps_kept_keys_far_below_a_masked_one():
    """The inference form normalises by the largest score over all keys; when every kept key scores ~200 nats below
    a masked one, their weights would underflow, so that row is recomputed with -inf masking: still exact."""
    torch.manual_seed(0)
    tk, d = 64, 8
    q = torch.zeros(1, 2, 1, d)
    q[..., 0] = 1.0
    k = torch.randn(1, 1, tk, d) * 0.1
    v = torch.randn(1, 1, tk, d)
    k[0, 0, 5, 0] = 1600.0  # scale 1/sqrt(8): a score of ~566 on a masked key
    allowed = torch.zeros(1, 1, tk, dtype=torch.bool)
    allowed[..., 10:] = True
    with torch.no_grad():
        out, lse = decode._masked_pass(q, k, v, allowed, d ** -0.5, None)
    s = (q[0, :, 0] @ k[0, 0, 10:].T) * d ** -0.5
    ref = torch.softmax(s, -1) @ v[0, 0, 10:]
    assert torch.isfinite(out).all() and torch.allclose(out[0, :, 0], ref, atol=1e-6)
    assert torch.allclose(lse[0, :, 0], torch.logsumexp(s, -1), atol=1e-5)
