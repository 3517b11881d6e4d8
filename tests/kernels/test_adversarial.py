"""Adversarial input, every kernel entry against its dense reference: empty problems (B, Tq or Tk = 0), T = 1,
queries with no allowed key (all-padding rows, left padding), groups nobody is in, one group holding every token,
every token alone in its group, window 0 and window >= T, sinks beyond the sequence; and NaN/Inf, which every entry
refuses with the same ValueError (semantics: ``focusattn.kernels.validation``)."""
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels import GroupIndex, focus_attention, sink_key_mask
from focusattn.kernels.decode import focus_decode_attention
from focusattn.kernels.decomposed import decomposed_focus_attention
from focusattn.kernels.elastic import lazy_attention
from focusattn.kernels.flex import flex_focus_attention
from focusattn.kernels.reference import dense_focus_attention
from focusattn.kernels.soft import soft_focus_attention
from tests.conftest import assert_close, random_membership

BACKENDS = ("dense", "decomposed", "flex", "flex-sorted", "auto")
STRUCTURES = ("random", "one_group", "alone", "empty_groups", "overlap")
PADDING = ("none", "all", "one_row", "left", "holes")


def membership_of(structure, b, t, gen):
    """Bool ``[b, t, K]`` of a degenerate (or plain random) kind."""
    if structure == "alone":  # every token alone in its own group: only the window remains
        return torch.eye(max(t, 1), dtype=torch.bool)[:t].expand(b, t, max(t, 1)).clone()
    if structure == "one_group":  # one group (not the first) holds every token, the others are empty
        m = torch.zeros(b, t, 4, dtype=torch.bool)
        m[..., 2] = True
        return m
    if structure == "empty_groups":  # 6 groups, tokens only ever in groups 1 and 4
        m = torch.zeros(b, t, 6, dtype=torch.bool)
        pick = torch.rand(b, t, generator=gen) < 0.5
        m[..., 1], m[..., 4] = pick, ~pick
        return m
    if structure == "overlap":
        return random_membership(b, t, 4, 2, gen=gen)
    return random_membership(b, t, 3, 1, gen=gen)


def padding_of(kind, b, t, gen):
    if kind == "none":
        return None
    kpm = torch.ones(b, t, dtype=torch.bool)
    if kind == "all":
        kpm[:] = False
    elif kind == "one_row" and b:
        kpm[-1] = False  # one sequence is padding only
    elif kind == "left":
        kpm[:, : (t + 1) // 2] = False
    elif kind == "holes":
        kpm = torch.rand(b, t, generator=gen) > 0.4
    return kpm


@st.composite
def problems(draw):
    tk = draw(st.sampled_from([0, 1, 1, 2, 5, 9, 17]))
    tq = tk if draw(st.booleans()) else draw(st.integers(0, tk))
    b = draw(st.sampled_from([0, 1, 2, 2]))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.integers(1, 2))
    window = draw(st.sampled_from([0, 1, max(tk - 1, 0), tk, tk + 3, 10**6]))
    structure = draw(st.sampled_from(STRUCTURES))
    padding = draw(st.sampled_from(PADDING))
    sink = draw(st.sampled_from([0, 0, 1, 3, tk + 2]))
    softcap = draw(st.sampled_from([None, None, 2.0]))
    dtype = draw(st.sampled_from([torch.float32, torch.float32, torch.float64]))  # cpu-flash and generic engines
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(b, hq, tq, 4, generator=gen, dtype=dtype)
    k = torch.randn(b, hkv, tk, 4, generator=gen, dtype=dtype)
    v = torch.randn(b, hkv, tk, 4, generator=gen, dtype=dtype)
    m = membership_of(structure, b, tk, gen)
    kw = dict(softcap=softcap, key_padding_mask=padding_of(padding, b, tk, gen))
    return q, k, v, m, window, sink, kw


