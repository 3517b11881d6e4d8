"""Router objectives against the frozen model's own attention (``retrofit --objective attention``).

Why: the LM and distillation objectives run the whole model forward *and backward* through 30 layers to train 0.2% of
the weights (about a minute per 2048-token step here), so routers saw 100 steps at 2048 tokens. Peers train their
selectors against the frozen model's attention instead (DeepSeek's sparse-attention indexer warm-up: a KL to the
main attention, summed over heads; SeerAttention: gates distilled from pooled attention maps). Here one no-grad
forward of the original model (:func:`..hf.probe.capture`) gives each layer's input and its attention; every
router is then trained on its own layer with no backward through the model, and a window's targets can be reused
(``pool``) because the frozen model's attention never changes.

The loss of a query ``i`` is the cross-entropy from the original's distant attention (head mean, its ``M`` most
attended distant keys, renormalised) to the routing's normalised affinity over the distant keys,
``a_ij / sum_j' a_ij'`` with ``a_ij = g_i . g_j`` the probability that two soft assignments share a group. Sharing
a group with every distant key is as bad as sharing it with none, so the loss itself asks for groups, and queries
count by their distant mass (a query that attends locally needs nothing from its groups). A router with its own
query projection (``FocusConfig.query_proj``) uses ``a_ij = gq_i . gk_j``: the query's soft groups against the key's.

With global keys (``FocusConfig.global_rate``) the scorer is trained to pick the keys whose mean distant attention
from the queries after them (their *attraction*) is in the top ``global_rate`` share of the window (binary
cross-entropy), and the group loss leaves out the keys the scorer already makes global: groups serve the rest.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from ..kernels import recall as R
from ..kernels.common import topk_membership

OBJECTIVES = ("lm", "attention")
ATTN_LOSSES = ("ce", "mass")  # the attention objective's per-router loss (router_attention_loss, router_mass_loss)
EPS = 1e-9


@dataclass
class LayerTargets:
    """One layer's targets for a batch: ``h`` [B, T, d] its input (bf16 to halve a pool's memory), ``idx`` [B, T, M]
    the most attended distant keys (-1 = none), ``weight`` [B, T, M] their head-mean probability, ``mass`` [B, T]
    the query's whole distant mass, ``attraction`` [B, T] a key's mean distant attention over the queries that see
    it as distant (NaN for keys with fewer than ``MIN_SEEN`` such queries: no label)."""

    h: torch.Tensor
    idx: torch.Tensor
    weight: torch.Tensor
    mass: torch.Tensor
    attraction: torch.Tensor | None = None


MIN_SEEN = 32  # queries a key must be distant to before its attraction is a label
FIELDS = ("h", "idx", "weight", "mass", "attraction")  # LayerTargets' fields, in order (the on-disk cache's keys)

def layer_targets(h, q, k, *, window: int, sink: int, top_m: int, scale=None, softcap=None,
                  dense: torch.Tensor | None = None) -> LayerTargets:
    """Targets of one layer from its input and q/k (no gradient), rows in chunks. ``dense``: bool [Hq], query heads
    served dense (``FocusConfig.dense_heads``): they keep every pair whatever the groups, so the target is the other
    heads' mean (all heads when every head is dense: the routing then serves nothing and any target will do)."""
    if dense is not None and bool(dense.any()) and not bool(dense.all()):
        q = q[:, ~dense.to(q.device)]  # GQA: expand_kv maps the kept query heads to their own KV heads below
        k = k[:, ~dense.view(k.shape[1], -1)[:, 0].to(k.device)]
    b, _, t, _ = q.shape
    m = min(top_m, t)
    idx = torch.full((b, t, m), -1, dtype=torch.int32)
    weight = torch.zeros(b, t, m)
    mass = torch.zeros(b, t)
    cols = torch.zeros(b, t, dtype=torch.float64)
    for r0 in range(0, t, R.ROWS):
        r1 = min(t, r0 + R.ROWS)
        _, _, distant = R.pair_kinds(r0, r1, r1, window, sink, q.device)  # keys from r1 on are never seen:
        p = R.causal_probs(q, k[:, :, :r1], r0, r1, scale=scale, softcap=softcap).mean(1) * distant
        p = F.pad(p, (0, t - r1))  # padded after the head mean, 1/H of the memory traffic
        mass[:, r0:r1] = p.sum(-1).cpu()
        cols += p.sum(1).double().cpu()
        vals, ix = p.topk(m, dim=-1)
        weight[:, r0:r1] = vals.cpu()
        idx[:, r0:r1] = torch.where(vals > 0, ix, -1).to(torch.int32).cpu()
    seen = (t - torch.arange(t) - window - 1).clamp_min(0).double()  # queries to which key j is distant
    seen[:sink] = 0  # sinks are always kept: no label
    attraction = torch.where(seen >= MIN_SEEN, cols / seen.clamp_min(1), torch.nan).float()
    return LayerTargets(h.detach().to(torch.bfloat16).cpu(), idx, weight, mass, attraction)


