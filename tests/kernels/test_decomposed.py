"""The decomposed prefill kernel's parts: inclusion–exclusion for top-k > 1, causal tiles, the signed merge."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from focusattn.kernels.decomposed import decomposed_focus_attention
from focusattn.kernels.decomposed import driver as driver_mod
from focusattn.kernels.decomposed import packed as packed_mod
from focusattn.kernels.decomposed import plan as plan_mod
from focusattn.kernels.decomposed.fused import fused_bwd, fused_fwd
from focusattn.kernels.lse import merge_signed_
from focusattn.kernels.reference import dense_focus_attention, masked_attention
from tests.conftest import random_membership


def _memberships(draw, gen, b, t):
    """Exact top-k routing, or variable set sizes (1..max_set groups per token, as a thresholded router gives)."""
    kk = draw(st.integers(1, 6))
    if draw(st.booleans()):
        return random_membership(b, t, kk, draw(st.integers(1, min(3, kk))), gen=gen)
    max_set = draw(st.integers(1, min(4, kk)))
    sizes = torch.randint(1, max_set + 1, (b, t, 1), generator=gen)
    rank = torch.rand(b, t, kk, generator=gen).argsort(-1).argsort(-1)
    return rank < sizes


@st.composite
def problems(draw):
    b, hkv = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    hq = hkv * draw(st.integers(1, 3))
    t = draw(st.integers(1, 48))
    d = draw(st.sampled_from([4, 8]))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        q, k, v = torch.randn(b, hq, t, d, generator=gen), *(torch.randn(b, hkv, t, d, generator=gen) for _ in "kv")
    else:  # token-major memory, as Hugging Face attention modules hand q/k/v over ([B, T, H, D] transposed)
        q, k, v = (torch.randn(b, t, h, d, generator=gen).transpose(1, 2) for h in (hq, hkv, hkv))
    memb = _memberships(draw, gen, b, t)
    window = draw(st.sampled_from([0, 1, 5, t + 3]))
    kpm = None
    pad = draw(st.sampled_from(["none", "left", "holes"]))
    if pad != "none":
        kpm = torch.ones(b, t, dtype=torch.bool)
        kpm[:, : draw(st.integers(0, t))] = False
        if pad == "holes":
            kpm &= torch.rand(b, t, generator=gen) > 0.25
    return q, k, v, memb, window, kpm


def _grads(fn, q, k, v, seed=1):
    gen = torch.Generator().manual_seed(seed)
    go, gl = torch.randn(q.shape, generator=gen), torch.randn(q.shape[:3], generator=gen)
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]  # keeps each input's memory layout
    out, lse = fn(*leaves)
    loss = (out * go).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * gl).sum()
    return (out.detach(), lse.detach(), *torch.autograd.grad(loss, leaves))


@pytest.mark.parametrize("decomposition", ["ie", "lowest", "auto"])
@settings(max_examples=30, deadline=None)
@given(prob=problems())
def test_matches_dense_outputs_lse_and_gradients(decomposition, prob):
    _assert_matches_dense(prob, decomposition=decomposition)


def _assert_matches_dense(prob, **kwargs):
    """Outputs, LSE (empty rows -inf alike) and q/k/v gradients of the decomposed kernel as the dense reference's."""
    q, k, v, memb, window, kpm = prob
    ref = _grads(lambda a, b, c: dense_focus_attention(a, b, c, memb, window, key_padding_mask=kpm,
                                                       return_lse=True), q, k, v)
    got = _grads(lambda a, b, c: decomposed_focus_attention(a, b, c, memb, window, key_padding_mask=kpm,
                                                            return_lse=True, **kwargs), q, k, v)
    assert torch.equal(torch.isneginf(got[1]), torch.isneginf(ref[1]))
    fin = torch.isfinite(ref[1])
    assert (got[0] - ref[0]).abs().max() <= 1e-5
    assert fin.sum() == 0 or (got[1][fin] - ref[1][fin]).abs().max() <= 1e-5
    for name, r, g in zip("qkv", ref[2:], got[2:]):
        assert (r - g).abs().max() <= 1e-5 * max(1.0, float(r.abs().max())), name


