"""Part B, cross-group local pairs: ``1 <= i - j <= w`` (with query and key roles ``0 <= i - j <= w``) and no
shared group, in query blocks of ``BAND_BLOCK`` rows
against ``BAND_BLOCK + w`` keys. Blocks are laid out as a batch ``[B * n_blocks, H, C or L, D]`` so the fused op (or
the generic kernel) sees them as many small independent attention problems. On the fused path (batch 1) the blocks
are strided views of q, k and v (:func:`blocks_view`): no Python-side copies of the overlapping key windows, which at
T = 2048 took the band from ~40 to ~28 ms (the op still copies strided key windows internally, so a chunk's
memory is about as before).
"""
from __future__ import annotations

import torch

from ..common import group_bits
from ..lse import acc
from . import plan as _plan
from .chunk import block_attn_bwd, block_attn_fwd
from .fused import fused_bwd, fused_fwd
from .plan import Grads, Problem


class Band:
    """Index bookkeeping for the banded part, shared by forward and backward."""

    def __init__(self, t: int, window: int, membership, kpm, qmembership=None):
        device = membership.device
        block = _plan.BAND_BLOCK
        self.t, self.window, self.c, self.device = t, window, block, device
        self.nb = -(-t // block)
        self.l = block + window
        nbr = torch.arange(self.nb, device=device)
        self.qpos_c = (nbr[:, None] * block + torch.arange(block, device=device)[None, :]).clamp(max=t - 1)
        self.kpos = nbr[:, None] * block - window + torch.arange(self.l, device=device)[None, :]  # [nb, L]
        self.kpos_c = self.kpos.clamp(0, t - 1)
        # Query c of a block sits at distance c + w - l from key l: the band pattern is the same for every block.
        dist = torch.arange(block, device=device)[:, None] + window - torch.arange(self.l, device=device)[None, :]
        # [C, L]: local (common.in_window) minus the diagonal (part A's: a token shares a group with itself). With
        # query and key roles the diagonal stays: a pair (i, i) is part A's only where i's query and key groups meet,
        # which the "no shared group" test below decides like any other pair.
        self.base = (dist >= (0 if qmembership is not None else 1)) & (dist <= window)
        self.kvalid = self.kpos >= 0  # only the first ceil(w / C) blocks have keys before position 0
        if kpm is not None:
            self.kvalid = self.kvalid[None] & kpm[:, self.kpos_c]  # [B, nb, L]
        if membership.shape[-1] <= 63:  # one int64 bitmask per token: "shares a group" is one AND, not a K-long dot
            kk = membership.shape[-1]
            # the narrowest integer holding K bits: the per-chunk [n, C, L] AND is the band's largest temporary
            narrow = torch.uint8 if kk <= 8 else torch.int16 if kk <= 15 else torch.int32 if kk <= 31 else None
            bits = group_bits(membership)[..., 0]  # [B, T]
            self.bits, self.mf = (bits if narrow is None else bits.to(narrow)), None
            self.qbits = self.bits
            if qmembership is not None:
                qb = group_bits(qmembership)[..., 0]
                self.qbits = qb if narrow is None else qb.to(narrow)
        else:
            self.bits, self.mf = None, membership.float()
            self.qmf = self.mf if qmembership is None else qmembership.float()

    def mask(self, n0, n1):
        """Bool ``[B * (n1 - n0), C, L]``: in band, key in range and not padded, no shared group. Rows past T
        (padding of the last block) are left as they are: their outputs are discarded."""
        qc, kc = self.qpos_c[n0:n1], self.kpos_c[n0:n1]
        if self.bits is not None:
            bq, bk = self.qbits[:, qc], self.bits[:, kc]  # [B, n, C], [B, n, L]
            ok = (bq[..., :, None] & bk[..., None, :]) == 0
        else:
            ok = torch.matmul(self.qmf[:, qc], self.mf[:, kc].transpose(-1, -2)) == 0
        ok &= self.base
        kv = self.kvalid[..., n0:n1, :]
        if kv.dim() == 3:  # padding mask given: [B, n, L]
            ok &= kv[:, :, None, :]
        elif n0 * self.c < self.window:  # chunk contains blocks whose window starts before position 0
            ok &= kv[None, :, None, :]
        return ok.flatten(0, 1)

    def chunks(self, bsz, hq):
        """Block ranges of at most ``CHUNK_ELEMS`` score elements and ``1/BAND_FRACTION`` of the sequence (so the
        chunk's temporaries stay a small fraction of the output at every T); on CUDA, where the fused op never
        materialises scores and each call costs a launch, up to ``CUDA_BAND_ELEMS`` mask elements per chunk."""
        if self.device.type == "cuda":
            step = max(1, _plan.CUDA_BAND_ELEMS // max(1, bsz * self.c * self.l))
        else:
            step = max(1, min(_plan.CHUNK_ELEMS // max(1, bsz * hq * self.c * self.l),
                              -(-self.nb // _plan.BAND_FRACTION)))
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


def blocks_view(x, r0: int, n: int, rows: int, step: int) -> torch.Tensor:
    """``[1, H, T, D]`` -> ``[n, H, rows, D]``: block ``j`` holds rows ``r0 + j * step`` to ``+ rows`` (overlapping
    when ``rows > step``, as the key windows do). A strided view of ``x`` (any layout: the fused op reads strides),
    so the band copies no key window; only rows outside ``[0, T)`` (the first ``w`` keys' left edge, the last
    block's tail) are zero-padded, by a copy of just that chunk's range."""
    t = x.shape[2]
    lo, hi = r0, r0 + (n - 1) * step + rows
    if lo < 0 or hi > t:
        x = torch.nn.functional.pad(x[:, :, max(lo, 0):min(hi, t)], (0, 0, max(0, -lo), max(0, hi - t)))
    else:
        x = x[:, :, lo:hi]
    st = x.stride()
    return x.as_strided((n, x.shape[1], rows, x.shape[3]), (step * st[2], st[1], st[2], st[3]), x.storage_offset())


def forward_chunks(p: Problem):
    """Yield ``(r0, r1, out, lse)`` of the banded part, row chunk by row chunk (rows ``r0:r1`` of the sequence), so
    the caller merges each chunk in place and no ``[B, Hq, T, D]`` band output ever exists. ``out`` is
    ``[B, Hq, r1 - r0, D]`` and ``lse`` ``[B, Hq, r1 - r0]``, or, when the chunk is whole blocks,
    ``[B, Hq, n, C, D]`` / ``[B, Hq, n, C]`` strided views of the fused op's blocked result (no un-blocking copy).

    With the fused op and batch 1 the blocks are views (:func:`blocks_view`): a chunk costs its mask and the op."""
    q, k, v = p.q, p.k, p.v
    bsz, hq, t, d = q.shape
    hkv = k.shape[1]
    band = Band(t, p.window, p.membership, p.kpm, p.qmembership)
    fused = p.fused
    c = band.c
    for n0, n1 in band.chunks(bsz, hq):
        allowed = band.mask(n0, n1)
        nn = n1 - n0
        r0, r1 = n0 * c, min(t, n1 * c)
        if fused and bsz == 1:
            o, l_ = fused_fwd(blocks_view(q, r0, nn, c, c), blocks_view(k, r0 - p.window, nn, band.l, c),
                              blocks_view(v, r0 - p.window, nn, band.l, c), allowed[:, None], p.scale)
            if r1 - r0 == nn * c:
                yield r0, r1, o.transpose(0, 1)[None], l_.transpose(0, 1)[None]
                continue
        else:
            qb, kb, vb = band.q_blocks(q, n0, n1), band.k_windows(k, n0, n1), band.k_windows(v, n0, n1)
            if fused:
                o, l_ = fused_fwd(qb, kb, vb, allowed[:, None], p.scale)
            else:
                o, l_ = block_attn_fwd(qb.view(qb.shape[0], hkv, hq // hkv, c, d), kb, vb,
                                       allowed[:, None, None], p.scale, p.softcap)
                o, l_ = o.reshape(qb.shape), l_.reshape(qb.shape[:3])
            del qb, kb, vb
        del allowed
        yield r0, r1, band.unblock(o, bsz, n0, n1)[:, :, :r1 - r0], band.unblock(l_, bsz, n0, n1)[:, :, :r1 - r0]


def backward(p: Problem, g: Grads) -> None:
    q, k, v = p.q, p.k, p.v
    bsz, hq, t, d = q.shape
    hkv = k.shape[1]
    band = Band(t, p.window, p.membership, p.kpm, p.qmembership)
    fused = p.fused
    for n0, n1 in band.chunks(bsz, hq):
        allowed = band.mask(n0, n1)
        qb, kb, vb = band.q_blocks(q, n0, n1), band.k_windows(k, n0, n1), band.k_windows(v, n0, n1)
        dob, ob, lb = band.q_blocks(g.do, n0, n1), band.q_blocks(g.o, n0, n1), band.q_blocks(g.lse, n0, n1)
        dlb = None if g.dlse is None else band.q_blocks(g.dlse, n0, n1)
        if fused:
            a, b_, c = fused_bwd(dob, qb, kb, vb, ob, lb, dlb, allowed[:, None], p.scale)
        else:
            g5 = lambda x: x.reshape(x.shape[0], hkv, hq // hkv, *x.shape[2:])  # noqa: E731
            a, b_, c = block_attn_bwd(g5(qb), kb, vb, allowed[:, None, None], p.scale, p.softcap, g5(dob), g5(ob),
                                      g5(lb), None if dlb is None else g5(dlb))
            a = a.reshape(qb.shape)
        r0, r1 = n0 * band.c, min(t, n1 * band.c)
        g.dq[:, :, r0:r1] += band.unblock(acc(a), bsz, n0, n1)[:, :, :r1 - r0]
        kidx = band.kpos_c[n0:n1].flatten()  # out-of-range keys were masked, so they add exact zeros
        nn = n1 - n0
        g.dk.index_add_(2, kidx, acc(b_).view(bsz, nn, hkv, band.l, d).transpose(1, 2).reshape(bsz, hkv, -1, d))
        g.dv.index_add_(2, kidx, acc(c).view(bsz, nn, hkv, band.l, d).transpose(1, 2).reshape(bsz, hkv, -1, d))
