"""Query and key roles (``query_membership``): every backend and the decode path equal the dense reference (outputs,
LSE, gradients), with GQA, padding, sinks and global keys; the symmetric default is unchanged."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from focusattn.kernels import dispatch
from focusattn.kernels.api import focus_attention
from focusattn.kernels.decomposed import decomposed_focus_attention
from focusattn.kernels.decomposed.plan import plan_groups
from focusattn.kernels.group_index import GroupIndex
from focusattn.kernels.reference import dense_focus_attention, focus_allowed
from tests.conftest import assert_close
from tests.kernels.test_focus_attention import FAST, _attend


def roles_membership(b, t, k_groups, key_top_k, gen, *, query_top_k=1, inside=True):
    """``(keys [b, t, K], queries [b, t, K])``: each token a key of ``key_top_k`` groups and a query of
    ``query_top_k``, its query groups the first of its key groups (``inside``, as the router serves them) or any."""
    order = torch.rand(b, t, k_groups, generator=gen).argsort(-1)
    keys = torch.zeros(b, t, k_groups, dtype=torch.bool).scatter_(-1, order[..., :key_top_k], True)
    qorder = order if inside else torch.rand(b, t, k_groups, generator=gen).argsort(-1)
    queries = torch.zeros(b, t, k_groups, dtype=torch.bool).scatter_(-1, qorder[..., :query_top_k], True)
    return keys, queries


def _case(seed, b, hq, hkv, tq, tk, k_groups, key_top_k, *, padded=False, query_top_k=1, inside=True, d=8,
          dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, hq, tq, d, generator=g, dtype=dtype)
    k = torch.randn(b, hkv, tk, d, generator=g, dtype=dtype)
    v = torch.randn(b, hkv, tk, d, generator=g, dtype=dtype)
    km, qm = roles_membership(b, tk, k_groups, key_top_k, g, query_top_k=query_top_k, inside=inside)
    kpm = None
    if padded:
        kpm = torch.rand(b, tk, generator=g) > 0.2
        kpm[:, : int(torch.randint(0, tk, (1,), generator=g))] = False  # left padding, plus holes
    return q, k, v, km, qm[:, tk - tq:], kpm


def _check(got, want, name, atol=2e-5):
    out, lse = got
    w_out, w_lse = want
    assert_close(out, w_out, atol=atol, rtol=1e-4, name=f"{name} out")
    fin = torch.isfinite(w_lse)
    assert torch.equal(fin, torch.isfinite(lse)), f"{name}: empty rows differ"
    assert_close(lse[fin], w_lse[fin], atol=atol, rtol=1e-4, name=f"{name} lse")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 2),
       tk=st.integers(1, 48), decode=st.booleans(), k_groups=st.integers(1, 5), key_top_k=st.integers(1, 3),
       window=st.sampled_from([0, 1, 3, 7, 60]), padded=st.booleans(), sink=st.sampled_from([0, 1, 2, "mask"]),
       inside=st.booleans(), softcap=st.sampled_from([None, None, 1.5]), backend=st.sampled_from(FAST))
def test_roles_match_the_reference(seed, b, hkv, g, tk, decode, k_groups, key_top_k, window, padded, sink, inside,
                                   softcap, backend):
    key_top_k = min(key_top_k, k_groups)
    tq = max(1, tk // 3) if decode else tk
    q, k, v, km, qm, kpm = _case(seed, b, hkv * g, hkv, tq, tk, k_groups, key_top_k, padded=padded, inside=inside)
    if sink == "mask":  # global keys: a key mask with the first token
        sink = torch.rand(b, tk, generator=torch.Generator().manual_seed(seed + 1)) < 0.2
        sink[:, 0] = True
    if backend == "flex" and softcap is not None:
        softcap = None  # flex's score_mod with a softcap is covered by the symmetric suite
    kw = dict(sink=sink, softcap=softcap, key_padding_mask=kpm, query_membership=qm, return_lse=True)
    want = dense_focus_attention(q, k, v, km, window, **kw)
    if backend == "flex-sorted" and tq == tk:  # its sorted layout is one membership: roles are refused, clearly
        with pytest.raises(ValueError, match="backend='flex-sorted' serves symmetric routing"):
            _attend(q, k, v, km, window, backend=backend, **kw)
        return
    _check(_attend(q, k, v, km, window, backend=backend, **kw), want, backend)
    if decode and backend in ("decomposed", "auto", "auto-sparse"):  # the group index path of a decode step
        _check(_attend(q, k, v, km, window, backend=backend, group_index=GroupIndex(km), **kw), want, "indexed")


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), tk=st.integers(2, 40), k_groups=st.integers(2, 5),
       window=st.sampled_from([0, 2, 5]), padded=st.booleans(), query_top_k=st.integers(2, 3))
def test_several_query_groups_use_the_lowest_shared_group(seed, tk, k_groups, window, padded, query_top_k):
    """Kernels take any roles (config serves query top-1 only): a query of several groups counts each pair once."""
    q, k, v, km, qm, kpm = _case(seed, 2, 4, 2, tk, tk, k_groups, min(2, k_groups), padded=padded,
                                 query_top_k=min(query_top_k, k_groups), inside=False)
    kw = dict(sink=1, key_padding_mask=kpm, query_membership=qm, return_lse=True)
    want = dense_focus_attention(q, k, v, km, window, **kw)
    _check(focus_attention(q, k, v, km, window, backend="decomposed", **kw), want, "decomposed")
    _check(focus_attention(q[:, :, -3:], k, v, km, window, backend="decomposed", group_index=GroupIndex(km),
                           **{**kw, "query_membership": qm[:, -3:]}),
           dense_focus_attention(q[:, :, -3:], k, v, km, window, **{**kw, "query_membership": qm[:, -3:]}), "decode")


@pytest.mark.parametrize("backend", ["decomposed", "auto", "auto-dense", "dense"])
@pytest.mark.parametrize("softcap,padded", [(None, False), (None, True), (2.0, False)])
def test_roles_gradients(backend, softcap, padded):
    q, k, v, km, qm, kpm = _case(3, 2, 4, 2, 45, 45, 4, 2, padded=padded)
    ws = [t.clone().requires_grad_() for t in (q, k, v)]
    rs = [t.clone().requires_grad_() for t in (q, k, v)]
    gen = torch.Generator().manual_seed(1)
    cot, cot_l = torch.randn(2, 4, 45, 8, generator=gen), torch.randn(2, 4, 45, generator=gen)
    kw = dict(sink=1, softcap=softcap, key_padding_mask=kpm, query_membership=qm, return_lse=True)

    def loss(out, lse):  # through the output and the LSE (the sparse merges need both right)
        return (out * cot).sum() + (lse.masked_fill(~torch.isfinite(lse), 0.0) * cot_l).sum()

    loss(*_attend(*ws, km, 3, backend=backend, **kw)).backward()
    loss(*dense_focus_attention(*rs, km, 3, **kw)).backward()
    for a, r, n in zip(ws, rs, "qkv"):
        assert_close(a.grad, r.grad, atol=5e-5, rtol=1e-4, name=f"d{n}")


def test_decode_step_equals_the_prefill_row():
    """A decode step (one new query over the cache, group index appended) gives the prefill's last row."""
    q, k, v, km, qm, _ = _case(5, 1, 4, 2, 300, 300, 8, 2)
    prefill = focus_attention(q, k, v, km, 16, sink=1, query_membership=qm, backend="decomposed")
    index = GroupIndex(km[:, :-1]).append(km[:, -1:])
    step = focus_attention(q[:, :, -1:], k, v, km, 16, sink=1, query_membership=qm[:, -1:], backend="decomposed",
                           group_index=index)
    assert_close(step, prefill[:, :, -1:], atol=2e-5, rtol=1e-4, name="decode step")