@torch.no_grad()
def attention_targets(model, x: torch.Tensor, *, top_m: int) -> list[LayerTargets]:
    """One no-grad forward of composed ``model`` as the original (``hf.probe.capture``): every layer's targets."""
    from ..focus.attend import dense_query_heads
    from ..hf import focus_config, routers
    from ..hf.probe import capture

    cfg = focus_config(model)
    out: list[LayerTargets | None] = [None] * len(routers(model))

    def fn(layer, module, h, q, k, scale, softcap):
        dense = dense_query_heads(cfg, layer, q.shape[1], k.shape[1], q.device)
        out[layer] = layer_targets(h, q, k, window=cfg.window, sink=cfg.sink_tokens, top_m=top_m, scale=scale,
                                   softcap=softcap, dense=dense)

    with capture(model, fn):
        model(x, logits_to_keep=1)
    return out


def distant_sums(groups: torch.Tensor, window: int, sink: int) -> torch.Tensor:
    """``S[b, i] = sum of groups[b, j]`` over query i's distant keys (``sink <= j < i - window``), ``[B, T, K]``, by
    a prefix sum: the normaliser of the affinity without any ``T x T`` tensor."""
    t = groups.shape[1]
    c = F.pad(torch.cumsum(groups, 1), (0, 0, 1, 0))  # c[:, n] = sum over j < n
    hi = (torch.arange(t, device=groups.device) - window).clamp_min(0)
    lo = min(sink, t)
    s = c[:, hi] - c[:, lo:lo + 1]
    return s * (hi > lo).to(s.dtype)[None, :, None]


@torch.no_grad()
def top1_budget(groups: torch.Tensor, window: int, sink: int, global_keys: torch.Tensor | None = None) -> float:
    """The mean share of a query's distant keys (``sink <= j < i - window``) that hard top-1 of ``groups`` [B, T, K]
    keeps (the key shares the query's group, or is a global key), over queries with distant keys: the budget beside
    ``kept``, without which a router that grows its groups would look better (it keeps more by keeping more keys)."""
    t, k = groups.shape[1], groups.shape[-1]
    top = groups.argmax(-1)
    one = F.one_hot(top, k).to(torch.float64)
    if global_keys is not None:
        one = torch.cat([one * ~global_keys[..., None], global_keys[..., None].to(one.dtype)], -1)  # last: global
    counts = distant_sums(one, window, sink)  # [B, T, K(+1)]: distant keys per group (and global)
    same = counts.gather(-1, top[..., None])[..., 0] + (counts[..., -1] if global_keys is not None else 0)
    n = (torch.arange(t, device=groups.device) - window - min(sink, t)).clamp_min(0).to(torch.float64)
    ok = n > 0
    if not bool(ok.any()):
        return 0.0
    return float((same[:, ok] / n[ok]).mean())


def _group_targets(tg: LayerTargets, device, global_keys: torch.Tensor | None = None):
    """What both group losses read of the targets: ``(rows [B, 1, 1], idx [B, T, M] with -1 clamped to 0, targeted
    (the real entries), is_global (targeted keys that are global keys, or None), w_norm (the weights over the
    query's targets that are not global, renormalised), mass (the query's distant mass, 0 without such targets))``."""
    raw = tg.idx.to(device).long()
    targeted = raw >= 0
    idx = raw.clamp_min(0)
    rows = torch.arange(raw.shape[0], device=device)[:, None, None]
    valid, is_global = targeted, None
    if global_keys is not None:
        is_global = global_keys[rows, idx] & targeted
        valid = targeted & ~is_global
    w = tg.weight.to(device) * valid
    w_norm = w / w.sum(-1, keepdim=True).clamp_min(EPS)
    return rows, idx, targeted, is_global, w_norm, tg.mass.to(device) * valid.any(-1)


