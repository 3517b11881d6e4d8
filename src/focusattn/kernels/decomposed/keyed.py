"""Part A when every key holds at most one group and queries may hold many (query and key roles, key top-1: the
key-space router's form), forward only: all groups in a few batched calls instead of one call per group.

A query in ``m`` groups meets each of its keys in exactly one of them (a key has one group), so part A is the sum
of the groups' partial softmaxes with no pair counted twice. The per-group path (:mod:`.same_group`) pays a call,
a gather and an LSE merge per group and query: with hundreds of small groups (hundreds of keys each at 8K tokens)
that overhead, not the arithmetic, is the cost. Here the groups are padded into batches ``[C, Qmax, Kmax]`` (groups
sorted by their query and key counts and cut into chunks whose padding stays under ``PAD_RATIO``), each chunk one
fused call (:func:`.fused.fused_fwd`, causal by position through its mask) giving every (group, query) partial and
its LSE, merged into the queries' rows at once by an online log-sum-exp merge (a scatter max of the references, then
``index_add_``: a query in several groups of one chunk is summed, not overwritten). The result is part A's
normalised output and LSE, which the band (:mod:`.band`) is then merged into like any part.

No autograd: the driver takes this path only when no input needs a gradient (serving), and the per-group path
otherwise, whose backward is tested. Scores in float32 (the accumulation dtype); softcap applied like the
reference.
"""
from __future__ import annotations

import torch

from ..lse import acc_dtype
from .fused import fused_fwd
from .plan import Problem

# Scores per batched call (floats): chunks of groups are cut to stay under it (~64 MB of float32).
CHUNK_SCORES = 1 << 24
# A chunk's padded pairs over its real ones at most (else the next group starts a new chunk).
PAD_RATIO = 1.25
# Query positions per sub-problem: a block's queries see their groups' keys up to the block's end only.
QUERY_BLOCK = 512


def applies(p: Problem, needs_grad: bool) -> bool:
    """Roles whose keys hold at most one group each, no gradient: this engine's case."""
    return (not needs_grad and p.qmembership is not None and p.membership.shape[-1] > 1
            and int(p.membership.sum(-1).max()) <= 1)


def forward(p: Problem) -> tuple[torch.Tensor, torch.Tensor]:
    """Part A: ``(out [B, Hq, T, D], lse [B, Hq, T])`` in the accumulation dtype (``lse`` ``-inf`` and ``out`` 0
    for a query with no key in its groups)."""
    q, v = p.q, p.v
    b, hq, t, _ = q.shape
    dt = acc_dtype(q.dtype)
    out = torch.zeros(b, hq, t, v.shape[-1], dtype=dt, device=q.device)
    lse = torch.full((b, hq, t), float("-inf"), dtype=dt, device=q.device)
    for bi in range(b):
        _one_row(p, bi, out[bi], lse[bi], hq, dt)
    return out, lse


