"""``backend="auto"``: the exact engine that is fastest for one call's shape, from measured break-evens.

Every branch computes the same mask (:func:`.reference.focus_allowed`); they differ only in how much work they do:

* ``causal`` — the mask keeps every causal pair: the window covers the whole call (``Tk - 1 <= window``), or every
  two tokens share a group (one group holds every token, or each token is in more than ``K / 2`` groups). Focus
  *is* causal attention there, so it is one fused causal call (SDPA's own CPU flash op), padding as a key mask.
* ``masked`` — a prefill shorter than the measured break-even for its top-k: one fused call with the Focus mask as
  an explicit boolean mask, in row chunks that skip the keys after each chunk (~0.56 of the dense square at 8 chunks).
* ``decomposed`` — a prefill at or above the break-even: the sub-quadratic engine (:mod:`.decomposed`).
* ``decode-masked`` — a decode step (``Tq < Tk``) over a cache shorter than the measured gather break-even: the
  same fused call with the step's mask (one row per query: shares a group, window, sinks, padding).
* ``gather`` — a longer decode step: the window, group and sink keys gathered (:mod:`.decode`; lists longer than
  ``decode.DENSE_DECODE_FRACTION`` of the cache still take the masked pass).

The break-evens are data, ``dispatch.json`` beside this file (or the file named by ``$FOCUSATTN_DISPATCH_FILE``),
written by ``focusattn bench-dispatch`` (see docs/DISPATCH.md). A device type absent from that file never takes
``masked`` and always gathers: the sparse engines' behaviour before there was a dispatcher. ``PICKS`` counts the
branches taken (tests check each is reachable; benchmarks report which ran).
"""
from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .backends import FUSED_DTYPES, cpu_flash_available, cuda_fused_available
from .common import has_sinks, in_window, relative_distance, sink_key_mask
from .decomposed.fused import fused_bwd, fused_fwd
from .lse import mark_empty

PREFILL_BRANCHES = ("causal", "masked", "decomposed")
DECODE_BRANCHES = ("causal", "decode-masked", "gather")
PICKS: collections.Counter = collections.Counter()
DATA_FILE = Path(__file__).with_name("dispatch.json")
ENV_FILE = "FOCUSATTN_DISPATCH_FILE"
# Query rows per chunk of the masked prefill (at least; T / MASKED_CHUNKS for longer calls): chunk r sees keys up to
# its last row only, so the work is (n + 1) / 2n of the square instead of all of it.
MASKED_ROWS = 256
MASKED_CHUNKS = 8


@dataclass(frozen=True)
class BreakEvens:
    """Measured thresholds for one device type, by top-k (the most groups any token of the call is in; a larger k
    than measured uses the largest measured). ``prefill``: a prefill of at least this many tokens runs decomposed,
    shorter ones masked; ``decode``: a decode step over at least this many cached keys gathers them, shorter caches
    take one masked pass."""

    prefill: dict[int, int] = field(default_factory=dict)
    decode: dict[int, int] = field(default_factory=dict)

    @staticmethod
    def _at(table: dict[int, int], k: int) -> int:
        if not table:
            return 0
        below = [kk for kk in table if kk <= k]
        return table[max(below)] if below else table[min(table)]

    def prefill_min(self, k: int) -> int:
        return self._at(self.prefill, k)

    def decode_min(self, k: int) -> int:
        return self._at(self.decode, k)


