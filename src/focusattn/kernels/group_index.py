"""``GroupIndex``: per-group key positions kept up to date during decoding, so a step never scans the whole cache.

Without it, :func:`focusattn.kernels.decode.focus_decode_attention` finds a query's keys by testing all ``Tk`` keys'
membership (``O(Tk * K)`` per step, plus a compaction). The index stores, for every batch row ``b`` and group ``g``,
the ascending positions of the tokens in ``g`` (int32, padded with ``INT32_MAX``, capacity doubled on overflow), and
the membership itself. A query at position ``p`` then reads only its own groups' lists (``~Tk * k / K`` entries)
plus the window ``[p - w, p]``:

* a listed key ``j >= p - w`` is dropped (the window already has it), so window and group parts are disjoint;
* with top-k > 1 a key sharing several groups with the query appears in several lists; it is kept only in the list
  of the *lowest* shared group (one membership lookup per candidate and lower group), so each key is counted once.

Building costs one ``nonzero`` over the prefill membership (sorted by group for free); ``append`` of ``t`` tokens
costs ``O(t * K)`` (the membership rows and the counts; the position lists catch up in one batch when they are next
read, so steps that never gather never write them) plus amortised regrowth. Memory: ``B * K * cap`` int32 with
``cap`` the next power of two >= the largest group, i.e. ``4 * B * T * k`` bytes (up to twice that) for balanced
top-k groups and at worst ``4 * B * T * K`` if one group takes every token, plus the ``B * T * K`` bytes of
membership.
"""
from __future__ import annotations

import collections
from dataclasses import dataclass

import torch

_PAD = torch.iinfo(torch.int32).max  # sorts after every real position, and fails every "< p - w" test
_FIRST = 16  # the host record keeps the groups of this many first positions (the sinks a step may add)


@dataclass
class _Host:
    """Host-side record for one-row decode steps (:meth:`GroupIndex.last_keys`), all Python ints: ``far[g]`` = how
    many of group g's tokens lie before ``far_len`` (the last token's window starts there), ``recent`` the groups of
    the tokens from ``far_len`` on (the window, oldest first), ``first`` the groups of the first positions."""

    window: int
    far_len: int
    far: list
    recent: collections.deque
    first: list
    lists: list | None = None
    every: list | None = None  # the groups of every position, built by the first step with ``extra`` keys


def _groups_of(rows: list) -> list[tuple[int, ...]]:
    return [tuple(i for i, x in enumerate(r) if x) for r in rows]


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, (max(1, n) - 1).bit_length())


def _check_membership(m, name: str, batch=None, groups=None, every_token=True) -> None:
    """Type and shape of a membership; ``every_token``: also that each token is in a group (append checks that
    from the group counts it computes anyway)."""
    if not isinstance(m, torch.Tensor) or m.dtype != torch.bool or m.dim() != 3:
        raise ValueError(f"{name} must be a bool tensor [B, T, K], got "
                         f"{(m.dtype, tuple(m.shape)) if isinstance(m, torch.Tensor) else type(m).__name__}")
    if m.shape[2] < 1 or (batch is not None and (m.shape[0], m.shape[2]) != (batch, groups)):
        raise ValueError(f"{name} must have shape [B, t, K] = [{batch}, t, {groups}], got {tuple(m.shape)}")
    if every_token and m.shape[1] and not bool(m.any(-1).all()):
        raise ValueError(f"{name}: every token must belong to at least one group")


