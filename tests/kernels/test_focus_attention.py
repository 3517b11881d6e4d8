"""One contract, every backend: focus_attention must equal the dense reference (outputs, LSE, gradients)."""
import logging

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels import decode as decode_mod
from focusattn.kernels import dispatch
from focusattn.kernels.decomposed import plan as plan_mod
from focusattn.kernels.api import focus_attention
from focusattn.kernels.decode import focus_key_indices
from focusattn.kernels.decomposed import decomposed_focus_attention
from focusattn.kernels.reference import dense_focus_attention, focus_allowed, masked_attention
from tests.conftest import random_membership

# "auto-dense" / "auto-sparse": backend="auto" with break-evens that send every call it may to the dense branches
# (causal, masked, decode-masked) / to the sparse engines (decomposed, gather): each branch meets the same contract.
FAST = ("decomposed", "flex", "flex-sorted", "auto", "auto-dense", "auto-sparse")
AUTO_TABLES = {"auto-dense": {"cpu": dispatch.BreakEvens({1: 10**9}, {1: 10**9})},
               "auto-sparse": {"cpu": dispatch.BreakEvens()}}


def _attend(*args, backend, **kw):
    """``focus_attention`` with ``backend``, the ``auto-*`` names dispatching by their break-evens."""
    if backend in AUTO_TABLES:
        with dispatch.using(AUTO_TABLES[backend]):
            return focus_attention(*args, backend="auto", **kw)
    return focus_attention(*args, backend=backend, **kw)


@st.composite
def problems(draw, allow_decode=True):
    b = draw(st.integers(1, 2))
    hkv = draw(st.integers(1, 2))
    hq = hkv * draw(st.integers(1, 3))
    tk = draw(st.integers(1, 40))
    tq = draw(st.integers(1, tk)) if allow_decode and draw(st.booleans()) else tk
    k_groups = draw(st.integers(1, 5))
    top_k = draw(st.integers(1, min(3, k_groups)))
    window = draw(st.sampled_from([0, 1, 3, 7, tk - 1 if tk > 1 else 0, tk + 5]))
    d = draw(st.sampled_from([4, 8]))
    softcap = draw(st.sampled_from([None, None, 1.5]))
    padded = draw(st.booleans())
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, d, generator=gen)
    k = torch.randn(b, hkv, tk, d, generator=gen)
    v = torch.randn(b, hkv, tk, d, generator=gen)
    memb = random_membership(b, tk, k_groups, top_k, gen=gen)
    kpm = None
    if padded:  # left padding of random length, plus a random hole, like batched generation
        kpm = torch.rand(b, tk, generator=gen) > 0.2
        kpm[:, : draw(st.integers(0, tk))] = False
    sink = draw(st.sampled_from([0, 0, 1, 2]))
    return q, k, v, memb, window, dict(softcap=softcap, key_padding_mask=kpm, sink=sink)


def _assert_lse_close(lse, ref, atol):
    assert torch.equal(torch.isneginf(lse), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    if fin.any():
        assert (lse[fin] - ref[fin]).abs().max() <= atol


@pytest.mark.parametrize("backend", FAST)
@settings(max_examples=25, deadline=None)
@given(prob=problems())
def test_forward_matches_dense_fp32(backend, prob):
    q, k, v, memb, window, kw = prob
    ref, ref_lse = dense_focus_attention(q, k, v, memb, window, return_lse=True, **kw)
    out, lse = _attend(q, k, v, memb, window, backend=backend, return_lse=True, **kw)
    assert out.dtype == q.dtype and out.shape == q.shape and lse.dtype == torch.float32
    assert (out - ref).abs().max() <= 1e-5
    _assert_lse_close(lse, ref_lse, 1e-5)


@pytest.mark.parametrize("backend", ("dense",) + FAST)
@settings(max_examples=12, deadline=None)
@given(prob=problems())
def test_gradients_match_dense(backend, prob):
    q, k, v, memb, window, kw = prob
    gen = torch.Generator().manual_seed(1)
    go = torch.randn(q.shape, generator=gen)
    gl = torch.randn(q.shape[:3], generator=gen)

    def grads(fn):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out, lse = fn(*leaves)
        # the LSE gets an upstream gradient too (its -inf rows are constants: they have no keys)
        loss = (out * go).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * gl).sum()
        return torch.autograd.grad(loss, leaves)

    if backend in ("flex", "flex-sorted") and q.device.type == "cpu":  # no CPU backward in FlexAttention: refuse
        with pytest.raises(ValueError, match=f"backend '{backend}' has no backward on CPU"):
            grads(lambda a, b, c: _attend(a, b, c, memb, window, backend=backend, return_lse=True, **kw))
        return
    ref = grads(lambda a, b, c: dense_focus_attention(a, b, c, memb, window, return_lse=True, **kw))
    got = grads(lambda a, b, c: _attend(a, b, c, memb, window, backend=backend, return_lse=True, **kw))
    for name, r, g in zip("qkv", ref, got):
        assert (r - g).abs().max() <= 1e-4, name