def assert_same_as_reference(out, lse, ref, ref_lse, tol):
    assert out.shape == ref.shape and out.dtype == ref.dtype and lse.shape == ref_lse.shape
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), "queries with no allowed key differ"
    assert not out.isnan().any() and not lse.isnan().any()
    assert_close(out, ref, atol=tol, rtol=tol, name="out")
    fin = torch.isfinite(ref_lse)
    assert_close(lse[fin].to(ref_lse.dtype), ref_lse[fin], atol=tol, rtol=tol, name="lse")
    assert (out[torch.isneginf(lse)] == 0).all(), "a query with no allowed key must output zeros"


@pytest.mark.parametrize("backend", BACKENDS)
@settings(max_examples=15, deadline=None)
@given(prob=problems())
def test_focus_attention_equals_reference(backend, prob):
    q, k, v, m, window, sink, kw = prob
    ref, ref_lse = dense_focus_attention(q, k, v, m, window, sink=sink, return_lse=True, **kw)
    out, lse = focus_attention(q, k, v, m, window, sink=sink, backend=backend, return_lse=True, **kw)
    assert_same_as_reference(out, lse, ref, ref_lse, 1e-5)
    if q.shape[2] < k.shape[2] and backend in ("decomposed", "auto") and k.shape[0]:  # decoding from a GroupIndex
        out, lse = focus_attention(q, k, v, m, window, sink=sink, backend=backend, return_lse=True,
                                   group_index=GroupIndex(m), **kw)
        assert_same_as_reference(out, lse, ref, ref_lse, 1e-5)


@settings(max_examples=15, deadline=None)
@given(prob=problems())
def test_direct_entries_equal_reference(prob):
    """The backends' own entry points (used by benches and advanced callers) keep the same contract."""
    q, k, v, m, window, _, kw = prob
    ref, ref_lse = dense_focus_attention(q, k, v, m, window, return_lse=True, **kw)
    assert_same_as_reference(*focus_decode_attention(q, k, v, m, window, return_lse=True, **kw), ref, ref_lse, 1e-5)
    assert_same_as_reference(*flex_focus_attention(q, k, v, m, window, return_lse=True, **kw), ref, ref_lse, 1e-5)
    if q.shape[2] == k.shape[2]:
        assert_same_as_reference(*decomposed_focus_attention(q, k, v, m, window, return_lse=True, **kw), ref, ref_lse, 1e-5)
    else:
        with pytest.raises(ValueError, match="Tq == Tk"):
            decomposed_focus_attention(q, k, v, m, window, **kw)


@pytest.mark.parametrize("backend", ("dense", "decomposed"))
@settings(max_examples=10, deadline=None)
@given(prob=problems())
def test_gradients_equal_reference(backend, prob):
    q, k, v, m, window, sink, kw = prob
    gen = torch.Generator().manual_seed(3)
    go = torch.randn(q.shape, generator=gen, dtype=q.dtype)

    def grads(fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*leaves)
        return torch.autograd.grad((out * go).sum(), leaves, allow_unused=False)

    ref = grads(lambda a, b_, c: dense_focus_attention(a, b_, c, m, window, sink=sink, **kw))
    got = grads(lambda a, b_, c: focus_attention(a, b_, c, m, window, sink=sink, backend=backend, **kw))
    for name, g, r in zip("qkv", got, ref):
        assert not g.isnan().any(), f"d{name} has NaN"
        assert_close(g, r, atol=1e-4, rtol=1e-4, name=f"d{name}")