class GroupIndex:
    """Positions of each group's tokens, per batch row; see the module docstring.

    ``GroupIndex(membership)`` indexes a prefill's bool ``[B, T, K]`` membership; ``append(m)`` adds ``[B, t, K]``
    for the next ``t`` positions; ``crop(n)`` keeps the first ``n`` (to follow a KV cache that is cropped, e.g. by
    assisted decoding); ``reorder(batch_idx)`` follows a beam-search cache reorder. ``len(index)`` is the number of
    indexed tokens and must equal the KV length it is used with.
    """

    def __init__(self, membership: torch.Tensor):
        _check_membership(membership, "membership")
        b, t, k = membership.shape
        dev = membership.device
        self.counts = membership.sum(1)  # [B, K] long
        self._bound = int(self.counts.max())  # host-side upper bound on counts.max(), so append needs no sync
        self._cap = _pow2_at_least(self._bound)
        # one extra column per list: a dump slot for scatter writes that must land nowhere
        self._pos = torch.full((b, k, self._cap + 1), _PAD, dtype=torch.int32, device=dev)
        nz = membership.transpose(1, 2).nonzero()  # (b, g, t) rows, already sorted by (b, g) then position
        start = (self.counts.flatten().cumsum(0) - self.counts.flatten())  # first row of each (b, g) in nz
        flat = nz[:, 0] * k + nz[:, 1]
        slot = torch.arange(nz.shape[0], device=dev) - start[flat]
        self._pos[nz[:, 0], nz[:, 1], slot] = nz[:, 2].to(torch.int32)
        self._memb = torch.zeros(b, _pow2_at_least(t), k, dtype=torch.bool, device=dev)
        self._memb[:, :t] = membership
        self._len = t
        self._listed, self._listed_len = self.counts, t  # the lists hold every token so far (see _sync)
        self._host: _Host | None = None  # built by the first last_keys call
        self._arange = torch.arange(0, dtype=torch.int32, device=dev)
        self._note_groups(membership)

    # ------------------------------------------------------------------------------------------- state
    def __len__(self) -> int:
        return self._len

    @property
    def membership(self) -> torch.Tensor:
        """The indexed membership ``[B, len, K]`` as a view (no copy): pass it as ``membership`` instead of
        concatenating a growing tensor every step."""
        return self._memb[:, :self._len]

    @property
    def device(self) -> torch.device:
        return self._pos.device

    def group_lists(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(positions [B, K, L] int32, counts [B, K])``: list ``(b, g)`` is ``positions[b, g, :counts[b, g]]``,
        ascending, padded with ``INT32_MAX``; ``L`` = the longest list."""
        self._sync()
        return self._pos[:, :, :int(self.counts.max())], self.counts

    def _note_groups(self, membership: torch.Tensor) -> None:
        """Set ``min_groups`` / ``max_groups`` (the fewest / most groups of any indexed token; ``K`` / 0 when none):
        the dispatcher reads them instead of scanning every token per step (:mod:`.dispatch`); append keeps them."""
        lo, hi = self.counts.shape[1], 0
        if membership.shape[1]:
            lo, hi = torch.stack(torch.aminmax(membership.sum(-1))).tolist()  # one sync
        self.min_groups, self.max_groups = lo, hi
        # does one group hold every token, in every batch row? Once not, appending never makes it so again
        self.one_group_holds_all = bool((self.counts == self._len).any(-1).all())

    # ------------------------------------------------------------------------------------------- updates
    def _grow_lists(self, need: int) -> None:
        cap = _pow2_at_least(max(need, 2 * self._cap))
        pos = torch.full((*self._pos.shape[:2], cap + 1), _PAD, dtype=torch.int32, device=self.device)
        pos[:, :, :self._cap] = self._pos[:, :, :self._cap]
        self._pos, self._cap = pos, cap

    def append(self, membership_new: torch.Tensor, groups: list[tuple[int, ...]] | None = None) -> "GroupIndex":
        """Index ``membership_new`` ``[B, t, K]`` as positions ``len .. len + t - 1``; returns ``self``. ``groups``:
        one sequence's new rows as ascending group tuples the caller already holds on the host (a decode step's
        groups decided there, :func:`~focusattn.focus.router.one_token_groups`), so the host record takes them
        without reading the rows back (a sync per layer and step)."""
        b, k = self.counts.shape
        _check_membership(membership_new, "membership_new", b, k, every_token=False)
        if membership_new.device != self.device:
            raise ValueError(f"membership_new is on {membership_new.device} but the index is on {self.device}")
        t = membership_new.shape[1]
        if t == 0:
            return self
        if self._host is not None:  # one sync gives the host record its rows, and the check and the bounds
            rows = groups if groups is not None else _groups_of(membership_new[0].tolist())
            lo, hi = min(map(len, rows)), max(map(len, rows))
        else:
            lo, hi = torch.stack(torch.aminmax(membership_new.sum(-1))).tolist()  # one sync: the check, the bounds
        if lo < 1:
            raise ValueError("membership_new: every token must belong to at least one group")
        if self._len + t > self._memb.shape[1]:
            memb = torch.zeros(b, _pow2_at_least(self._len + t), k, dtype=torch.bool, device=self.device)
            memb[:, :self._len] = self.membership
            self._memb = memb
        self._memb[:, self._len:self._len + t] = membership_new
        self.counts = self.counts + (membership_new.sum(1) if t > 1 else membership_new[:, 0])  # bool -> long
        self._len += t
        self.min_groups, self.max_groups = min(self.min_groups, lo), max(self.max_groups, hi)
        if self.one_group_holds_all:
            self.one_group_holds_all = bool((self.counts == self._len).any(-1).all())
        if self._host is not None:
            h = self._host
            h.first.extend(rows[:max(0, _FIRST - len(h.first))])
            h.recent.extend(rows)
            if h.every is not None:
                h.every.extend(rows)
            self._advance()
        return self

    def _sync(self) -> None:
        """Write the positions of the tokens appended since the lists were last read, in one batch: a decode step
        that does not gather (``backend="auto"`` below the gather break-even, :mod:`.dispatch`) pays only for the
        membership row and the counts, and the lists catch up when a step reads them."""
        t = self._len - self._listed_len
        if t == 0:
            return
        b, k = self.counts.shape
        mt = self._memb[:, self._listed_len:self._len].transpose(1, 2)  # [B, K, t]
        self._bound += t
        if self._bound > self._cap:  # only now is the true maximum needed (one sync per regrowth, not per step)
            self._bound = int(self.counts.max())
            if self._bound > self._cap:
                self._grow_lists(self._bound)
        slot = self._listed[..., None] + mt.long().cumsum(-1) - 1
        slot = torch.where(mt, slot, self._cap)  # non-members write into the dump column
        newpos = torch.arange(self._listed_len, self._len, dtype=torch.int32, device=self.device).expand(b, k, t)
        self._pos.scatter_(2, slot, newpos)
        self._pos[:, :, self._cap] = _PAD
        self._listed, self._listed_len = self.counts, self._len

    def crop(self, n: int) -> "GroupIndex":
        """Keep the first ``n`` tokens (``O(B * K * cap)``: for rare rollbacks, not per step); returns ``self``."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self._len:
            raise ValueError(f"crop length must be an int in [0, {self._len}], got {n!r}")
        self._sync()
        keep = self._pos < n
        self._pos.masked_fill_(~keep, _PAD)
        self.counts = self._listed = keep[:, :, :self._cap].sum(-1)
        self._listed_len = n
        self._memb[:, n:self._len] = False
        self._len = n
        self._bound = int(self.counts.max())
        self._host = None
        self._note_groups(self.membership)
        return self

    def reorder(self, batch_idx: torch.Tensor) -> "GroupIndex":
        """Keep batch rows ``batch_idx`` (long ``[B']``, repeats allowed), as beam search reorders its KV cache;
        ``O(B' * (K * cap + T * K))`` copies, far less than the cache's own reorder. Returns ``self``."""
        batch_idx = batch_idx.to(self.device)
        self._sync()
        self._listed = self._listed[batch_idx]
        self._pos, self.counts, self._memb = self._pos[batch_idx], self.counts[batch_idx], self._memb[batch_idx]
        self._host = None
        self._note_groups(self.membership)
        return self

    # ------------------------------------------------------------------------------------------- queries
    def key_indices(self, qpos: torch.Tensor, window: int, key_padding_mask: torch.Tensor | None = None, *,
                    query_membership: torch.Tensor | None = None):
        """Keys of the queries at absolute positions ``qpos`` ``[C]`` (each ``< len``): ``(idx [B, C, L] long,
        valid [B, C, L] bool)``, window keys first, then each shared group's keys; every allowed key appears exactly
        once among the valid entries (invalid entries point at key 0). Work ``O(C * (w + sum of the query's group
        sizes) * k)``, independent of the other groups.

        ``query_membership`` ``[B, C, K]``: the queries' own groups when query and key roles differ (the index holds
        the tokens' groups as keys); None = the queries' indexed rows. A query reads the lists of its own groups."""
        self._sync()
        b, k = self.counts.shape
        dev = self.device
        qpos = qpos.to(dev)
        mq = self._memb[:, qpos] if query_membership is None else query_membership.to(dev)  # [B, C, K]
        kq = int(mq.sum(-1).max())
        # the query's groups, lowest id first (stable sort of 1/0 flags), padded with invalid slots
        flags, gid = torch.sort(mq.to(torch.uint8), dim=-1, descending=True, stable=True)
        gid, gvalid = gid[..., :kq], flags[..., :kq].bool()  # [B, C, kq]
        bi = torch.arange(b, device=dev)[:, None, None]
        longest = int(self.counts[bi, gid].masked_fill(~gvalid, 0).max()) if kq else 0
        cand = self._pos[:, :, :longest][bi, gid]  # [B, C, kq, Lg] int32
        p = qpos[None, :, None, None]
        ok = gvalid[..., None] & (cand < p - window)  # outside the window (so also causal); padding fails
        keys = torch.where(ok, cand, 0).long()
        if kq > 1:  # keep a key only under the lowest group it shares with the query (slot 0 keeps all)
            other = gid[:, :, None, None, :-1]  # groups of the lower slots, [B, C, 1, 1, kq - 1]
            shared = self._memb[bi[..., None, None], keys[:, :, 1:, :, None], other]  # [B, C, kq - 1, Lg, kq - 1]
            lower = torch.ones(kq - 1, kq - 1, dtype=torch.bool, device=dev).tril()  # [slot s - 1, slot s' < s]
            drop = (shared & gvalid[:, :, None, None, :-1] & lower[:, None, :]).any(-1)
            ok = torch.cat([ok[:, :, :1], ok[:, :, 1:] & ~drop], 2)
        keys, ok = keys.flatten(2), ok.flatten(2)
        span = min(window, int(qpos.max())) + 1
        wkeys = qpos[:, None] - torch.arange(span, device=dev)  # [C, span]
        wok = (wkeys >= 0).expand(b, -1, -1)
        idx = torch.cat([wkeys.clamp_min(0).expand(b, -1, -1), keys], -1)
        valid = torch.cat([wok, ok], -1)
        if key_padding_mask is not None:
            valid = valid & key_padding_mask.gather(1, idx.flatten(1)).view_as(idx)
        return idx.masked_fill(~valid, 0), valid

    # ------------------------------------------------------------------------------------------- one-row decode steps
    def _advance(self) -> None:
        """Move the host record's window start to the last token's (``len - 1 - window``)."""
        h = self._host
        target = max(0, self._len - 1 - h.window)
        while h.far_len < target:
            for g in h.recent.popleft():
                h.far[g] += 1
            h.far_len += 1

    def last_keys(self, window: int, sink: int = 0, query_groups: tuple[int, ...] | None = None, *,
                  extra: torch.Tensor | list[int] | None = None) -> torch.Tensor | None:
        """Positions (int32 ``[L]``, each allowed key once) that the *last* indexed token may attend as a query:
        the first ``sink`` tokens, the earlier tokens of its groups (``query_groups``, with query and key roles;
        else its own) before its window, the window ``[p - w, p]``, and ``extra`` (positions ``<= p`` every
        query sees, int32 or a list of ints: global keys; those already listed are dropped). None for more than one
        batch row.

        The common decode step (one sequence, one new token) at host speed: a Python record per group of how many
        of its tokens lie before the window (:class:`_Host`, kept by :meth:`append` in ``O(t * K)`` Python work,
        the window's groups rolling through a deque) makes each group's far keys a slice of its position list, so
        a step is a few slices and one concatenation, with no tensor scan and no sync beyond ``append``'s."""
        if self.counts.shape[0] != 1 or self._len == 0 or sink > _FIRST:
            return None
        if self._host is None or self._host.window != window:
            far_len = max(0, self._len - 1 - window)
            m = self.membership[0]
            self._host = _Host(window, far_len, m[:far_len].sum(0).tolist(),
                               collections.deque(_groups_of(m[far_len:].tolist())), _groups_of(m[:_FIRST].tolist()))
        h = self._host
        if self._listed_len < h.far_len:  # the lists lag the index (see _sync): catch up, once per ~window steps
            self._sync()
        qg = h.recent[-1] if query_groups is None else query_groups
        if h.lists is None or h.lists[0]._base is not self._pos:  # per-group views of row 0 (one slice a step)
            h.lists = list(self._pos[0].unbind(0))
        parts = [h.lists[g][:h.far[g]] for g in qg if h.far[g]]
        if len(parts) > 1:  # top-k > 1: a key in several of the query's groups is listed once
            parts = [torch.unique(torch.cat(parts))]
        sinks = [j for j in range(min(sink, h.far_len)) if not set(h.first[j]).intersection(qg)]
        if self._arange.numel() < self._len:
            self._arange = torch.arange(_pow2_at_least(self._len), dtype=torch.int32, device=self.device)
        if sinks:
            parts.insert(0, self._arange[:len(sinks)] if sinks[-1] == len(sinks) - 1 else
                         torch.tensor(sinks, dtype=torch.int32, device=self.device))
        if extra is not None and len(extra):  # keep those before the window, not first sinks, in no query group
            if h.every is None:
                h.every = _groups_of(self.membership[0].tolist())
            lo, qs, every = min(sink, h.far_len), set(qg), h.every
            extra = extra.tolist() if isinstance(extra, torch.Tensor) else extra
            far = [j for j in extra if lo <= j < h.far_len and qs.isdisjoint(every[j])]
            if far:
                parts.insert(0, torch.tensor(far, dtype=torch.int32, device=self.device))
        parts.append(self._arange[h.far_len:self._len])
        return torch.cat(parts) if len(parts) > 1 else parts[0]
