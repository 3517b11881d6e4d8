"""The CUDA paths of the decomposed kernel against the dense reference (skipped without a GPU; run on a GPU machine
with ``scripts/gpu_check.sh``): part A packed into one variable-length call (the CUDA default), the
memory-efficient engine part by part, and the generic engine, in float32 and fp16/bf16 (outputs, LSE, gradients),
and on the property-test problems of the CPU suite."""
import pytest
import torch
from hypothesis import HealthCheck, given, settings

from focusattn.kernels.api import focus_attention
from focusattn.kernels.backends import cuda_fused_available, flash_attn_varlen
from focusattn.kernels.decomposed import decomposed_focus_attention
from focusattn.kernels.decomposed import driver as driver_mod
from focusattn.kernels.decomposed import plan as plan_mod
from focusattn.kernels.decomposed.fused import (_flash_probe_error, cuda_flash_varlen_status, cuda_fused_status,
                                                cuda_varlen_bwd, cuda_varlen_fwd, varlen_probe_error)
from focusattn.kernels.reference import dense_focus_attention
from tests.conftest import random_membership
from tests.kernels.test_decomposed import problems

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
DEV = torch.device("cuda")
# engine -> how the test selects it: (varlen_fn, force the generic engine)
ENGINES = {"packed": ("auto", False), "packed-mem-efficient": (driver_mod.CUDA_VARLEN, False),
           "mem-efficient": (None, False), "generic": (None, True)}


@pytest.fixture
def engine(request, monkeypatch):
    varlen, generic = ENGINES[request.param]
    if generic:
        monkeypatch.setattr(plan_mod.Problem, "engine", property(lambda self: "generic"))
    return varlen


def _problem(dtype, t=300, top_k=2, seed=0, token_major=False):
    gen = torch.Generator().manual_seed(seed)
    if token_major:
        q, k, v = (torch.randn(2, t, h, 64, generator=gen).transpose(1, 2) for h in (6, 2, 2))
    else:
        q, k, v = torch.randn(2, 6, t, 64, generator=gen), *(torch.randn(2, 2, t, 64, generator=gen) for _ in "kv")
    memb = random_membership(2, t, 5, top_k, gen=gen)
    kpm = torch.ones(2, t, dtype=torch.bool)
    kpm[1, :17] = False
    return (*(x.to(DEV, dtype) for x in (q, k, v)), memb.to(DEV), kpm.to(DEV))


def _run(fn, q, k, v, seed=1):
    """Output, LSE and q/k/v gradients of ``out·go + lse·gl`` (an LSE gradient too, as a merged caller has)."""
    gen = torch.Generator().manual_seed(seed)
    go = torch.randn(q.shape, generator=gen).to(q.device)
    gl = torch.randn(q.shape[:3], generator=gen).to(q.device)
    leaves = [x.detach().requires_grad_(True) for x in (q, k, v)]
    out, lse = fn(*leaves)
    loss = (out.float() * go).sum() + (torch.where(torch.isfinite(lse), lse, 0.0) * gl).sum()
    return (out.detach().float(), lse.detach(), *(g.float() for g in torch.autograd.grad(loss, leaves)))


def _check(ref, got, tol):
    assert torch.equal(torch.isneginf(got[1]), torch.isneginf(ref[1]))
    fin = torch.isfinite(ref[1])
    assert not fin.any() or (got[1][fin] - ref[1][fin]).abs().max() <= tol * 10
    for name, r, g in zip(("out", "dq", "dk", "dv"), (ref[0], *ref[2:]), (got[0], *got[2:])):
        err = float((r - g).abs().max())
        assert err <= tol * max(1.0, float(r.abs().max())), f"{name}: {err:.2e}"


WHOLE_GRAPH_INEXACT = pytest.mark.xfail(reason="the whole-prefill compile was not exact on an H200 with torch 2.11 "
                                                "(2026-12-04: this case failed, the flex-calls-only ones passed)",
                                         strict=False)


@pytest.mark.parametrize("top_k,t,whole_graph", [(2, 300, False), (1, 2000, False),
                                                 pytest.param(1, 300, True, marks=WHOLE_GRAPH_INEXACT)])
def test_sorted_flex_on_cuda_compiles_with_gradients_and_lse(top_k, t, whole_graph):
    """The sync-free group-sorted prefill (``backend="flex-sorted"``, kernels/flex_sorted.py) compiled on CUDA, the
    FlexAttention calls alone (the default) and the whole prefill in one graph: outputs, LSE and gradients as the
    dense reference, with padding and a sink; at 2000 tokens the block masks hold full blocks (no ``mask_mod``) and
    skipped ones. First in this file: gpu_check.sh's test timeout must not cut it. (On an H200, 2026-12-04: the
    flex-calls-only cases at 300 tokens passed, top-1 and top-2; few cases,
    since each compiles its own kernels, forward and backward, for tens of seconds.)"""
    import focusattn.kernels.flex_sorted as fs

    q, k, v, memb, kpm = _problem(torch.float32, t=t, top_k=top_k)
    ref = _run(lambda a, b, c: dense_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, sink=1,
                                                     return_lse=True), q, k, v)
    got = _run(lambda a, b, c: fs.sorted_flex_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, sink=1,
                                                              return_lse=True, top_k=top_k, whole_graph=whole_graph),
               q, k, v)
    assert not fs._WHOLE_GRAPH_FAILED, fs._WHOLE_GRAPH_FAILED  # no silent fallback
    _check(ref, got, 1e-4)


