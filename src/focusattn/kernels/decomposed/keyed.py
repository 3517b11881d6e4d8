"""Parts A and B together when every key holds at most one group and queries may hold many (query and key roles, key
top-1: the key-space router's form), forward only: blocks of queries, each one masked fused call over the keys its
queries can see.

The sub-problem is a block of ``QUERY_BLOCK`` consecutive queries. Its keys are the window band (positions
``lim .. end`` with ``lim = start - w``: every local key of the block, and the keys there that share a group) and,
before ``lim``, the keys of every group at least one of its queries joined (the union of the block's query groups).
The mask is exactly the reference's (:func:`..reference.focus_allowed`): ``j <= i`` and (``i - j <= w`` or
``Q_i`` holds ``j``'s group), and a padded key is allowed nowhere. So one call gives each query its whole
normalised output and LSE over A and B. Without padding the first ``Problem.sink`` keys (attention sinks) are folded
in as well: they hold no group here, the band keeps them local, and each block's last columns keep them distant, so
nothing is left to merge (:mod:`..api` merged the sinks in a separate pass: ~2% of a prefill at 8192).

Why blocks and not groups: a query sits in several (tens of) groups, so a per-group formulation gathers, computes
and merges each query row once per group, and at 8K tokens that traffic, not the pairs, was the cost. A block
shares its rows across every group and pays instead the union's extra keys (measured on SmolLM2-135M's key-space
routing, 64 centroids at 8192: 6-7 groups a query, 9-12 per 64-query block; the keys computed are 1.3-1.9x the
pairs the mask keeps). Blocks of similar key counts are padded into chunks (``PAD_RATIO``), each one fused call
(:func:`.fused.fused_fwd`, its additive mask the block's rows).

Gathers read token-major 2-D rows (``index_select`` over ``[T, H * D]``: on a 3-D ``[T, H, D]`` view it was ~40x
slower here). No autograd: the driver takes this path only when no input needs a gradient (serving), the per-group
path otherwise, whose backward is tested. Softcap (no fused op) takes the same blocks through float32 matmuls.
"""
from __future__ import annotations

import torch

from ..lse import acc_dtype
from .fused import fused_fwd
from .plan import Problem

# Scores per batched call (floats): chunks of blocks are cut to stay under it. On the CPU a smaller chunk keeps its
# gathered keys, values and mask near the core (~7 MB at 1 << 22 with SmolLM2's heads): measured on four captured
# layers of keys256-floor at 8192 (one thread, another job on the other core, best of three alternated rounds)
# 0.72 s at 1 << 22 and 0.70 s at 1 << 21 against 0.87 s at 1 << 24 and 0.75 s at 1 << 20. On CUDA fewer, larger
# calls (CUDA_CHUNK_SCORES, ~64 MB of float32).
CHUNK_SCORES = 1 << 22
CUDA_CHUNK_SCORES = 1 << 24
# A chunk's padded keys over its real ones at most (else the next block starts a new chunk).
PAD_RATIO = 1.25
# Queries per block. Measured at 8192 tokens (one thread): 64 beat 32 (a smaller union, but twice the calls and
# mask rows per key) and 128 (a larger union).
QUERY_BLOCK = 64


def applies(p: Problem, needs_grad: bool) -> bool:
    """Roles whose keys hold at most one group each, no gradient: this engine's case."""
    return serves(p.membership, p.qmembership, needs_grad)


def serves(membership, qmembership, needs_grad: bool) -> bool:
    """:func:`applies` from the call's arguments."""
    return (not needs_grad and qmembership is not None and membership.shape[-1] > 1
            and int(membership.sum(-1).max()) <= 1)


def folds_sinks(sink, membership, qmembership, key_padding_mask, needs_grad: bool) -> bool:
    """Whether this engine serves the call and takes ``sink`` (the first N keys, an int) into its own calls."""
    return (isinstance(sink, int) and not isinstance(sink, bool) and sink > 0 and key_padding_mask is None
            and serves(membership, qmembership, needs_grad))


