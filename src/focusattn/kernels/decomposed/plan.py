"""The problem and its plan: which tokens form each group's sub-problem, and whether it needs an explicit mask."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from ..backends import CPU_FLASH_DTYPES, cpu_flash_available
from ..lse import acc_dtype

# Score elements per chunk in the chunked paths (~16 MiB of fp32): bounds memory, big enough to amortise overhead.
CHUNK_ELEMS = 1 << 22
# Query block for the cross-group window part: each block sees BAND_BLOCK + w keys, so waste is BAND_BLOCK / w.
BAND_BLOCK = 64


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


def group_mask(plan: GroupPlan, membership, key_padding_mask, r0: int, r1: int) -> torch.Tensor:
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


def row_chunk(n_keys: int, heads: int) -> int:
    return max(16, CHUNK_ELEMS // max(1, heads * n_keys))


def gather(x: torch.Tensor, plan: GroupPlan) -> torch.Tensor:
    """``[1, H, n, D]`` rows of the group, contiguous (what the fused kernels want)."""
    return x[plan.b].index_select(1, plan.idx).unsqueeze(0)
