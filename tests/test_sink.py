"""Attention sinks: the fast path (any backend + exact LSE merge) equals the dense reference mask."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels.reference import dense_focus_attention, sink_key_mask
from focusattn.kernels.api import focus_attention
from focusattn.kernels.soft import soft_focus_attention


def _case(seed, b, hq, hkv, tq, tk, k, top_k, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, 8, generator=g, dtype=dtype)
    kk = torch.randn(b, hkv, tk, 8, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, tk, 8, generator=g, dtype=dtype)
    scores = torch.randn(b, tk, k, generator=g)
    member = torch.zeros(b, tk, k, dtype=torch.bool).scatter_(-1, scores.topk(top_k, -1).indices, True)
    return q, kk, v, member


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


def test_soft_gate_never_gates_sinks():
    q, kk, v, member = _case(1, 1, 2, 2, 24, 24, 3, 1)
    hard = dense_focus_attention(q, kk, v, member, 4, sink=1)
    soft = soft_focus_attention(q, kk, v, member.float(), 4, lam=80.0, offset=0.5, gate="log",
                                sink_keys=sink_key_mask(24, 1))
    assert (soft - hard).abs().max() < 1e-5


def test_sink_tokens_in_model_generation_fast_equals_dense():
    import focusattn as fa
    from focusattn.hf import routers

    from .hf.tiny import V, tiny_model

    m = tiny_model("llama")
    fa.compose(m, fa.FocusConfig(num_groups=4, window=3, top_k=1, backend="decomposed", sink_tokens=1))
    for r in routers(m):
        with torch.no_grad():
            r.proj.weight.mul_(50)
    m.eval()
    x = torch.randint(1, V, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        fast = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        fa.set_top_k(m, 1, backend="dense")
        dense = m.generate(x, max_new_tokens=10, do_sample=False, pad_token_id=0)
        seq = x
        for _ in range(10):
            seq = torch.cat([seq, m(seq, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(fast, dense) and torch.equal(dense, seq)


@pytest.mark.parametrize("bad", [-1, 1.5])
def test_sink_tokens_validation(bad):
    import focusattn as fa

    with pytest.raises(ValueError, match="sink_tokens"):
        fa.FocusConfig(sink_tokens=bad)
