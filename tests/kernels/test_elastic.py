"""Elastic-Softmax kernels: chunked two-pass vs the dense reference (outputs and all gradients), gradcheck, errors."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels.elastic import distance_bias, elastic_weights, lazy_attention

PARAMS = ("out", "q", "k", "v", "tau", "bias")


def _inputs(b, hkv, g, tq, tk, d, w, seed, dtype, tau_lo=-0.5, tau_hi=1.5):
    gen = torch.Generator().manual_seed(seed)
    hq = hkv * g
    q = torch.randn(b, hq, tq, d, generator=gen, dtype=dtype)
    k = torch.randn(b, hkv, tk, d, generator=gen, dtype=dtype)
    v = torch.randn(b, hkv, tk, d, generator=gen, dtype=dtype)
    tau = torch.rand(hq, generator=gen, dtype=dtype) * (tau_hi - tau_lo) + tau_lo
    bias = torch.randn(hq, w, generator=gen, dtype=dtype)
    return [t.requires_grad_() for t in (q, k, v, tau, bias)]


def _run(impl, xs, **kw):
    out = lazy_attention(*xs, impl=impl, **kw)
    gout = torch.randn(out.shape, generator=torch.Generator().manual_seed(123), dtype=out.dtype)
    return [out, *torch.autograd.grad((out * gout).sum(), xs)]


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 2), tk=st.integers(1, 24),
       dq=st.integers(0, 6), d=st.sampled_from([2, 4, 8]), w=st.integers(1, 30), block=st.integers(1, 9),
       beyond=st.sampled_from(["zero", "clamp"]), seed=st.integers(0, 10_000),
       n_cap=st.one_of(st.none(), st.integers(1, 24)))
def test_chunked_matches_reference_fp32(b, hkv, g, tk, dq, d, w, block, beyond, seed, n_cap):
    tq = max(1, tk - dq)  # queries aligned to the end of the keys (prefill and cached decoding)
    xs = _inputs(b, hkv, g, tq, tk, d, w, seed, torch.float32)
    ref = _run("reference", xs, bias_beyond=beyond, n_cap=n_cap)
    got = _run("chunked", xs, bias_beyond=beyond, block=block, n_cap=n_cap)
    for name, r, c in zip(PARAMS, ref, got):
        assert torch.allclose(r, c, atol=1e-5, rtol=1e-5), f"{name}: max diff {(r - c).abs().max().item()}"


@pytest.mark.parametrize("impl", ["reference", "chunked"])
@pytest.mark.parametrize("beyond", ["zero", "clamp"])
def test_gradcheck_float64(impl, beyond):
    # tau in [0.3, 0.7] and random logits keep every p away from the threshold kink, where finite differences break.
    xs = _inputs(1, 1, 2, 5, 6, 3, 4, seed=7, dtype=torch.float64, tau_lo=0.3, tau_hi=0.7)
    fn = lambda *a: lazy_attention(*a, impl=impl, block=2, bias_beyond=beyond)  # noqa: E731
    assert torch.autograd.gradcheck(fn, xs, eps=1e-6, atol=1e-5)


def test_rule_by_hand():
    """One head, two keys, zero scores: p = (1/2, 1/2) for the second query; tau = 0.5 -> threshold 1/4."""
    q = torch.zeros(1, 1, 2, 2)
    k = torch.zeros(1, 1, 2, 2)
    v = torch.tensor([[[[1.0, 0.0], [0.0, 1.0]]]])
    bias = torch.zeros(1, 1)
    out = lazy_attention(q, k, v, torch.tensor([0.5]), bias, impl="chunked", block=1)
    # row 0: p = 1, threshold 0.5 -> a = 0.5 on key 0; row 1: a = 1/4 on each key
    assert torch.allclose(out[0, 0], torch.tensor([[0.5, 0.0], [0.25, 0.25]]))


def test_n_cap_holds_the_threshold_at_tau_over_the_cap():
    """Zero scores: p = 1/n on every visible key. Uncapped (tau = 0.5) every row keeps 1/n - 0.5/n = 0.5/n per key;
    with n_cap = 2 rows n >= 2 subtract 0.5/2, so rows past 2 tokens (p = 1/n <= 1/4 for n >= 4) are all zero."""
    q, k = torch.zeros(1, 1, 6, 2), torch.randn(1, 1, 6, 2)
    tau, bias = torch.tensor([0.5]), torch.zeros(1, 1)
    a = elastic_weights(q, k, tau, bias)
    n = torch.arange(1, 7.0)
    assert torch.allclose(a[0, 0].sum(-1), 0.5 * torch.ones(6))
    capped = elastic_weights(q, k, tau, bias, n_cap=2)
    want = torch.clamp(1 / n - 0.5 / n.clamp(max=2), min=0) * n  # row sums
    assert torch.allclose(capped[0, 0].sum(-1), want)
    assert torch.count_nonzero(capped[0, 0, 3:]) == 0
    with pytest.raises(ValueError, match="n_cap must be"):
        elastic_weights(q, k, tau, bias, n_cap=0)


@pytest.mark.parametrize("impl", ["reference", "chunked"])
def test_gradcheck_float64_with_n_cap(impl):
    xs = _inputs(1, 1, 2, 5, 6, 3, 4, seed=7, dtype=torch.float64, tau_lo=0.3, tau_hi=0.7)
    fn = lambda *a: lazy_attention(*a, impl=impl, block=2, n_cap=3)  # noqa: E731
    assert torch.autograd.gradcheck(fn, xs, eps=1e-6, atol=1e-5)


def test_uniform_row_with_tau_one_is_all_zero():
    q = torch.zeros(1, 1, 6, 4)
    k = torch.randn(1, 1, 6, 4)
    a = elastic_weights(q, k, torch.ones(1), torch.zeros(1, 3))
    assert torch.count_nonzero(a) == 0


def test_negative_tau_adds_mass_and_no_zeros():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 8, 4, generator=gen), torch.randn(1, 1, 8, 4, generator=gen)
    a = elastic_weights(q, k, torch.tensor([-0.5]), torch.zeros(1, 4))
    assert torch.allclose(a.sum(-1), torch.full((1, 1, 8), 1.5))
    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    assert (a[0, 0][causal] > 0).all() and (a[0, 0][~causal] == 0).all()


def test_bias_table_lookup_zero_vs_clamp():
    bias = torch.tensor([[1.0, 2.0, 3.0]])
    dist = torch.tensor([0, 2, 3, 10])
    assert distance_bias(bias, dist, "zero").tolist() == [[1.0, 3.0, 0.0, 0.0]]
    assert distance_bias(bias, dist, "clamp").tolist() == [[1.0, 3.0, 3.0, 3.0]]


def test_bias_shifts_logits_like_a_score():
    """A bias of +log(3) at distance 1 triples that key's softmax weight relative to the others."""
    q = torch.zeros(1, 1, 3, 2)
    k = torch.zeros(1, 1, 3, 2)
    a = elastic_weights(q, k, torch.zeros(1), torch.tensor([[0.0, math.log(3.0)]]))
    assert torch.allclose(a[0, 0, 2], torch.tensor([0.2, 0.6, 0.2]))