def test_memory_efficient_probe_passes():
    """The engine is only used after its probe: on a GPU machine it must pass, or every test below would be
    testing the generic fallback."""
    ok, reason = cuda_fused_status()
    assert ok, reason
    assert cuda_fused_available()
    print("flash_attn varlen:", flash_attn_varlen() is not None)


@pytest.mark.parametrize("engine", list(ENGINES), indirect=True)
@pytest.mark.parametrize("top_k", [1, 2, 3])
@pytest.mark.parametrize("token_major", [False, True])
def test_fp32_outputs_lse_and_gradients(engine, top_k, token_major):
    q, k, v, memb, kpm = _problem(torch.float32, top_k=top_k, token_major=token_major)
    ref = _run(lambda a, b, c: dense_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, return_lse=True),
               q, k, v)
    got = _run(lambda a, b, c: decomposed_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, return_lse=True,
                                                          varlen_fn=engine), q, k, v)
    _check(ref, got, 1e-4)  # TF32 may be on for the reference's matmuls


@pytest.mark.parametrize("engine", list(ENGINES), indirect=True)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_half_precision_outputs_and_gradients(engine, dtype, top_k):
    """Against the float32 reference on the same rounded inputs."""
    q, k, v, memb, kpm = _problem(dtype, top_k=top_k)
    ref = _run(lambda a, b, c: dense_focus_attention(a.float(), b.float(), c.float(), memb, 16, key_padding_mask=kpm,
                                                     return_lse=True), q, k, v)
    got = _run(lambda a, b, c: decomposed_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, return_lse=True,
                                                          varlen_fn=engine), q, k, v)
    assert got[0].dtype == torch.float32 and got[2].dtype == torch.float32  # (cast by _run)
    _check(ref, got, 3e-2)


@pytest.mark.parametrize("engine", ["mem-efficient"], indirect=True)
def test_causal_tiles_and_band_views_on_cuda(engine, monkeypatch):
    """Tiny tiles, merge slices and band blocks: the tiled forward, the in-place merges and the band's strided
    block views on the CUDA op (batch 1, both layouts)."""
    monkeypatch.setattr(driver_mod, "MERGE_ROWS", 3)
    monkeypatch.setattr(driver_mod, "MERGE_FRACTION", 10_000)
    monkeypatch.setattr(plan_mod, "MIN_TILE", 5)
    monkeypatch.setattr(plan_mod, "TILE_FRACTION", 1000)
    monkeypatch.setattr(plan_mod, "BAND_BLOCK", 4)
    monkeypatch.setattr(plan_mod, "BAND_FRACTION", 10_000)
    for token_major in (False, True):
        for top_k in (1, 2, 3):
            q, k, v, memb, _ = _problem(torch.float32, t=90, top_k=top_k, seed=top_k, token_major=token_major)
            q, k, v, memb = q[:1], k[:1], v[:1], memb[:1]
            ref = _run(lambda a, b, c: dense_focus_attention(a, b, c, memb, 7, return_lse=True), q, k, v)
            got = _run(lambda a, b, c: decomposed_focus_attention(a, b, c, memb, 7, return_lse=True, varlen_fn=engine),
                       q, k, v)
            _check(ref, got, 1e-4)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prob=problems())
def test_property_problems_on_cuda(prob):
    """The CPU suite's random problems (shapes, GQA, head sizes 4 and 8 that the op needs padded, windows,
    padding, variable set sizes) through ``focus_attention`` on CUDA, against the dense reference."""
    q, k, v, memb, window, kpm = (None if x is None else x.to(DEV) if torch.is_tensor(x) else x for x in prob)
    ref = _run(lambda a, b, c: dense_focus_attention(a, b, c, memb, window, key_padding_mask=kpm, return_lse=True),
               q, k, v)
    got = _run(lambda a, b, c: focus_attention(a, b, c, memb, window, key_padding_mask=kpm, return_lse=True,
                                               backend="decomposed"), q, k, v)
    _check(ref, got, 1e-4)


