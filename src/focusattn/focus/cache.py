"""``RoutingCache``: one layer's routing state between forwards (prefill / decode step / reset).

Causal routing makes a token's groups final once computed, so generation routes only the new tokens of each step and
appends them to what the prefill routed. The cache holds, per attention layer:

* the layer input of the forward in flight (stored by the host integration's pre-hook, taken by the attention call);
* the soft groups ``[B, T, K]`` of every token routed since the last full no-grad forward (grown in amortised
  O(new tokens), no re-concatenation per step);
* with hard top-k, a :class:`~focusattn.kernels.group_index.GroupIndex` over their membership, so a decode step
  reads only its own groups' keys.

:meth:`route` is the one entry: a full forward (``tq == tk``) is a prefill, anything else a decode step.
While the window covers every key of a call (``tk - 1 <= window``: a short prompt, and the decode steps that keep
the cache that short) the mask keeps every causal pair whatever the groups, so, at inference, routing is deferred:
the layer inputs are kept and routed in one batch by the first call that needs groups (or a reader), exactly as a
prefill of them would route them; such a call is the original attention (:class:`CallRouting` with no routing).
:meth:`groups` / :meth:`membership` / :meth:`last` read the routing of the last forward (and the decode steps
after it) for analysis; they are what ``hf.last_routing(model)`` returns.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.group_index import GroupIndex
from .router import FocusRouter, Routing


def _pow2_at_least(n: int) -> int:
    return 1 << max(4, (max(1, n) - 1).bit_length())


class _Rows:
    """A ``[B, T, K]`` tensor grown along T: capacity doubles, so appending t rows costs O(t) amortised."""

    def __init__(self, x: torch.Tensor):
        self._buf, self._len = x, x.shape[1]  # no copy until the first append

    def __len__(self) -> int:
        return self._len

    def append(self, x: torch.Tensor) -> None:
        n = self._len + x.shape[1]
        if n > self._buf.shape[1]:
            buf = x.new_empty(x.shape[0], _pow2_at_least(n), x.shape[2])
            buf[:, :self._len] = self._buf[:, :self._len]
            self._buf = buf
        self._buf[:, self._len:n] = x
        self._len = n

    def view(self) -> torch.Tensor:
        return self._buf[:, :self._len]


@dataclass
class CallRouting:
    """What one attention call needs: ``routing`` covers all ``Tk`` keys (hard decode: the new tokens' groups and
    every key's membership; None: deferred, see the module docstring); ``group_index`` over the keys (hard decode
    steps only); ``trimmed``: the host's KV cache kept only its last keys (sliding-window layers), so ``routing``
    was cut to them and no sink applies."""

    routing: Routing | None  # None: deferred (the window covers the call: it is the original attention)
    group_index: GroupIndex | None = None
    trimmed: bool = False


class RoutingCache:
    """Routing state of one attention layer between forwards; see the module docstring."""

    def __init__(self):
        self._hidden: torch.Tensor | None = None
        self._row_keys: torch.Tensor | None = None  # [B, Hkv * D], each row's last key: see follow_rows
        self.reset()

    # ------------------------------------------------------------------------------------------- host side
    def set_hidden(self, h: torch.Tensor | None) -> None:
        """Store the layer input of the forward in flight (called by the host's forward pre-hook)."""
        self._hidden = h

    def take_hidden(self) -> torch.Tensor:
        """The stored layer input, cleared so a stale one is never reused."""
        h, self._hidden = self._hidden, None
        if h is None:
            raise RuntimeError("Focus router received no hidden state: was the forward pre-hook removed?")
        return h

    def reset(self) -> None:
        """Forget every cached token (a config change, a new generation)."""
        self._groups: _Rows | None = None  # bool for a key-space router (Routing.groups_hard): read back as float
        self._index: GroupIndex | None = None
        self._prefill_membership: torch.Tensor | None = None
        self._scores: _Rows | None = None  # router logits, kept for online rebalancing (cfg.rebalance)
        self._qscores: _Rows | None = None  # the queries' logits, the same for cfg.query_proj
        self._valid: _Rows | None = None  # their padding mask [B, T, 1] (None: every token real)
        self._memo: dict = {}  # rebalancing boundary -> potentials
        self._global: _Rows | None = None  # global keys [B, T, 1] (cfg.global_rate > 0)
        self._global_list: list[int] | None = None  # their positions in row 0 (one sequence), built when first read
        self._query: _Rows | None = None  # query memberships [B, T, K] with query and key roles (cfg.key_top_k)
        self._pending: tuple | None = None  # deferred (router, layer inputs [B, T, d], prefill padding mask or None)

    def follow_rows(self, key: torch.Tensor, tq: int) -> None:
        """Refuse a decode step whose KV cache had its batch rows reordered since the last call (beam search, or any
        loop that gathers cache rows): the cached routing belongs to the rows as they were and cannot follow.

        ``key`` [B, Hkv, Tk, D] is the layer's keys for this call, the last ``tq`` of them new. Each row's last key
        is remembered; at a decode step the row's key before the new ones must be nearer to that row's own record
        than to any other row's (exact after a gather; tolerant of a cache that re-quantises keys). Batches of one
        row cannot be reordered and cost nothing."""
        b = key.shape[0]
        prev = self._row_keys
        self._row_keys = key[:, :, -1].detach().flatten(1).float().clone() if b > 1 else None
        if prev is None or tq == key.shape[2] or prev.shape[0] != b:
            return
        dist = torch.cdist(key[:, :, -tq - 1].detach().flatten(1).float(), prev,  # [B now, B recorded]
                           compute_mode="donot_use_mm_for_euclid_dist")  # exact: equal rows tie, never win
        if bool((dist.min(dim=1).values < dist.diagonal()).any()):
            raise RuntimeError("the KV cache's batch rows were reordered (beam search?): Focus routing does not "
                               "follow reorders; generate with greedy search or sampling")

    # ------------------------------------------------------------------------------------------- routing
    def route(self, router: FocusRouter, h: torch.Tensor, tk: int, *, key_padding_mask: torch.Tensor | None = None,
              sliding_window: int | None = None, keep: bool = True, defer: bool = False) -> CallRouting:
        """Route the ``tq = h.shape[1]`` new tokens of a call over ``tk`` keys. ``tq == tk``: a prefill (remembered
        when ``keep``: pass False while building an autograd graph); else a decode step appended to the cache.
        ``key_padding_mask`` [B, Tk] (prefill only) keeps padding out of the routing statistics. ``defer``: the
        caller can run the call as the original attention, so a call the window covers may leave its routing for
        later (module docstring); the result's routing is then None."""
        tq = h.shape[1]
        if keep and defer and tk - 1 <= router.cfg.window and router.defers():
            if tq == tk:
                self.reset()
                self._pending = (router, h, key_padding_mask)
                return CallRouting(None)
            if self._pending is not None and self._pending[1].shape[1] + tq == tk:
                r, past, kpm = self._pending
                self._pending = (r, torch.cat([past, h], 1), kpm)
                return CallRouting(None)
        if tq < tk:
            self._flush()
        if tq == tk:
            memo: dict = {}
            routing = router(h, mask=key_padding_mask, start=0, memo=memo)
            return CallRouting(self.prefill(routing, keep=keep, valid=key_padding_mask, memo=memo))
        if router.cfg.routing == "sequence":
            raise ValueError("decoding with a KV cache needs FocusConfig.routing='causal' (sequence routing sees the "
                             "future); compose with routing='causal'")
        start = len(self._groups) if self._groups is not None else tk - tq  # absolute (a trimmed KV cache: tk < it)
        if keep and self._groups is not None and (not router.cfg.rebalance or (  # inference (no graph): the
                self._scores is not None and len(self._scores) == start)):  # router's lean step where it applies
            routing = router.decode(h, start, self._memo)
            if routing is not None:
                return self.step(routing, tk, sliding_window=sliding_window)
        past = None
        if router.cfg.rebalance:
            if self._scores is None or len(self._scores) != start:
                raise RuntimeError("online rebalancing needs the router scores of every cached token: start "
                                   "generation with a full prefill after setting rebalance")
            past = (self._scores.view(), None if self._valid is None else self._valid.view()[..., 0],
                    None if self._qscores is None else self._qscores.view())
        return self.step(router(h, start=start, past=past, memo=self._memo), tk,
                         sliding_window=sliding_window)

    def _flush(self) -> None:
        """Route the deferred layer inputs as one prefill (evaluation mode, no graph): the routing a prefill of
        those tokens would have given, online rebalancing included."""
        if self._pending is None:
            return
        router, h, valid = self._pending
        self._pending = None
        if valid is not None and valid.shape[1] < h.shape[1]:  # the decode steps' tokens are real
            valid = torch.cat([valid, valid.new_ones(valid.shape[0], h.shape[1] - valid.shape[1])], 1)
        memo: dict = {}
        was = router.training
        router.training = False  # a reader in training mode must not update the router's statistics
        try:
            with torch.no_grad():
                routing = router(h, mask=valid, start=0, memo=memo)
        finally:
            router.training = was
        self.prefill(routing, keep=True, valid=valid, memo=memo)

    def prefill(self, routing: Routing, *, keep: bool = True, valid: torch.Tensor | None = None,
                memo: dict | None = None) -> Routing:
        """A full forward's routing; with ``keep`` it replaces the cache (the start of a generation)."""
        if keep:
            self._groups = _Rows(routing.membership if routing.groups_hard else routing.groups)
            self._index = None  # built from _prefill_membership by the first decode step (a prefill-only
            self._prefill_membership = routing.membership  # workload, e.g. evaluation, never pays for it)
            self._scores = None if routing.scores is None else _Rows(routing.scores)
            self._qscores = None if routing.query_scores is None else _Rows(routing.query_scores)
            self._valid = None if valid is None or routing.scores is None else _Rows(valid[..., None])
            self._memo = {} if memo is None else memo
            self._global = None if routing.global_keys is None else _Rows(routing.global_keys[..., None])
            self._global_list = None
            self._query = None if routing.query_membership is None else _Rows(routing.query_membership)
        return routing

    def cached(self, hard: bool) -> int:
        """Tokens held for hard (indexed) or soft routing; -1 when there is none of that kind."""
        self._flush()
        if hard:
            if self._index is None:
                return self._prefill_membership.shape[1] if self._prefill_membership is not None else -1
            return len(self._index)
        return len(self._groups) if self._groups is not None else -1

    def step(self, routing: Routing, tk: int, *, sliding_window: int | None = None) -> CallRouting:
        """Append a decode step's routing (``tq`` new tokens) and return the routing of all ``tk`` keys."""
        tq = routing.groups.shape[1]
        hard = routing.membership is not None
        cached = self.cached(hard)
        # A sliding-window layer's KV cache keeps only its last keys (Gemma-2): every cached key is then inside the
        # model's window, and the true first token, outside it, is masked anyway, so no sink applies to that call.
        trimmed = sliding_window is not None and cached + tq > tk and cached >= 0
        if cached + tq != tk and not trimmed:
            raise RuntimeError(f"Focus routing cache holds {max(cached, 0)} tokens but the KV cache has {tk - tq}: "
                               "start generation with a full prefill (beam search reorders are not followed)")
        self._groups.append(routing.membership if routing.groups_hard else routing.groups)
        if self._scores is not None and routing.scores is not None:
            self._scores.append(routing.scores)
        if self._qscores is not None and routing.query_scores is not None:
            self._qscores.append(routing.query_scores)
        if self._valid is not None:
            self._valid.append(torch.ones_like(routing.groups[..., :1], dtype=torch.bool))
        glob = None
        if self._global is not None and routing.global_keys is not None:
            self._global.append(routing.global_keys[..., None])
            glob = self._global.view()[..., 0]
            if self._global_list is not None:  # kept in step while it exists (one sequence)
                new, at = routing.global_keys[0], len(self._global) - tq  # absolute positions
                if tq == 1:
                    if bool(new[0]):
                        self._global_list.append(at)
                else:
                    self._global_list.extend((new.nonzero()[:, 0] + at).tolist())
        index = None
        if hard:  # per-group positions, appended in O(new tokens): the decode kernel never scans all T keys
            if self._index is None:
                self._index, self._prefill_membership = GroupIndex(self._prefill_membership), None
            index = self._index
            # the keys' groups (the queries', with roles, are this step's own); decided on the host: not read back
            index.append(routing.membership, None if routing.host_groups is None else [routing.host_groups])
            qmem = routing.query_membership
            if self._query is not None and qmem is not None:
                self._query.append(qmem)
            routing = Routing(routing.groups, index.membership, global_keys=glob, query_membership=qmem,
                              query_groups=routing.query_groups)
        else:  # soft: every key's groups, the new queries' own (cfg.query_proj)
            routing = Routing(self._groups_view(), None, global_keys=glob, query_groups=routing.query_groups)
        if trimmed:
            return CallRouting(Routing(routing.groups[:, -tk:],
                                       None if routing.membership is None else routing.membership[:, -tk:],
                                       query_membership=routing.query_membership, query_groups=routing.query_groups),
                               None, True)
        return CallRouting(routing, index)

    def global_positions(self) -> list[int] | None:
        """The positions of one sequence's global keys as Python ints (None: no global keys, or a batch), kept
        up to date by :meth:`step` once read: a decode step's key list takes them without scanning a ``[Tk]`` mask
        (:func:`focusattn.focus.attend.attend_one_token`)."""
        if self._global is None or self._global._buf.shape[0] != 1:
            return None
        if self._global_list is None:
            self._global_list = self._global.view()[0, :, 0].nonzero()[:, 0].tolist()
        return self._global_list

    # ------------------------------------------------------------------------------------------- readers
    def __len__(self) -> int:
        if self._pending is not None:
            return self._pending[1].shape[1]
        return len(self._groups) if self._groups is not None else 0

    def groups(self) -> torch.Tensor | None:
        """Soft groups ``[B, T, K]`` of every cached token (None before the first no-grad full forward)."""
        self._flush()
        return None if self._groups is None else self._groups_view()

    def _groups_view(self) -> torch.Tensor:
        v = self._groups.view()
        return v.float() if v.dtype == torch.bool else v

    def membership(self) -> torch.Tensor | None:
        """Hard top-k membership bool ``[B, T, K]`` of every cached token as a key (None in soft mode or before
        any)."""
        self._flush()
        return self._prefill_membership if self._index is None else self._index.membership

    def query_membership(self) -> torch.Tensor | None:
        """With query and key roles, every cached token's groups as a query ``[B, T, K]``; else None."""
        self._flush()
        return None if self._query is None else self._query.view()

    def last(self) -> Routing | None:
        """The cached routing as one :class:`Routing` (None before the first no-grad full forward)."""
        self._flush()
        if self._groups is None:
            return None
        return Routing(self.groups(), self.membership(),
                       global_keys=None if self._global is None else self._global.view()[..., 0],
                       query_membership=self.query_membership())