@pytest.mark.parametrize("backend", FAST)
@settings(max_examples=8, deadline=None)
@given(prob=problems())
def test_bf16_within_bf16_tolerance(backend, prob):
    q, k, v, memb, window, kw = prob
    qb, kb, vb = (t.bfloat16() for t in (q, k, v))
    ref = dense_focus_attention(qb.float(), kb.float(), vb.float(), memb, window, **kw)
    # return_lse keeps flex on its eager path (compiled CPU flex has no LSE); the output is what is checked
    out = _attend(qb, kb, vb, memb, window, backend=backend, return_lse=True, **kw)[0]
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_shared_pair_counted_once_top2():
    """Every token in groups {0, 1}: all causal pairs share two groups; counted twice, the output would still be a
    convex combination but the LSE would be log 2 too high. Must equal plain causal attention exactly."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 30, 8, generator=gen) for _ in range(3))
    memb = torch.zeros(1, 30, 3, dtype=torch.bool)
    memb[..., :2] = True
    out, lse = focus_attention(q, k, v, memb, 0, backend="decomposed", return_lse=True)
    causal = torch.ones(30, 30, dtype=torch.bool).tril()
    ref, ref_lse = masked_attention(q, k, v, causal, return_lse=True)
    assert (out - ref).abs().max() <= 1e-5
    assert (lse - ref_lse).abs().max() <= 1e-5


def test_chunk_boundaries(monkeypatch):
    """Tiny chunk budgets force many row chunks, band chunks and decode chunks through the same shapes."""
    monkeypatch.setattr(plan_mod, "CHUNK_ELEMS", 64)
    monkeypatch.setattr(plan_mod, "BAND_BLOCK", 4)
    monkeypatch.setattr(decode_mod, "GATHER_ELEMS", 64)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 45, 8, generator=gen, requires_grad=True)
    k = torch.randn(2, 2, 45, 8, generator=gen, requires_grad=True)
    v = torch.randn(2, 2, 45, 8, generator=gen, requires_grad=True)
    memb = random_membership(2, 45, 4, 2, gen=gen)
    kpm = torch.ones(2, 45, dtype=torch.bool)
    kpm[1, :6] = False
    for softcap in (None, 2.0):
        for tq in (45, 9):
            qq = q[:, :, -tq:]
            ref = dense_focus_attention(qq, k, v, memb, 6, softcap=softcap, key_padding_mask=kpm)
            out = focus_attention(qq, k, v, memb, 6, softcap=softcap, key_padding_mask=kpm, backend="decomposed")
            assert (out - ref).abs().max() <= 1e-5
            g = torch.randn(out.shape, generator=gen)
            gr = torch.autograd.grad((ref * g).sum(), (q, k, v))
            go = torch.autograd.grad((out * g).sum(), (q, k, v))
            for a, b in zip(gr, go):
                assert (a - b).abs().max() <= 1e-4


def test_generic_engine_gradcheck_fp64():
    """float64 takes the generic chunked engine (no fused CPU op); gradcheck its hand-written backward, LSE
    included, against finite differences."""
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(1, 2, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 1, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 9, 4, generator=gen, dtype=torch.float64, requires_grad=True)
    memb = random_membership(1, 9, 3, 2, gen=gen)
    for softcap in (None, 1.5):
        fn = lambda a, b, c: decomposed_focus_attention(a, b, c, memb, 2, softcap=softcap, return_lse=True)  # noqa
        assert torch.autograd.gradcheck(fn, (q, k, v), fast_mode=True)


def test_varlen_packing_with_reference_varlen():
    """The CUDA varlen path packs all groups into one call; check the packing and LSE layout on CPU by passing a
    reference implementation of flash-attn's varlen contract (out [total, H, D], LSE [H, total])."""
    calls = []

    def fake_varlen(q, k, v, cu_q, cu_k, max_q, max_k, dropout_p, softmax_scale, causal, return_attn_probs):
        calls.append(cu_q.tolist())
        outs, lses = [], []
        for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            n = e - s
            o, l_ = masked_attention(q[s:e].transpose(0, 1)[None], k[s:e].transpose(0, 1)[None],
                                     v[s:e].transpose(0, 1)[None], torch.ones(n, n, dtype=torch.bool).tril(),
                                     scale=softmax_scale, return_lse=True)
            outs.append(o[0].transpose(0, 1))
            lses.append(l_[0])
        return torch.cat(outs), torch.cat(lses, -1), None

    gen = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 33, 8, generator=gen)
    k = torch.randn(2, 2, 33, 8, generator=gen)
    v = torch.randn(2, 2, 33, 8, generator=gen)
    memb = random_membership(2, 33, 3, 1, gen=gen)
    out, lse = decomposed_focus_attention(q, k, v, memb, 4, return_lse=True, varlen_fn=fake_varlen)
    ref, ref_lse = dense_focus_attention(q, k, v, memb, 4, return_lse=True)
    assert len(calls) == 1 and calls[0][-1] == 2 * 33  # one packed call, no padding
    assert (out - ref).abs().max() <= 1e-5 and (lse - ref_lse).abs().max() <= 1e-5


