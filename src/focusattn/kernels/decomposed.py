"""Exact sub-quadratic Focus attention for prefill (``Tq == Tk``): sort by group, attend inside groups, add the window.

The allowed set ``M = {j <= i and (i - j <= w or S_i ∩ S_j != ∅)}`` (``S_i`` = token i's groups) is split into two
*disjoint* parts whose partial softmaxes are merged exactly by log-sum-exp (:mod:`.lse`):

* **A, same-group**, attributed to the *lowest shared group*: in group g's sub-problem, key j is allowed for query i
  iff ``j <= i``, both are in g, and they share no group ``< g``. With top-1 nobody has a lower group, so every
  sub-problem is plain causal attention over the group's tokens in position order (a stable sort by group keeps
  causal order), which is what the fused kernel does best. With top-k > 1 the rule "share no lower group" is
  ``(m_i[:g] · m_j[:g]) == 0``: it counts a pair sharing two groups exactly once, and group 0 never needs a mask.
* **B, cross-group local**: ``1 <= i - j <= w`` and ``S_i ∩ S_j = ∅`` (distance 0 always shares a group: A's).

Cost: A is ``sum_g n_g^2 / 2`` pairs (``k^2/K`` of causal attention for balanced groups), B is ``T (w + C)`` pairs
(query blocks of ``C`` rows see ``C + w`` keys). No ``[T, T]`` tensor exists: group sub-problems are handed whole to
the fused kernel (which tiles internally) or cut into row chunks with ``[rows, keys]`` masks of bounded size.

Engines for part A: ``cpu-flash`` (``aten._scaled_dot_product_flash_attention_for_cpu``: fused, returns LSE, one
call per group, so groups are packed with no padding waste — the CPU analogue of varlen), ``varlen`` (flash-attn on
CUDA, forward only: all groups in one packed call), and ``generic`` (chunked matmul/softmax in float32; used for
softcap, which the fused CPU op lacks, and for dtypes/devices without a fused op).

Gradients: the fused op's LSE carries no autograd graph, so the whole computation is one ``autograd.Function``.
Its backward uses the standard ring-attention identity: given the *merged* output ``O`` and LSE ``L``, each part's
contribution to ``dS`` is ``P_ij (dP_ij - Δ_i)`` with ``P_ij = exp(s_ij - L_i)`` and ``Δ_i = dO_i · O_i``, so every
part can be back-propagated independently with the fused backward op (fed ``O`` and ``L``). A gradient flowing into
the returned LSE adds ``g_i P_ij`` to ``dS``; for the fused op this is injected by appending a ones-column to ``v``
(``dP`` gains ``g_i``) and a zero-column to ``O`` (``Δ`` unchanged).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .backends import CPU_FLASH_DTYPES, cpu_flash_available, flash_attn_varlen
from .lse import finite_or_zero, acc, acc_dtype, mark_empty, merge_pair

NEG_INF = float("-inf")
# Score elements per chunk in the chunked paths (~16 MiB of fp32): bounds memory, big enough to amortise overhead.
CHUNK_ELEMS = 1 << 22
# Query block for the cross-group window part: each block sees BAND_BLOCK + w keys, so waste is BAND_BLOCK / w.
BAND_BLOCK = 64


# ----------------------------------------------------------------------------------------------------------------
# Generic chunk kernels (any device/dtype; float32 math, float64 for float64); q [..., H, G, M, D], k/v [..., H, N, D],
# mask bool broadcastable to [..., H, G, M, N]; G = query heads per KV head, so GQA never copies K/V.
# ----------------------------------------------------------------------------------------------------------------
def _scores(q, k, scale, softcap):
    *lead, h, g, m, d = q.shape
    n = k.shape[-2]
    raw = torch.matmul(acc(q).reshape(*lead, h, g * m, d), acc(k).transpose(-1, -2)).view(*lead, h, g, m, n)
    raw = raw * scale
    t = torch.tanh(raw / softcap) if softcap is not None else None
    return (softcap * t if t is not None else raw), t


def block_attn_fwd(q, k, v, mask, scale, softcap):
    """Masked softmax attention on one chunk; returns float32 ``(out [..., H, G, M, D], lse [..., H, G, M])``."""
    *lead, h, g, m, d = q.shape
    s, _ = _scores(q, k, scale, softcap)
    s = s.masked_fill(~mask, NEG_INF)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - finite_or_zero(lse).unsqueeze(-1))
    out = torch.matmul(p.view(*lead, h, g * m, -1), acc(v)).view(*lead, h, g, m, d)
    return out, lse


def block_attn_bwd(q, k, v, mask, scale, softcap, do, o, lse, dlse):
    """Backward of one chunk given the *global* ``o``/``lse`` (see module docstring). Returns float32 dq, dk, dv."""
    *lead, h, g, m, d = q.shape
    n = k.shape[-2]
    s, t = _scores(q, k, scale, softcap)
    p = torch.exp(s.masked_fill(~mask, NEG_INF) - finite_or_zero(acc(lse)).unsqueeze(-1))
    do2 = acc(do).reshape(*lead, h, g * m, d)
    dp = torch.matmul(do2, acc(v).transpose(-1, -2)).view(*lead, h, g, m, n)
    delta = (acc(do) * acc(o)).sum(-1)
    if dlse is not None:
        delta = delta - acc(dlse)
    ds = p * (dp - delta.unsqueeze(-1))
    if t is not None:
        ds = ds * (1.0 - t * t)
    ds = (ds * scale).view(*lead, h, g * m, n)
    dq = torch.matmul(ds, acc(k)).view(*lead, h, g, m, d)
    dk = torch.matmul(ds.transpose(-1, -2), acc(q).reshape(*lead, h, g * m, d))
    dv = torch.matmul(p.view(*lead, h, g * m, n).transpose(-1, -2), do2)
    return dq, dk, dv


# ----------------------------------------------------------------------------------------------------------------
# Planning: which tokens form each group's sub-problem, and whether it needs an explicit mask.
# ----------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroupPlan:
    b: int
    g: int
    idx: torch.Tensor  # ascending absolute positions of the group's tokens
    masked: bool  # some pair must be dropped (shares a lower group, or padded key): needs a per-pair mask


def plan_groups(membership: torch.Tensor, key_padding_mask: torch.Tensor | None) -> list[GroupPlan]:
    """Stable sort by group: ``nonzero`` of the transposed membership lists (group, position) in group-major,
    position-ascending order, i.e. exactly the stably sorted copies, in O(T K)."""
    bsz, _, kk = membership.shape
    m = membership.long()
    has_lower = (m.cumsum(-1) - m) > 0  # [B, T, K]: token has some group < g
    plans = []
    for b in range(bsz):
        nz = membership[b].t().nonzero()
        gid, pos = nz[:, 0], nz[:, 1]
        counts = torch.bincount(gid, minlength=kk).tolist()
        flag = has_lower[b][pos, gid]
        if key_padding_mask is not None:
            flag = flag | ~key_padding_mask[b][pos]
        flags = [bool(f.any()) for f in torch.split(flag, counts)] if len(pos) else [False] * kk
        for g, (idx, f) in enumerate(zip(torch.split(pos, counts), flags)):
            if len(idx):
                plans.append(GroupPlan(b, g, idx, f))
    return plans


def _group_mask(plan: GroupPlan, membership, key_padding_mask, r0: int, r1: int) -> torch.Tensor:
    """Bool ``[r1 - r0, r1]`` mask for rows ``r0:r1`` of a group sub-problem against its keys ``0:r1``."""
    dev = plan.idx.device
    rows = torch.arange(r0, r1, device=dev)[:, None]
    allowed = torch.arange(r1, device=dev)[None, :] <= rows
    key_idx = plan.idx[:r1]
    if plan.g > 0:
        low = membership[plan.b, key_idx, : plan.g].float()
        allowed &= torch.matmul(low[r0:r1], low.t()) == 0
    if key_padding_mask is not None:
        allowed &= key_padding_mask[plan.b, key_idx][None, :]
    return allowed


def _row_chunk(n_keys: int, heads: int) -> int:
    return max(16, CHUNK_ELEMS // max(1, heads * n_keys))


def _gather(x: torch.Tensor, plan: GroupPlan) -> torch.Tensor:
    """``[1, H, n, D]`` rows of the group, contiguous (what the fused kernels want)."""
    return x[plan.b].index_select(1, plan.idx).unsqueeze(0)


# ----------------------------------------------------------------------------------------------------------------
# Fused CPU op wrappers. ``allowed``: bool mask broadcastable to [B, 1, M, N], or None for causal (top-left).
# ----------------------------------------------------------------------------------------------------------------
def _float_mask(allowed, dtype):
    """The fused op wants an additive mask of q's dtype (it rejects bool)."""
    zero = torch.zeros((), dtype=dtype, device=allowed.device)
    return torch.where(allowed, zero, torch.full((), NEG_INF, dtype=dtype, device=allowed.device))


