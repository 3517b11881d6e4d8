"""``sink`` as a key mask (the first tokens plus the global keys a router chose): every backend and the decode path
equal the dense reference, outputs, LSE and gradients, with padding and GQA."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels.api import focus_attention
from focusattn.kernels.common import sink_count, sink_key_mask
from focusattn.kernels.group_index import GroupIndex
from focusattn.kernels.reference import focus_allowed, masked_attention
from focusattn.kernels.validation import validate_focus_inputs
from tests.conftest import assert_close, random_membership
from tests.kernels.test_focus_attention import FAST, _attend


def _case(seed, b, hq, hkv, tq, tk, k_groups, top_k, padded, rate):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, t, 8, generator=g) for h, t in ((hq, tq), (hkv, tk), (hkv, tk)))
    memb = random_membership(b, tk, k_groups, top_k, gen=g)
    glob = torch.rand(b, tk, generator=g) < rate
    glob[:, 0] = True  # the first token, as sink_tokens=1 adds it
    kpm = None
    if padded:
        kpm = torch.rand(b, tk, generator=g) > 0.2
        kpm[:, 0] = False
    return q, k, v, memb, glob, kpm


def _reference(q, k, v, memb, window, glob, kpm):
    sinks = glob if kpm is None else glob & kpm
    mask = focus_allowed(memb, window, q.shape[2], sinks)[:, None]
    if kpm is not None:
        mask = mask & kpm[:, None, None]
    return masked_attention(q, k, v, mask, return_lse=True)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 2),
       tk=st.integers(2, 48), decode=st.booleans(), k_groups=st.integers(2, 5), top_k=st.integers(1, 2),
       window=st.sampled_from([0, 2, 5]), padded=st.booleans(), rate=st.sampled_from([0.0, 0.1, 0.4]),
       backend=st.sampled_from(("dense",) + FAST))
def test_global_keys_match_the_reference(seed, b, hkv, g, tk, decode, k_groups, top_k, window, padded, rate, backend):
    top_k = min(top_k, k_groups)
    tq = max(1, tk // 3) if decode else tk
    q, k, v, memb, glob, kpm = _case(seed, b, hkv * g, hkv, tq, tk, k_groups, top_k, padded, rate)
    want, want_lse = _reference(q, k, v, memb, window, glob, kpm)
    got, lse = _attend(q, k, v, memb, window, sink=glob, key_padding_mask=kpm, backend=backend, return_lse=True)
    assert_close(got, want, atol=2e-5, rtol=1e-4, name=f"{backend} out")
    fin = torch.isfinite(want_lse)
    assert torch.equal(fin, torch.isfinite(lse))
    assert_close(lse[fin], want_lse[fin], atol=2e-5, rtol=1e-4, name=f"{backend} lse")
    if decode and backend in ("auto", "decomposed"):  # the group index path of a decode step
        got_i = focus_attention(q, k, v, memb, window, sink=glob, key_padding_mask=kpm, backend=backend,
                                group_index=GroupIndex(memb))
        assert_close(got_i, want, atol=2e-5, rtol=1e-4, name="indexed decode")


@pytest.mark.parametrize("padded", [False, True])
def test_global_keys_in_a_gathering_decode_step(padded):
    """A long cache with K=8 top-1: the step gathers its lists (not the masked pass) and adds the global keys."""
    q, k, v, memb, glob, kpm = _case(11, 1, 4, 2, 1, 700, 8, 1, padded, 0.02)
    want, _ = _reference(q, k, v, memb, 5, glob, kpm)
    for index in (None, GroupIndex(memb)):
        got = focus_attention(q, k, v, memb, 5, sink=glob, key_padding_mask=kpm, backend="decomposed",
                              group_index=index)
        assert_close(got, want, atol=2e-5, rtol=1e-4, name="gathered decode")


@pytest.mark.parametrize("backend", ["decomposed", "auto", "dense"])
def test_global_keys_gradients(backend):
    q, k, v, memb, glob, _ = _case(3, 2, 4, 2, 37, 37, 4, 1, False, 0.15)
    ws = [t.clone().requires_grad_() for t in (q, k, v)]
    rs = [t.clone().requires_grad_() for t in (q, k, v)]
    cot = torch.randn(2, 4, 37, 8, generator=torch.Generator().manual_seed(1))
    (focus_attention(*ws, memb, 3, sink=glob, backend=backend) * cot).sum().backward()
    (_reference(*rs, memb, 3, glob, None)[0] * cot).sum().backward()
    for a, r, n in zip(ws, rs, "qkv"):
        assert_close(a.grad, r.grad, atol=5e-5, rtol=1e-4, name=f"d{n}")


def test_sink_mask_helpers_and_validation():
    kpm = torch.tensor([[False, True, True, True]])
    m = torch.tensor([[True, False, True, False]])
    assert sink_key_mask(4, m, kpm).tolist() == [[False, False, True, False]]
    assert sink_key_mask(4, 2, kpm).tolist() == [[False, True, True, False]]
    assert sink_count(m) == 2 and sink_count(3) == 3
    q, k, v = torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8), torch.zeros(1, 1, 4, 8)
    memb = torch.ones(1, 4, 2, dtype=torch.bool)
    for bad in (torch.ones(1, 5, dtype=torch.bool), torch.ones(1, 4), torch.ones(3, 4, dtype=torch.bool)):
        with pytest.raises(ValueError, match="sink"):
            validate_focus_inputs(q, k, v, memb, 2, sink=bad)
