"""Soft-gated training attention: both gates, the window, the sinks, and the limit towards the hard mask."""
import math

import torch

from focusattn.kernels import dense_focus_attention, masked_attention, sink_key_mask, soft_focus_attention

from tests.conftest import focus_case as _case


def _qkv(b=2, hq=4, hkv=2, t=24, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, t, d, generator=g) for h in (hq, hkv, hkv)]


def test_soft_gate_with_full_window_is_plain_causal_attention():
    q, k, v = _qkv()
    groups = torch.softmax(torch.randn(2, 24, 3), -1)
    causal = torch.ones(24, 24, dtype=torch.bool).tril()
    ref = masked_attention(q, k, v, causal)
    for gate in ("log", "multiplicative"):
        out = soft_focus_attention(q, k, v, groups, 24, lam=10.0, gate=gate)
        assert torch.allclose(out, ref, atol=1e-6)


def test_log_gate_tends_to_hard_mask_but_multiplicative_does_not():
    q, k, v = _qkv()
    member = torch.nn.functional.one_hot(torch.randint(0, 3, (2, 24)), 3).bool()
    hard = dense_focus_attention(q, k, v, member, 4)
    groups = member.double().float()
    log_gate = soft_focus_attention(q, k, v, groups, 4, lam=80.0, offset=0.5, gate="log")
    mult_gate = soft_focus_attention(q, k, v, groups, 4, lam=80.0, offset=0.5, gate="multiplicative")
    assert (log_gate - hard).abs().max() < 1e-5
    assert (mult_gate - hard).abs().max() > 1e-2  # a zeroed logit still receives exp(0) weight


def test_soft_gate_gradient_reaches_groups():
    q, k, v = _qkv()
    logits = torch.randn(2, 24, 3, requires_grad=True)
    out = soft_focus_attention(q, k, v, torch.softmax(logits, -1), 3, lam=10.0, gate="log")
    out.square().sum().backward()
    assert logits.grad.abs().sum() > 0 and math.isfinite(logits.grad.sum().item())


def test_soft_gate_never_gates_sinks():
    q, kk, v, member = _case(1, 1, 2, 2, 24, 24, 3, 1)
    hard = dense_focus_attention(q, kk, v, member, 4, sink=1)
    soft = soft_focus_attention(q, kk, v, member.float(), 4, lam=80.0, offset=0.5, gate="log",
                                sink_keys=sink_key_mask(24, 1))
    assert (soft - hard).abs().max() < 1e-5


from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels.soft import soft_reference


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), rep=st.integers(1, 3), tk=st.integers(1, 40),
       extra=st.integers(0, 40), window=st.integers(0, 12), k=st.integers(1, 5), lam=st.floats(0.5, 60),
       sinks=st.integers(0, 2), pad=st.booleans(), dv=st.sampled_from([None, 5]), seed=st.integers(0, 99))
def test_fast_log_gate_matches_reference(b, hkv, rep, tk, extra, window, k, lam, sinks, pad, dv, seed):
    """The one-SDPA-call log gate equals the spelled-out reference: outputs and gradients of q, k, v and groups,
    with GQA, a value head size of its own, queries at the end of the keys, sinks and left padding (rows with no
    allowed key are zeros, with finite gradients)."""
    g = torch.Generator().manual_seed(seed)
    tq = max(1, tk - extra)
    q = torch.randn(b, hkv * rep, tq, 8, generator=g, dtype=torch.float64, requires_grad=True)
    kk = torch.randn(b, hkv, tk, 8, generator=g, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, hkv, tk, dv or 8, generator=g, dtype=torch.float64, requires_grad=True)
    groups = torch.softmax(torch.randn(b, tk, k, generator=g, dtype=torch.float64) * 3, -1).requires_grad_()
    kpm = None
    if pad:
        kpm = torch.ones(b, tk, dtype=torch.bool)
        kpm[0, : tk // 2] = False  # left padding: the early query rows of batch 0 see no key
    allowed = None if kpm is None else kpm[:, None, None, :]
    sink = sink_key_mask(tk, sinks, kpm, q.device) if sinks else None
    kw = dict(lam=lam, offset=0.5, gate="log", allowed=allowed, sink_keys=sink)
    outs, grads = [], []
    for fn in (soft_focus_attention, soft_reference):
        for x in (q, kk, v, groups):
            x.grad = None
        o = fn(q, kk, v, groups, window, **kw)
        (o * torch.linspace(-1, 1, o.shape[-1], dtype=o.dtype)).sum().backward()
        outs.append(o.detach())
        grads.append([x.grad.clone() for x in (q, kk, v, groups)])
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-9, atol=1e-9)
    for a, r in zip(*grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, rtol=1e-7, atol=1e-8)