# ------------------------------------------------------------------------------------------------ non-finite input
def _entries():
    """(name, fn(q, k, v) -> output) for every public kernel entry, on a small problem with padding."""
    m = random_membership(1, 6, 3, 1, seed=1)
    kpm = torch.tensor([[False, True, True, True, True, True]])
    e = {f"focus_attention[{b}]": (lambda q, k, v, b=b: focus_attention(q, k, v, m, 1, backend=b,
                                                                          key_padding_mask=kpm, sink=1))
         for b in BACKENDS}
    e["decomposed"] = lambda q, k, v: decomposed_focus_attention(q, k, v, m, 1, key_padding_mask=kpm)
    e["decode"] = lambda q, k, v: focus_decode_attention(q[:, :, -2:], k, v, m, 1, key_padding_mask=kpm)
    e["decode+group_index"] = lambda q, k, v: focus_attention(q[:, :, -2:], k, v, m, 1, group_index=GroupIndex(m))
    e["flex"] = lambda q, k, v: flex_focus_attention(q, k, v, m, 1, key_padding_mask=kpm)
    g = torch.softmax(torch.randn(1, 6, 3), -1)
    e["soft"] = lambda q, k, v: soft_focus_attention(q, k, v, g, 1, lam=5.0, allowed=kpm[:, None, None, :])
    for impl in ("reference", "chunked"):
        e[f"lazy[{impl}]"] = (lambda q, k, v, impl=impl: lazy_attention(q, k, v, torch.full((2,), 0.1),
                                                                         torch.zeros(2, 3), impl=impl, block=4))
    return e


ENTRIES = _entries()


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", ["q", "k", "v"])
@pytest.mark.parametrize("entry", sorted(ENTRIES))
def test_non_finite_input_is_a_clear_error(entry, where, value):
    """Even a NaN in a key nobody may see (position 0 is padding here): the backends would disagree on it. (With a
    GroupIndex a decode step checks its own rows only: the last one here.)"""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 6, 4, generator=gen) for _ in range(3))
    last = where == "q" or "group_index" in entry
    dict(q=q, k=k, v=v)[where][0, 0, -1 if last else 0, 1] = value
    with pytest.raises(ValueError, match=f"^{where} contains 1 NaN/Inf"):
        ENTRIES[entry](q, k, v)


def test_non_finite_soft_groups_and_lazy_parameters_are_clear_errors():
    q = k = v = torch.randn(1, 2, 5, 4)
    g = torch.softmax(torch.randn(1, 5, 3), -1)
    g[0, 2, 0] = math.nan
    with pytest.raises(ValueError, match="^groups contains"):
        soft_focus_attention(q, k, v, g, 1, lam=5.0)
    with pytest.raises(ValueError, match="^lam must be a finite"):
        soft_focus_attention(q, k, v, torch.softmax(torch.randn(1, 5, 3), -1), 1, lam=math.inf)
    with pytest.raises(ValueError, match="^tau contains"):
        lazy_attention(q, k, v, torch.tensor([0.1, math.nan]), torch.zeros(2, 3))
    with pytest.raises(ValueError, match="^bias contains"):
        lazy_attention(q, k, v, torch.zeros(2), torch.full((2, 3), math.inf))
    for scale in (math.inf, math.nan, 0.0):
        with pytest.raises(ValueError, match="^scale must be a finite number"):
            focus_attention(q, k, v, random_membership(1, 5, 3, 1), 1, scale=scale)


def test_degenerate_shapes_are_clear_errors():
    m = random_membership(1, 5, 3, 1)
    with pytest.raises(ValueError, match="head dim D >= 1"):
        focus_attention(torch.randn(1, 2, 5, 0), torch.randn(1, 2, 5, 0), torch.randn(1, 2, 5, 0), m, 1)
    with pytest.raises(ValueError, match="at least one head"):
        focus_attention(torch.randn(1, 2, 5, 4), torch.randn(1, 0, 5, 4), torch.randn(1, 0, 5, 4), m, 1)
    with pytest.raises(ValueError, match="window must be an int >= 0"):
        focus_attention(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), m, -1)
    with pytest.raises(ValueError, match="at least one group"):
        focus_attention(torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4), torch.randn(1, 2, 5, 4),
                        torch.zeros(1, 5, 3, dtype=torch.bool), 1)