@pytest.mark.parametrize("kw, match", [
    ({"tau": torch.ones(3)}, "tau must have shape"),
    ({"bias": torch.zeros(3, 4)}, "bias must have shape"),
    ({"bias": torch.zeros(2)}, "bias must have shape"),
    ({"bias": torch.zeros(2, 0)}, "W must be >= 1"),
    ({"impl": "fast"}, "impl must be one of"),
    ({"bias_beyond": "wrap"}, "bias_beyond must be one of"),
    ({"block": 0}, "block must be"),
])
def test_bad_inputs_name_the_argument(kw, match):
    args = {"q": torch.zeros(1, 2, 4, 2), "k": torch.zeros(1, 2, 4, 2), "v": torch.zeros(1, 2, 4, 2),
            "tau": torch.ones(2), "bias": torch.zeros(2, 4)}
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        lazy_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("tau"), args.pop("bias"), **args)


def test_bfloat16_inputs_are_computed_in_float32():
    xs = [t.detach() for t in _inputs(1, 2, 1, 40, 40, 8, 16, seed=3, dtype=torch.float32)]
    ref = lazy_attention(*xs, impl="reference")
    half = lazy_attention(*[t.bfloat16() for t in xs], impl="chunked", block=16)
    assert half.dtype == torch.bfloat16
    # bf16 rounding of the inputs alone moves outputs by ~1e-2 here (all-bf16 arithmetic measured ~2e-2).
    assert (half.float() - ref).abs().max() < 1.5e-2


