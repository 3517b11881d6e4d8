"""Part A, same-group pairs: one causal sub-problem per (batch row, group), attributed to the lowest shared group.

Forward engines return ``(out [1, Hq, n, D], lse [1, Hq, n] float32, -inf for empty rows)``; backward engines add
float32 gradients into the :class:`.plan.Grads` accumulators in place.
"""
from __future__ import annotations

import torch

from ..lse import acc
from .chunk import block_attn_bwd, block_attn_fwd
from .fused import cpu_flash_bwd, cpu_flash_fwd, flash_rows
from .plan import GroupPlan, Grads, Problem, gather, group_mask, row_chunk


def forward(p: Problem, plan: GroupPlan):
    return _fwd_cpu_flash(p, plan) if p.engine == "cpu-flash" else _fwd_generic(p, plan)


def backward(p: Problem, plan: GroupPlan, g: Grads) -> None:
    if p.engine == "cpu-flash":
        _bwd_cpu_flash(p, plan, g)
    else:
        _bwd_generic(p, plan, g)


def _fwd_cpu_flash(p: Problem, plan: GroupPlan):
    qg, kg, vg = gather(p.q, plan), gather(p.k, plan), gather(p.v, plan)
    if not plan.masked:  # causal over the group; every row sees itself, so no empty rows
        return cpu_flash_fwd(qg, kg, vg, None, p.scale)
    n = len(plan.idx)
    outs, lses = [], []
    step = flash_rows(n)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1)
        o, lse = cpu_flash_fwd(qg[:, :, r0:r1], kg[:, :, :r1], vg[:, :, :r1], allowed, p.scale)
        outs.append(o)
        lses.append(lse)
    return torch.cat(outs, 2), torch.cat(lses, 2)


def _fwd_generic(p: Problem, plan: GroupPlan):
    hq, hkv, d = p.q.shape[1], p.k.shape[1], p.q.shape[-1]
    qg = gather(p.q, plan).view(1, hkv, hq // hkv, -1, d)
    kg, vg = gather(p.k, plan), gather(p.v, plan)
    n = len(plan.idx)
    outs, lses = [], []
    step = row_chunk(n, hq)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1)
        o, lse = block_attn_fwd(qg[..., r0:r1, :], kg[:, :, :r1], vg[:, :, :r1], allowed, p.scale, p.softcap)
        outs.append(o.reshape(1, hq, r1 - r0, d))
        lses.append(lse.reshape(1, hq, r1 - r0))
    return torch.cat(outs, 2), torch.cat(lses, 2)


def forward_varlen(p: Problem, plans: list[GroupPlan], fn):
    """All (unmasked) group sub-problems in one packed flash-attn varlen call; returns a list aligned with plans."""
    q, k, v = p.q, p.k, p.v
    qs = torch.cat([q[x.b].index_select(1, x.idx).transpose(0, 1) for x in plans])  # [total, Hq, D]
    ks = torch.cat([k[x.b].index_select(1, x.idx).transpose(0, 1) for x in plans])
    vs = torch.cat([v[x.b].index_select(1, x.idx).transpose(0, 1) for x in plans])
    lens = [len(x.idx) for x in plans]
    cu = torch.tensor([0] + lens, device=q.device).cumsum(0).to(torch.int32)
    extra = {"softcap": p.softcap} if p.softcap is not None else {}
    res = fn(qs, ks, vs, cu, cu, max(lens), max(lens), dropout_p=0.0, softmax_scale=p.scale, causal=True,
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


def _bwd_cpu_flash(p: Problem, plan: GroupPlan, g: Grads) -> None:
    qg, kg, vg = gather(p.q, plan), gather(p.k, plan), gather(p.v, plan)
    dog, og = gather(g.do, plan), gather(g.o, plan)
    lg = g.lse[plan.b].index_select(1, plan.idx).unsqueeze(0)
    dlg = None if g.dlse is None else g.dlse[plan.b].index_select(1, plan.idx).unsqueeze(0)
    if not plan.masked:
        gq, gk, gv = cpu_flash_bwd(dog, qg, kg, vg, og, lg, dlg, None, p.scale)
    else:
        n = len(plan.idx)
        gq, gk, gv = p.zeros(qg.shape), p.zeros(kg.shape), p.zeros(vg.shape)
        step = flash_rows(n)
        for r0 in range(0, n, step):
            r1 = min(n, r0 + step)
            rs = slice(r0, r1)
            allowed = group_mask(plan, p.membership, p.kpm, r0, r1)
            a, b_, c = cpu_flash_bwd(dog[:, :, rs], qg[:, :, rs], kg[:, :, :r1], vg[:, :, :r1], og[:, :, rs],
                                     lg[:, :, rs], None if dlg is None else dlg[:, :, rs], allowed, p.scale)
            gq[:, :, rs] += a
            gk[:, :, :r1] += b_
            gv[:, :, :r1] += c
    g.dq[plan.b].index_add_(1, plan.idx, acc(gq[0]))
    g.dk[plan.b].index_add_(1, plan.idx, acc(gk[0]))
    g.dv[plan.b].index_add_(1, plan.idx, acc(gv[0]))


def _bwd_generic(p: Problem, plan: GroupPlan, g: Grads) -> None:
    hq, hkv, d = p.q.shape[1], p.k.shape[1], p.q.shape[-1]
    gs = hq // hkv
    qg = gather(p.q, plan).view(1, hkv, gs, -1, d)
    dog, og = gather(g.do, plan).view(1, hkv, gs, -1, d), gather(g.o, plan).view(1, hkv, gs, -1, d)
    lg = g.lse[plan.b].index_select(1, plan.idx).view(1, hkv, gs, -1)
    dlg = None if g.dlse is None else g.dlse[plan.b].index_select(1, plan.idx).view(1, hkv, gs, -1)
    kg, vg = gather(p.k, plan), gather(p.v, plan)
    n = len(plan.idx)
    gq, gk, gv = p.zeros(1, hkv, gs, n, d), p.zeros(1, hkv, n, d), p.zeros(1, hkv, n, d)
    step = row_chunk(n, hq)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        allowed = group_mask(plan, p.membership, p.kpm, r0, r1)
        rs = slice(r0, r1)
        a, b_, c = block_attn_bwd(qg[..., rs, :], kg[:, :, :r1], vg[:, :, :r1], allowed, p.scale, p.softcap,
                                  dog[..., rs, :], og[..., rs, :], lg[..., rs], None if dlg is None else dlg[..., rs])
        gq[..., rs, :] += a
        gk[:, :, :r1] += b_
        gv[:, :, :r1] += c
    g.dq[plan.b].index_add_(1, plan.idx, gq.view(hq, n, d))
    g.dk[plan.b].index_add_(1, plan.idx, gk[0])
    g.dv[plan.b].index_add_(1, plan.idx, gv[0])
