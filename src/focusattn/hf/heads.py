"""Copying heads of a frozen model: the heads that look far back for an earlier occurrence of the current token,
which a routed mask serves worst.

Both halves of the induction circuit (Olsson et al. 2022, "In-context learning and induction heads"; duplicate-token
heads in Wang et al. 2022, "Interpretability in the wild") are scored the standard way, on a sequence of random
tokens repeated once: on the second copy, the attention a head puts on the token *after* the earlier occurrence of
the current token (``induction``: it predicts the next token by copying) and on the earlier occurrence *itself*
(``duplicate``: it finds where the current token was seen before, what a retrieval from far back starts with).
Random tokens carry no meaning, so only a copying head scores, and nothing here depends on a corpus or on the probes
that later evaluate the model. The heads found this way are what ``FocusConfig.dense_heads`` serves densely
(DuoAttention, Xiao et al. 2024, keeps such "retrieval heads" on the full cache the same way).
"""
from __future__ import annotations

import torch

from ..kernels.recall import causal_probs
from .probe import capture
from .specs import attention_modules

# score kind -> the key scored, relative to the earlier occurrence of the current token
KINDS = {"induction": 1, "duplicate": 0}


@torch.no_grad()
def aligned_attention(model, seqs, kinds: dict[str, int] = KINDS) -> dict[str, torch.Tensor]:
    """``{kind: [layers, kv_heads]}``: per key/value head, the largest of its query heads' mean attention from each
    query row ``i`` in ``r0:r1`` on the key ``i - distance + offset`` (``offset`` of the kind: :data:`KINDS`), mean
    over ``seqs``, a list of ``(tokens, r0, r1, distance)``: a copy ``distance`` tokens after its original, scored
    over rows ``r0:r1`` of it. One forward per sequence; ``model``: composed (routers attached)."""
    n_layers = len(attention_modules(model))
    scores = {kind: [None] * n_layers for kind in kinds}
    device = next(model.parameters()).device
    for tokens, r0, r1, distance in seqs:
        def fn(layer, module, h, q, k, scale, softcap, r0=r0, r1=r1, distance=distance):
            hq, hkv = q.shape[1], k.shape[1]
            rows = torch.arange(r0, r1, device=q.device)
            p = causal_probs(q, k, r0, r1, scale=scale, softcap=softcap)  # [B, Hq, rows, T]
            at = torch.arange(len(rows), device=q.device)
            for kind, offset in kinds.items():
                got = p[:, :, at, rows - distance + offset].mean((0, 2)).view(hkv, hq // hkv).max(-1).values.cpu()
                scores[kind][layer] = got if scores[kind][layer] is None else scores[kind][layer] + got

        with capture(model, fn):
            model(torch.as_tensor(tokens, dtype=torch.long)[None].to(device), logits_to_keep=1)
    return {kind: torch.stack(s) / len(seqs) for kind, s in scores.items()}


def copy_scores(model, *, half: int = 256, seeds: tuple[int, ...] = (0, 1)) -> dict[str, torch.Tensor]:
    """``{kind: [layers, kv_heads]}`` for every kind of :data:`KINDS`: :func:`aligned_attention` over the second
    copy of ``half`` random tokens repeated once (one sequence per seed). ``model``: composed (routers attached)."""
    vocab = model.config.vocab_size
    low = min(1000, vocab // 4)  # past the special and byte tokens of common vocabularies
    seqs = []
    for seed in seeds:
        x = torch.randint(low, vocab, (half,), generator=torch.Generator().manual_seed(seed))
        seqs.append((torch.cat([x, x]), half + 1, 2 * half, half))
    return aligned_attention(model, seqs)


def induction_scores(model, **kw) -> torch.Tensor:
    """``[layers, kv_heads]``: the ``induction`` scores of :func:`copy_scores`."""
    return copy_scores(model, **kw)["induction"]


def scored_heads(model, counts: dict[str, int], *, scores: dict[str, torch.Tensor] | None = None,
                 **kw) -> tuple[tuple[int, int], ...]:
    """Sorted ``(layer, kv_head)`` pairs: for each kind in ``counts`` (in order), its ``n`` heads of highest score
    among those not chosen yet, so the total is the sum of the counts. ``scores``: :func:`copy_scores` of ``model``
    measured already (a sweep over several specs scores once)."""
    s = copy_scores(model, **kw) if scores is None else scores
    total = next(iter(s.values())).numel()
    spec = "+".join(f"{k}:{n}" for k, n in counts.items())
    if sum(counts.values()) > total:
        raise ValueError(f"{spec}: allowed at most {total} heads in all (this model has "
                         f"{s['induction'].shape[0]} layers x {s['induction'].shape[1]} KV heads)")
    chosen: list[int] = []
    for kind, n in counts.items():
        order = [i for i in s[kind].flatten().argsort(descending=True, stable=True).tolist() if i not in chosen]
        chosen += order[:n]
    hkv = s["induction"].shape[1]
    return tuple(sorted((i // hkv, i % hkv) for i in chosen))


def induction_heads(model, n: int, **kw) -> tuple[tuple[int, int], ...]:
    """The ``n`` key/value heads of highest :func:`induction_scores`, as sorted ``(layer, kv_head)`` pairs."""
    return scored_heads(model, {"induction": n}, **kw)


def parse_dense_heads(spec: str):
    """``--dense-heads``: ``"none"`` (every head routed), ``"17:1,18:2"`` (layer:kv_head pairs) or scored heads,
    ``"induction:N"``, ``"duplicate:M"`` or both, ``"induction:N+duplicate:M"`` (:func:`scored_heads`, measured on
    the model at load). Returns a tuple of pairs, or ``{kind: n}`` for scored heads."""
    from .._errors import InputError

    s = str(spec).strip()
    allowed = ("'none', 'layer:kv_head,...' (e.g. 17:1,18:2) or scored heads 'induction:N', 'duplicate:M' or "
               "'induction:N+duplicate:M'")
    if s == "none":
        return ()
    try:
        if s.split(":", 1)[0] in KINDS:
            counts = {}
            for part in s.split("+"):
                kind, n = part.split(":")
                if kind not in KINDS or kind in counts or int(n) < 0:
                    raise ValueError
                counts[kind] = int(n)
            return counts
        pairs = tuple((int(a), int(b)) for a, b in (p.split(":") for p in s.split(",") if p))
        if not pairs or any(a < 0 or b < 0 for a, b in pairs):
            raise ValueError
        return pairs
    except ValueError:
        raise InputError("dense_heads", spec, f"allowed {allowed}") from None


def describe(counts: dict[str, int]) -> str:
    """Words for a scored-heads spec, for model cards and reports."""
    what = {"induction": "induction score (attention on the token after the earlier occurrence of the current "
                         "token)",
            "duplicate": "duplicate-token score (attention on the earlier occurrence of the current token itself)"}
    return " and ".join(f"the {n} key/value heads of highest {what[k]}" for k, n in counts.items() if n) \
        + ", on repeated random tokens"

