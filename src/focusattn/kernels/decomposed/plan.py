"""The problem and its plan: which tokens form each group's sub-problem, and whether it needs an explicit mask."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

from ..backends import FUSED_DTYPES, cpu_flash_available, cuda_fused_available
from ..lse import acc_dtype

# Score elements per chunk in the chunked paths (~16 MiB of fp32): bounds memory, big enough to amortise overhead.
CHUNK_ELEMS = 1 << 22
# Query block for the cross-group window part: each block sees BAND_BLOCK + w keys, so waste is BAND_BLOCK / w.
BAND_BLOCK = 64
# "auto" uses inclusion–exclusion when no token has more groups than this, else masked lowest-group parts. With 3
# groups per token the pairwise intersections add ~(3/K)^2 * C(K,2) / 2 of causal attention (0.16 T^2 for K = 8, on
# top of the groups' 0.56 T^2), more than the masks cost: measured at T = 8192, K = 8, top-3, one thread, CPU time
# 2143 ms (ie) vs 1850 ms (lowest); top-2 measured even (1008 vs 982 ms). ``decomposition="ie"`` still takes any k.
IE_MAX_SET = 2
# Causal tiles (forward): an unmasked part longer than whole_rows(T) (two tiles; top-1 groups of K >= 8 are shorter)
# is cut into query tiles of tile_rows(T) = max(MIN_TILE, T / TILE_FRACTION) rows, each attending its own rows
# causally and the part's earlier tokens in key blocks of 2 tiles, so nothing part-sized is gathered: a tile's
# temporaries (queries, keys, outputs) stay ~1/3 of the output whatever the part's size (top-2 parts hold ~2T/K
# tokens, a Zipf giant group ~T/3). MIN_TILE keeps the fused calls out of their small-size regime (the op's
# time per pair at 256 rows is ~1.5x that at 1024 and above). Overlapping parts (top-k > 1) are merged into the
# accumulator through gathered slices, which cost memory of their own: their floor is half and their whole parts
# one tile. Measured at T = 2048 (captured K=8 routing): top-1 peak memory 1.48x SDPA's with a 256 floor, whose
# whole parts keep the largest group (408 tokens) in one call (a 128 floor: 1.42x, that group in 4 tiles); top-2
# 1.49x with a 128 floor (256: 1.92x).
TILE_FRACTION = 16
MIN_TILE = 256
# The window band's row chunks hold at most T / BAND_FRACTION rows: a chunk's temporaries (its mask, the fused op's
# output and its copies of the strided key windows) are ~2.5x its share of the output.
BAND_FRACTION = 16
# On CUDA the band is one call up to this many mask elements ([blocks, BAND_BLOCK, BAND_BLOCK + w]: 64M is 5M
# tokens at w = 128; its additive bias in bf16 is 128 MiB).
CUDA_BAND_ELEMS = 1 << 26


@dataclass(frozen=True)
class Problem:
    """One decomposed attention call (inputs assumed validated): what every part and engine reads.

    ``q`` ``[B, Hq, T, D]``, ``k``/``v`` ``[B, Hkv, T, D]``, ``membership`` bool ``[B, T, K]``, ``kpm`` the key
    padding mask ``[B, T]`` or None, ``window`` w, ``scale``, ``softcap`` (None = none); ``qmembership``: with
    query and key roles the queries' groups ``[B, T, K]`` (``membership`` is then the keys'), else None; ``sink``:
    the first ``sink`` keys are every query's (attention sinks), set only where :mod:`.keyed` folds them in."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    membership: torch.Tensor
    kpm: torch.Tensor | None
    window: int
    scale: float
    softcap: float | None
    qmembership: torch.Tensor | None = None
    sink: int = 0

    @property
    def query_membership(self) -> torch.Tensor:
        """The queries' groups: ``qmembership`` with roles, else ``membership``."""
        return self.membership if self.qmembership is None else self.qmembership

    @cached_property
    def engine(self) -> str:
        """``"cpu-flash"`` (PyTorch's fused CPU op), ``"cuda-mem-efficient"`` (PyTorch's fused CUDA op, when its
        probe passed) for float32/16 without softcap, else ``"generic"`` (chunked matmul/softmax)."""
        q = self.q
        if self.softcap is not None or q.dtype not in FUSED_DTYPES:
            return "generic"
        if q.device.type == "cpu" and cpu_flash_available():
            return "cpu-flash"
        if q.device.type == "cuda" and cuda_fused_available():
            return "cuda-mem-efficient"
        return "generic"

    @property
    def fused(self) -> bool:
        """A fused op (one per device) runs the unmasked and masked calls: see :mod:`.fused`."""
        return self.engine != "generic"

    def zeros(self, *shape) -> torch.Tensor:
        """A float32 (float64 for float64 inputs) accumulator on q's device."""
        return torch.zeros(*shape, device=self.q.device, dtype=acc_dtype(self.q.dtype))