def _per_sequence(fn, cu, *xs):
    """Apply ``fn`` to each packed sequence of ``xs`` (``[n, H, ...]`` -> ``[1, H, len, ...]``), re-packed."""
    outs = []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        res = fn(*(None if x is None else x[a:b].transpose(0, 1)[None] for x in xs))
        outs.append([r[0].transpose(0, 1) for r in res])
    return [torch.cat(parts) for parts in zip(*outs)]


# Part A packed (the GPU layout) with the CPU's fused op run sequence by sequence as the variable-length kernel:
# the packing, the vectorised signed merge and the packed backward are tested here, on every CI run.
CPU_VARLEN = packed_mod.Varlen(
    "cpu-per-sequence",
    lambda q, k, v, cu, max_len, scale: _per_sequence(lambda a, b, c: fused_fwd(a, b, c, None, scale), cu, q, k, v),
    lambda do, q, k, v, o, lse, dlse, cu, max_len, scale: _per_sequence(
        lambda a, b, c, d, e, f, h: fused_bwd(a, b, c, d, e, f, h, None, scale), cu, do, q, k, v, o, lse, dlse))


@settings(max_examples=60, deadline=None)
@given(prob=problems())
def test_packed_part_a_matches_dense(prob):
    """Packed part A (one variable-length call, one signed scatter merge, one packed backward): outputs, LSE and
    gradients as the dense reference, on the same problems (masked parts, i.e. padding holes, run per part)."""
    _assert_matches_dense(prob, varlen_fn=CPU_VARLEN)


def test_packed_merge_handles_subtracted_parts_and_chunks():
    """Top-2 and top-3 (subtracted intersections) with the scatter merge cut into tiny row chunks."""
    gen = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(1, 4, 50, 8, generator=gen), *(torch.randn(1, 2, 50, 8, generator=gen) for _ in "kv")
    for top_k in (2, 3):
        memb = random_membership(1, 50, 4, top_k, gen=gen)
        p = plan_mod.Problem(q, k, v, memb, None, 0, 0.3, None)
        plans = plan_mod.plan_groups(memb, None, "ie")
        assert any(x.sign < 0 for x in plans)
        o, lse = packed_mod.forward(p, packed_mod.pack(plans, 50), CPU_VARLEN, rows_per_merge=7)
        ref_o, ref_l = dense_focus_attention(q, k, v, memb, 0, scale=0.3, return_lse=True)
        assert (o - ref_o).abs().max() <= 1e-5 and (lse - ref_l).abs().max() <= 1e-5


@pytest.mark.parametrize("block", [3, 4])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prob=problems())
def test_band_block_views_match_dense(monkeypatch, block, prob):
    """Tiny band blocks, one per chunk: the fused path's strided block views (batch 1) meet interior chunks, the
    zero-padded first and last chunks and a last block cut by T, on both memory layouts; batch 2 takes the copying
    path. Outputs, LSE and gradients as the dense reference."""
    monkeypatch.setattr(plan_mod, "BAND_BLOCK", block)
    monkeypatch.setattr(plan_mod, "BAND_FRACTION", 10_000)
    _assert_matches_dense(prob)


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_ie_parts_are_unmasked_and_count_each_pair_once(top_k):
    """Without padding every inclusion–exclusion part is plain causal attention (the fused fast path), and the
    signed multiplicities add up to exactly one per pair sharing a group, zero otherwise."""
    t, kk = 60, 5
    memb = random_membership(1, t, kk, top_k, seed=top_k)
    plans = plan_mod.plan_groups(memb, None, "ie")
    assert not any(x.masked for x in plans)
    assert len(plans) > (kk if top_k > 1 else 0) and all(x.sign == 1 for x in plans[:kk])
    count = torch.zeros(t, t, dtype=torch.long)
    for x in plans:
        count[x.idx[:, None], x.idx[None, :]] += x.sign
    shared = (memb[0].float() @ memb[0].float().t()) > 0
    assert torch.equal(count, shared.long())