def router_mass_loss(logits: torch.Tensor, tg: LayerTargets, *, iters: int,
                     global_keys: torch.Tensor | None = None) -> torch.Tensor:
    """Minus the expected share of the targets' distant mass a query keeps, ``sum_j w_ij g_i . g_j`` (``w``
    renormalised over the query's targets, queries weighted by their distant mass), under soft groups *balanced on
    the window*: ``softmax(logits + b)`` with ``b`` the window's Sinkhorn potentials (no gradient through them).

    Why (``retrofit --attn-loss mass``): the cross-entropy of :func:`router_attention_loss` costs ``log(1/eps)`` for
    every target key outside the query's group and only the log of a group's size for keeping more, so it buys mass
    with budget (measured: routers continued on it kept more keys per query at the same mass once capped,
    docs/DECISIONS.md). Here every assignment is balanced, so the only way to keep more is to group better. Global
    keys (kept anyway) are left out, as in the cross-entropy."""
    from ..focus.sinkhorn import sinkhorn_potentials

    g = torch.softmax(logits + sinkhorn_potentials(logits.detach(), iters)[:, None, :], dim=-1)
    rows, idx, _, _, w_norm, mass = _group_targets(tg, g.device, global_keys)
    kept = (w_norm * (g[:, :, None, :] * g[rows, idx]).sum(-1)).sum(-1)
    return -(mass * kept).sum() / mass.sum().clamp_min(EPS)


def global_key_loss(logits: torch.Tensor, tg: LayerTargets, rate: float) -> torch.Tensor:
    """Binary cross-entropy of the global-key scorer's ``logits`` [B, T] against "attraction in the top ``rate``
    share of this window's labelled keys"."""
    a = tg.attraction.to(logits.device)
    ok = torch.isfinite(a)
    if not bool(ok.any()):
        return logits.sum() * 0
    thr = torch.quantile(a[ok], 1 - rate)
    label = (a >= thr).float()
    return F.binary_cross_entropy_with_logits(logits[ok], label[ok])


def router_attention_loss(groups: torch.Tensor, tg: LayerTargets, *, window: int, sink: int,
                          global_keys: torch.Tensor | None = None, query_groups: torch.Tensor | None = None,
                          key_top_k: int = 1):
    """``(loss, kept)``: the mass-weighted cross-entropy of the module docstring for soft ``groups`` [B, T, K]
    (gradient flows to them), and the share of the targets' mass that hard top-1 of ``groups`` keeps (no gradient;
    what the served top-1 mask would keep of these keys, the global keys counted as kept). ``global_keys`` [B, T]:
    keys kept anyway, left out of the group loss. ``query_groups`` [B, T, K]: the queries' own soft groups
    (``FocusConfig.query_proj``; ``groups`` are then the keys'), and ``kept`` counts a key that holds the query's
    top group among its ``key_top_k``; None = symmetric."""
    rows, idx, targeted, is_global, w_norm, mass = _group_targets(tg, groups.device, global_keys)
    gj = groups[rows, idx]  # [B, T, M, K]; its backward scatters into [B, T, K], nothing T x T
    gq = groups if query_groups is None else query_groups
    aff = (gq[:, :, None, :] * gj).sum(-1)
    denom = (gq * distant_sums(groups, window, sink)).sum(-1)
    ce = -(w_norm * torch.log(aff + EPS)).sum(-1) + torch.log(denom + EPS)
    loss = (mass * ce).sum() / mass.sum().clamp_min(EPS)
    with torch.no_grad():
        if query_groups is None:
            top = groups.argmax(-1)
            same = top[rows, idx] == top[..., None]
        else:  # key j holds query i's group
            same = topk_membership(groups, key_top_k)[rows, idx, query_groups.argmax(-1)[..., None]]
        w_all = tg.weight.to(groups.device) * targeted
        if is_global is not None:
            same = same | is_global
        kept = float((w_all * same).sum() / w_all.sum().clamp_min(EPS))
    return loss, kept