def test_long_gathering_decode_with_roles():
    """K=8 query top-1 / key top-2 over 700 keys: the step gathers its lists (not the masked pass)."""
    q, k, v, km, qm, kpm = _case(11, 1, 4, 2, 1, 700, 8, 2, padded=True)
    want = dense_focus_attention(q, k, v, km, 5, sink=1, key_padding_mask=kpm, query_membership=qm)
    for index in (None, GroupIndex(km)):
        got = focus_attention(q, k, v, km, 5, sink=1, key_padding_mask=kpm, query_membership=qm,
                              backend="decomposed", group_index=index)
        assert_close(got, want, atol=2e-5, rtol=1e-4, name="gathered decode")


def test_query_top1_key_top2_counts_each_pair_once_and_keeps_between_top1_and_top2():
    gen = torch.Generator().manual_seed(0)
    km, qm = roles_membership(1, 256, 8, 2, gen)
    plans = plan_groups(km, None, query_membership=qm)
    assert all(x.sign == 1 and x.kidx is not None for x in plans)
    assert sum(len(x.idx) for x in plans) == 256  # every query in exactly one part: nothing subtracted
    top1 = focus_allowed(qm, 0, 256).sum()
    top2 = focus_allowed(km, 0, 256).sum()
    roles = focus_allowed(km, 0, 256, query_membership=qm).sum()
    assert top1 < roles < top2