class _Lists:
    """Each group's positions in one ``members`` [T, K] bool: group-major, ascending (one ``nonzero``); with
    ``per_group`` blocks, each (group, block of ``QUERY_BLOCK`` positions) its own list."""

    def __init__(self, members: torch.Tensor, per_group: int = 1):
        self.gid, self.pos = members.t().nonzero(as_tuple=True)
        gid = self.gid
        if per_group > 1:  # composite groups g * per_group + the position's block: still in (group, position) order
            gid = gid * per_group + self.pos // QUERY_BLOCK
        self.counts = torch.bincount(gid, minlength=members.shape[-1] * per_group)
        self.start = torch.cumsum(self.counts, 0) - self.counts

    def slots(self, groups: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        """The first ``counts`` (default: all) positions of each of ``groups``, padded with -1:
        ``[len(groups), largest count]``."""
        n = self.counts[groups] if counts is None else counts
        col = torch.arange(int(n.max()), device=n.device)
        sel = (self.start[groups][:, None] + col[None]).clamp_max(max(len(self.pos) - 1, 0))
        return torch.where(col[None] < n[:, None], self.pos[sel] if len(self.pos) else sel, -1)


def _one_row(p: Problem, bi: int, out: torch.Tensor, lse: torch.Tensor, hq: int, dt) -> None:
    """Batch row ``bi`` into ``out`` [Hq, T, D] and ``lse`` [Hq, T]. Sub-problems are (group, block of
    ``QUERY_BLOCK`` query positions): the group's queries in the block against the group's keys up to the block's
    end, so a query early in a long sequence does not pay for its groups' later keys."""
    kmem = p.membership[bi]
    if p.kpm is not None:
        kmem = kmem & p.kpm[bi][:, None]  # a padded key is in no group
    qmem = p.qmembership[bi]
    t, kk = qmem.shape
    nb = -(-t // QUERY_BLOCK)
    kl = _Lists(kmem)
    # queries: composite group g * nb + block; keys: group g's keys before the block's end (a prefix of its list)
    ql = _Lists(qmem, nb)
    per_block = torch.bincount(kl.gid * nb + kl.pos // QUERY_BLOCK, minlength=kk * nb).view(kk, nb)
    kcount = per_block.cumsum(1).reshape(-1)  # [K * nb]: keys of g before the end of block b
    qcount = ql.counts
    live = ((kcount > 0) & (qcount > 0)).nonzero()[:, 0]
    if not len(live):
        return
    # sub-problems sorted by their query then key counts: neighbours pad little in one chunk
    live = live[torch.argsort(qcount[live] * (int(kcount.max()) + 1) + kcount[live], stable=True)]
    dv = p.v.shape[-1]
    q, k, v = p.q[bi], p.k[bi], p.v[bi]
    acc = torch.zeros(hq, t, dv, dtype=dt, device=out.device)  # sum of exp(l - ref) * o over the parts merged
    z = torch.zeros(hq, t, dtype=dt, device=out.device)  # sum of exp(l - ref)
    ref = torch.full((hq, t), float("-inf"), dtype=dt, device=out.device)  # running max of the parts' LSE
    qc, kc = qcount[live].tolist(), kcount[live].tolist()
    c0 = 0
    while c0 < len(live):  # sub-problems [c0, c1): padded to their largest query and key counts
        c1, qm, km, real = c0, 0, 0, 0
        while c1 < len(live):
            qm2, km2, real2 = max(qm, qc[c1]), max(km, kc[c1]), real + qc[c1] * kc[c1]
            padded = (c1 - c0 + 1) * qm2 * km2
            if c1 > c0 and (padded * hq > CHUNK_SCORES or padded > PAD_RATIO * real2):
                break
            qm, km, real, c1 = qm2, km2, real2, c1 + 1
        sub = live[c0:c1]
        qpos, kpos = ql.slots(sub), kl.slots(sub // nb, kcount[sub])
        c0 = c1
        allowed = ((kpos[:, None, :] >= 0) & (kpos[:, None, :] <= qpos[:, :, None]))[:, None]  # causal by position
        o, l = _attend(p, q[:, qpos.clamp_min(0)].transpose(0, 1), k[:, kpos.clamp_min(0)].transpose(0, 1),
                       v[:, kpos.clamp_min(0)].transpose(0, 1), allowed)  # [C, Hq, Qm, D], [C, Hq, Qm]
        flat = qpos.reshape(-1)
        keep = flat >= 0
        idx = flat[keep]
        l = l.to(dt).transpose(0, 1).reshape(hq, -1)[:, keep]
        o = o.to(dt).transpose(0, 1).reshape(hq, -1, dv)[:, keep]
        # online merge: a query may sit in several groups of one chunk, so its new reference is a scatter max
        touched = torch.unique(idx)
        old = ref[:, touched]
        ref.scatter_reduce_(1, idx[None].expand(hq, -1), l, "amax")
        new = ref[:, touched]
        factor = torch.where(torch.isfinite(old), torch.exp(old - new), torch.zeros_like(old))
        acc[:, touched] *= factor[..., None]
        z[:, touched] *= factor
        r = ref[:, idx]
        w = torch.where(torch.isfinite(l), torch.exp(l - torch.where(torch.isfinite(r), r, torch.zeros_like(r))),
                        torch.zeros_like(l))
        acc.index_add_(1, idx, w[..., None] * o)
        z.index_add_(1, idx, w)
    some = z > 0
    out.copy_(torch.where(some[..., None], acc / torch.where(some, z, torch.ones_like(z))[..., None],
                          torch.zeros_like(acc)))
    lse.copy_(torch.where(some, ref + torch.log(torch.where(some, z, torch.ones_like(z))),
                          torch.full_like(z, float("-inf"))))


def _attend(p: Problem, q, k, v, allowed):
    """One chunk's padded groups: ``q`` [C, Hq, Qm, D], ``k``/``v`` [C, Hkv, Km, D], ``allowed`` [C, 1, Qm, Km];
    ``(out, lse)``, LSE ``-inf`` and output 0 for a row with no allowed key. The fused op where it applies
    (:func:`.fused.fused_fwd`), else scores in the accumulation dtype (softcap)."""
    if p.fused:
        return fused_fwd(q.contiguous(), k.contiguous(), v.contiguous(), allowed, p.scale)
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