def cpu_flash_fwd(q, k, v, allowed, scale):
    """Fused forward; LSE fixed to -inf for empty rows (the op reports 0 there)."""
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    if allowed is None:
        return op(q, k, v, 0.0, True, scale=scale)
    o, lse = op(q, k, v, 0.0, False, attn_mask=_float_mask(allowed, q.dtype), scale=scale)
    return o, mark_empty(lse, allowed.any(-1))


def cpu_flash_bwd(do, q, k, v, o, lse, dlse, allowed, scale):
    """Fused backward against the *global* ``o``/``lse``; ``dlse`` is injected through an extra value column."""
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
        gq, gk, gv = bop(*args, True, scale=scale)
    else:
        gq, gk, gv = bop(*args, False, attn_mask=_float_mask(allowed, q.dtype), scale=scale)
    return gq[..., :d], gk[..., :d], gv[..., :d]


def _flash_rows(n: int) -> int:
    """Row chunk for masked fused calls: the op cannot skip the masked upper triangle of a ``[rows, r1]`` chunk,
    so small chunks keep that waste to ``rows / n`` of the causal work; 256 rows still fill the cores."""
    return max(16, min(256, CHUNK_ELEMS // max(1, n)))


# ----------------------------------------------------------------------------------------------------------------
# Part A forward engines. Each returns (out [1, Hq, n, D], lse [1, Hq, n] float32, -inf for empty rows).
# ----------------------------------------------------------------------------------------------------------------
def _a_fwd_cpu_flash(plan, q, k, v, membership, kpm, scale):
    qg, kg, vg = _gather(q, plan), _gather(k, plan), _gather(v, plan)
    if not plan.masked:  # causal over the group; every row sees itself, so no empty rows
        return cpu_flash_fwd(qg, kg, vg, None, scale)
    n = len(plan.idx)
    outs, lses = [], []
    step = _flash_rows(n)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = _group_mask(plan, membership, kpm, r0, r1)
        o, lse = cpu_flash_fwd(qg[:, :, r0:r1], kg[:, :, :r1], vg[:, :, :r1], allowed, scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def _a_fwd_generic(plan, q, k, v, membership, kpm, scale, softcap):
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[-1]
    qg = _gather(q, plan).view(1, hkv, hq // hkv, -1, d)
    kg, vg = _gather(k, plan), _gather(v, plan)
    n = len(plan.idx)
    outs, lses = [], []
    step = _row_chunk(n, hq)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = _group_mask(plan, membership, kpm, r0, r1)
        o, lse = block_attn_fwd(qg[..., r0:r1, :], kg[:, :, :r1], vg[:, :, :r1], allowed, scale, softcap)
        outs.append(o.reshape(1, hq, r1 - r0, d))
        lses.append(lse.reshape(1, hq, r1 - r0))
    return torch.cat(outs, 2), torch.cat(lses, 2)


def _a_fwd_varlen(plans, q, k, v, scale, softcap, fn):
    """All (unmasked) group sub-problems in one packed flash-attn varlen call; returns a list aligned with plans."""
    qs = torch.cat([q[p.b].index_select(1, p.idx).transpose(0, 1) for p in plans])  # [total, Hq, D]
    ks = torch.cat([k[p.b].index_select(1, p.idx).transpose(0, 1) for p in plans])
    vs = torch.cat([v[p.b].index_select(1, p.idx).transpose(0, 1) for p in plans])
    lens = [len(p.idx) for p in plans]
    cu = torch.tensor([0] + lens, device=q.device).cumsum(0).to(torch.int32)
    extra = {"softcap": softcap} if softcap is not None else {}
    res = fn(qs, ks, vs, cu, cu, max(lens), max(lens), dropout_p=0.0, softmax_scale=scale, causal=True,
             return_attn_probs=True, **extra)
    out, lse = res[0], res[1]
    results, start = [], 0
    for i, n in enumerate(lens):
        o = out[start:start + n].transpose(0, 1).unsqueeze(0)
        # flash-attn >= 2.4 returns LSE [Hq, total]; older versions [nseq, Hq, max_len] (padded).
        ls = lse[:, start:start + n] if lse.dim() == 2 else lse[i, :, :n]
        results.append((o, ls.float().unsqueeze(0)))
        start += n
    return results


# ----------------------------------------------------------------------------------------------------------------
# Part A backward engines: accumulate float32 grads into dq/dk/dv [B, H, T, D] in place.
# ----------------------------------------------------------------------------------------------------------------
def _a_bwd_cpu_flash(plan, q, k, v, membership, kpm, scale, do, o, lse, dlse, dq, dk, dv):
    qg, kg, vg = _gather(q, plan), _gather(k, plan), _gather(v, plan)
    dog, og = _gather(do, plan), _gather(o, plan)
    lg = lse[plan.b].index_select(1, plan.idx).unsqueeze(0)
    dlg = None if dlse is None else dlse[plan.b].index_select(1, plan.idx).unsqueeze(0)
    if not plan.masked:
        gq, gk, gv = cpu_flash_bwd(dog, qg, kg, vg, og, lg, dlg, None, scale)
    else:
        n = len(plan.idx)
        gq = torch.zeros(qg.shape, device=q.device, dtype=acc_dtype(q.dtype))
        gk = torch.zeros(kg.shape, device=q.device, dtype=acc_dtype(q.dtype))
        gv = torch.zeros(vg.shape, device=q.device, dtype=acc_dtype(q.dtype))
        step = _flash_rows(n)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            rs = slice(r0, r1)
            allowed = _group_mask(plan, membership, kpm, r0, r1)
            a, b_, c = cpu_flash_bwd(dog[:, :, rs], qg[:, :, rs], kg[:, :, :r1], vg[:, :, :r1], og[:, :, rs],
                                     lg[:, :, rs], None if dlg is None else dlg[:, :, rs], allowed, scale)
            gq[:, :, rs] += a
            gk[:, :, :r1] += b_
            gv[:, :, :r1] += c
    dq[plan.b].index_add_(1, plan.idx, acc(gq[0]))
    dk[plan.b].index_add_(1, plan.idx, acc(gk[0]))
    dv[plan.b].index_add_(1, plan.idx, acc(gv[0]))


def _a_bwd_generic(plan, q, k, v, membership, kpm, scale, softcap, do, o, lse, dlse, dq, dk, dv):
    hq, hkv, d = q.shape[1], k.shape[1], q.shape[-1]
    g = hq // hkv
    qg = _gather(q, plan).view(1, hkv, g, -1, d)
    dog, og = _gather(do, plan).view(1, hkv, g, -1, d), _gather(o, plan).view(1, hkv, g, -1, d)
    lg = lse[plan.b].index_select(1, plan.idx).view(1, hkv, g, -1)
    dlg = None if dlse is None else dlse[plan.b].index_select(1, plan.idx).view(1, hkv, g, -1)
    kg, vg = _gather(k, plan), _gather(v, plan)
    n = len(plan.idx)
    gq = torch.zeros(1, hkv, g, n, d, device=q.device, dtype=acc_dtype(q.dtype))
    gk = torch.zeros(1, hkv, n, d, device=q.device, dtype=acc_dtype(q.dtype))
    gv = torch.zeros(1, hkv, n, d, device=q.device, dtype=acc_dtype(q.dtype))
    step = _row_chunk(n, hq)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = _group_mask(plan, membership, kpm, r0, r1)
        rs = slice(r0, r1)
        a, b_, c = block_attn_bwd(qg[..., rs, :], kg[:, :, :r1], vg[:, :, :r1], allowed, scale, softcap,
                                  dog[..., rs, :], og[..., rs, :], lg[..., rs], None if dlg is None else dlg[..., rs])
        gq[..., rs, :] += a
        gk[:, :, :r1] += b_
        gv[:, :, :r1] += c
    dq[plan.b].index_add_(1, plan.idx, gq.view(hq, n, d))
    dk[plan.b].index_add_(1, plan.idx, gk[0])
    dv[plan.b].index_add_(1, plan.idx, gv[0])


# ----------------------------------------------------------------------------------------------------------------
# Part B: cross-group pairs with 1 <= i - j <= w, in query blocks of BAND_BLOCK rows against BAND_BLOCK + w keys.
# Blocks are laid out as a batch [B * n_blocks, H, C or L, D] so the fused op (or the generic kernel) sees them as
# many small independent attention problems.
# ----------------------------------------------------------------------------------------------------------------
class _Band:
    """Index bookkeeping for the banded part, shared by forward and backward."""

    def __init__(self, t: int, window: int, membership, kpm):
        device = membership.device
        block = BAND_BLOCK
        self.t, self.w, self.c = t, window, block
        self.nb = -(-t // block)
        self.l = block + window
        nbr = torch.arange(self.nb, device=device)
        self.qpos_c = (nbr[:, None] * block + torch.arange(block, device=device)[None, :]).clamp(max=t - 1)
        self.kpos = nbr[:, None] * block - window + torch.arange(self.l, device=device)[None, :]  # [nb, L]
        self.kpos_c = self.kpos.clamp(0, t - 1)
        # Query c of a block sits at distance c + w - l from key l: the band pattern is the same for every block.
        dist = torch.arange(block, device=device)[:, None] + window - torch.arange(self.l, device=device)[None, :]
        self.base = (dist >= 1) & (dist <= window)  # [C, L]
        self.kvalid = self.kpos >= 0  # only the first ceil(w / C) blocks have keys before position 0
        if kpm is not None:
            self.kvalid = self.kvalid[None] & kpm[:, self.kpos_c]  # [B, nb, L]
        kk = membership.shape[-1]
        if kk <= 63:  # one int64 bitmask per token: "shares a group" is one AND, cheaper than a K-long dot
            weights = torch.ones((), dtype=torch.int64, device=device) << torch.arange(kk, device=device)
            self.bits = (membership.long() * weights).sum(-1)  # [B, T]
            self.mf = None
        else:
            self.bits, self.mf = None, membership.float()

    def mask(self, n0, n1):
        """Bool ``[B * (n1 - n0), C, L]``: in band, key in range and not padded, no shared group. Rows past T
        (padding of the last block) are left as they are: their outputs are discarded."""
        qc, kc = self.qpos_c[n0:n1], self.kpos_c[n0:n1]
        if self.bits is not None:
            bq, bk = self.bits[:, qc], self.bits[:, kc]  # [B, n, C], [B, n, L]
            ok = (bq[..., :, None] & bk[..., None, :]) == 0
        else:
            ok = torch.matmul(self.mf[:, qc], self.mf[:, kc].transpose(-1, -2)) == 0
        ok &= self.base
        kv = self.kvalid[..., n0:n1, :]
        if kv.dim() == 3:  # padding mask given: [B, n, L]
            ok &= kv[:, :, None, :]
        elif n0 * self.c < self.w:  # chunk contains blocks whose window starts before position 0
            ok &= kv[None, :, None, :]
        return ok.flatten(0, 1)

    def chunks(self, bsz, hq):
        step = max(1, CHUNK_ELEMS // max(1, bsz * hq * self.c * self.l))
        for n0 in range(0, self.nb, step):
            yield n0, min(self.nb, n0 + step)

    def q_blocks(self, x, n0, n1):
        """``[B, H, T, (D)]`` -> ``[B * n, H, C, (D)]`` for blocks ``n0:n1`` (zero rows past T)."""
        bsz, h = x.shape[:2]
        tail = x.shape[3:]
        x = x[:, :, n0 * self.c:n1 * self.c]
        short = (n1 - n0) * self.c - x.shape[2]
        if short:
            x = torch.nn.functional.pad(x, (0, 0) * len(tail) + (0, short))
        x = x.reshape(bsz, h, n1 - n0, self.c, *tail)
        return x.transpose(1, 2).reshape(bsz * (n1 - n0), h, self.c, *tail)

    def k_windows(self, x, n0, n1):
        """``[B, Hkv, T, D]`` -> ``[B * n, Hkv, L, D]`` (copies ``L/C`` times the keys of the chunk)."""
        bsz, h, _, d = x.shape
        return x[:, :, self.kpos_c[n0:n1]].transpose(1, 2).reshape(bsz * (n1 - n0), h, self.l, d)

    def unblock(self, x, bsz, n0, n1):
        """Inverse of :meth:`q_blocks` for one chunk: ``[B * n, H, C, (D)]`` -> ``[B, H, n * C, (D)]``."""
        h, tail = x.shape[1], x.shape[3:]
        return x.view(bsz, n1 - n0, h, self.c, *tail).transpose(1, 2).reshape(bsz, h, (n1 - n0) * self.c, *tail)


def _b_forward(q, k, v, membership, kpm, window, scale, softcap):
    bsz, hq, t, d = q.shape
    hkv = k.shape[1]
    band = _Band(t, window, membership, kpm)
    fused = _engine(q, softcap) == "cpu-flash"
    out = torch.zeros(bsz, hq, band.nb * band.c, d, device=q.device, dtype=acc_dtype(q.dtype))
    lse = torch.full((bsz, hq, band.nb * band.c), NEG_INF, device=q.device, dtype=acc_dtype(q.dtype))
    for n0, n1 in band.chunks(bsz, hq):
        allowed = band.mask(n0, n1)
        qb, kb, vb = band.q_blocks(q, n0, n1), band.k_windows(k, n0, n1), band.k_windows(v, n0, n1)
        if fused:
            o, l_ = cpu_flash_fwd(qb, kb, vb, allowed[:, None], scale)
        else:
            o, l_ = block_attn_fwd(qb.view(qb.shape[0], hkv, hq // hkv, band.c, d), kb, vb, allowed[:, None, None],
                                   scale, softcap)
            o, l_ = o.reshape(qb.shape), l_.reshape(qb.shape[:3])
        rows = slice(n0 * band.c, n1 * band.c)
        out[:, :, rows] = band.unblock(o, bsz, n0, n1)
        lse[:, :, rows] = band.unblock(l_, bsz, n0, n1)
    return out[:, :, :t], lse[:, :, :t]


def _b_backward(q, k, v, membership, kpm, window, scale, softcap, do, o, lse, dlse, dq, dk, dv):
    bsz, hq, t, d = q.shape
    hkv = k.shape[1]
    band = _Band(t, window, membership, kpm)
    fused = _engine(q, softcap) == "cpu-flash"
    dq_pad = torch.zeros(bsz, hq, band.nb * band.c, d, device=q.device, dtype=acc_dtype(q.dtype))
    for n0, n1 in band.chunks(bsz, hq):
        allowed = band.mask(n0, n1)
        qb, kb, vb = band.q_blocks(q, n0, n1), band.k_windows(k, n0, n1), band.k_windows(v, n0, n1)
        dob, ob, lb = band.q_blocks(do, n0, n1), band.q_blocks(o, n0, n1), band.q_blocks(lse, n0, n1)
        dlb = None if dlse is None else band.q_blocks(dlse, n0, n1)
        if fused:
            a, b_, c = cpu_flash_bwd(dob, qb, kb, vb, ob, lb, dlb, allowed[:, None], scale)
        else:
            g5 = lambda x: x.reshape(x.shape[0], hkv, hq // hkv, *x.shape[2:])  # noqa: E731
            a, b_, c = block_attn_bwd(g5(qb), kb, vb, allowed[:, None, None], scale, softcap, g5(dob), g5(ob),
                                      g5(lb), None if dlb is None else g5(dlb))
            a = a.reshape(qb.shape)
        dq_pad[:, :, n0 * band.c:n1 * band.c] += band.unblock(acc(a), bsz, n0, n1)
        kidx = band.kpos_c[n0:n1].flatten()  # out-of-range keys were masked, so they add exact zeros
        nn = n1 - n0
        dk.index_add_(2, kidx, acc(b_).view(bsz, nn, hkv, band.l, d).transpose(1, 2).reshape(bsz, hkv, -1, d))
        dv.index_add_(2, kidx, acc(c).view(bsz, nn, hkv, band.l, d).transpose(1, 2).reshape(bsz, hkv, -1, d))
    dq += dq_pad[:, :, :t]


# ----------------------------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------------------------
def _engine(q, softcap) -> str:
    if q.device.type == "cpu" and softcap is None and q.dtype in CPU_FLASH_DTYPES and cpu_flash_available():
        return "cpu-flash"
    return "generic"


def _forward(q, k, v, membership, kpm, window, scale, softcap, plans, varlen_fn=None):
    bsz, hq, t, d = q.shape
    o_acc = torch.zeros(bsz, hq, t, d, device=q.device, dtype=acc_dtype(q.dtype))
    l_acc = torch.full((bsz, hq, t), NEG_INF, device=q.device, dtype=acc_dtype(q.dtype))
    overlap = bool((membership.sum(-1) > 1).any())
    engine = _engine(q, softcap)

    results = {}
    if varlen_fn is not None:
        plain = [p for p in plans if not p.masked]
        if plain:
            results = dict(zip((id(p) for p in plain), _a_fwd_varlen(plain, q, k, v, scale, softcap, varlen_fn)))
    for p in plans:
        if id(p) in results:
            o_p, l_p = results[id(p)]
        elif engine == "cpu-flash":
            o_p, l_p = _a_fwd_cpu_flash(p, q, k, v, membership, kpm, scale)
        else:
            o_p, l_p = _a_fwd_generic(p, q, k, v, membership, kpm, scale, softcap)
        if overlap:
            o_m, l_m = merge_pair(o_acc[p.b].index_select(1, p.idx), l_acc[p.b].index_select(1, p.idx), o_p[0],
                                  l_p[0])
        else:  # top-1: each token's only same-group partial goes straight in
            o_m, l_m = acc(o_p[0]), acc(l_p[0])
        o_acc[p.b].index_copy_(1, p.idx, o_m)
        l_acc[p.b].index_copy_(1, p.idx, l_m)
    if window > 0:
        o_b, l_b = _b_forward(q, k, v, membership, kpm, window, scale, softcap)
        o_acc, l_acc = merge_pair(o_acc, l_acc, o_b, l_b)
    return o_acc, l_acc


class _DecomposedFocus(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, membership, kpm, window, scale, softcap, varlen_fn):
        plans = plan_groups(membership, kpm)
        o, lse = _forward(q, k, v, membership, kpm, window, scale, softcap, plans, varlen_fn)
        out = o.to(q.dtype)
        ctx.save_for_backward(q, k, v, membership, kpm, out, lse)
        ctx.plans, ctx.window, ctx.scale, ctx.softcap = plans, window, scale, softcap
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, membership, kpm, out, lse = ctx.saved_tensors
        if dout is None:
            dout = torch.zeros_like(out)
        dout = dout.to(q.dtype).contiguous()
        dq = torch.zeros(q.shape, device=q.device, dtype=acc_dtype(q.dtype))
        dk = torch.zeros(k.shape, device=q.device, dtype=acc_dtype(q.dtype))
        dv = torch.zeros(v.shape, device=q.device, dtype=acc_dtype(q.dtype))
        engine = _engine(q, ctx.softcap)
        for p in ctx.plans:
            if engine == "cpu-flash":
                _a_bwd_cpu_flash(p, q, k, v, membership, kpm, ctx.scale, dout, out, lse, dlse, dq, dk, dv)
            else:
                _a_bwd_generic(p, q, k, v, membership, kpm, ctx.scale, ctx.softcap, dout, out, lse, dlse, dq, dk,
                               dv)
        if ctx.window > 0:
            _b_backward(q, k, v, membership, kpm, ctx.window, ctx.scale, ctx.softcap, dout, out, lse, dlse, dq, dk,
                        dv)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None, None, None, None


def decomposed_focus_attention(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None,
                               return_lse=False, varlen_fn="auto"):
    """Exact Focus attention for ``Tq == Tk`` without any ``[T, T]`` tensor (inputs assumed validated by the API).

    ``varlen_fn``: a ``flash_attn_varlen_func``-compatible callable for the same-group part (forward only; the
    backward always uses PyTorch ops), ``None`` to never use one, ``"auto"`` = flash-attn's when on CUDA with
    flash-attn installed and fp16/bf16 inputs.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if varlen_fn == "auto":
        varlen_fn = None
        if q.device.type == "cuda" and q.dtype in (torch.float16, torch.bfloat16):
            varlen_fn = flash_attn_varlen()
    out, lse = _DecomposedFocus.apply(q, k, v, membership, key_padding_mask, int(window), scale, softcap, varlen_fn)
    return (out, lse) if return_lse else out
