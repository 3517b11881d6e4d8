"""``FocusRouter``: the per-layer learnable centroid router (the only trainable part of a Focus retrofit)."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.distributed as tdist
from torch import nn

from ..kernels.common import topk_membership
from .config import FocusConfig
from .sinkhorn import sinkhorn_potentials


@dataclass
class Routing:
    """One forward's routing for one layer. ``groups``: soft assignments [B, T, K] (rows sum to 1);
    ``membership``: bool [B, T, K] top-k membership (the tokens' groups *as keys*), or None in soft mode;
    ``query_membership``: with query and key roles (``cfg.key_top_k``), the queries' groups [B, Tq, K] (the last
    ``Tq`` tokens: all of them after a prefill, the new ones after a decode step); None = symmetric (a query's groups
    are its key groups). With ``cfg.query_proj`` ``groups`` are the *key* soft assignments and ``query_groups`` /
    ``query_scores`` the queries' own (the same ``Tq`` tokens), from the query projection."""

    groups: torch.Tensor
    membership: torch.Tensor | None
    scores: torch.Tensor | None = None  # the logits before offsets [B, T, K] (what online rebalancing needs later)
    global_keys: torch.Tensor | None = None  # bool [B, T]: keys every later query sees (cfg.global_rate > 0)
    global_logits: torch.Tensor | None = None  # [B, T] the global-key scorer's logits (with gradient in training)
    query_membership: torch.Tensor | None = None
    query_groups: torch.Tensor | None = None  # [B, Tq, K] the queries' soft assignments (cfg.query_proj), else None
    query_scores: torch.Tensor | None = None  # [B, Tq, K] their logits before offsets, kept like ``scores``
    host_groups: tuple[int, ...] | None = None  # one decode token's groups decided on the host (one_token_groups)
    # ``groups`` is exactly ``membership.float()`` (a key-space router: one group per key, no soft form), so a cache
    # keeps the bool membership instead (a quarter of the bytes: 6 MiB a layer less at 8192 tokens and K = 256)
    groups_hard: bool = False