def test_symmetric_default_is_unchanged():
    """No query membership, or one equal to the keys' rows: the symmetric mask and the same numbers."""
    q, k, v, km, _, _ = _case(7, 2, 4, 2, 40, 40, 4, 2)
    sym = focus_attention(q, k, v, km, 3, sink=1, backend="decomposed", return_lse=True)
    ref = dense_focus_attention(q, k, v, km, 3, sink=1, return_lse=True)
    _check(sym, ref, "symmetric")
    same = focus_attention(q, k, v, km, 3, sink=1, backend="decomposed", query_membership=km, return_lse=True)
    _check(same, ref, "roles equal to the keys")
    assert torch.equal(focus_allowed(km, 3, 40), focus_allowed(km, 3, 40, query_membership=km))


def test_roles_on_the_generic_engine_and_float64():
    q, k, v, km, qm, kpm = _case(9, 1, 2, 1, 33, 33, 3, 2, padded=True, dtype=torch.float64)
    kw = dict(sink=2, key_padding_mask=kpm, query_membership=qm, return_lse=True)
    _check(decomposed_focus_attention(q, k, v, km, 4, **{k_: w for k_, w in kw.items() if k_ != "sink"}),
           dense_focus_attention(q, k, v, km, 4, **{k_: w for k_, w in kw.items() if k_ != "sink"}), "float64")


def test_bad_query_membership_is_refused():
    q, k, v, km, qm, _ = _case(1, 1, 2, 1, 10, 10, 4, 2)
    with pytest.raises(ValueError, match="query_membership must have shape"):
        focus_attention(q, k, v, km, 2, query_membership=qm[:, :5])
    with pytest.raises(ValueError, match="query_membership must be None or a bool"):
        focus_attention(q, k, v, km, 2, query_membership=qm.float())
    empty = qm.clone()
    empty[0, 3] = False
    with pytest.raises(ValueError, match="every query must belong"):
        focus_attention(q, k, v, km, 2, query_membership=empty)


def test_dispatch_never_takes_the_pigeonhole_shortcut_with_roles():
    """Every key in more than K/2 groups does not make every pair shared when the queries have their own groups."""
    gen = torch.Generator().manual_seed(2)
    km, qm = roles_membership(1, 30, 4, 3, gen, inside=False)
    q = torch.randn(1, 2, 30, 8)
    assert dispatch.choose(q, q, km, 2) == "causal"
    assert dispatch.choose(q, q, km, 2, query_membership=qm) != "causal"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("varlen_fn", ["auto", None])
def test_roles_on_cuda_match_the_reference(dtype, varlen_fn):
    """On CUDA a roles call never takes the packed call (whose causal rule is by list index): part by part on the
    fused op, forward and backward equal to the float32 reference."""
    q, k, v, km, qm, kpm = (x.cuda() if x is not None else None for x in _case(4, 2, 6, 2, 300, 300, 8, 2, d=64,
                                                                                 padded=True))
    ws = [t.to(dtype).requires_grad_() for t in (q, k, v)]
    rs = [t.clone().requires_grad_() for t in (q, k, v)]
    cot = torch.randn(2, 6, 300, 64, device="cuda")
    out, lse = decomposed_focus_attention(*ws, km, 16, key_padding_mask=kpm, query_membership=qm, return_lse=True,
                                          varlen_fn=varlen_fn)
    ref, ref_lse = dense_focus_attention(*rs, km, 16, key_padding_mask=kpm, query_membership=qm, return_lse=True)
    (out.float() * cot).sum().backward()
    (ref * cot).sum().backward()
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    assert_close(out.float(), ref, atol=tol, rtol=tol, name="out")
    for a, r, n in zip(ws, rs, "qkv"):
        assert_close(a.grad.float(), r.grad, atol=tol * 5, rtol=tol * 5, name=f"d{n}")


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), b=st.integers(1, 2), hkv=st.integers(1, 2), g=st.integers(1, 3),
       tk=st.integers(2, 60), k_groups=st.integers(2, 9), query_top_k=st.integers(1, 9),
       window=st.sampled_from([0, 1, 4, 70]), padded=st.booleans(), sink=st.sampled_from([0, 1, 3]),
       softcap=st.sampled_from([None, None, 2.0]), chunk=st.sampled_from([None, 64]),
       block=st.sampled_from([1, 7, 512]))