@dataclass
class Grads:
    """A backward pass: the upstream gradients, the *merged* forward results and the accumulators (float32,
    ``[B, H, T, D]``) that every part adds into."""

    do: torch.Tensor
    o: torch.Tensor
    lse: torch.Tensor
    dlse: torch.Tensor | None
    dq: torch.Tensor
    dk: torch.Tensor
    dv: torch.Tensor


@dataclass(frozen=True)
class GroupPlan:
    """One causal sub-problem over the tokens ``idx`` of batch row ``b``, added to the result with ``sign``.

    ``g``: the group for the *lowest shared group* rule (fallback decomposition: key j is kept only if it shares no
    group ``< g`` with the query), or None for an inclusion–exclusion part (plain causal over ``idx``).
    ``masked``: some pair must be dropped (lowest-group rule, or a padded key after a real one): needs a per-pair
    mask and the chunked path; else the part is plain causal attention, the fused op's fastest case.
    ``kidx``: query and key roles: the part's *keys* (ascending positions), ``idx`` then being its queries; a
    query attends the part's keys at or before its own position (causal by position, not by list index), so such
    a part is always ``masked``. None: the part's tokens are both its queries and its keys."""

    b: int
    g: int | None
    idx: torch.Tensor  # ascending absolute positions of the part's tokens (its queries, with roles)
    masked: bool
    sign: int = 1
    kidx: torch.Tensor | None = None

    @property
    def keys(self) -> torch.Tensor:
        """Ascending positions of the part's keys."""
        return self.idx if self.kidx is None else self.kidx

    def key_end(self, r1: int) -> int:
        """How many of the part's keys rows ``:r1`` may see (those at or before the position of row ``r1 - 1``)."""
        if self.kidx is None:
            return r1
        return int(torch.searchsorted(self.kidx, self.idx[r1 - 1:r1], right=True)) if r1 else 0


def plan_groups(membership: torch.Tensor, key_padding_mask: torch.Tensor | None,
                mode: str = "auto", query_membership: torch.Tensor | None = None) -> list[GroupPlan]:
    """The same-group parts. ``mode``: ``"ie"`` (inclusion–exclusion, see :mod:`.driver`), ``"lowest"`` (masked
    lowest-shared-group parts), ``"auto"`` = ie when every token has at most ``IE_MAX_SET`` groups.
    Positive parts come first: the signed merge relies on it (see :func:`..lse.merge_signed`).
    ``query_membership``: query and key roles (:func:`_plan_roles`; ``mode`` does not apply)."""
    if mode not in ("auto", "ie", "lowest"):
        raise ValueError(f"mode must be 'auto', 'ie' or 'lowest', got {mode!r}")
    if query_membership is not None:
        return _plan_roles(query_membership, membership, key_padding_mask)
    kmax = int(membership.sum(-1).max()) if membership.numel() else 1
    if mode == "lowest" or (mode == "auto" and kmax > IE_MAX_SET):
        return _plan_lowest(membership, key_padding_mask)
    return _plan_ie(membership, key_padding_mask, kmax)


def _plan_roles(qmemb, kmemb, key_padding_mask) -> list[GroupPlan]:
    """Query and key roles: per batch row and group ``g``, the queries of ``g`` against the keys of ``g``, causal by
    position (one masked part each, ``kidx`` its keys). A query in one group (query top-1) meets every pair once;
    a query in several is kept only under the lowest group it shares with the key (``g`` set: the masks test
    the lower groups), so no pair is counted twice and no part is subtracted. Padded keys are masked; a query
    before every key of its group gets no part row (nothing to see there)."""
    bsz, _, kk = kmemb.shape
    lowest = bool((qmemb.sum(-1) > 1).any())
    plans = []
    for b in range(bsz):
        qnz, knz = qmemb[b].t().nonzero(), kmemb[b].t().nonzero()  # (group, position), group-major, ascending
        if key_padding_mask is not None:
            knz = knz[key_padding_mask[b][knz[:, 1]]]  # a padded key is in no part (the same as masking it)
        qsplit = torch.split(qnz[:, 1].contiguous(), torch.bincount(qnz[:, 0], minlength=kk).tolist())
        ksplit = torch.split(knz[:, 1].contiguous(), torch.bincount(knz[:, 0], minlength=kk).tolist())
        for g, (qi, ki) in enumerate(zip(qsplit, ksplit)):
            if not len(ki):
                continue
            qi = qi[qi >= ki[0]]  # queries before the group's first key see none of its keys
            if len(qi):
                plans.append(GroupPlan(b, g if lowest else None, qi, True, 1, ki))
    return plans