def test_auto_falls_back_to_lowest_group_for_large_sets():
    memb = torch.zeros(1, 10, 6, dtype=torch.bool)
    memb[0, :, :plan_mod.IE_MAX_SET + 1] = True
    assert all(x.g is not None for x in plan_mod.plan_groups(memb, None, "auto"))
    assert all(x.g is None for x in plan_mod.plan_groups(memb[..., :plan_mod.IE_MAX_SET], None, "auto"))
    with pytest.raises(ValueError, match="mode"):
        plan_mod.plan_groups(memb, None, "fast")


def test_left_padding_stays_unmasked():
    """Leading padded tokens of a part see only padded keys there: they are dropped, not masked."""
    memb = random_membership(1, 40, 3, 2, seed=4)
    kpm = torch.ones(1, 40, dtype=torch.bool)
    kpm[0, :11] = False
    plans = plan_mod.plan_groups(memb, kpm, "ie")
    assert plans and not any(x.masked for x in plans) and all(bool(kpm[0, x.idx].all()) for x in plans)


@pytest.mark.parametrize("token_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_causal_tiles_match_dense(monkeypatch, token_major, dtype):
    """Tiny tiles and merge slices: every part is cut into query tiles against a causal square and earlier key
    blocks (forward) or rectangle + causal-square pairs (backward), and merged into the output a few rows at a
    time; on both memory layouts, and in bf16 (whose tile outputs are merged out of place)."""
    monkeypatch.setattr(driver_mod, "MERGE_ROWS", 3)
    monkeypatch.setattr(driver_mod, "MERGE_FRACTION", 10_000)
    monkeypatch.setattr(plan_mod, "MIN_TILE", 5)
    monkeypatch.setattr(plan_mod, "TILE_FRACTION", 1000)
    gen = torch.Generator().manual_seed(7)
    if token_major:
        q, k, v = (torch.randn(2, 70, h, 8, generator=gen).transpose(1, 2) for h in (4, 2, 2))
    else:
        q, k, v = torch.randn(2, 4, 70, 8, generator=gen), *(torch.randn(2, 2, 70, 8, generator=gen) for _ in "kv")
    tol = 1e-5
    if dtype != torch.float32:  # the reference in float32 on the same rounded inputs
        q, k, v = (x.to(dtype) for x in (q, k, v))
        tol = 2e-2
    for top_k in (1, 2, 3):
        memb = random_membership(2, 70, 4, top_k, gen=gen)
        ref = _grads(lambda a, b, c: dense_focus_attention(a.float(), b.float(), c.float(), memb, 3,
                                                           return_lse=True), q, k, v)
        got = _grads(lambda a, b, c: decomposed_focus_attention(a, b, c, memb, 3, return_lse=True), q, k, v)
        for r, g in zip(ref, got):
            assert (r.float() - g.float()).abs().max() <= tol * max(1.0, float(r.abs().max()))


@pytest.mark.parametrize("top_k", [1, 2])
@pytest.mark.parametrize("softcap", [None, 5.0])
def test_token_major_inputs_match_contiguous_ones(top_k, softcap):
    """Rows are gathered whole from token-major q/k/v (the HF layout) and the accumulators are token-major: the
    same numbers as contiguous inputs, on the fused path and on the generic one (softcap)."""
    gen = torch.Generator().manual_seed(5)
    t, hq, hkv, d = 40, 4, 2, 8
    q, k, v = (torch.randn(1, t, h, d, generator=gen).transpose(1, 2) for h in (hq, hkv, hkv))
    memb = random_membership(1, t, 4, top_k, gen=gen)
    fn = lambda a, b, c: decomposed_focus_attention(a, b, c, memb, 6, softcap=softcap, return_lse=True)  # noqa: E731
    major = _grads(fn, q, k, v)
    contig = _grads(fn, q.contiguous(), k.contiguous(), v.contiguous())
    for a, b in zip(major, contig):
        assert torch.allclose(a, b, atol=1e-6, equal_nan=True)
    ref = _grads(lambda a, b, c: dense_focus_attention(a, b, c, memb, 6, softcap=softcap, return_lse=True), q, k, v)
    assert (major[0] - ref[0]).abs().max() <= 1e-5


def test_signed_merge_recovers_union_from_overlapping_parts():
    """Parts {A ∪ C}, {B ∪ C} minus {C} = A ∪ B ∪ C, with all three parts' scores far apart in scale."""
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 1, 3, 4, generator=gen), torch.randn(1, 1, 9, 4, generator=gen) * 3, \
        torch.randn(1, 1, 9, 4, generator=gen)
    sets = {"ac": [0, 1, 2, 6, 7, 8], "bc": [3, 4, 5, 6, 7, 8], "c": [6, 7, 8]}
    parts = {}
    for name, keys in sets.items():
        mask = torch.zeros(3, 9, dtype=torch.bool)
        mask[:, keys] = True
        parts[name] = masked_attention(q, k, v, mask, return_lse=True)
    o, lse = parts["ac"][0].clone(), parts["ac"][1].clone()
    merge_signed_(o, lse, *parts["bc"], 1)
    merge_signed_(o, lse, *parts["c"], -1)
    ref_o, ref_l = masked_attention(q, k, v, torch.ones(3, 9, dtype=torch.bool), return_lse=True)
    assert (o - ref_o).abs().max() <= 1e-5 and (lse - ref_l).abs().max() <= 1e-5
    # a part that cancels the accumulator exactly leaves an empty row, not NaN
    o2, l2 = parts["c"][0].clone(), parts["c"][1].clone()
    merge_signed_(o2, l2, *parts["c"], -1)
    assert torch.isneginf(l2).all() and torch.equal(o2, torch.zeros_like(o2))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("sink", [0, 1, 2])
