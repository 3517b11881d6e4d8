"""Induction (retrieval) heads of a frozen model: the heads that copy from far back, which a routed mask serves worst.

Scored the standard way (Olsson et al. 2022, "In-context learning and induction heads"): a sequence of random tokens
repeated once; on the second copy, the attention a head puts on the token *after* the earlier occurrence of the
current token. Random tokens carry no meaning, so only a copying head scores, and nothing here depends on a corpus
or on the probes that later evaluate the model. The heads found this way are what ``FocusConfig.dense_heads`` serves
densely (DuoAttention, Xiao et al. 2024, keeps such "retrieval heads" on the full cache the same way).
"""
from __future__ import annotations

import torch

from ..kernels.recall import causal_probs
from .probe import capture
from .specs import attention_modules


@torch.no_grad()
def induction_scores(model, *, half: int = 256, seeds: tuple[int, ...] = (0, 1)) -> torch.Tensor:
    """``[layers, kv_heads]``: per key/value head, the largest induction score of its query heads (mean attention on
    the induction target over the second copy, mean over ``seeds``). ``model``: composed (routers attached)."""
    vocab = model.config.vocab_size
    low = min(1000, vocab // 4)  # past the special and byte tokens of common vocabularies
    n_layers = len(attention_modules(model))
    scores: list[torch.Tensor | None] = [None] * n_layers
    device = next(model.parameters()).device

    def fn(layer, module, h, q, k, scale, softcap):
        t, hq, hkv = q.shape[2], q.shape[1], k.shape[1]
        rows = torch.arange(half + 1, t, device=q.device)
        p = causal_probs(q, k, half + 1, t, scale=scale, softcap=softcap)  # [B, Hq, rows, T]
        target = p[:, :, torch.arange(len(rows), device=q.device), rows - half + 1].mean((0, 2))  # [Hq]
        got = target.view(hkv, hq // hkv).max(-1).values.cpu()
        scores[layer] = got if scores[layer] is None else scores[layer] + got

    with capture(model, fn):
        for seed in seeds:
            g = torch.Generator().manual_seed(seed)
            x = torch.randint(low, vocab, (half,), generator=g)
            model(torch.cat([x, x])[None].to(device), logits_to_keep=1)
    return torch.stack(scores) / len(seeds)


def induction_heads(model, n: int, **kw) -> tuple[tuple[int, int], ...]:
    """The ``n`` key/value heads of highest :func:`induction_scores`, as sorted ``(layer, kv_head)`` pairs."""
    s = induction_scores(model, **kw)
    if not 0 <= n <= s.numel():
        raise ValueError(f"induction:{n}: allowed 0..{s.numel()} heads (this model has {s.shape[0]} layers x "
                         f"{s.shape[1]} KV heads)")
    top = s.flatten().topk(n).indices.tolist()
    return tuple(sorted((i // s.shape[1], i % s.shape[1]) for i in top))


def parse_dense_heads(spec: str):
    """``--dense-heads``: ``"none"`` (every head routed), ``"17:1,18:2"`` (layer:kv_head pairs) or ``"induction:N"``
    (the N heads of highest induction score, measured on the model at load). Returns a tuple of pairs or the int N."""
    from .._errors import InputError

    s = str(spec).strip()
    allowed = "'none', 'layer:kv_head,...' (e.g. 17:1,18:2) or 'induction:N'"
    if s == "none":
        return ()
    try:
        if s.startswith("induction:"):
            n = int(s.split(":", 1)[1])
            if n < 0:
                raise ValueError
            return n
        pairs = tuple((int(a), int(b)) for a, b in (p.split(":") for p in s.split(",") if p))
        if not pairs or any(a < 0 or b < 0 for a, b in pairs):
            raise ValueError
        return pairs
    except ValueError:
        raise InputError("dense_heads", spec, f"allowed {allowed}") from None