def load_breakevens(path: str | Path | None = None) -> dict[str, BreakEvens]:
    """``{device type: BreakEvens}`` from a dispatch file (``path``, else ``$FOCUSATTN_DISPATCH_FILE``, else the
    packaged ``dispatch.json``); ValueError naming the file when it is not one."""
    path = Path(path or os.environ.get(ENV_FILE) or DATA_FILE)
    try:
        doc = json.loads(path.read_text())
        return {dev: BreakEvens({int(k): int(t) for k, t in row["prefill_decomposed_min_tokens"].items()},
                                {int(k): int(t) for k, t in row["decode_gather_min_tokens"].items()})
                for dev, row in doc["devices"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"dispatch file {path} is not a focusattn dispatch file ({exc})") from None


@functools.cache
def _packaged() -> dict[str, BreakEvens]:
    return load_breakevens()


_OVERRIDE: list[dict[str, BreakEvens]] = []


def breakevens(device_type: str) -> BreakEvens:
    """The thresholds in force for ``device_type`` (empty where none were measured)."""
    return (_OVERRIDE[-1] if _OVERRIDE else _packaged()).get(device_type, BreakEvens())


@contextlib.contextmanager
def using(table: dict[str, BreakEvens]):
    """Dispatch by ``table`` (``{device type: BreakEvens}``) inside the block: what-if runs, and tests that drive
    every branch over the same inputs."""
    _OVERRIDE.append(table)
    try:
        yield
    finally:
        _OVERRIDE.pop()


def _fused_ok(q: torch.Tensor, softcap) -> bool:
    """The dense branches run on PyTorch's fused op: no softcap, a fused dtype, a device that has the op."""
    if softcap is not None or q.dtype not in FUSED_DTYPES:
        return False
    return cpu_flash_available() if q.device.type == "cpu" else q.device.type == "cuda" and cuda_fused_available()


def _every_pair_shares(membership: torch.Tensor, group_index=None) -> bool:
    """True when any two tokens share a group: one group holds every token, or every token is in more than K/2
    groups (pigeonhole). With a group index both come from its counts (``O(K)``, not ``O(Tk K)``)."""
    if group_index is not None:
        return 2 * group_index.min_groups > group_index.counts.shape[-1] or group_index.one_group_holds_all
    kk = membership.shape[-1]
    return 2 * int(membership.sum(-1).min()) > kk or bool(membership.all(1).any(-1).all())


def choose(q, k, membership, window, *, softcap=None, group_index=None, query_membership=None) -> str:
    """The branch for one validated, non-empty call (see the module docstring). With query and key roles
    (``query_membership``) the ``causal`` branch is taken only when the window covers the call (the pigeonhole
    test is for one membership), and the break-evens are read at the keys' top-k (the cost of the call's lists)."""
    tq, tk = q.shape[2], k.shape[2]
    fused = _fused_ok(q, softcap)
    roles = query_membership is not None
    if fused and (tk - 1 <= window or (not roles and _every_pair_shares(membership, group_index))):
        return "causal"
    be = breakevens(q.device.type)
    if tq == tk:
        if fused and tk < be.prefill_min(int(membership.sum(-1).max())):
            return "masked"
        return "decomposed"
    if not fused:
        return "gather"
    if roles:
        top = int(membership.sum(-1).max()) if group_index is None else group_index.max_groups
    else:
        top = group_index.max_groups if group_index is not None else int(membership[:, tk - tq:].sum(-1).max())
    return "decode-masked" if tk < be.decode_min(top) else "gather"


# ------------------------------------------------------------------------------------------------ dense branches
@functools.lru_cache(maxsize=4)
def _local_and_causal(tq: int, tk: int, window: int, device: torch.device):
    """``(local, causal)`` bool ``[Tq, Tk]``: shared by every layer of a forward (the same shapes), so built once."""
    dist = relative_distance(tq, tk, device)
    return in_window(dist, window), dist >= 0


def _chunk_mask(membership, window, r0, r1, tq, tk, sink, kpm, rows_only_causal, query_membership=None):
    """Bool ``[B, 1, r1 - r0, e]`` of the Focus mask for query rows ``r0:r1`` against keys ``:e`` (the keys up to
    the chunk's last query); ``rows_only_causal``: the causal (+ padding) mask alone. ``query_membership``
    ``[B, Tq, K]``: the queries' groups (query and key roles), else the keys' last ``Tq`` rows."""
    e = tk - tq + r1
    qm = query_membership
    if tq == 1 and not rows_only_causal:  # a decode step: one row, built by slices (no [Tq, Tk] tables)
        m = membership.to(torch.float32)
        mq = m[:, -1:] if qm is None else qm.to(torch.float32)
        allowed = torch.matmul(m, mq.transpose(1, 2))[..., 0] > 0  # shares a group with the query
        allowed[:, max(0, tk - 1 - window):] = True
        if kpm is None and not isinstance(sink, torch.Tensor):
            allowed[:, :sink] = True  # the sinks: the first keys
        else:  # a key mask (global keys) or padding
            if has_sinks(sink):
                allowed.logical_or_(sink_key_mask(tk, sink, kpm, membership.device))
            if kpm is not None:
                allowed.logical_and_(kpm)
        return allowed[:, None, None]
    local, causal = _local_and_causal(tq, tk, window, membership.device)
    if rows_only_causal:
        allowed = causal[None, r0:r1, :e]
    else:
        m = membership.to(torch.float32)
        mq = m[:, tk - tq + r0:tk - tq + r1] if qm is None else qm[:, r0:r1].to(torch.float32)
        shared = torch.matmul(mq, m[:, :e].transpose(1, 2)) > 0  # BLAS, not K loops
        allowed = shared.logical_or_(local[None, r0:r1, :e])
        if has_sinks(sink):
            allowed.logical_or_(sink_key_mask(tk, sink, kpm, membership.device)[:, None, :e])
        allowed.logical_and_(causal[None, r0:r1, :e])
    if kpm is not None:
        allowed = allowed & kpm[:, None, :e]
    return allowed[:, None]


def _chunks(tq: int, tk: int, masked: bool):
    if tq == 1 or not masked:
        return [(0, tq)]
    rows = max(MASKED_ROWS, -(-tq // MASKED_CHUNKS))
    return [(r0, min(tq, r0 + rows)) for r0 in range(0, tq, rows)]


class _Dense(torch.autograd.Function):
    """Fused forward/backward over the chunks (the op's LSE carries no graph, so one Function; its backward is the
    op's own, fed the chunk's output and LSE, with an LSE gradient through :func:`.decomposed.fused.fused_bwd`)."""

    @staticmethod
    def forward(ctx, q, k, v, masks, chunks, scale, tk):
        out, lse = _dense_forward(q, k, v, masks, chunks, scale, tk)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.masks, ctx.chunks, ctx.scale, ctx.tk = masks, chunks, scale, tk
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, out, lse = ctx.saved_tensors
        tq, tk = q.shape[2], ctx.tk
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        if dout is None:
            dout = torch.zeros_like(out)
        empty = lse == float("-inf")  # no allowed key: no gradient (+inf makes every P exactly 0, not NaN)
        lse = lse.masked_fill(empty, float("inf"))
        if dlse is not None:
            dlse = dlse.masked_fill(empty, 0.0)
        for (r0, r1), mask in zip(ctx.chunks, ctx.masks):
            e = tk - tq + r1
            causal = mask is None and tq == tk
            gq, gk, gv = fused_bwd(dout[:, :, r0:r1].to(q.dtype), q[:, :, r0:r1], k[:, :, :e], v[:, :, :e],
                                   out[:, :, r0:r1], lse[:, :, r0:r1], None if dlse is None else dlse[:, :, r0:r1],
                                   mask, ctx.scale, causal)
            dq[:, :, r0:r1] += gq
            dk[:, :, :e] += gk
            dv[:, :, :e] += gv
        dq.masked_fill_(empty[..., None], 0.0)
        return dq, dk, dv, None, None, None, None


def _dense_forward(q, k, v, masks, chunks, scale, tk):
    tq = q.shape[2]
    if len(chunks) == 1:
        o, lse = fused_fwd(q, k, v, masks[0], scale, causal=masks[0] is None and tq == tk)
        return o, lse.float()
    out = torch.empty_like(q)
    lse = q.new_empty(q.shape[:3], dtype=torch.float32)
    for (r0, r1), mask in zip(chunks, masks):
        e = tk - tq + r1
        o, l_ = fused_fwd(q[:, :, r0:r1], k[:, :, :e], v[:, :, :e], mask, scale, causal=False)
        out[:, :, r0:r1], lse[:, :, r0:r1] = o, l_
    return out, lse


def dense_branch(q, k, v, membership, window, *, sink=0, scale, key_padding_mask=None, causal_only: bool,
                 query_membership=None):
    """``(out, lse)`` of the ``causal`` (``causal_only``: every causal pair kept) or ``masked`` branch, exact:
    the same allowed set as the reference, rows with no allowed key zero with LSE ``-inf``."""
    tq, tk = q.shape[2], k.shape[2]
    kpm = key_padding_mask
    needs_mask = not causal_only or kpm is not None or (tq != tk and tq > 1)
    chunks = _chunks(tq, tk, needs_mask and not causal_only)
    masks = [_chunk_mask(membership, window, r0, r1, tq, tk, sink, kpm, causal_only, query_membership)
             if needs_mask else None for r0, r1 in chunks]
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    if tq == 1 and kpm is None and not needs_grad and not causal_only and q.device.type == "cpu":
        # a decode step at inference: the additive mask in one op (the query always sees itself: no empty row)
        bias = torch.where(masks[0], 0.0, float("-inf")).to(q.dtype)
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, False, attn_mask=bias,
                                                                                scale=scale)
        return out, lse.float()
    if needs_grad:
        out, lse = _Dense.apply(q, k, v, masks, chunks, scale, tk)
    else:
        out, lse = _dense_forward(q, k, v, masks, chunks, scale, tk)
    if kpm is not None:  # the op reports LSE 0 for a row with no allowed key (only padding leaves a row empty)
        has = torch.cat([m.any(-1) for m in masks], 2) if len(masks) > 1 else masks[0].any(-1)  # [B, 1, Tq]
        if not bool(has.all()):
            lse = mark_empty(lse, has)
            out = out.masked_fill(~has[..., None], 0.0)
    return out, lse