def forward(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """Parts A and B: ``(out [B, Hq, T, D], lse [B, Hq, T])`` in the accumulation dtype (token-major storage;
    ``lse`` ``-inf`` and ``out`` 0 for a query with no allowed key)."""
    b, hq, t, _ = p.q.shape
    dt = acc_dtype(p.q.dtype)
    dv = p.v.shape[-1]
    out = torch.zeros(b, t, hq, dv, dtype=dt, device=p.q.device)
    lse = torch.full((b, hq, t), float("-inf"), dtype=dt, device=p.q.device)
    for bi in range(b):
        _one_row(p, bi, out[bi], lse[bi], dt)
    return out.transpose(1, 2), lse


def _one_row(p: Problem, bi: int, out: torch.Tensor, lse: torch.Tensor, dt) -> None:
    """Batch row ``bi`` into ``out`` [T, Hq, D] and ``lse`` [Hq, T]."""
    q, k, v = p.q[bi], p.k[bi], p.v[bi]
    hq, t, d = q.shape
    hkv, dv = k.shape[0], v.shape[-1]
    dev = q.device
    kmem = p.membership[bi]
    real = torch.ones(t, dtype=torch.bool, device=dev) if p.kpm is None else p.kpm[bi].to(torch.bool)
    kmem = kmem & real[:, None]  # a padded key is in no group (and, below, allowed nowhere)
    qmem = p.qmembership[bi]
    kk = qmem.shape[-1]
    bq = max(1, min(QUERY_BLOCK, t))
    nb = -(-t // bq)
    has = kmem.any(-1)
    gid = torch.where(has, kmem.to(torch.uint8).argmax(-1), -1)  # each key's group, -1 for none
    n_sink = min(p.sink, t)
    gid[:n_sink] = -1  # a folded sink is no group key: the band keeps it local, its own column distant
    qpad = torch.cat([qmem, qmem.new_zeros(nb * bq - t, kk)]) if nb * bq > t else qmem
    union = qpad.view(nb, bq, kk).any(1)  # [nb, K]: the groups some query of the block joined
    start = torch.arange(nb, device=dev) * bq
    lim = (start - p.window).clamp_min(0)  # group keys before lim; the band from lim to the block's end
    bandlen = (start + bq).clamp_max(t) - lim
    # keys of group g before each block's lim: per-(group, block) counts, prefix-summed over blocks
    pos = torch.arange(t, device=dev)
    hist = torch.zeros(kk + 1, nb + 1, dtype=torch.long, device=dev)
    cell = (gid + 1) * (nb + 1) + torch.searchsorted(lim, pos, right=True)  # column: the first block whose lim > j
    hist.view(-1).index_add_(0, cell, torch.ones_like(cell))
    before = hist[1:].cumsum(1)[:, :nb]  # [K, nb]: keys of g with a position < lim_b
    gcount = (union.t() * before).sum(0)
    total = gcount + bandlen + n_sink
    order = torch.argsort(total, stable=True)
    tot = total[order].tolist()
    kt = k.transpose(0, 1).reshape(t, hkv * d)  # token-major rows for index_select
    vt = v.transpose(0, 1).reshape(t, hkv * dv)
    qt = q.transpose(0, 1).reshape(t, hq * d)
    real_ext = torch.cat([real, real.new_zeros(1)])  # position t: a padding slot
    gid_ext = torch.cat([torch.where(gid < 0, kk, gid), gid.new_full((1,), kk)])  # K: no group (padding slot t)
    qpad = torch.cat([qpad, qpad.new_zeros(len(qpad), 1)], 1)  # column K: the group no query holds
    rows = torch.arange(bq, device=dev)
    cap = CHUNK_SCORES if dev.type == "cpu" else max(CHUNK_SCORES, CUDA_CHUNK_SCORES)
    c0 = 0
    while c0 < nb:  # blocks [c0, c1) of the order: padded to their largest key count
        c1, km, n_real = c0, 0, 0
        while c1 < nb:
            km2, real2 = max(km, tot[c1]), n_real + tot[c1]
            if c1 > c0 and ((c1 - c0 + 1) * bq * km2 * hq > cap or (c1 - c0 + 1) * km2 > PAD_RATIO * real2):
                break
            km, n_real, c1 = km2, real2, c1 + 1
        blk = order[c0:c1]
        c0 = c1
        _chunk(p, blk, km, bq, t, union, gid, gid_ext, real_ext, lim, gcount, bandlen, rows, qpad, kt, vt, qt,
               (hq, hkv, d, dv), out, lse, dt)


def _chunk(p, blk, km, bq, t, union, gid, gid_ext, real_ext, lim, gcount, bandlen, rows, qpad, kt, vt, qt, dims,
           out, lse, dt) -> None:
    """One padded call over blocks ``blk``: keys ``[C, km]`` = each block's group keys, then its band, then the
    padding slot ``t``, then (folded sinks) the ``p.sink`` first positions."""
    hq, hkv, d, dv = dims
    dev = blk.device
    c = len(blk)
    lm, gc, bl = lim[blk], gcount[blk], bandlen[blk]
    kpos = torch.full((c, km), t, dtype=torch.long, device=dev)
    if int(gc.sum()):
        sel = union[blk][:, gid.clamp_min(0)] & (gid >= 0)[None] & (torch.arange(t, device=dev)[None] < lm[:, None])
        r, j = sel.nonzero(as_tuple=True)  # row-major: each block's keys in ascending position
        col = torch.arange(len(r), device=dev) - (torch.cumsum(gc, 0) - gc)[r]
        kpos[r, col] = j
    col = torch.arange(km, device=dev)
    band = (col[None] >= gc[:, None]) & (col[None] < (gc + bl)[:, None])
    kpos = torch.where(band, lm[:, None] + col[None] - gc[:, None], kpos)
    n_sink = min(p.sink, t)
    if n_sink:
        kpos[:, km - n_sink:] = torch.arange(n_sink, device=dev)
    qpos = blk[:, None] * bq + rows[None]  # [C, bq] (past t: padding rows, dropped below)
    # The mask in columns, not distances: band column ``col`` holds position ``lim + col - gc``, so ``j <= i`` is
    # ``col <= hi`` and ``i - j <= w`` is ``col >= hi - w`` with ``hi = gc - lim + i``; group columns (``col < gc``)
    # are before every query of the block and never local. A key in no group, padding slot included, gathers the
    # all-false last column of ``qpad``.
    hi = (gc - lm)[:, None, None] + qpos[:, :, None]  # [C, bq, 1]
    colr = col[None, None]
    ingroup = torch.gather(qpad.view(-1, bq, qpad.shape[-1])[blk], 2, gid_ext[kpos][:, None, :].expand(-1, bq, -1))
    local = colr >= hi - p.window
    if p.kpm is not None:
        local &= real_ext[kpos][:, None, :]  # a padded key holds no group (``gid_ext``), so only the band sees it
    allowed = (ingroup | local) & (colr <= hi)
    if n_sink:  # a sink's own column: the queries it is distant to (the band's column allows the others)
        allowed[:, :, km - n_sink:] = qpos[:, :, None] - torch.arange(n_sink, device=dev) > p.window
    kc = kpos.clamp_max(t - 1).reshape(-1)
    ks = kt.index_select(0, kc).view(c, km, hkv, d).transpose(1, 2)
    vs = vt.index_select(0, kc).view(c, km, hkv, dv).transpose(1, 2)
    qs = qt.index_select(0, qpos.clamp_max(t - 1).reshape(-1)).view(c, bq, hq, d).transpose(1, 2)
    # without padding every query sees itself (the band), so the fused call need not look for empty rows
    o, l = _attend(p, qs, ks, vs, allowed[:, None], nonempty=p.kpm is None)  # [C, Hq, bq, D], [C, Hq, bq]
    keep = (qpos < t).reshape(-1)
    idx = qpos.reshape(-1)[keep]
    out.index_copy_(0, idx, o.transpose(1, 2).reshape(c * bq, hq, dv)[keep].to(dt))
    lse.index_copy_(1, idx, l.transpose(0, 1).reshape(hq, c * bq)[:, keep].to(dt))


def _attend(p: Problem, q, k, v, allowed, nonempty: bool = False):
    """One chunk: ``q`` [C, Hq, Qm, D], ``k``/``v`` [C, Hkv, Km, D], ``allowed`` [C, 1, Qm, Km]; ``(out, lse)``, LSE
    ``-inf`` and output 0 for a row with no allowed key. The fused op where it applies (:func:`.fused.fused_fwd`),
    else scores in the accumulation dtype (softcap)."""
    if p.fused:
        return fused_fwd(q, k, v, allowed, p.scale, nonempty=nonempty)
    c, hq, qm, d = q.shape
    hkv = k.shape[1]
    dt = acc_dtype(q.dtype)
    qs = q.to(dt).reshape(c, hkv, hq // hkv, qm, d)
    s = torch.matmul(qs, k.to(dt)[:, :, None].transpose(-1, -2)) * p.scale  # [C, Hkv, G, Qm, Km]
    if p.softcap is not None:
        s = torch.tanh(s / p.softcap) * p.softcap
    s = s.masked_fill(~allowed[:, :, None], float("-inf"))
    lse = torch.logsumexp(s, -1)
    w = torch.exp(s - torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))[..., None])
    o = torch.matmul(w, v.to(dt)[:, :, None])  # rows with no key: w is 0, o is 0
    return o.reshape(c, hq, qm, -1), lse.reshape(c, hq, qm)