@settings(max_examples=20, deadline=None)
@given(b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 2), tk=st.integers(1, 20), dq=st.integers(0, 5),
       w=st.integers(1, 24), seed=st.integers(0, 10_000))
def test_all_true_mask_is_the_unmasked_kernel(b, hkv, g, tk, dq, w, seed):
    """The model-mask path (reference) equals the chunked kernel when the mask removes nothing: outputs, grads."""
    tq = max(1, tk - dq)
    xs = _inputs(b, hkv, g, tq, tk, 4, w, seed, torch.float64)
    allowed = torch.ones(b, 1, tq, tk, dtype=torch.bool)
    for got, want in zip(_run("chunked", xs, allowed=allowed), _run("chunked", xs)):
        assert torch.allclose(got, want, atol=1e-10)


@settings(max_examples=20, deadline=None)
@given(tk=st.integers(2, 16), window=st.integers(1, 6), pad=st.integers(0, 4), seed=st.integers(0, 10_000),
       softcap=st.one_of(st.none(), st.floats(0.5, 5.0)))
def test_masked_rule_by_hand(tk, window, pad, seed, softcap):
    """Row by row: softmax over the keys the mask and causality allow, threshold tau / (their count), no
    renormalisation; a row that may see nothing keeps nothing."""
    pad = min(pad, tk - 1)
    q, k, v, tau, bias = (t.detach() for t in _inputs(1, 1, 2, tk, tk, 4, 8, seed, torch.float64, 0.0, 1.5))
    i = torch.arange(tk)[:, None]
    j = torch.arange(tk)[None]
    allowed = ((i - j < window) & (j >= pad))[None, None]
    out = lazy_attention(q, k, v, tau, bias, allowed=allowed, softcap=softcap)
    kk = k.expand(1, 2, tk, 4)
    vv = v.expand(1, 2, tk, 4)
    for h in range(2):
        for r in range(tk):
            keys = [c for c in range(r + 1) if bool(allowed[0, 0, r, c])]
            want = torch.zeros(4, dtype=torch.float64)
            if keys:
                s = (q[0, h, r] @ kk[0, h, keys].T) / 2.0
                if softcap is not None:
                    s = softcap * torch.tanh(s / softcap)
                s = s + distance_bias(bias, torch.tensor([r - c for c in keys]))[h]
                p = torch.softmax(s, -1)
                a = torch.relu(p - tau[h] / len(keys))
                want = a @ vv[0, h, keys]
            assert torch.allclose(out[0, h, r], want, atol=1e-10), (h, r)
    w = elastic_weights(q, k, tau, bias, allowed=allowed, softcap=softcap)
    assert torch.allclose(w @ vv, out, atol=1e-10)


def test_bad_mask_names_the_argument():
    xs = [t.detach() for t in _inputs(1, 1, 1, 4, 4, 2, 4, 0, torch.float32)]
    with pytest.raises(ValueError, match="allowed must be a bool mask"):
        lazy_attention(*xs, allowed=torch.ones(1, 1, 4, 4))
    with pytest.raises(ValueError, match="softcap"):
        lazy_attention(*xs, softcap=-1.0)
