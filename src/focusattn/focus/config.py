"""``FocusConfig``: every Focus knob in one validated, typed place."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from .._errors import InputError
from ..kernels.backends import BACKENDS  # names defined by the layer that implements them
from ..kernels.soft import GATES

ROUTINGS = ("causal", "sequence", "random")  # implemented by router.FocusRouter
ROUTER_INPUTS = ("hidden", "keys")  # router.FocusRouter, key_router.KeyRouter
KEY_SCORES = ("centroids", "means")  # what a key-space router's queries score (key_router.KeyRouter)


@dataclass(frozen=True)
class FocusConfig:
    """Focus routing and gating.

    num_groups (K), group_dim (d_g), window (w), tau, sinkhorn_iters: the paper's knobs (App. B defaults).
    gate: soft training gate, ``"log"`` (logit + log sigmoid(lam*(a - gate_offset)), tends to the hard mask) or
        ``"multiplicative"`` (paper Eq. 2, logit * sigmoid(lam*(a - gate_offset))). See README "Design decisions".
    lam, gate_offset: gate sharpness and the affinity at which the gate is one half (0 reproduces Eq. 2 as written).
    routing: ``"causal"`` (per-group Sinkhorn offsets learned in training, frozen at evaluation: a token's group
        depends on that token alone), ``"sequence"`` (the paper's sequence-wide Sinkhorn, which sees the future) or
        ``"random"`` (a baseline: each position's groups drawn at random, balanced and causal, the router unused).
    top_k: ``None`` = soft gating; k = hard membership in the k highest-scoring groups (inference).
    key_top_k: separate query and key roles (not in the paper): ``None`` = symmetric (a token's groups as a key are
        its ``top_k`` groups as a query); k = each token is a *key* of its ``k`` highest-scoring groups and a
        *query* of its ``top_k`` (one router, the same scores). Only ``top_k=1`` is served exactly with roles (each
        pair is then counted in the query's one group; ``top_k=None``, the soft training gate, keeps the setting
        for when hard routing is served); e.g. ``top_k=1, key_top_k=2`` keeps about ``2/K`` of the
        distant pairs. See docs/DESIGN.md "Query and key roles".
    query_proj: the query role gets its own projection ``W_q`` onto the same centroids (not in the paper; causal
        routing, ``top_k`` None or 1): a token's query group is the top-1 of ``(W_q h) C^T / tau``, its key groups
        the top ``key_top_k`` (else ``top_k``) of ``(W_g h) C^T / tau``. Why: attention is asymmetric (q . k), and a
        retrieval lookup needs the query (token A) and the key *after* an earlier A in one group, which one shared
        ranking cannot express. ``W_q`` starts as a copy of ``W_g``, so an untrained one serves the symmetric groups.
    router_hidden: a small MLP beside the router's linear projection (not in the paper): a token's router features
        are ``W_g h + W_2 gelu(W_1 h + b_1)`` with ``W_1`` of ``router_hidden`` rows (and ``W_q h`` plus the same MLP
        for the query role with ``query_proj``). Why tried: a partition into K groups fitted on each window
        (scripts/partition_oracle.py) keeps 59% of the distant attention the global keys leave where the linear router
        keeps 36%. Measured: trained MLP routers, served with the cap, drop the same share as the linear one
        (docs/DECISIONS.md). ``W_2`` starts at zero, so an untrained MLP serves the linear router's groups (and a
        linear adapter continues exactly). 0 = linear.
    offset_momentum: EMA momentum of the causal per-group offsets.
    backend: kernel for hard top-k attention.
    sink_tokens: the first n real tokens stay visible to every query, like local pairs (attention sinks; not in the
        paper, whose mask is ``sink_tokens=0``; see README "Design decisions" for why and the measurement).
    rebalance: causal online rebalancing (not in the paper; ``routing="causal"`` only): from position n on, every n
        tokens the per-group offsets are re-estimated by Sinkhorn over the sequence's *own earlier* tokens, so groups
        stay balanced on text unlike the training corpus while a token's group still never depends on later tokens.
        0 = the offsets learned in training only. See README "Design decisions" for the measurement.
    rebalance_warm: each re-estimate starts from the previous one's potentials instead of zero (still causal), so
        ``sinkhorn_iters`` steps reach balance on the nearly hard assignments of a small tau (see
        ``router.online_offsets``). False keeps adapters saved before it serving exactly as measured.
    capacity: a hard cap on group sizes at hard top-k (not in the paper; causal routing): a token never joins a
        group that already holds more than ``capacity`` times the balanced share of the *earlier* tokens' key
        memberships, counted at the start of its block of ``router.CAPACITY_BLOCK`` positions (so it is causal, and
        a prefill and the decode steps after it give the same groups); it takes its best groups among the others.
        Why: online rebalancing only shifts soft scores, and routers trained on the attention objective still put
        0.3-0.6 of a text unlike their training corpus in one group of some layer (measured), which makes that
        layer's group part cost several times a balanced one's. The soft groups (training, the soft gate) are
        unchanged. 0 = off; else at least 1, and ``K / (K - k + 1)`` for key top-k ``k``, so enough groups stay open.
    global_rate: the share of tokens a learned scorer makes *global keys* (not in the paper): visible to every later
        query, like the sinks, chosen by each key's own layer input (causal). Measured reason: in SmolLM2 a few
        keys hold most of the attention paid beyond the window (docs/RESULTS.md, attention recall). 0 = off.
    router_input: what a token is routed by. ``"hidden"`` (the paper): its layer input, through ``W_g`` onto learned
        centroids. ``"keys"`` (not in the paper; ``focus.key_router.KeyRouter``): the layer's own keys and queries
        after RoPE: each key joins its nearest of K centroids fitted on the layer's keys (its KV heads side by side;
        ``group_dim`` is then that width, set by ``compose``), and each query takes groups in the order its
        KV-group-mean query scores their centroids until they hold ``budget`` of its distant keys (key top-1, query
        top-many: roles, no pair counted twice). Why: measured on held-out text, this keeps the distant attention a
        query needs within 1.5x of the oracle at the same budget where the learned router drops 2-3x as much (docs/
        DECISIONS.md, "Routing in the layer's own key space"). Hard routing only (``top_k=1``), causal.
    budget: with ``router_input="keys"``, the share of each query's distant keys (beyond the window, after the sinks)
        that its groups hold, in (0, 1]; 0 with ``"hidden"``.
    key_scores: with ``router_input="keys"``, what a query ranks groups by: ``"centroids"`` (the fitted ones) or
        ``"means"`` (the means of the group's keys in this sequence before the query's window, the centroid counted
        as one key; causal; ``KeyRouter._mean_scores``). Why ``"means"``: a key unlike the calibration text (a
        passkey's digits) joins a centroid without moving it, so no query ranks its group for it.
    rank_block: with ``router_input="keys"``, 0 (each query ranks the groups by its own scores) or ``B``: the
        queries of each block of ``B`` positions rank them by the mean scores of the previous block's queries
        (``KeyRouter._shared_scores``; causal), so they fill their budgets with prefixes of one order. Why: the keyed
        engine computes, per 64 queries (``kernels.decomposed.keyed.QUERY_BLOCK``, the block to use), every key of
        the groups any of them joined; with shared rankings that union is about one query's set.
    rank_own: with ``rank_block``, how many groups a query takes by its own scores before the block's shared order
        (0: none). Why: the shared order is the previous block's, so a lookup of the query's own (a passkey, a copy)
        is lost without it (measured: passkey 4/6 -> 2/6 at 2048 with ``rank_own=0``).
    union_block: with ``router_input="keys"``, 0 (each query keeps the groups it joined) or ``B``: a query also keeps
        every group that the earlier queries of its block of ``B`` real tokens joined, and every group of the block
        before (``KeyRouter._block_union``; causal, so decode = prefill). Why: the keyed engine computes, per 64
        queries (``kernels.decomposed.keyed.QUERY_BLOCK``, the block to use), every key of the groups any of them
        joined and masked each row down to its own; keeping them instead, a smaller ``budget`` keeps as much of the
        attention at less compute (measured on held-out text: docs/DECISIONS.md, "Queries keep their block's
        groups").
    min_keys: with ``router_input="keys"``, 0 or ``N``: each query's budget is at least ``N`` of its distant keys
        (all of them when it has fewer). Why: a share is stingy early in a sequence (at 2048 tokens 4% is a group
        or two), so short contexts lost most of their distant attention; a floor costs little at long context, where
        the share exceeds it (measured: docs/DECISIONS.md, "A floor under the budget").
    dense_heads: ``(layer, kv_head)`` pairs served with full causal attention, the original model's (not in the
        paper): every query head of that key/value head sees every earlier key, while the layer's other heads keep
        the routed mask; the router still runs for the layer. Why: a few heads copy from far back (induction /
        retrieval heads; DuoAttention, Xiao et al. 2024), and one group per token cannot route "the token after an
        earlier A" to a query A. Measured (attention-objective adapter, top-1, 2048 tokens): 6 of SmolLM2's 90 KV
        heads (``hf.heads.induction_heads``) take repeat-copy perplexity from 11.5 to 2.9, and 4 duplicate-token
        heads beside them (``hf.heads.scored_heads``) to 1.6, against the original's 1.45 (docs/results/
        long_eval_attention_g2_warm_copy10.json). () = every head routed.
    """

    num_groups: int = 8
    group_dim: int = 16
    window: int = 128
    tau: float = 0.1
    sinkhorn_iters: int = 10
    gate: str = "log"
    lam: float = 10.0
    gate_offset: float = 0.5
    routing: str = "causal"
    top_k: int | None = None
    key_top_k: int | None = None
    query_proj: bool = False
    router_hidden: int = 0
    offset_momentum: float = 0.9
    backend: str = "auto"
    sink_tokens: int = 1
    rebalance: int = 0
    rebalance_warm: bool = False
    capacity: float = 0.0
    global_rate: float = 0.0
    dense_heads: tuple[tuple[int, int], ...] = ()
    router_input: str = "hidden"
    budget: float = 0.0
    key_scores: str = "centroids"
    rank_block: int = 0
    rank_own: int = 0
    union_block: int = 0
    min_keys: int = 0

    def __post_init__(self):
        def bad(name, allowed):  # InputError: the command line names the flag (--window), Python the field
            raise InputError(name, getattr(self, name), f"allowed {allowed} (FocusConfig.{name})")

        if not isinstance(self.num_groups, int) or self.num_groups < 1:
            bad("num_groups", "an integer >= 1")
        if not isinstance(self.group_dim, int) or self.group_dim < 1:
            bad("group_dim", "an integer >= 1")
        if not isinstance(self.window, int) or self.window < 0:
            bad("window", "an integer >= 0")
        if not self.tau > 0:
            bad("tau", "a float > 0")
        if not isinstance(self.sinkhorn_iters, int) or self.sinkhorn_iters < 0:
            bad("sinkhorn_iters", "an integer >= 0")
        if self.gate not in GATES:
            bad("gate", GATES)
        if not self.lam > 0:
            bad("lam", "a float > 0")
        if not 0.0 <= self.gate_offset < 1.0:
            bad("gate_offset", "a float in [0, 1)")
        if self.routing not in ROUTINGS:
            bad("routing", ROUTINGS)
        if self.top_k is not None and (not isinstance(self.top_k, int) or not 1 <= self.top_k <= self.num_groups):
            bad("top_k", f"None or an integer in 1..num_groups ({self.num_groups})")
        if self.key_top_k is not None:
            if isinstance(self.key_top_k, bool) or not isinstance(self.key_top_k, int) \
                    or not 1 <= self.key_top_k <= self.num_groups:
                bad("key_top_k", f"None (symmetric) or an integer in 1..num_groups ({self.num_groups})")
            if self.top_k not in (None, 1):  # None: the soft gate (training), which serves no hard mask
                bad("key_top_k", f"None with top_k={self.top_k!r} (query and key roles are served exactly only with "
                    "top_k=1: set top_k=1, or key_top_k=None for symmetric routing)")
        if not isinstance(self.query_proj, bool):
            bad("query_proj", "True or False")
        if self.query_proj and self.top_k not in (None, 1):  # None: the soft gate (training)
            bad("query_proj", f"False with top_k={self.top_k!r} (an own query projection is served exactly only "
                "with top_k=1: set top_k=1, or query_proj=False for one shared ranking)")
        if self.query_proj and self.routing != "causal":
            bad("query_proj", f"False with routing={self.routing!r} (the query offsets are learned like the "
                "causal offsets)")
        if isinstance(self.router_hidden, bool) or not isinstance(self.router_hidden, int) or self.router_hidden < 0:
            bad("router_hidden", "an integer >= 0 (the router MLP's hidden width; 0 = the linear router)")
        if not 0.0 <= self.offset_momentum < 1.0:
            bad("offset_momentum", "a float in [0, 1)")
        if self.backend not in BACKENDS:
            bad("backend", BACKENDS)
        if not isinstance(self.sink_tokens, int) or self.sink_tokens < 0:
            bad("sink_tokens", "an integer >= 0")
        if isinstance(self.rebalance, bool) or not isinstance(self.rebalance, int) or self.rebalance < 0:
            bad("rebalance", "an integer >= 0 (tokens between re-estimates; 0 = off)")
        if not isinstance(self.rebalance_warm, bool):
            bad("rebalance_warm", "True or False")
        if self.rebalance_warm and not self.rebalance:
            bad("rebalance_warm", "False with rebalance=0 (warm starts chain the online re-estimates; set rebalance)")
        if isinstance(self.capacity, bool) or not isinstance(self.capacity, (int, float)) \
                or not (self.capacity == 0 or self.capacity >= 1):
            bad("capacity", "0 (off) or a float >= 1 (the largest group as a multiple of the balanced share)")
        if self.capacity and self.routing != "causal":
            bad("capacity", f"0 with routing={self.routing!r} (the cap counts earlier tokens: causal routing)")
        kk = self.served_key_top_k
        if self.capacity and kk is not None and self.capacity < self.num_groups / (self.num_groups - kk + 1):
            bad("capacity", f"0 or >= {self.num_groups / (self.num_groups - kk + 1):.4g} = K / (K - k + 1) with "
                f"key top-k {kk} (fewer open groups than a token joins)")
        if isinstance(self.global_rate, bool) or not isinstance(self.global_rate, (int, float)) \
                or not 0.0 <= self.global_rate < 1.0:
            bad("global_rate", "a float in [0, 1) (share of tokens made global keys; 0 = off)")
        if self.global_rate and self.routing != "causal":
            bad("global_rate", f"0 with routing={self.routing!r} (the global-key threshold is learned like the causal "
                "offsets)")
        if self.rebalance and self.routing != "causal":
            bad("rebalance", f"0 with routing={self.routing!r} (online rebalancing is a form of causal routing)")
        try:  # JSON gives lists: normalise to sorted unique (layer, kv_head) tuples, hashable like the rest
            heads = tuple(sorted({(int(p[0]), int(p[1])) for p in self.dense_heads
                                  if len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                         for x in p)}))
        except TypeError:
            heads = None
        if heads is None or len(heads) != len(self.dense_heads):
            bad("dense_heads", "distinct (layer, kv_head) pairs of integers >= 0, e.g. ((17, 1), (18, 2))")
        object.__setattr__(self, "dense_heads", heads)
        if self.router_input not in ROUTER_INPUTS:
            bad("router_input", ROUTER_INPUTS)
        if isinstance(self.budget, bool) or not isinstance(self.budget, (int, float)):
            bad("budget", "a float in (0, 1] with router_input='keys', else 0")
        if self.router_input == "hidden" and self.budget != 0:
            bad("budget", "0 with router_input='hidden' (the budget is the key-space router's; set router_input="
                "'keys')")
        if self.key_scores not in KEY_SCORES:
            bad("key_scores", KEY_SCORES)
        if self.router_input == "hidden" and self.key_scores != "centroids":
            bad("key_scores", "'centroids' with router_input='hidden' (the key-space router's choice)")
        if isinstance(self.rank_block, bool) or not isinstance(self.rank_block, int) or self.rank_block < 0:
            bad("rank_block", "0 or a positive number of positions (64 = the keyed engine's query block)")
        if isinstance(self.rank_own, bool) or not isinstance(self.rank_own, int) or self.rank_own < 0:
            bad("rank_own", "0 or a positive number of groups")
        if self.rank_own and not self.rank_block:
            bad("rank_own", "0 without rank_block (the groups a query takes before the block's shared order)")
        if self.router_input == "hidden" and self.rank_block:
            bad("rank_block", "0 with router_input='hidden' (the key-space router's choice)")
        if isinstance(self.union_block, bool) or not isinstance(self.union_block, int) or self.union_block < 0:
            bad("union_block", "0 or a positive number of positions (64 = the keyed engine's query block)")
        if self.router_input == "hidden" and self.union_block:
            bad("union_block", "0 with router_input='hidden' (the key-space router's choice)")
        if isinstance(self.min_keys, bool) or not isinstance(self.min_keys, int) or self.min_keys < 0:
            bad("min_keys", "0 or a positive number of distant keys (a floor under each query's budget)")
        if self.router_input == "hidden" and self.min_keys:
            bad("min_keys", "0 with router_input='hidden' (the key-space router's choice)")
        if self.router_input == "keys":
            if not 0 < self.budget <= 1:
                bad("budget", "a float in (0, 1] with router_input='keys' (the share of each query's distant keys)")
            if self.top_k != 1:
                bad("top_k", "1 with router_input='keys' (each key in its nearest centroid; the queries' groups "
                    "follow the budget; there is no soft gate)")
            if self.routing not in ("causal", "random"):
                bad("routing", "'causal' (the fitted centroids) or 'random' (the baseline: random groups, the same "
                    "budget) with router_input='keys'")
            for name, off in (("key_top_k", None), ("query_proj", False), ("router_hidden", 0),
                              ("rebalance", 0), ("capacity", 0), ("global_rate", 0)):
                if getattr(self, name) != off:
                    bad(name, f"{off!r} with router_input='keys' (the key-space router serves none other)")

    @property
    def roles(self) -> bool:
        """Hard routing whose query and key memberships differ (an own query projection, the key-space router, or
        ``key_top_k`` set and not equal to ``top_k``)."""
        return self.top_k is not None and (self.query_proj or self.router_input == "keys"
                                           or (self.key_top_k is not None and self.key_top_k != self.top_k))

    def dense_kv_heads(self, layer: int) -> tuple[int, ...]:
        """The key/value heads of ``layer`` served with full causal attention (``dense_heads``)."""
        return tuple(h for (i, h) in self.dense_heads if i == layer)

    @property
    def served_key_top_k(self) -> int | None:
        """The groups a token holds as a key at hard top-k (``key_top_k``, else ``top_k``)."""
        return self.top_k if self.key_top_k is None else self.key_top_k

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FocusConfig":
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown FocusConfig keys {sorted(unknown)}; known: {sorted(known)}")
        return cls(**d)