class AttentionObjective:
    """``objective(x) -> (loss, scalars)`` for the training loop: targets from one capture forward per batch
    (memoised by the batch's tokens when ``pool``: the same windows come back, the frozen model's attention does
    not change), then every router's loss on its own layer, mean over layers, plus the balance loss."""

    def __init__(self, model, *, top_m: int = 64, balance_loss: float = 0.0, memo: bool = False,
                 cache_dir: str | Path | None = None, loss: str = "ce"):
        from ..hf import focus_config, routers

        if loss not in ATTN_LOSSES:
            raise ValueError(f"loss={loss!r}: allowed {', '.join(ATTN_LOSSES)}")
        self.model, self.top_m, self.balance_loss, self.loss = model, top_m, balance_loss, loss
        self.routers, self.cfg = routers(model), focus_config(model)
        self.memo: dict[str, list[LayerTargets]] | None = {} if memo else None
        self.cache_dir = None if cache_dir is None else Path(cache_dir)

    def targets(self, x: torch.Tensor) -> list[LayerTargets]:
        """The batch's targets: memoised in memory, and on disk in ``cache_dir`` (keyed by the tokens, the model's
        window/sink, ``top_m`` and dense heads), so other runs on the same windows skip the capture forwards."""
        what = (self.cfg.window, self.cfg.sink_tokens, self.top_m)
        what += (tuple(self.cfg.dense_heads),) if self.cfg.dense_heads else ()  # (no dense heads: the older keys)
        key = hashlib.sha1(x.cpu().numpy().tobytes() + repr(what).encode()).hexdigest()
        if self.memo is not None and key in self.memo:
            return self.memo[key]
        path = None if self.cache_dir is None else self.cache_dir / f"{key}.safetensors"
        if path is not None and path.exists():
            flat = load_file(str(path))
            tg = [LayerTargets(*(flat.get(f"{i}.{f}") for f in FIELDS)) for i in range(len(self.routers))]
        else:
            tg = attention_targets(self.model, x, top_m=self.top_m)
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                save_file({f"{i}.{f}": getattr(t, f).contiguous() for i, t in enumerate(tg) for f in FIELDS
                           if getattr(t, f) is not None}, str(tmp))
                tmp.replace(path)  # a crash never leaves a half-written file
        if self.memo is not None:
            self.memo[key] = tg
        return tg

    def _layer(self, r, tg: LayerTargets):
        h = tg.h.to(device=next(r.parameters()).device, dtype=torch.float32)
        routing = r(h)
        mass = self.loss == "mass"
        with torch.set_grad_enabled(torch.is_grad_enabled() and not mass):  # the mass loss needs only its kept
            loss, k = router_attention_loss(routing.groups, tg, window=self.cfg.window, sink=self.cfg.sink_tokens,
                                            global_keys=routing.global_keys, query_groups=routing.query_groups,
                                            key_top_k=self.cfg.served_key_top_k or 1)
        if mass:  # the scores again, with their gradient (the routing keeps them detached)
            loss = router_mass_loss(r.scores(h), tg, iters=self.cfg.sinkhorn_iters, global_keys=routing.global_keys)
        return routing, loss, k

    @torch.no_grad()
    def kept(self, x: torch.Tensor) -> tuple[float, float]:
        """``(kept, budget)``: the share of ``x``'s target mass top-1 keeps and the share of distant keys it keeps
        (:func:`top1_budget`), means over layers, with the routers in the mode they are in (evaluation: a held-out
        window, nothing learned from it)."""
        ks, bs = [], []
        for r, tg in zip(self.routers, self.targets(x)):
            routing, _, k = self._layer(r, tg)
            ks.append(k)
            bs.append(top1_budget(routing.groups, self.cfg.window, self.cfg.sink_tokens, routing.global_keys))
        return sum(ks) / len(ks), sum(bs) / len(bs)

    def __call__(self, x: torch.Tensor):
        losses, kept, glob = [], [], []
        for r, tg in zip(self.routers, self.targets(x)):
            routing, loss, k = self._layer(r, tg)
            losses.append(loss)
            kept.append(k)
            if routing.global_logits is not None:
                glob.append(global_key_loss(routing.global_logits, tg, self.cfg.global_rate))
        attn = torch.stack(losses).mean()
        bal = torch.stack([r.balance for r in self.routers]).mean()
        logs = {"attn_ce": attn.item(), "balance": bal.item(), "kept_top1": sum(kept) / len(kept)}
        total = attn + self.balance_loss * bal
        if glob:
            g = torch.stack(glob).mean()
            logs["global_bce"] = g.item()
            total = total + g
        return total, {"loss": total.item(), **logs}