def _plan_lowest(membership, key_padding_mask) -> list[GroupPlan]:
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


def _plan_ie(membership, key_padding_mask, kmax: int) -> list[GroupPlan]:
    """Inclusion–exclusion parts: for every non-empty set ``A`` of at most ``kmax`` groups held by some token, the
    tokens whose group set contains ``A``, with sign ``(-1)^(|A|+1)``. A pair sharing ``c`` groups is then counted
    ``sum_m (-1)^(m+1) C(c, m) = 1`` time. Odd sizes (positive) first, each part in ascending position order.

    Padding: a part's leading padded tokens see only padded keys inside the part, so they are dropped (exact; this
    covers left padding); a padded token after a real one makes the part ``masked``."""
    bsz, t, kk = membership.shape
    dev = membership.device
    flags, gid = torch.sort(membership.to(torch.uint8), dim=-1, descending=True, stable=True)
    gid = gid[..., :kmax]  # [B, T, kmax]: each token's groups in ascending order first
    size = flags.sum(-1)  # [B, T]
    pos = torch.arange(t, device=dev)
    sizes = sorted(range(1, kmax + 1), key=lambda m: (m % 2 == 0, m))  # positive parts first
    plans = []
    for b in range(bsz):
        for m in sizes:
            keys, poss = [], []
            for combo in itertools.combinations(range(kmax), m):
                ok = size[b] > combo[-1]
                key = torch.zeros(t, dtype=torch.long, device=dev)
                for c in combo:
                    key = key * kk + gid[b, :, c]
                keys.append(key[ok])
                poss.append(pos[ok])
            key, p = torch.cat(keys), torch.cat(poss)
            if not len(key):
                continue
            order = torch.argsort(key * t + p)  # by set, then position (causal order inside each part)
            key, p = key[order], p[order]
            counts = torch.unique_consecutive(key, return_counts=True)[1].tolist()
            sign = 1 if m % 2 else -1
            for idx in torch.split(p, counts):
                masked = False
                if key_padding_mask is not None:
                    real = key_padding_mask[b, idx]
                    first = int(torch.argmax(real.to(torch.uint8)))
                    if not bool(real[first]):
                        continue  # only padded tokens: every pair of the part is masked
                    idx, masked = idx[first:], not bool(real[first:].all())
                plans.append(GroupPlan(b, None, idx, masked, sign))
    return plans


def group_mask(plan: GroupPlan, membership, key_padding_mask, r0: int, r1: int,
               qmembership=None) -> torch.Tensor:
    """Bool ``[r1 - r0, r1]`` mask for rows ``r0:r1`` of a part against its keys ``0:r1``; a roles part (``kidx``):
    ``[r1 - r0, plan.key_end(r1)]``, ``qmembership`` the queries' groups."""
    if plan.kidx is not None:
        return _roles_mask(plan, membership, qmembership, r0, r1)
    dev = plan.idx.device
    rows = torch.arange(r0, r1, device=dev)[:, None]
    allowed = torch.arange(r1, device=dev)[None, :] <= rows
    key_idx = plan.idx[:r1]
    if plan.g is not None and plan.g > 0:
        low = membership[plan.b, key_idx, : plan.g].float()
        allowed &= torch.matmul(low[r0:r1], low.t()) == 0
    if key_padding_mask is not None:
        allowed &= key_padding_mask[plan.b, key_idx][None, :]
    return allowed


def _roles_mask(plan: GroupPlan, kmemb, qmemb, r0: int, r1: int) -> torch.Tensor:
    """Rows ``r0:r1`` of a roles part against its keys ``:key_end(r1)``: the key is at or before the query and, under
    the lowest-group rule, shares no group ``< g`` with it (padded keys are not in the part)."""
    e = plan.key_end(r1)
    kpos = plan.kidx[:e]
    qpos = plan.idx[r0:r1]
    allowed = kpos[None, :] <= qpos[:, None]
    if plan.g is not None and plan.g > 0:
        lq = qmemb[plan.b, qpos, :plan.g].float()
        lk = kmemb[plan.b, kpos, :plan.g].float()
        allowed &= torch.matmul(lq, lk.t()) == 0
    return allowed