def test_rows_without_keys_give_no_gradient_and_spoil_none(seed, sink):
    """Queries with no allowed key (left padding, padded holes) sit in the same parts as real queries: their
    gradient is 0, and the real queries' gradients to the shared keys are the reference's (no NaN wiped to 0)."""
    from focusattn.kernels.api import focus_attention

    gen = torch.Generator().manual_seed(seed)
    t, hq, hkv, d = 14, 2, 1, 4
    q, k, v = torch.randn(1, hq, t, d, generator=gen), *(torch.randn(1, hkv, t, d, generator=gen) for _ in "kv")
    kpm = torch.ones(1, t, dtype=torch.bool)
    kpm[:, :4] = False  # left padding: rows 0-3 see no key
    kpm &= torch.rand(1, t, generator=gen) > 0.3  # and holes
    memb = random_membership(1, t, 3, 1 + seed % 2, gen=gen)
    go = torch.randn(q.shape, generator=gen)

    def grads(backend):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = focus_attention(*leaves, memb, 2, sink=sink, key_padding_mask=kpm, backend=backend)
        return torch.autograd.grad((out * go).sum(), leaves)

    for name, g, r in zip("qkv", grads("decomposed"), grads("dense")):
        assert not g.isnan().any() and (g - r).abs().max() <= 1e-5, name


def test_the_cuda_probe_takes_its_reference_gradients_also_under_no_grad(monkeypatch):
    """The memory-efficient engine's probe runs once, on the first call, which in a model's inference is under
    ``torch.no_grad()``: its reference needs autograd there too (on the H200 it refused the engine with "element 0 of
    tensors does not require grad" when first asked by a model, and the decomposed kernel fell back to its generic
    engine)."""
    from focusattn.kernels.decomposed import fused

    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fused, "_probe_error", lambda *a: seen.append(torch.is_grad_enabled()) or 0.0)
    with torch.no_grad():
        assert fused.cuda_fused_status.__wrapped__() == (True, "ok")
    assert seen and all(seen)