def test_group_index_decode_checks_only_this_steps_rows():
    """The documented contract: with a GroupIndex a decode step scans its own k/v rows, not the whole cache."""
    m = random_membership(1, 6, 3, 1, seed=2)
    q, k, v = torch.randn(1, 2, 1, 4), torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    k[0, 0, -1, 0] = math.nan
    with pytest.raises(ValueError, match="^k contains"):
        focus_attention(q, k, v, m, 1, group_index=GroupIndex(m))


# ------------------------------------------------------------------------------------------------ soft and elastic
@settings(max_examples=15, deadline=None)
@given(prob=problems(), gate=st.sampled_from(["log", "multiplicative"]))
def test_soft_kernel_limits_equal_reference(prob, gate):
    """The log gate at a huge sharpness is the hard mask (one-hot or evenly split groups); with a window covering
    every pair nothing is gated and both gates are plain causal attention. Compared on real-token queries (a padded
    query's row has no meaning for the soft gate, which penalises rather than removes) plus every row that the
    reference leaves empty where no key is allowed at all (causal, not padding): those must be zeros. A padded
    query whose only allowed keys are gated keeps them (the gate penalises, softmax renormalises): not compared."""
    q, k, v, m, window, sink, kw = prob
    tk = k.shape[2]
    kpm = kw["key_padding_mask"]
    if gate == "multiplicative":
        window = tk + 1 + window % 3
    groups = m.to(q.dtype) / m.sum(-1, keepdim=True).clamp_min(1)
    allowed = None if kpm is None else kpm[:, None, None, :]
    out = soft_focus_attention(q, k, v, groups, window, lam=1e5, offset=0.1, gate=gate, softcap=kw["softcap"],
                               allowed=allowed, sink_keys=sink_key_mask(tk, sink, kpm, q.device))
    ref, ref_lse = dense_focus_attention(q, k, v, m, window, sink=sink, return_lse=True, **kw)
    assert out.shape == ref.shape and not out.isnan().any()
    rows = torch.ones(ref_lse.shape, dtype=torch.bool)
    if kpm is not None:
        causal = torch.arange(tk)[None, :] <= torch.arange(tk - q.shape[2], tk)[:, None]  # [Tq, Tk]
        none_allowed = ~(causal[None, None] & kpm[:, None, None, :]).any(-1)  # [B, 1, Tq]
        rows = kpm[:, None, tk - q.shape[2]:].expand_as(rows) | (torch.isneginf(ref_lse) & none_allowed)
    assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5, name="soft out")


@st.composite
def lazy_problems(draw):
    tk = draw(st.sampled_from([0, 1, 2, 5, 11]))
    tq = tk if draw(st.booleans()) else draw(st.integers(0, tk))
    b = draw(st.sampled_from([0, 1, 2]))
    w = draw(st.sampled_from([1, 2, tk + 3]))
    block = draw(st.sampled_from([1, 3, 64]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q = torch.randn(b, 2, tq, 4, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(b, 1, tk, 4, generator=gen, dtype=torch.float64) for _ in range(2))
    tau = torch.tensor([draw(st.sampled_from([0.0, 0.5, -0.2])), 0.3], dtype=torch.float64)
    bias = torch.randn(2, w, generator=gen, dtype=torch.float64)
    return q, k, v, tau, bias, block, draw(st.sampled_from(["zero", "clamp"]))


@settings(max_examples=15, deadline=None)
@given(prob=lazy_problems())
def test_lazy_chunked_equals_reference_on_degenerate_shapes(prob):
    q, k, v, tau, bias, block, beyond = prob
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v, tau, bias)]
    grads = []
    for impl in ("reference", "chunked"):
        out = lazy_attention(*leaves, impl=impl, block=block, bias_beyond=beyond)
        assert out.shape == q.shape and not out.isnan().any()
        grads.append((out, *torch.autograd.grad((out * out).sum(), leaves)))
    for name, a, r in zip(["out", "dq", "dk", "dv", "dtau", "dbias"], grads[1], grads[0]):
        assert_close(a, r, atol=1e-9, rtol=1e-9, name=name)
