"""Wrappers of PyTorch's fused attention ops that return the per-row LSE (forward) and take a global ``O`` and
LSE (backward): the CPU flash op, and on CUDA the memory-efficient (cutlass) op, which unlike CUDA's flash op
also takes float32 and an additive bias. :func:`fused_fwd` / :func:`fused_bwd` pick by device.

``allowed``: bool mask broadcastable to ``[B, 1, M, N]``, or None for causal (top-left aligned) or, with
``causal=False``, every pair (the rectangle of a causal tile against the keys before it).
"""
from __future__ import annotations

import functools

import torch

from ..backends import logger
from ..lse import finite_or_zero, mark_empty
from ..reference import masked_attention
from . import plan

NEG_INF = float("-inf")
# The CUDA memory-efficient op's alignment: head dims in multiples of 8, bias rows padded to 16 elements, LSE rows
# padded to 32 (its kAlignLSE); custom_mask_type 1 = causal from the top left.
_CUDA_HEAD_ALIGN, _CUDA_BIAS_ALIGN, _CUDA_LSE_ALIGN, _CUDA_CAUSAL = 8, 16, 32, 1


def _float_mask(allowed, dtype):
    """The fused op wants an additive mask of q's dtype (it rejects bool)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), NEG_INF, dtype=dtype, device=allowed.device))


def fused_fwd(q, k, v, allowed, scale, causal=True, nonempty=False):
    """Fused forward ``(out, lse)``; LSE ``-inf`` for empty rows (the CPU op reports 0 there), their output 0.
    ``nonempty``: the caller knows every row allows a key, so the CPU path skips the pass that looks for empty ones."""
    if q.device.type == "cuda":
        return _cuda_fwd(q, k, v, allowed, scale, causal)
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if allowed is None:
        return op(q, k, v, 0.0, causal, scale=scale)
    o, lse = op(q, k, v, 0.0, False, attn_mask=_float_mask(allowed, q.dtype), scale=scale)
    return (o, lse) if nonempty else (o, mark_empty(lse, allowed.any(-1)))


def fused_bwd(do, q, k, v, o, lse, dlse, allowed, scale, causal=True):
    """Fused backward against the *global* ``o``/``lse``; ``dlse`` is injected through an extra value column."""
    if q.device.type == "cuda":
        return _cuda_bwd(do, q, k, v, o, lse, dlse, allowed, scale, causal)
    bop = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
    d = q.shape[-1]
    lse = finite_or_zero(lse).contiguous()
    if dlse is not None:
        v = torch.cat([v, torch.ones_like(v[..., :1])], -1)
        o = torch.cat([o, torch.zeros_like(o[..., :1])], -1)
        do = torch.cat([do, dlse.unsqueeze(-1).to(do.dtype)], -1)
        q = torch.cat([q, torch.zeros_like(q[..., :1])], -1)  # one head size for the op; zero columns leave the
        k = torch.cat([k, torch.zeros_like(k[..., :1])], -1)  # scores unchanged because the scale is explicit
    args = (do.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(), o.contiguous(), lse, 0.0)
    if allowed is None:
        gq, gk, gv = bop(*args, causal, scale=scale)
    else:
        gq, gk, gv = bop(*args, False, attn_mask=_float_mask(allowed, q.dtype), scale=scale)
    return gq[..., :d], gk[..., :d], gv[..., :d]


def flash_rows(n: int) -> int:
    """Row chunk for masked fused calls: the op cannot skip the masked upper triangle of a ``[rows, r1]`` chunk,
    so small chunks keep that waste to ``rows / n`` of the causal work; 256 rows still fill the cores."""
    return max(16, min(256, plan.CHUNK_ELEMS // max(1, n)))


# Query and key roles: a part's queries come in at least ROLES_CHUNKS row chunks (of at least ROLES_MIN_ROWS rows),
# each against the part's keys up to its last query: the staircase the op computes whole is then ~1/(2 x chunks) of
# the rectangle beyond the causal half (one 256-row chunk covers a top-1 group of 2K tokens whole: twice the work).
ROLES_CHUNKS = 8
ROLES_MIN_ROWS = 64


def roles_rows(n_queries: int, n_keys: int) -> int:
    """Row chunk of a roles part (:mod:`.plan`, ``kidx``): :func:`flash_rows`, cut to ``1/ROLES_CHUNKS`` of the
    part's queries (not below ``ROLES_MIN_ROWS``)."""
    return min(flash_rows(n_keys), max(ROLES_MIN_ROWS, -(-n_queries // ROLES_CHUNKS)))


# ------------------------------------------------------------------------------------------------------ CUDA
def _as4d(allowed):
    while allowed.dim() < 4:
        allowed = allowed[None]
    return allowed


def _cuda_bias(allowed, q):
    """Additive bias whose rows are padded to the op's alignment (a view of the first N columns, as SDPA's own
    wrapper passes it), expanded to exactly ``[B, Hq, M, N]`` (the backward checks every size)."""
    allowed = _as4d(allowed)
    n = allowed.shape[-1]
    width = _round_up(n, _CUDA_BIAS_ALIGN)
    bias = torch.full((*allowed.shape[:-1], width), NEG_INF, dtype=q.dtype, device=allowed.device)
    bias[..., :n].masked_fill_(allowed, 0.0)
    return bias[..., :n].expand(q.shape[0], q.shape[1], q.shape[2], n)


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def _bwd_operands(do, q, k, v, o, dlse, hq):
    """The backward's ``(do, q, k, v, o)`` with head dims padded to the op's alignment and, with ``dlse``, the LSE
    gradient injected: ``dP`` gains ``dlse_i`` through a ones column of ``v`` (and a zero column of ``O``: Δ
    unchanged). ``hq``: K/V expanded to that many heads (the memory-efficient op), or None (native GQA)."""
    width = _round_up(q.shape[-1] + (dlse is not None), _CUDA_HEAD_ALIGN)
    if dlse is not None:
        v, do = _pad_head(v, width, 1.0), _pad_head(do, width, dlse.to(do.dtype))
    if hq is not None:
        k, v = _heads(k, hq), _heads(v, hq)
    return tuple(_pad_head(x, width) for x in (do, q, k, v, o))


def _sum_heads(x, hkv, dim=1):
    """Gradients of K/V expanded by :func:`_heads` summed back to ``hkv`` heads."""
    return x if x.shape[dim] == hkv else x.unflatten(dim, (hkv, x.shape[dim] // hkv)).sum(dim + 1)


def _heads(x, hq):
    """GQA: the op wants one KV head per query head (copies ``hq / hkv`` times; a stride-0 view cannot be had)."""
    return x if x.shape[1] == hq else x.repeat_interleave(hq // x.shape[1], dim=1)


def _pad_head(x, width, fill=None):
    """Zero columns up to ``width`` (scores are unchanged: the scale is explicit); ``fill`` goes in the first one."""
    extra = width - x.shape[-1]
    if extra == 0:
        return x
    pad = x.new_zeros(*x.shape[:-1], extra)
    if fill is not None:
        pad[..., 0] = fill
    return torch.cat([x, pad], -1)


def _t(x):
    """``[B, H, M, D]`` -> the op's ``[B, M, H, D]`` (a view)."""
    return x.transpose(1, 2)


def _foldable(q, k, allowed, causal) -> bool:
    """GQA without copying K/V per query head: the G query heads of a KV head become G*M rows of one head. Exact
    when a row's allowed keys do not depend on its index (an explicit mask, repeated per head, or none); the causal
    mask type would shift with the row index. Measured on an H200: the expanded K/V windows were the band's peak
    memory (226 MB at 32K tokens) and 0.29 ms of copying."""
    return q.shape[1] != k.shape[1] and (allowed is not None or not causal)


def _fold(x, hkv):
    """``[B, Hq, M, ...]`` -> ``[B, Hkv, G * M, ...]`` (query heads ``h * G .. h * G + G - 1`` share KV head h)."""
    return x.reshape(x.shape[0], hkv, -1, *x.shape[3:])


def _unfold(x, hq):
    return x.reshape(x.shape[0], hq, -1, *x.shape[3:])


def _fold_mask(allowed, b, g):
    """Bool ``[B, 1, G * M, N]``: the mask's rows once per query head of a group."""
    a = _as4d(allowed)
    m, n = a.shape[-2:]
    return a.expand(b, 1, m, n).unsqueeze(2).expand(b, 1, g, m, n).reshape(b, 1, g * m, n)


def _cuda_fwd(q, k, v, allowed, scale, causal):
    if _foldable(q, k, allowed, causal):
        hq, hkv = q.shape[1], k.shape[1]
        fa = None if allowed is None else _fold_mask(allowed, q.shape[0], hq // hkv)
        out, lse = _cuda_fwd(_fold(q, hkv), k, v, fa, scale, causal)
        return _unfold(out, hq), _unfold(lse, hq)
    d, hq = q.shape[-1], q.shape[1]
    width = _round_up(d, _CUDA_HEAD_ALIGN)
    q, k, v = (_pad_head(x, width) for x in (q, _heads(k, hq), _heads(v, hq)))
    m, n = q.shape[2], k.shape[2]
    bias = None if allowed is None else _cuda_bias(allowed, q)
    mask_type = _CUDA_CAUSAL if allowed is None and causal else 0
    out, lse = torch.ops.aten._efficient_attention_forward(
        _t(q), _t(k), _t(v), bias, None, None, m, n, 0.0, mask_type, True, scale=scale)[:2]
    out, lse = _t(out)[..., :d], lse[..., :m]
    if allowed is not None:
        has = _as4d(allowed).any(-1)  # [B, 1, M]
        out = out.masked_fill(~has[..., None], 0.0)
        lse = mark_empty(lse, has)
    return out, lse


def _cuda_bwd(do, q, k, v, o, lse, dlse, allowed, scale, causal):
    if _foldable(q, k, allowed, causal):
        hq, hkv = q.shape[1], k.shape[1]
        fa = None if allowed is None else _fold_mask(allowed, q.shape[0], hq // hkv)
        gq, gk, gv = _cuda_bwd(_fold(do, hkv), _fold(q, hkv), k, v, _fold(o, hkv), _fold(lse, hkv),
                               None if dlse is None else _fold(dlse, hkv), fa, scale, causal)
        return _unfold(gq, hq), gk, gv
    d, hq, hkv = q.shape[-1], q.shape[1], k.shape[1]
    do, q, k, v, o = _bwd_operands(do, q, k, v, o, dlse, hq)
    m, n = q.shape[2], k.shape[2]
    # LSE rows padded to the op's block with +inf, as its forward writes them (P = 0 for the padding rows)
    lse_p = torch.full((q.shape[0], hq, _round_up(m, _CUDA_LSE_ALIGN)), float("inf"),
                       dtype=torch.float32, device=q.device)
    lse_p[..., :m] = finite_or_zero(lse)
    bias = None if allowed is None else _cuda_bias(allowed, q)
    mask_type = _CUDA_CAUSAL if allowed is None and causal else 0
    seed = offset = torch.empty((), dtype=torch.long)  # read only with dropout
    # the op reads O with an implied [B, M, H, D] row stride: O must be contiguous in that layout
    gq, gk, gv = torch.ops.aten._efficient_attention_backward(
        _t(do), _t(q), _t(k), _t(v), bias, _t(o).contiguous(), None, None, m, n, lse_p, 0.0, seed, offset,
        mask_type, False, scale=scale)[:3]
    gq, gk, gv = (_t(x)[..., :d] for x in (gq, gk, gv))
    return gq, _sum_heads(gk, hkv), _sum_heads(gv, hkv)


@functools.cache
def cuda_fused_status() -> tuple[bool, str]:
    """Whether the CUDA memory-efficient op runs and agrees with plain matmul/softmax on a tiny problem (forward
    and backward, causal, masked, GQA, an LSE gradient and an empty row): ``(ok, reason)``. Probed once; when it
    fails the decomposed kernel uses its generic engine on CUDA and says why."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if not hasattr(torch.ops.aten, "_efficient_attention_backward"):
        return _refuse(f"torch {torch.__version__} has no aten._efficient_attention_backward")
    try:
        gen = torch.Generator().manual_seed(0)
        dev = torch.device("cuda")
        q, k, v = (torch.randn(1, h, 40, 12, generator=gen, dtype=torch.float64) for h in (4, 2, 2))
        allowed = torch.rand(40, 40, generator=gen) > 0.5
        allowed[3] = False
        for mask in (None, allowed):
            for causal in (True, False):
                with torch.enable_grad():  # the reference's gradients, also when first asked under no_grad
                    err = _probe_error(q, k, v, mask, causal, dev, gen)  # (a model's inference; seen on an H200)
                if not err < 1e-3:
                    return _refuse(f"mismatch {err:.2e} (mask={mask is not None}, causal={causal})")
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use this op
        return _refuse(f"{type(exc).__name__}: {exc}")
    return True, "ok"


def _refuse(reason: str) -> tuple[bool, str]:
    logger.warning("CUDA memory-efficient attention unusable (%s); the decomposed kernel uses its generic engine "
                   "on CUDA", reason)
    return False, reason


def _probe_error(q, k, v, allowed, causal, dev, gen) -> float:
    """Largest error of :func:`fused_fwd` / :func:`fused_bwd` on ``dev`` against the dense reference (autograd in
    float64), fed the reference's O and LSE as the backward's global ones."""
    scale = 0.3
    keep = allowed if allowed is not None else torch.ones(40, 40, dtype=torch.bool)
    if allowed is None and causal:
        keep = keep.tril()
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o, lse = masked_attention(*leaves, keep, scale=scale, return_lse=True)
    do, dl = torch.randn(o.shape, generator=gen, dtype=torch.float64), torch.randn(lse.shape, generator=gen,
                                                                                   dtype=torch.float64)
    dl = dl.masked_fill(torch.isneginf(lse), 0.0)
    ref = (o.detach(), lse.detach(),
           *torch.autograd.grad((o * do).sum() + (finite_or_zero(lse) * dl).sum(), leaves))
    c = [x.to(dev, torch.float32) for x in (q, k, v, ref[0], ref[1], do, dl)]
    a = None if allowed is None else allowed.to(dev)
    got = (*fused_fwd(c[0], c[1], c[2], a, scale, causal),
           *fused_bwd(c[5], c[0], c[1], c[2], c[3], c[4], c[6], a, scale, causal))
    errs = []
    for r, g in zip(ref, got):
        r, g = r.to(g.device, torch.float64), g.double()
        same_inf = torch.isinf(r) & (r == g)
        errs.append(float(torch.where(same_inf, 0.0, (r - g).abs()).max()))
    return max(errs)


def _seq_positions(cu, n):
    """For packed rows ``0..n-1``: the sequence of each row and its position inside it."""
    lens = cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(len(lens), device=cu.device), lens.long(), output_size=n)
    return seq, torch.arange(n, device=cu.device) - cu[:-1].long()[seq]


def cuda_varlen_fwd(q, k, v, cu, max_len, scale):
    """Every sequence of ``cu`` in one causal call of the memory-efficient op (its variable-length form):
    ``q`` ``[n, Hq, D]``, ``k``/``v`` ``[n, Hkv, D]`` -> ``(out [n, Hq, D], lse [n, Hq] float32)``."""
    d, hq, n = q.shape[-1], q.shape[1], q.shape[0]
    width = _round_up(d, _CUDA_HEAD_ALIGN)
    q, k, v = (_pad_head(x, width) for x in (q, _heads(k, hq), _heads(v, hq)))
    out, lse = torch.ops.aten._efficient_attention_forward(
        q[None], k[None], v[None], None, cu, cu, max_len, max_len, 0.0, _CUDA_CAUSAL, True, scale=scale)[:2]
    seq, pos = _seq_positions(cu, n)
    return out[0, ..., :d], lse[seq, :, pos]  # lse [n_seq, Hq, >= max_len] -> [n, Hq]


def cuda_varlen_bwd(do, q, k, v, o, lse, dlse, cu, max_len, scale):
    """Backward of :func:`cuda_varlen_fwd` against the global ``o``/``lse`` of each row (``[n, Hq]``, +inf for
    rows without keys), ``dlse`` injected through an extra value column as in :func:`_cuda_bwd`."""
    d, hq, hkv, n = q.shape[-1], q.shape[1], k.shape[1], q.shape[0]
    do, q, k, v, o = _bwd_operands(do, q, k, v, o, dlse, hq)
    seq, pos = _seq_positions(cu, n)
    lse_p = torch.full((len(cu) - 1, hq, _round_up(max_len, _CUDA_LSE_ALIGN)), float("inf"),
                       dtype=torch.float32, device=q.device)
    lse_p[seq, :, pos] = finite_or_zero(lse.float())
    seed = offset = torch.empty((), dtype=torch.long)  # read only with dropout
    gq, gk, gv = torch.ops.aten._efficient_attention_backward(
        do[None], q[None], k[None], v[None], None, o[None].contiguous(), cu, cu, max_len, max_len, lse_p, 0.0, seed,
        offset, _CUDA_CAUSAL, False, scale=scale)[:3]
    gq, gk, gv = (x[0, ..., :d] for x in (gq, gk, gv))
    return gq, _sum_heads(gk, hkv), _sum_heads(gv, hkv)


def flash_attn_forward(fn):
    """flash-attn's ``flash_attn_varlen_func`` as a packed forward (``fwd`` of :class:`.packed.Varlen`)."""
    def fwd(q, k, v, cu, max_len, scale):
        res = fn(q, k, v, cu, cu, max_len, max_len, dropout_p=0.0, softmax_scale=scale, causal=True,
                 return_attn_probs=True)
        out, lse = res[0], res[1]
        if lse.dim() == 2:  # flash-attn >= 2.4: [Hq, n]; older: [n_seq, Hq, max_len] (padded)
            return out, lse.t().float()
        seq, pos = _seq_positions(cu, q.shape[0])
        return out, lse[seq, :, pos].float()
    return fwd


def cuda_flash_varlen_fwd(q, k, v, cu, max_len, scale):
    """Like :func:`cuda_varlen_fwd` with PyTorch's bundled FlashAttention-2 (fp16/bf16; GQA without copying K/V,
    LSE ``[Hq, n]`` unpadded)."""
    d = q.shape[-1]
    width = _round_up(d, _CUDA_HEAD_ALIGN)
    q, k, v = (_pad_head(x, width) for x in (q, k, v))
    out, lse = torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, max_len, max_len, 0.0, True, False,
                                                       scale=scale)[:2]
    if lse.dim() == 3:  # older layout [n_seq, Hq, max_len]
        seq, pos = _seq_positions(cu, q.shape[0])
        return out[..., :d], lse[seq, :, pos]
    return out[..., :d], lse.t()


def cuda_flash_varlen_bwd(do, q, k, v, o, lse, dlse, cu, max_len, scale):
    """Backward of :func:`cuda_flash_varlen_fwd` against the global ``o``/``lse`` of each row (as
    :func:`cuda_varlen_bwd`)."""
    d = q.shape[-1]
    do, q, k, v, o = _bwd_operands(do, q, k, v, o, dlse, None)
    rng = torch.empty(2, dtype=torch.int64, device=q.device)  # read only with dropout
    gq, gk, gv = torch.ops.aten._flash_attention_backward(
        do, q, k, v, o, finite_or_zero(lse.float()).t().contiguous(), cu, cu, max_len, max_len, 0.0, True, rng,
        torch.empty((), dtype=torch.int64, device=q.device), scale=scale)[:3]
    return gq[..., :d], gk[..., :d], gv[..., :d]


@functools.cache
def cuda_flash_varlen_status() -> tuple[bool, str]:
    """Whether PyTorch's bundled FlashAttention runs in its variable-length form and agrees with plain
    matmul/softmax on a tiny bf16 problem (GQA, an LSE gradient): ``(ok, reason)``, probed once."""
    if not torch.cuda.is_available():
        return False, "no CUDA device"
    if not hasattr(torch.ops.aten, "_flash_attention_backward"):
        return False, f"torch {torch.__version__} has no aten._flash_attention_backward"
    try:
        with torch.enable_grad():  # first asked for inside an autograd.Function's forward, where grad is off
            err = _flash_probe_error(torch.device("cuda"))
        if err:
            return _refuse_flash(err)
    except Exception as exc:  # noqa: BLE001 - any failure means: do not use this op
        return _refuse_flash(f"{type(exc).__name__}: {exc}")
    return True, "ok"


def _flash_probe_error(dev) -> str | None:
    return varlen_probe_error(cuda_flash_varlen_fwd, cuda_flash_varlen_bwd, dev, torch.bfloat16, (3, 40, 17), 3e-2)


def varlen_probe_error(fwd, bwd, dev, dtype, lens, tol, heads=(4, 2)) -> str | None:
    """A packed variable-length kernel pair (``fwd``/``bwd`` of :class:`.packed.Varlen`) against plain
    matmul/softmax per sequence in float64 (GQA, an LSE gradient): the first output off by more than
    ``tol * max(1, |ref|)``, or None."""
    gen = torch.Generator().manual_seed(1)
    hq, hkv = heads
    n = sum(lens)
    q, k, v, do = (torch.randn(n, h, 64, generator=gen, dtype=torch.float64) for h in (hq, hkv, hkv, hq))
    dl = torch.randn(n, hq, generator=gen, dtype=torch.float64)
    cu = torch.tensor([0, *lens]).cumsum(0).to(torch.int32)
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
    outs, lses = [], []
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        o_s, l_s = masked_attention(*(x[a:b].transpose(0, 1)[None] for x in leaves),
                                    torch.ones(b - a, b - a, dtype=torch.bool).tril(), scale=0.125, return_lse=True)
        outs.append(o_s[0].transpose(0, 1))
        lses.append(l_s[0].t())
    ref_o, ref_l = torch.cat(outs), torch.cat(lses)
    ref = (ref_o, ref_l, *torch.autograd.grad((ref_o * do).sum() + (ref_l * dl).sum(), leaves))
    c = [x.to(dev, dtype) for x in (q, k, v, do)]
    cu = cu.to(dev)
    o, lse = fwd(c[0], c[1], c[2], cu, max(lens), 0.125)
    grads = bwd(c[3], c[0], c[1], c[2], o, lse, dl.to(dev, torch.float32), cu, max(lens), 0.125)
    for name, r, g in zip(("out", "lse", "dq", "dk", "dv"), ref, (o, lse, *grads)):
        r = r.detach()
        err = float((g.double().cpu() - r).abs().max())
        if not err <= tol * max(1.0, float(r.abs().max())):
            return f"{name} mismatch {err:.2e}"
    return None


def _refuse_flash(reason: str) -> tuple[bool, str]:
    logger.warning("PyTorch's FlashAttention varlen op unusable (%s); packing uses the memory-efficient op", reason)
    return False, reason