@settings(max_examples=20, deadline=None)
@given(prob=problems())
def test_decode_gathers_exactly_the_allowed_keys(prob):
    """Decode cost is the gathered list length: it must be the allowed set (window + shared groups), not Tk."""
    q, k, v, memb, window, kw = prob
    tk = k.shape[2]
    qpos = torch.arange(tk - q.shape[2], tk)
    idx, valid = focus_key_indices(memb, window, qpos, kw["key_padding_mask"])
    allowed = focus_allowed(memb, window, q.shape[2])
    if kw["key_padding_mask"] is not None:
        allowed = allowed & kw["key_padding_mask"][:, None, :]
    hits = torch.zeros(allowed.shape, dtype=torch.long).scatter_add_(-1, idx, valid.long())
    assert torch.equal(hits, allowed.long())  # every allowed key exactly once, nothing else
    assert idx.shape[-1] == max(1, int(allowed.sum(-1).max()))


def test_decode_one_step_long_context():
    gen = torch.Generator().manual_seed(4)
    tk = 300
    k = torch.randn(1, 3, tk, 16, generator=gen)
    v = torch.randn(1, 3, tk, 16, generator=gen)
    q = torch.randn(1, 9, 1, 16, generator=gen)
    memb = random_membership(1, tk, 8, 1, gen=gen)
    out, lse = focus_attention(q, k, v, memb, 16, backend="decomposed", return_lse=True)
    ref, ref_lse = dense_focus_attention(q, k, v, memb, 16, return_lse=True)
    assert (out - ref).abs().max() <= 1e-5 and (lse - ref_lse).abs().max() <= 1e-5


def _inputs():
    q = torch.randn(1, 4, 6, 8)
    k = torch.randn(1, 2, 6, 8)
    memb = torch.zeros(1, 6, 2, dtype=torch.bool)
    memb[..., 0] = True
    return q, k, k.clone(), memb


@pytest.mark.parametrize("mutate, match", [
    (lambda a: a.update(q=torch.randn(1, 3, 6, 8)), "heads"),
    (lambda a: a.update(q=torch.randn(1, 4, 6, 4)), "head dim"),
    (lambda a: a.update(v=torch.randn(1, 2, 5, 8)), "k and v"),
    (lambda a: a.update(q=torch.randn(1, 4, 7, 8)), "Tq"),
    (lambda a: a["membership"].__setitem__((0, 2, 0), False), "membership: every token"),
    (lambda a: a.update(membership=a["membership"].float()), "membership must be a bool"),
    (lambda a: a.update(membership=a["membership"][:, :5]), "membership must have shape"),
    (lambda a: a.update(window=-1), "window"),
    (lambda a: a.update(window=2.5), "window"),
    (lambda a: a.update(backend="fast"), "backend must be one of"),
    (lambda a: a.update(q=a["q"].long(), k=a["k"].long(), v=a["v"].long()), "backend 'auto' needs floating"),
    (lambda a: a.update(key_padding_mask=torch.ones(1, 6)), "key_padding_mask"),
    (lambda a: a.update(softcap=0.0), "softcap"),
])
def test_bad_input_raises_value_error_naming_argument(mutate, match):
    q, k, v, memb = _inputs()
    args = dict(q=q, k=k, v=v, membership=memb, window=2, backend="auto")
    mutate(args)
    with pytest.raises(ValueError, match=match):
        focus_attention(args.pop("q"), args.pop("k"), args.pop("v"), args.pop("membership"), args.pop("window"),
                        **args)


