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
