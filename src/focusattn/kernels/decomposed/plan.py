"""The problem and its plan: which tokens form each group's sub-problem, and whether it needs an explicit mask."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import torch

from ..backends import CPU_FLASH_DTYPES, cpu_flash_available
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
# Causal tiles: an unmasked part longer than max(MIN_TILE, T / TILE_FRACTION) rows is cut into row tiles.
# Measured at T = 8192 (K=8 top-1, model shapes): 1024-row tiles made the prefill kernel 1.7x slower than whole parts
# (the fused op is already a flash kernel with bounded memory), so only very long parts are tiled.
TILE_FRACTION = 16
# The window band's row chunks hold at most T / BAND_FRACTION rows. Its blocks are views (no copied key windows), so a
# chunk's temporaries are its mask and output, ~2x its share of the output. Measured at T = 2048 (captured K=8 top-1
# routing, one thread): 16 chunks 59.6 ms, 8 chunks 55.6 ms, SDPA 56.1 ms; peak memory 0.97x SDPA either way, and
# 1.30x at T = 8192 with 8 chunks (fewer: 1.5x and more).
BAND_FRACTION = 8
MIN_TILE = 16384


@dataclass(frozen=True)
class Problem:
    """One decomposed attention call (inputs assumed validated): what every part and engine reads.

    ``q`` ``[B, Hq, T, D]``, ``k``/``v`` ``[B, Hkv, T, D]``, ``membership`` bool ``[B, T, K]``, ``kpm`` the key
    padding mask ``[B, T]`` or None, ``window`` w, ``scale``, ``softcap`` (None = none)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    membership: torch.Tensor
    kpm: torch.Tensor | None
    window: int
    scale: float
    softcap: float | None

    @cached_property
    def engine(self) -> str:
        """``"cpu-flash"`` (PyTorch's fused CPU op: float32/16 on CPU, no softcap) or ``"generic"`` (chunked)."""
        q = self.q
        if q.device.type == "cpu" and self.softcap is None and q.dtype in CPU_FLASH_DTYPES and cpu_flash_available():
            return "cpu-flash"
        return "generic"

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
    mask and the chunked path; else the part is plain causal attention, the fused op's fastest case."""

    b: int
    g: int | None
    idx: torch.Tensor  # ascending absolute positions of the part's tokens
    masked: bool
    sign: int = 1


def plan_groups(membership: torch.Tensor, key_padding_mask: torch.Tensor | None,
                mode: str = "auto") -> list[GroupPlan]:
    """The same-group parts. ``mode``: ``"ie"`` (inclusion–exclusion, see :mod:`.driver`), ``"lowest"`` (masked
    lowest-shared-group parts), ``"auto"`` = ie when every token has at most ``IE_MAX_SET`` groups.
    Positive parts come first: the signed merge relies on it (see :func:`..lse.merge_signed`)."""
    if mode not in ("auto", "ie", "lowest"):
        raise ValueError(f"mode must be 'auto', 'ie' or 'lowest', got {mode!r}")
    kmax = int(membership.sum(-1).max()) if membership.numel() else 1
    if mode == "lowest" or (mode == "auto" and kmax > IE_MAX_SET):
        return _plan_lowest(membership, key_padding_mask)
    return _plan_ie(membership, key_padding_mask, kmax)


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


def group_mask(plan: GroupPlan, membership, key_padding_mask, r0: int, r1: int) -> torch.Tensor:
    """Bool ``[r1 - r0, r1]`` mask for rows ``r0:r1`` of a part against its keys ``0:r1``."""
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


def row_chunk(n_keys: int, heads: int) -> int:
    return max(16, CHUNK_ELEMS // max(1, heads * n_keys))


def tile_rows(t: int) -> int:
    """Rows per causal tile of an unmasked part: bounds every per-part temporary to about ``1/TILE_FRACTION`` of
    the output, whatever the group sizes (a giant group of imbalanced routing included)."""
    return max(MIN_TILE, -(-t // TILE_FRACTION))


def _token_major(xb: torch.Tensor) -> bool:
    """``xb`` [H, T, ...] stored token by token (a [T, H, ...] tensor seen through ``transpose``: the layout the
    Hugging Face attention modules hand over, and the one the accumulators use)."""
    return xb.dim() >= 2 and xb.shape[0] > 1 and xb.stride(1) > xb.stride(0)


def take_rows(x: torch.Tensor, b: int, idx: torch.Tensor) -> torch.Tensor:
    """``x[b][:, idx]`` ([H, n, ...]). On token-major memory whole token rows are gathered (16x faster at 8K tokens
    than an element-strided gather); the result is then a strided view, which the fused op and matmul accept."""
    xb = x[b]
    if _token_major(xb):
        return xb.transpose(0, 1).index_select(0, idx).transpose(0, 1)
    return xb.index_select(1, idx)


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


def gather(x: torch.Tensor, plan: GroupPlan, r0: int = 0, r1: int | None = None) -> torch.Tensor:
    """``[1, H, r1 - r0, D]`` rows ``r0:r1`` of the part (a strided view when ``x`` is token-major)."""
    idx = plan.idx if (r0 == 0 and r1 is None) else plan.idx[r0:r1]
    return take_rows(x, plan.b, idx).unsqueeze(0)