def test_auto_packs_part_a_on_cuda():
    """``varlen_fn="auto"`` on CUDA takes the packed path for unmasked parts, the per-part one with padding."""
    q, k, v, memb, kpm = _problem(torch.bfloat16)
    p = plan_mod.Problem(q, k, v, memb, None, 16, 0.125, None)
    assert p.engine == "cuda-mem-efficient"
    plans = plan_mod.plan_groups(memb, None)
    assert driver_mod._packed_varlen(p, plans, "auto") is driver_mod.CUDA_FLASH_VARLEN
    p32 = plan_mod.Problem(q.float(), k.float(), v.float(), memb, None, 16, 0.125, None)
    assert driver_mod._packed_varlen(p32, plans, "auto") is driver_mod.CUDA_VARLEN
    assert driver_mod._packed_varlen(p, plan_mod.plan_groups(memb, kpm & (torch.arange(300, device=DEV) % 7 > 0)),
                                     "auto") is None


def test_flash_varlen_probe_passes():
    """PyTorch's bundled FlashAttention in its variable-length form (forward and backward, GQA, an LSE gradient)
    against plain matmul/softmax: the packed bf16/fp16 default on CUDA."""
    assert _flash_probe_error(DEV) is None
    ok, reason = cuda_flash_varlen_status()
    assert ok, reason


def test_varlen_matches_per_sequence_reference():
    """:func:`cuda_varlen_fwd` / :func:`cuda_varlen_bwd` (all sequences in one call, GQA, an LSE gradient, a
    one-token sequence) against plain matmul/softmax per sequence, in float32."""
    assert varlen_probe_error(cuda_varlen_fwd, cuda_varlen_bwd, DEV, torch.float32, (5, 37, 1, 64), 1e-3,
                              heads=(6, 2)) is None


def test_flex_on_cuda_compiles_with_gradients_and_lse():
    """On CUDA ``backend="flex"`` compiles FlexAttention also when gradients and the LSE are needed (CPU cannot):
    outputs, LSE and gradients as the dense reference. (Added after the H200 session's last run: not yet run on a
    GPU.)"""
    q, k, v, memb, kpm = _problem(torch.float32, t=256, top_k=2)
    ref = _run(lambda a, b, c: dense_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, return_lse=True),
               q, k, v)
    got = _run(lambda a, b, c: focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, return_lse=True,
                                               backend="flex"), q, k, v)
    _check(ref, got, 1e-4)


@pytest.mark.parametrize("table", ["gather", "decode-masked"])
def test_one_token_lean_step_on_cuda(table):
    """``focus.attend.attend_one_token`` (the decode step of one sequence) on CUDA, both branches, against the dense
    reference on the CPU: the index's host record, the gathered rows and the masked call on the device."""
    import focusattn as fa
    from focusattn.focus.attend import attend_one_token
    from focusattn.kernels import dispatch
    from focusattn.kernels.group_index import GroupIndex

    if not cuda_fused_available():
        pytest.skip("no fused CUDA attention op")
    gen = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(1, 6, 1, 64, generator=gen), *(torch.randn(1, 2, 300, 64, generator=gen) for _ in "kv")
    member = random_membership(1, 300, 4, 1, seed=0)
    cfg = fa.FocusConfig(num_groups=4, window=16, top_k=1, sink_tokens=1)
    be = dispatch.BreakEvens() if table == "gather" else dispatch.BreakEvens(decode={1: 1 << 20})
    with torch.no_grad(), dispatch.using({"cuda": be}):
        got = attend_one_token(q.to(DEV), k.to(DEV), v.to(DEV), GroupIndex(member.to(DEV)), cfg, global_positions=[5])
    sinks = torch.zeros(1, 300, dtype=torch.bool)
    sinks[0, [0, 5]] = True
    want = dense_focus_attention(q, k, v, member, 16, sink=sinks)
    assert got is not None
    torch.testing.assert_close(got.cpu(), want, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_key_space_block_engine_on_cuda(dtype):
    """The key-space router's serving engine (decomposed.keyed: blocks of queries, one masked call each) on the GPU's
    fused op, against the float32 reference (no gradient: the engine's case)."""
    from unittest import mock

    from focusattn.kernels.decomposed import keyed
    from tests.kernels.test_roles import _case

    q, k, v, km, qm, kpm = (x.cuda() if x is not None else None
                            for x in _case(7, 2, 6, 2, 500, 500, 16, 1, padded=True, query_top_k=5, inside=False, d=64))
    want = dense_focus_attention(q, k, v, km, 32, sink=1, key_padding_mask=kpm, query_membership=qm,
                                 return_lse=True)
    with torch.no_grad(), mock.patch.object(keyed, "forward", wraps=keyed.forward) as spy:
        out, lse = focus_attention(q.to(dtype), k.to(dtype), v.to(dtype), km, 32, sink=1, key_padding_mask=kpm,
                                   query_membership=qm, backend="decomposed", return_lse=True)
    assert spy.called
    tol = 2e-5 if dtype == torch.float32 else 3e-2
    fin = torch.isfinite(want[1])
    torch.testing.assert_close(out.float(), want[0], atol=tol, rtol=tol)
    torch.testing.assert_close(lse.float()[fin], want[1][fin], atol=tol, rtol=tol)