def test_auto_logs_choice_once(caplog):
    from focusattn.kernels import backends

    backends._log_auto_choice.cache_clear()
    q, k, v, memb = _inputs()
    with caplog.at_level(logging.INFO, logger="focusattn"):
        a = focus_attention(q, k, v, memb, 2)
        focus_attention(q, k, v, memb, 2)
    msgs = [r for r in caplog.records if "backend='auto'" in r.getMessage()]
    assert len(msgs) == 1 and "decomposed" in msgs[0].getMessage()
    assert (a - focus_attention(q, k, v, memb, 2, backend="decomposed")).abs().max() <= 1e-6


def test_assert_close_reports_relative_error():
    from tests.conftest import assert_close

    assert_close(torch.ones(3), torch.ones(3) + 1e-7)
    with pytest.raises(AssertionError, match=r"max relative error 5\.000e-01"):
        assert_close(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0]), name="x")


def _branch_case(seed, tq, tk, window, top_k, groups=4, pad=True):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 6, tq, 8, generator=gen)  # GQA: 3 query heads per k/v head
    k, v = torch.randn(2, 2, tk, 8, generator=gen), torch.randn(2, 2, tk, 8, generator=gen)
    memb = random_membership(2, tk, groups, top_k, gen=gen)
    kpm = None
    if pad:  # left padding on one row, like batched generation
        kpm = torch.ones(2, tk, dtype=torch.bool)
        kpm[1, :5] = False
    return q, k, v, memb, kpm


# (table, Tq, Tk, window, top_k of 4 groups) -> the branch auto must take
BRANCH_CASES = [
    ("auto-sparse", 30, 30, 29, 1, "causal"),  # the window covers the sequence
    ("auto-sparse", 30, 30, 3, 3, "causal"),  # top-3 of 4: every two tokens share a group
    ("auto-dense", 30, 30, 3, 1, "masked"),
    ("auto-sparse", 30, 30, 3, 2, "decomposed"),
    ("auto-sparse", 2, 30, 40, 1, "causal"),  # the cache within the window
    ("auto-dense", 1, 30, 3, 2, "decode-masked"),
    ("auto-sparse", 3, 30, 3, 1, "gather"),
]


@pytest.mark.parametrize("table, tq, tk, window, top_k, branch", BRANCH_CASES)
def test_dispatcher_takes_each_branch_exactly(table, tq, tk, window, top_k, branch):
    """Each branch of backend='auto' is reached (counted in dispatch.PICKS) and equals the dense reference:
    outputs, LSE (padding rows -inf), gradients through both, sinks, GQA."""
    q, k, v, memb, kpm = _branch_case(tq * 100 + top_k, tq, tk, window, top_k)
    kw = dict(sink=1, key_padding_mask=kpm, return_lse=True)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref, ref_lse = dense_focus_attention(*leaves, memb, window, **kw)
    before = dict(dispatch.PICKS)
    out, lse = _attend(*leaves, memb, window, backend=table, **kw)
    assert {b: n - before.get(b, 0) for b, n in dispatch.PICKS.items() if n != before.get(b, 0)} == {branch: 1}
    assert (out - ref).abs().max() <= 1e-5
    _assert_lse_close(lse, ref_lse, 1e-5)
    gen = torch.Generator().manual_seed(7)
    go, gl = torch.randn(q.shape, generator=gen), torch.randn(q.shape[:3], generator=gen)

    def loss(o, l_):
        return (o * go).sum() + (torch.where(torch.isfinite(l_), l_, 0.0) * gl).sum()

    for name, a, b in zip("qkv", torch.autograd.grad(loss(ref, ref_lse), leaves),
                          torch.autograd.grad(loss(out, lse), leaves)):
        assert (a - b).abs().max() <= 1e-4, name
    with torch.no_grad():  # inference takes the same branch without autograd's Function: same answer
        out_ng = _attend(q, k, v, memb, window, backend=table, **kw)[0]
    assert (out_ng - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("table", ["auto", "auto-dense", "auto-sparse"])
@pytest.mark.parametrize("window, top_k", [(3, 1), (3, 2), (40, 1)])
def test_auto_decode_equals_prefill(table, window, top_k):
    """Token-by-token decoding through backend='auto' with a GroupIndex (as generation runs it) gives the prefill's
    rows, whichever branch each step takes."""
    from focusattn.kernels import GroupIndex

    q, k, v, memb, kpm = _branch_case(11, 36, 36, window, top_k)
    full = _attend(q, k, v, memb, window, backend=table, sink=1, key_padding_mask=kpm)
    index = GroupIndex(memb[:, :20])
    for t in range(20, 36):
        step = _attend(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], memb[:, :t + 1], window, backend=table,
                       sink=1, key_padding_mask=kpm[:, :t + 1], group_index=index.append(memb[:, t:t + 1]))
        assert (step[:, :, 0] - full[:, :, t]).abs().max() <= 1e-5, t