def test_keys_in_one_group_batched_engine_matches_the_reference(seed, b, hkv, g, tk, k_groups, query_top_k, window,
                                                                padded, sink, softcap, chunk, block):
    """Key top-1 with queries in many groups (the key-space router's form), no gradient: the batched engine
    (decomposed.keyed: A and B in blocks of queries; ``chunk`` forces many small batches, ``block`` the query block
    size, 1 query to 512) equals the dense reference, LSE included. Without padding the sinks are folded into the
    engine's calls (no separate sink pass), with padding merged after it."""
    from unittest import mock

    from focusattn.kernels import api
    from focusattn.kernels.decomposed import keyed

    q, k, v, km, qm, kpm = _case(seed, b, hkv * g, hkv, tk, tk, k_groups, 1, padded=padded,
                                 query_top_k=min(query_top_k, k_groups), inside=False)
    kw = dict(sink=sink, softcap=softcap, key_padding_mask=kpm, query_membership=qm, return_lse=True)
    want = dense_focus_attention(q, k, v, km, window, **kw)
    with mock.patch.object(keyed, "CHUNK_SCORES", chunk or keyed.CHUNK_SCORES), \
            mock.patch.object(keyed, "QUERY_BLOCK", block), \
            mock.patch.object(keyed, "forward", wraps=keyed.forward) as spy, \
            mock.patch.object(api, "sink_partial", wraps=api.sink_partial) as sinks:
        got = focus_attention(q, k, v, km, window, backend="decomposed", **kw)
    _check(got, want, "keyed", atol=5e-5)
    assert spy.called
    assert sinks.called == (sink > 0 and padded)  # folded in without padding


def test_sinks_fold_only_into_the_keyed_engine():
    """``decomposed_focus_attention(sink=N)`` is the keyed engine's: with padding or a gradient (the per-group
    path) it is a one-line error naming ``sink``."""
    q, k, v, km, qm, kpm = _case(3, 1, 4, 2, 30, 30, 5, 1, padded=True, query_top_k=2, inside=False)
    with pytest.raises(ValueError, match="sink=1"):
        decomposed_focus_attention(q, k, v, km, 4, key_padding_mask=kpm, query_membership=qm, sink=1)
    with pytest.raises(ValueError, match="sink=1"):
        decomposed_focus_attention(q.requires_grad_(), k, v, km, 4, query_membership=qm, sink=1)
    q = q.detach()
    with torch.no_grad():
        out = decomposed_focus_attention(q, k, v, km, 4, query_membership=qm, sink=1)
    assert_close(out, dense_focus_attention(q, k, v, km, 4, sink=1, query_membership=qm), atol=2e-5, name="fold")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_keys_in_one_group_batched_engine_in_half_precision(dtype):
    """The block engine on half-precision inputs (the fused op in that dtype, accumulators in float32): the
    reference's answer to half-precision tolerance, with many blocks, the window inside and across blocks."""
    from unittest import mock

    from focusattn.kernels.decomposed import keyed

    q, k, v, km, qm, kpm = _case(11, 2, 6, 2, 300, 300, 12, 1, padded=True, query_top_k=4, inside=False, d=16)
    want = dense_focus_attention(q, k, v, km, 20, sink=1, key_padding_mask=kpm, query_membership=qm,
                                 return_lse=True)
    with mock.patch.object(keyed, "QUERY_BLOCK", 16), mock.patch.object(keyed, "forward", wraps=keyed.forward) as spy:
        out, lse = focus_attention(q.to(dtype), k.to(dtype), v.to(dtype), km, 20, sink=1, key_padding_mask=kpm,
                                   query_membership=qm, backend="decomposed", return_lse=True)
    assert spy.called and out.dtype == dtype
    _check((out.float(), lse.float()), want, "keyed half", atol=2e-2)


def test_keys_in_one_group_with_gradients_take_the_per_group_path():
    """The batched engine has no backward: with a gradient the per-group parts run, exact in both directions."""
    q, k, v, km, qm, kpm = _case(5, 2, 4, 2, 40, 40, 6, 1, padded=True, query_top_k=3, inside=False)
    ws = [t.clone().requires_grad_() for t in (q, k, v)]
    rs = [t.clone().requires_grad_() for t in (q, k, v)]
    kw = dict(sink=1, key_padding_mask=kpm, query_membership=qm)
    got = focus_attention(*ws, km, 3, backend="decomposed", **kw)
    want = dense_focus_attention(*rs, km, 3, **kw)
    assert_close(got, want, atol=2e-5, name="out")
    cot = torch.randn_like(got)
    (got * cot).sum().backward()
    (want * cot).sum().backward()
    for a, r, n in zip(ws, rs, "qkv"):
        assert_close(a.grad, r.grad, atol=5e-5, name=f"d{n}")