def row_chunk(n_keys: int, heads: int) -> int:
    return max(16, CHUNK_ELEMS // max(1, heads * n_keys))


def tile_rows(t: int, overlap: bool = False) -> int:
    """Rows per causal query tile of an unmasked part (forward): bounds every per-part temporary to about
    ``1/TILE_FRACTION`` of the output, whatever the group sizes (a giant group of imbalanced routing included);
    key blocks are twice that, and parts up to twice that are done whole. ``overlap``: the parts are merged
    into the accumulator (top-k > 1), so the floor is ``MIN_TILE / 2``."""
    return max(MIN_TILE // 2 if overlap else MIN_TILE, -(-t // TILE_FRACTION))


def whole_rows(t: int, overlap: bool = False) -> int:
    """The largest unmasked part done in one causal call (forward): two tiles, or one when the parts are merged
    into the accumulator (their merge slices hold memory of their own)."""
    return tile_rows(t, overlap) * (1 if overlap else 2)


def bwd_tile_rows(t: int) -> int:
    """Rows per causal tile in the backward (which gathers the part's keys whole)."""
    return 2 * tile_rows(t)


def _token_major(xb: torch.Tensor) -> bool:
    """``xb`` [H, T, ...] stored token by token (a [T, H, ...] tensor seen through ``transpose``: the layout the
    Hugging Face attention modules hand over, and the one the accumulators use)."""
    return xb.dim() >= 2 and xb.shape[0] > 1 and xb.stride(1) > xb.stride(0)


def take_rows(x: torch.Tensor, b: int, idx: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """``x[b][:, idx]`` ([H, n, ...]). On token-major memory whole token rows are gathered (16x faster at 8K tokens
    than an element-strided gather); the result is then a strided view, which the fused op and matmul accept.
    ``out``: a flat buffer of at least that many elements to write into (see :class:`Workspace`)."""
    xb = x[b]
    tm = _token_major(xb)
    src = xb.transpose(0, 1) if tm else xb  # token rows are dim 0 of src when token-major, else dim 1
    dim = 0 if tm else 1
    if out is not None:
        out = out.view(*src.shape[:dim], len(idx), *src.shape[dim + 1:])
    rows = torch.index_select(src, dim, idx, out=out)
    return rows.transpose(0, 1) if tm else rows


class Workspace:
    """Flat buffers that one forward's same-group gathers write into, one per slot (``"q"``, ``"k"``, ``"v"``),
    sized once for the largest request (:meth:`reserve`) and reused part after part.

    A fresh multi-MiB tensor per part is fresh pages: measured at 32K tokens, gathering a group's queries costs
    ~5 ms into a new tensor against ~1.2 ms into a reused one; the page faults, not the copy, were the cost. A
    slot's contents are valid until its next use, so a part's gathers must be dead before the next part starts
    (the driver consumes each part's tiles before asking for the next part). :meth:`clear` before the window
    band, so the buffers do not add to that phase's peak."""

    def __init__(self):
        self.bufs: dict[str, torch.Tensor] = {}

    def reserve(self, slot: str, numel: int, like: torch.Tensor) -> None:
        buf = self.bufs.get(slot)
        if buf is None or buf.numel() < numel:
            self.bufs[slot] = torch.empty(numel, dtype=like.dtype, device=like.device)

    def rows(self, slot: str, x: torch.Tensor, b: int, idx: torch.Tensor) -> torch.Tensor:
        """:func:`take_rows` into this slot's buffer (grown when too small)."""
        numel = len(idx) * x[b, :, :1].numel()  # [H, n, ...]
        self.reserve(slot, numel, x)
        return take_rows(x, b, idx, out=self.bufs[slot][:numel])

    def clear(self) -> None:
        self.bufs.clear()


def put_rows_(x: torch.Tensor, b: int, idx: torch.Tensor, src: torch.Tensor) -> None:
    """``x[b][:, idx] = src`` in place, by whole token rows on token-major memory (see :func:`take_rows`)."""
    xb = x[b]
    if _token_major(xb):
        xb.transpose(0, 1).index_copy_(0, idx, src.transpose(0, 1))
    else:
        xb.index_copy_(1, idx, src)


def token_major_zeros(p: Problem, *shape) -> torch.Tensor:
    """An accumulator ``[B, H, T, ...]`` (float32; float64 for float64 inputs) stored token-major: rows are put
    whole, and the caller's ``transpose(1, 2)`` back to ``[B, T, H, D]`` needs no copy."""
    b, h, t, *rest = shape
    return p.zeros(b, t, h, *rest).transpose(1, 2)


def gather(x: torch.Tensor, plan: GroupPlan, r0: int = 0, r1: int | None = None, ws: Workspace | None = None,
           slot: str = "", keys: bool = False) -> torch.Tensor:
    """``[1, H, r1 - r0, D]`` rows ``r0:r1`` of the part (a strided view when ``x`` is token-major); into the
    workspace's ``slot`` when one is given. ``keys``: rows of the part's keys (:attr:`GroupPlan.keys`)."""
    src = plan.keys if keys else plan.idx
    idx = src if (r0 == 0 and r1 is None) else src[r0:r1]
    if ws is not None:
        return ws.rows(slot, x, plan.b, idx).unsqueeze(0)
    return take_rows(x, plan.b, idx).unsqueeze(0)
