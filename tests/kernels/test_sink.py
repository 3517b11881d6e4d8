"""Attention sinks: the fast path (any backend + exact LSE merge) equals the dense reference mask."""
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from focusattn.kernels.api import focus_attention
from focusattn.kernels.reference import dense_focus_attention, sink_key_mask
from tests.conftest import focus_case as _case


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), gqa=st.sampled_from([(2, 1), (4, 2), (3, 3)]),
       tk=st.integers(2, 40), decode=st.booleans(), k=st.integers(1, 4), window=st.integers(0, 6),
       sink=st.integers(1, 3), pad=st.booleans(), backend=st.sampled_from(["decomposed", "dense"]))
def test_sinks_fast_equals_dense(seed, b, gqa, tk, decode, k, window, sink, pad, backend):
    top_k = 1 + seed % k
    tq = 1 if decode else tk
    q, kk, v, member = _case(seed, b, gqa[0], gqa[1], tq, tk, k, top_k)
    kpm = None
    if pad:
        kpm = torch.ones(b, tk, dtype=torch.bool)
        kpm[0, : tk // 3] = False  # left padding in the first row
    ref = dense_focus_attention(q, kk, v, member, window, key_padding_mask=kpm, sink=sink)
    out = focus_attention(q, kk, v, member, window, sink=sink, key_padding_mask=kpm, backend=backend)
    rows = torch.ones(b, tq, dtype=torch.bool) if kpm is None else kpm[:, tk - tq:]
    assert (out - ref)[rows[:, None, :, None].expand_as(out)].abs().max().item() <= 1e-5


def test_sink_gradients_match_dense():
    q, kk, v, member = _case(3, 2, 4, 2, 30, 30, 4, 1, dtype=torch.float64)
    grads = []
    for fn in ("dense", "fast"):
        ts = [t.clone().requires_grad_() for t in (q, kk, v)]
        if fn == "dense":
            out = dense_focus_attention(*ts, member, 3, sink=2)
        else:
            out = focus_attention(*ts, member, 3, sink=2, backend="decomposed")
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        grads.append([t.grad for t in ts])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, atol=1e-6)


def test_sink_mask_counts_real_tokens_only():
    kpm = torch.tensor([[False, False, True, True, True], [True, True, True, True, True]])
    assert sink_key_mask(5, 2, kpm).tolist() == [[False, False, True, True, False], [True, True, False, False, False]]
    assert sink_key_mask(5, 0) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), tq=st.integers(1, 3), tk=st.integers(4, 40),
       k=st.integers(1, 4), window=st.integers(0, 6), sink=st.integers(1, 3), pad=st.booleans())
def test_decode_folds_sinks_into_its_lists(monkeypatch, seed, b, tq, tk, k, window, sink, pad):
    """A decode step (Tq < Tk) gathers the sink keys with the others: no sink part, no merge, same answer and
    gradients as the dense mask (one row, B = Tq = 1, takes the compacted path)."""
    import focusattn.kernels.api as api

    monkeypatch.setattr(api, "sink_partial", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("sink part")))
    top_k = 1 + seed % k
    q, kk, v, member = _case(seed, b, 4, 2, tq, tk, k, top_k, dtype=torch.float64)
    kpm = None
    if pad:
        kpm = torch.ones(b, tk, dtype=torch.bool)
        kpm[-1, : tk // 3] = False
    grads = []
    for fn in (dense_focus_attention, focus_attention):
        ts = [t.clone().requires_grad_() for t in (q, kk, v)]
        out, lse = fn(*ts, member, window, sink=sink, key_padding_mask=kpm, return_lse=True)
        (out * torch.linspace(-1, 1, out.shape[-1], dtype=out.dtype)).sum().backward()
        grads.append((out.detach(), lse.detach(), *[t.grad for t in ts]))
        with torch.no_grad():  # inference: gathered into the reused workspace, same answer twice in a row
            again = fn(q, kk, v, member, window, sink=sink, key_padding_mask=kpm)
        assert torch.allclose(again, out, atol=1e-10)
    for a, c in zip(*grads):
        assert torch.allclose(a, c, atol=1e-8)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seed=st.integers(0, 10_000), b=st.integers(1, 2), tk=st.integers(2, 40), k=st.integers(1, 4),
       window=st.integers(0, 6), sink=st.integers(1, 3), pad=st.booleans(), rows=st.integers(1, 7))
def test_inference_sink_merge_in_row_chunks(monkeypatch, seed, b, tk, k, window, sink, pad, rows):
    """At inference a prefill merges its sinks chunk by chunk in place (no output-sized partial): any chunking
    gives the dense answer."""
    import focusattn.kernels.api as api

    monkeypatch.setattr(api, "SINK_ROWS", rows)
    q, kk, v, member = _case(seed, b, 4, 2, tk, tk, k, 1 + seed % k)
    kpm = None
    if pad:
        kpm = torch.ones(b, tk, dtype=torch.bool)
        kpm[0, : tk // 3] = False
    ref = dense_focus_attention(q, kk, v, member, window, key_padding_mask=kpm, sink=sink)
    with torch.no_grad():
        out = focus_attention(q, kk, v, member, window, sink=sink, key_padding_mask=kpm, backend="decomposed")
    real = torch.ones(b, tk, dtype=torch.bool) if kpm is None else kpm
    assert (out - ref)[real[:, None, :, None].expand_as(out)].abs().max().item() <= 1e-5


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), tk=st.integers(2, 40), window=st.integers(0, 6), rate=st.floats(0.0, 0.5),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), roles=st.booleans())
def test_fused_sink_part_equals_the_differentiable_one(seed, tk, window, rate, dtype, roles):
    """Inference takes the CPU flash op for the sink part (global keys: any key mask); training the manual,
    differentiable path. Same output and LSE, empty rows included (LSE -inf, output 0)."""
    from focusattn.kernels.sink import sink_partial

    q, kk, v, member = _case(seed, 2, 4, 2, tk, tk, 4, 1, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    keys = torch.rand(2, tk, generator=g) < rate
    keys[:, 0] = True  # the first token, as served_sinks always adds it
    qmem = torch.nn.functional.one_hot(torch.randint(0, 4, (2, tk), generator=g), 4).bool() if roles else None
    fast = sink_partial(q, kk, v, member, window, keys, query_membership=qmem)
    slow = sink_partial(q.clone().requires_grad_(), kk, v, member, window, keys, query_membership=qmem)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert torch.equal(torch.isinf(fast[1]), torch.isinf(slow[1]))
    assert (fast[1] - slow[1]).nan_to_num(0.0, 0.0, 0.0).abs().max() <= tol
    assert (fast[0].float() - slow[0].detach().float()).abs().max() <= tol