def hard_memberships(scores: torch.Tensor, cfg: FocusConfig,
                     query_scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(key membership, query membership or None)`` bool [..., K] at the config's hard top-k. With roles both come
    from one ranking of ``scores``: a query's ``top_k`` groups are the first of its ``key_top_k`` key groups (so a
    token's query group is always one of its key groups, ties included). ``query_scores`` (``cfg.query_proj``): the
    queries rank their own scores instead (their group need not be one of their key groups)."""
    kk = cfg.served_key_top_k
    if query_scores is not None:
        return topk_membership(scores, kk), topk_membership(query_scores, cfg.top_k)
    if not cfg.roles:
        return topk_membership(scores, kk), None
    idx = scores.topk(max(kk, cfg.top_k), dim=-1).indices  # sorted, highest first
    zeros = torch.zeros(scores.shape, dtype=torch.bool, device=scores.device)
    return zeros.scatter(-1, idx[..., :kk], True), zeros.scatter(-1, idx[..., :cfg.top_k], True)


CAPACITY_BLOCK = 64  # positions that share one capacity decision (FocusConfig.capacity): a block of tokens is
# routed as one tensor op, so a prefill of T tokens costs T / 64 small steps per layer; a group may overshoot its cap
# by at most one block's tokens.


@torch.no_grad()
def served_memberships(groups: torch.Tensor, cfg: FocusConfig, query_groups: torch.Tensor | None = None, *,
                       mask: torch.Tensor | None = None, start: int = 0,
                       memo: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The hard memberships the config serves: :func:`hard_memberships`, under ``cfg.capacity`` when set: the
    tokens at positions ``start .. start + T - 1`` of block ``[s, s + CAPACITY_BLOCK)`` may not join a group whose
    key-membership count over the real tokens before ``s`` exceeds ``capacity`` times the balanced share; they rank
    only the other groups. ``memo["capacity"]`` carries the counts (``n`` tokens routed, their per-row counts
    ``run`` [B, K], the groups ``full`` at block start ``s``) from a prefill to the decode steps after it, which must
    follow it without a gap. ``query_groups`` (``cfg.query_proj``): the queries rank their own scores, uncapped (the
    cap bounds the keys a group holds)."""
    if not cfg.capacity:
        return hard_memberships(groups, cfg, query_groups)
    b, t, k = groups.shape
    state = None if memo is None or start == 0 else memo.get("capacity")
    if start > 0 and (state is None or state["n"] != start):
        raise ValueError(f"capacity needs the group counts of the {start} earlier tokens: start generation with a "
                         "full prefill after setting capacity")
    if state is not None and "run_host" in state:  # the host steps' counts (one_token_groups)
        state = {key: v for key, v in state.items() if key != "run_host"} | {
            "run": torch.tensor([state["run_host"]], dtype=torch.long, device=groups.device)}
    if state is None:
        state = {"n": 0, "s": 0, "run": torch.zeros(b, k, dtype=torch.long, device=groups.device),
                 "full": torch.zeros(b, k, dtype=torch.bool, device=groups.device)}
    run = state["run"]  # never written in place: each block makes a new tensor
    mems, qmems, pos = [], [], start
    while pos < start + t:
        s = pos // CAPACITY_BLOCK * CAPACITY_BLOCK
        full = state["full"]
        if s != state["s"]:  # a new block: its cap counts exactly the tokens before s (routed, no gap)
            full = run > cfg.capacity * run.sum(-1, keepdim=True) / k
            state = {key: v for key, v in state.items() if key != "full_host"} | {"s": s, "full": full}
        end = min(s + CAPACITY_BLOCK, start + t)
        g = groups[:, pos - start:end - start]
        g = g.masked_fill(full[:, None, :], -1.0)  # below any probability (no host sync on a GPU)
        qg = None if query_groups is None else query_groups[:, pos - start:end - start]
        mem, qmem = hard_memberships(g, cfg, qg)
        valid = mem if mask is None else mem & mask[:, pos - start:end - start, None]
        run = run + valid.sum(1)
        mems.append(mem)
        qmems.append(qmem)
        pos = end
    if memo is not None:
        memo["capacity"] = {**state, "n": start + t, "run": run}
    if len(mems) == 1:
        return mems[0], qmems[0]
    return torch.cat(mems, 1), None if qmems[0] is None else torch.cat(qmems, 1)


_ROWS: dict = {}  # (K, groups, device) -> a read-only bool membership row [1, 1, K] (never written in place)


def _row(k: int, gs: tuple, device) -> torch.Tensor:
    key = (k, gs, device)
    row = _ROWS.get(key)
    if row is None:
        row = torch.zeros(1, 1, k, dtype=torch.bool, device=device)
        row[0, 0, list(gs)] = True
        _ROWS[key] = row
    return row


def one_token_groups(groups: torch.Tensor, cfg: FocusConfig, *, start: int, memo: dict) -> tuple[int, ...] | None:
    """:func:`served_memberships` of one sequence's one new token (symmetric top-k), decided on the host, as the
    ascending tuple of its groups: one conversion of its K probabilities, the cap's counts kept as Python ints in
    ``memo["capacity"]``; the row is a cached constant (``_row``) and the group index takes the tuple as it is. A
    decode step at inference pays a few microseconds here instead of the general path's ~10 tensor ops. None where
    the tensor path must decide: a tie at the top-k boundary (its tie-break is the tensor op's), a new capacity
    block (the cap is re-evaluated there), or a state it does not hold."""
    k = cfg.num_groups
    kk = cfg.served_key_top_k
    state = None
    if cfg.capacity:
        state = memo.get("capacity")
        if state is None or state["n"] != start or start // CAPACITY_BLOCK * CAPACITY_BLOCK != state["s"]:
            return None
        full = state.get("full_host")
        if full is None:
            full = state["full_host"] = state["full"][0].tolist()
    p = groups[0, 0].tolist()
    if state is not None:
        p = [-1.0 if f else x for x, f in zip(p, full)]
    order = sorted(range(k), key=p.__getitem__, reverse=True)
    if kk < k and p[order[kk - 1]] == p[order[kk]]:
        return None
    gs = tuple(sorted(order[:kk]))
    if state is not None:
        run = state.get("run_host")
        if run is None:
            run = state["run"][0].tolist()
        run = list(run)
        for g in gs:
            run[g] += 1
        memo["capacity"] = {key: v for key, v in state.items() if key != "run"} | {"n": start + 1, "run_host": run}
    return gs


@torch.no_grad()
def online_offsets(logits: torch.Tensor, base: torch.Tensor, every: int, iters: int, *, start: int = 0,
                   past: torch.Tensor | None = None, past_valid: torch.Tensor | None = None,
                   mask: torch.Tensor | None = None, memo: dict | None = None, warm: bool = False) -> torch.Tensor:
    """Per-token offsets ``[B, T, K]`` for tokens at positions ``start .. start + T - 1`` (causal online rebalancing).

    A token at position p uses the Sinkhorn potentials of the sequence's tokens before ``s = (p // every) * every``
    (``base`` [B, K] when ``s == 0`` or no real token precedes ``s``): it never sees itself or a later token, and
    a prefill and the decode steps after it give the same offsets. ``past`` [B, start, K] / ``past_valid``: the
    earlier tokens' logits and padding mask (decode); ``memo`` maps ``s`` to its potentials so a decode step re-runs
    Sinkhorn only when it crosses a boundary. Tokens that all fall in one interval get its offsets as a broadcast
    view (read-only), so a decode step between boundaries is a dictionary lookup.

    ``warm``: each boundary's Sinkhorn starts from the previous boundary's potentials (a chain from the first
    boundary, still causal). Why: the router's logits are divided by a small tau, so Sinkhorn's assignment is
    nearly hard and ``iters`` steps from zero leave it far from balanced (measured on held-out news, 4096 tokens:
    the group cost was 2.6x the balanced one at 10 cold iterations, 1.2x at 10 warm ones, 1.1x at 100 cold ones).
    """
    b, t, k = logits.shape
    first, last = max(1, start // every), (start + t - 1) // every
    if start // every == last:  # every token in one interval (a decode step): one row of offsets, broadcast
        pot = base if last == 0 else None if memo is None else memo.get(last * every)
        if pot is not None:
            return pot.to(logits.dtype)[:, None, :].expand(b, t, k)
    out = base.to(logits.dtype)[:, None, :].expand(b, t, k).clone()
    if last < first:
        return out
    memo = {} if memo is None else memo
    full = full_valid = None

    def potentials(c: int) -> torch.Tensor:
        nonlocal full, full_valid
        if c * every in memo:
            return memo[c * every]
        j = c  # with warm starts, first compute the earlier boundaries of the chain that are not known yet
        while warm and j > 1 and (j - 1) * every not in memo:
            j -= 1
        if full is None:
            full = logits if past is None else torch.cat([past.to(logits.dtype), logits], 1)
            if mask is not None or past_valid is not None:
                pv = past_valid if past_valid is not None else logits.new_ones(b, start, dtype=torch.bool)
                mv = mask if mask is not None else logits.new_ones(b, t, dtype=torch.bool)
                full_valid = torch.cat([pv[:, :start], mv], 1) if past is not None else mv
        for i in range(j, c + 1):
            s = i * every
            init = memo[(i - 1) * every] if warm and i > 1 else None
            v = None if full_valid is None else full_valid[:, :s]
            pot = sinkhorn_potentials(full[:, :s].detach(), iters, v, init=init)
            if v is not None:  # a row with no real token before s keeps the learned offsets
                pot = torch.where(v.any(1, keepdim=True), pot, base.to(pot.dtype).expand_as(pot))
            memo[s] = pot
        return memo[c * every]

    for c in range(first, last + 1):
        s = c * every
        pot = potentials(c)
        lo, hi = max(s, start) - start, min(s + every, start + t) - start
        out[:, lo:hi] = pot[:, None, :].to(out.dtype)
    return out


def _in_backward() -> bool:
    """True while autograd runs a backward pass: activation checkpointing then *re-runs* this forward, which must
    reproduce the original computation and must not update the offsets a second time."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def balance_loss(groups: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Switch-style load balance ``K * sum_g f_g * P_g`` of the assignment actually served (1 when balanced).

    ``f_g``: share of tokens whose top group is g (no gradient), ``P_g``: mean soft probability of g. Causal routing
    gets no balancing gradient from Sinkhorn (its potentials are computed without one), and the language-model loss
    alone rewards putting every token in one group (that keeps every pair), so the router needs this pressure to keep
    the groups, and with them the sparse kernels' cost, balanced.
    """
    k = groups.shape[-1]
    flat = groups.reshape(-1, k).float()
    if mask is not None:
        flat = flat[mask.reshape(-1)]
    f = torch.bincount(flat.argmax(-1), minlength=k).to(flat.dtype) / max(1, flat.shape[0])
    return k * (f * flat.mean(0)).sum()


def _mean_over_ranks(x: torch.Tensor) -> torch.Tensor:
    """The batch statistic of the *global* batch under data parallelism (like SyncBatchNorm): every rank's batch is
    the same size, so the mean of the ranks' means is the global mean and each rank keeps the same offsets as one
    process with the whole batch. A no-op without a process group."""
    if not (tdist.is_available() and tdist.is_initialized()) or tdist.get_world_size() == 1:
        return x
    x = x.clone()
    tdist.all_reduce(x)
    return x / tdist.get_world_size()


def position_draws(start: int, t: int, k: int, device, salt: int = 0) -> torch.Tensor:
    """Uniform draws ``[t, k]`` for absolute positions ``start .. start + t - 1`` (fixed seeds, chunks of 4096
    positions): the random baselines' groups, the same for a position in a prefill and in a decode step."""
    chunk, rows = 4096, []
    for c in range(start // chunk, (start + t - 1) // chunk + 1):
        g = torch.Generator().manual_seed(1_000_003 * k + c + 7_919 * salt)
        rows.append(torch.rand(chunk, k, generator=g))
    return torch.cat(rows)[start - (start // chunk) * chunk:][:t].to(device)


class FocusRouter(nn.Module):
    """``scores = (W_g h) C^T / tau`` -> Sinkhorn-balanced soft groups, shared by every head of the layer
    (``cfg.router_hidden`` adds a small MLP's output to ``W_g h``).

    Causal routing keeps an EMA of the Sinkhorn per-group potentials (``offsets``, a buffer saved with the adapter).
    Training forwards update it from the batch; every forward (training included) assigns with the stored value, so a
    token's group never depends on other tokens of its sequence (with ``cfg.rebalance``: on earlier tokens only).
    ``cfg.query_proj`` adds the query role's projection ``proj_q`` (W_q) onto the same centroids, with its own
    offsets ``q_offsets`` learned the same way: the queries are balanced over the groups like the keys.
    """

    def __init__(self, d_model: int, cfg: FocusConfig):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(d_model, cfg.group_dim, bias=False)  # W_g
        self.centroids = nn.Parameter(torch.randn(cfg.num_groups, cfg.group_dim) / math.sqrt(cfg.group_dim))  # C
        self.register_buffer("offsets", torch.zeros(cfg.num_groups))
        self.register_buffer("offsets_ready", torch.zeros((), dtype=torch.bool))
        self.proj_q = None
        if cfg.query_proj:  # a copy of W_g: an untrained asymmetric router serves the symmetric groups
            self.proj_q = nn.Linear(d_model, cfg.group_dim, bias=False)
            with torch.no_grad():
                self.proj_q.weight.copy_(self.proj.weight)
            self.register_buffer("q_offsets", torch.zeros(cfg.num_groups))
        self.mlp = None
        if cfg.router_hidden:  # W_2 at zero: an untrained MLP serves the linear router's groups
            self.mlp = nn.Sequential(nn.Linear(d_model, cfg.router_hidden), nn.GELU(),
                                     nn.Linear(cfg.router_hidden, cfg.group_dim, bias=False))
            nn.init.zeros_(self.mlp[2].weight)
        self.globals = None  # the global-key scorer: one logit per token from its own layer input
        if cfg.global_rate > 0:
            self.globals = nn.Linear(d_model, 1)
            # logits above this are global keys: an EMA of training batches' (1 - rate) quantile, like the offsets
            self.register_buffer("global_threshold", torch.zeros(()))
        self.pending_threshold: torch.Tensor | None = None
        # The routing of cached tokens during generation is not kept here: see focus.cache.RoutingCache.
        self.pending_offsets: torch.Tensor | None = None  # last training batch's potentials, not yet in the EMA
        self.pending_q_offsets: torch.Tensor | None = None  # the same for the queries (cfg.query_proj)
        self.balance: torch.Tensor | None = None  # last training forward's load-balance loss (see balance_loss)
        self.largest_share: float | None = None  # last training forward's share of tokens in the largest group

    def _features(self, h: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """``W h`` [B, T, d_g], plus the MLP's ``W_2 gelu(W_1 h + b_1)`` with ``cfg.router_hidden``. F.linear, not
        the submodules' __call__ (hooks machinery, per layer and decode step)."""
        F = torch.nn.functional
        h = h.to(w.dtype)
        f = F.linear(h, w)
        if self.mlp is not None:
            f = f + F.linear(F.gelu(F.linear(h, self.mlp[0].weight, self.mlp[0].bias)), self.mlp[2].weight)
        return f

    def scores(self, h: torch.Tensor) -> torch.Tensor:
        """Logits ``(W_g h) C^T / tau`` [B, T, K] (tau applied once; Sinkhorn works on these directly)."""
        return self._features(h, self.proj.weight) @ self.centroids.t() / self.cfg.tau

    def scores_q(self, h: torch.Tensor) -> torch.Tensor:
        """The queries' logits ``(W_q h) C^T / tau`` [B, T, K] (``cfg.query_proj``): the same centroids."""
        return self._features(h, self.proj_q.weight) @ self.centroids.t() / self.cfg.tau

    def _offsets(self, logits, learned, batch_b, mask, start, past, memo) -> torch.Tensor:
        """The causal offsets ``[B, K]`` or ``[B, T, K]`` one role (keys, or queries with ``cfg.query_proj``)
        assigns with: learned from *earlier* batches (the very first batch has none: it uses its own ``batch_b``),
        re-estimated online over the earlier tokens (``past``: their scores, padding mask) with ``cfg.rebalance``."""
        cfg = self.cfg
        b = learned if bool(self.offsets_ready) or batch_b is None else batch_b
        b = b.to(logits.dtype).expand(logits.shape[0], -1)
        if cfg.rebalance:
            if start > 0 and (past is None or past[0] is None or past[0].shape[1] != start):
                raise ValueError(f"online rebalancing needs the scores of the {start} earlier tokens")
            b = online_offsets(logits, b, cfg.rebalance, cfg.sinkhorn_iters, start=start,
                               past=None if past is None else past[0], past_valid=None if past is None else past[1],
                               mask=mask, memo=memo, warm=cfg.rebalance_warm)
        return b

    def forward(self, h: torch.Tensor, mask: torch.Tensor | None = None, start: int = 0,
                past: tuple | None = None, memo: dict | None = None) -> Routing:
        """``h`` [B, T, d]: the layer input of positions ``start .. start + T - 1``. ``past``: the earlier tokens'
        ``(scores [B, start, K], padding mask or None)`` (with ``cfg.query_proj`` a third entry, their query scores)
        and ``memo`` (see :func:`online_offsets`; the queries' potentials go in its sub-dict ``memo["q"]``), needed
        only with ``cfg.rebalance`` when ``start > 0``."""
        cfg = self.cfg
        if cfg.routing == "random":
            return self._random(h.shape[0], h.shape[1], start, h.device)
        logits = self.scores(h)
        qlogits = qgroups = None
        if cfg.routing == "sequence":
            b = sinkhorn_potentials(logits, cfg.sinkhorn_iters, mask)  # differentiable, sees the whole sequence
        else:
            if self.proj_q is not None:
                qlogits = self.scores_q(h)
            batch_b = batch_q = None
            if self.training:
                with torch.no_grad():
                    batch_b = _mean_over_ranks(sinkhorn_potentials(logits.detach(), cfg.sinkhorn_iters, mask).mean(0))
                    if qlogits is not None:
                        batch_q = _mean_over_ranks(sinkhorn_potentials(qlogits.detach(), cfg.sinkhorn_iters,
                                                                       mask).mean(0))
                if not _in_backward():
                    # Apply the previous batch's statistics now, not during this step: activation checkpointing
                    # re-runs this forward inside backward, and it must see exactly the offsets used here.
                    self.flush_offsets()
                    self.pending_offsets, self.pending_q_offsets = batch_b, batch_q
            b = self._offsets(logits, self.offsets, batch_b, mask, start, past, memo)
            if qlogits is not None:
                qb = self._offsets(qlogits, self.q_offsets, batch_q, mask, start,
                                   None if past is None else (past[2] if len(past) > 2 else None, past[1]),
                                   None if memo is None else memo.setdefault("q", {}))
                qgroups = torch.softmax(qlogits + (qb[:, None, :] if qb.dim() == 2 else qb), dim=-1)
        if b.dim() == 2:
            b = b[:, None, :]
        groups = torch.softmax(logits + b, dim=-1)
        if self.training:  # computed in a checkpointing re-run too: the re-run must save the same tensors
            bal = balance_loss(groups, mask) if qgroups is None else \
                (balance_loss(groups, mask) + balance_loss(qgroups, mask)) / 2
        if self.training and not _in_backward():
            self.balance = bal
            self.largest_share = float(groups.detach().argmax(-1).flatten().bincount().max()) / groups[..., 0].numel()
        membership = qmem = None
        if cfg.top_k is not None:
            membership, qmem = served_memberships(groups, cfg, qgroups, mask=mask, start=start, memo=memo)
        glob = gl = None
        if self.globals is not None:
            gl = self.globals(h.to(self.globals.weight.dtype)).squeeze(-1)
            thr = self.global_threshold
            if self.training:
                with torch.no_grad():
                    vals = gl.detach() if mask is None else gl.detach()[mask]
                    batch_thr = _mean_over_ranks(torch.quantile(vals.float().flatten()[:1 << 24], 1 - cfg.global_rate))
                if not _in_backward():
                    self.pending_threshold = batch_thr
                if not bool(self.offsets_ready):
                    thr = batch_thr
            glob = gl.detach() > thr
        # the logits are kept (by the routing cache) only when online rebalancing will need them in decode steps
        keep = cfg.rebalance and qlogits is not None
        return Routing(groups, membership, logits.detach() if cfg.rebalance else None, glob, gl, qmem, qgroups,
                       qlogits.detach() if keep else None)

    @torch.no_grad()
    def served(self, h: torch.Tensor, top_k: int, key_top_k: int | None = None) -> Routing:
        """The hard routing this router serves on layer input ``h`` (one full sequence) at query top-``top_k`` /
        key top-``key_top_k`` (None = symmetric), whatever top-k its config serves: the cap and global keys
        included. For analyses that compare masks at several budgets on one input."""
        old = self.cfg
        self.cfg = dataclasses.replace(old, top_k=top_k, key_top_k=key_top_k)
        try:
            return self(h)
        finally:
            self.cfg = old

    def defers(self) -> bool:
        """Hard causal routing in evaluation mode: the routing of a token then depends on its own layer input (and
        earlier tokens' scores) only, global keys included (the learned threshold), so it may wait
        (``RoutingCache`` defers calls the window covers) and a decode step may take :meth:`decode`."""
        cfg = self.cfg
        return not self.training and cfg.routing == "causal" and cfg.top_k is not None

    def decode(self, h: torch.Tensor, start: int, memo: dict) -> Routing | None:
        """What :meth:`forward` gives for a decode step's new tokens at inference (evaluation mode, no gradient,
        causal hard routing), without its general machinery: the per-step cost is the few tensor ops of the
        routing itself, not the Python around them. None where a step needs more: the first step of a new online
        rebalancing interval (Sinkhorn over the earlier tokens), sequence or random routing."""
        cfg = self.cfg
        if not self.defers():
            return None
        asym = self.proj_q is not None
        b, qb = self.offsets, self.q_offsets if asym else None
        if cfg.rebalance:
            c = start // cfg.rebalance
            if c != (start + h.shape[1] - 1) // cfg.rebalance:
                return None
            if c > 0:
                b = memo.get(c * cfg.rebalance)
                qb = memo.get("q", {}).get(c * cfg.rebalance) if asym else None
                if b is None or (asym and qb is None):
                    return None
                b, qb = b[:, None, :], None if qb is None else qb[:, None, :]
        logits = self.scores(h)
        groups = torch.softmax(logits + b.to(logits.dtype), dim=-1)
        qlogits = qgroups = None
        if asym:
            qlogits = self.scores_q(h)
            qgroups = torch.softmax(qlogits + qb.to(qlogits.dtype), dim=-1)
        membership = gs = None
        if not cfg.roles and h.shape[0] == 1 and h.shape[1] == 1 and h.device.type == "cpu":
            # on the host where the host is the device; on a GPU the conversion would be a sync per layer
            gs = one_token_groups(groups, cfg, start=start, memo=memo)
            membership, qmem = (None, None) if gs is None else (_row(cfg.num_groups, gs, h.device), None)
        if membership is None:
            membership, qmem = served_memberships(groups, cfg, qgroups, start=start, memo=memo)
        glob = None
        if self.globals is not None:  # forward's rule at evaluation: above the learned threshold
            w = self.globals.weight
            glob = torch.nn.functional.linear(h.to(w.dtype), w, self.globals.bias).squeeze(-1) > self.global_threshold
        keep = bool(cfg.rebalance)
        return Routing(groups, membership, logits if keep else None, glob, query_membership=qmem,
                       query_groups=qgroups, query_scores=qlogits if keep and asym else None, host_groups=gs)

    @torch.no_grad()
    def _random(self, batch: int, t: int, start: int, device) -> Routing:
        """Baseline routing: groups drawn per absolute position (fixed seed, chunks of 4096 positions), so the same
        position gets the same groups in prefill and decode, whatever the text."""
        k = self.cfg.num_groups
        scores = position_draws(start, t, k, device)
        groups = torch.nn.functional.one_hot(scores.argmax(-1), k).float().expand(batch, t, k)
        membership = qmem = None
        if self.cfg.top_k is not None:
            membership, qmem = hard_memberships(scores, self.cfg)
            membership = membership.expand(batch, t, k).contiguous()
            qmem = None if qmem is None else qmem.expand(batch, t, k).contiguous()
        return Routing(groups, membership, query_membership=qmem)

    @torch.no_grad()
    def flush_offsets(self) -> None:
        """Fold the last training batch's Sinkhorn potentials into the EMA offsets (idempotent)."""
        b, self.pending_offsets = self.pending_offsets, None
        thr, self.pending_threshold = self.pending_threshold, None
        qb, self.pending_q_offsets = self.pending_q_offsets, None
        if b is None:
            return
        mom = self.cfg.offset_momentum
        if not bool(self.offsets_ready):
            self.offsets.copy_(b)
            if thr is not None:
                self.global_threshold.copy_(thr)
            if qb is not None:
                self.q_offsets.copy_(qb)
            self.offsets_ready.fill_(True)
        else:
            self.offsets.mul_(mom).add_((1 - mom) * b)
            if thr is not None:
                self.global_threshold.mul_(mom).add_((1 - mom) * thr)
            if qb is not None:
                self.q_offsets.mul_(mom).add_((1 - mom) * qb)

    def train(self, mode: bool = True):
        if not mode:
            self.flush_offsets()  # evaluation uses everything learned so far
        return super().train(mode)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
