"""Elastic-Softmax ("Lazy Attention") kernels: causal softmax with a per-head distance bias, then a per-row threshold.

For head ``h`` and a query at absolute position ``P`` (so ``n = P + 1`` visible keys)::

    s_Pj  = scale * q_P . k_j + b_h(P - j)          (j <= P; b_h from the [H, W] distance table)
    p_Pj  = softmax_j(s_Pj)
    a_Pj  = max(0, p_Pj - tau_h / n)                 (no renormalisation: rows sum to <= 1 when tau >= 0)
    o_P   = sum_j a_Pj v_j

``n_cap`` (None by default, the paper's rule) replaces ``n`` by ``min(n, n_cap)`` in the threshold: with ``n_cap`` =
the training length a longer input keeps every threshold at a scale seen in training (the lab's extrapolation ablation).

``b_h(d)`` is ``bias[h, d]`` for ``0 <= d < W``; past the table it is 0 (``bias_beyond="zero"``, the dev code's
default) or ``bias[h, W-1]`` (``"clamp"``, an older dev-code variant). Shapes follow :mod:`.reference`: ``q`` is
``[B, Hq, Tq, D]``, ``k``/``v`` are ``[B, Hkv, Tk, D]`` (GQA by ``Hq // Hkv``), queries are aligned to the end of the
keys (``P = Tk - Tq + i``), q/k already rotated.

Two implementations with one contract:

* ``impl="reference"``: explicit ``[Tq, Tk]`` scores and plain autograd; the oracle.
* ``impl="chunked"``: the two-pass FlashAttention layout. Pass 1 walks key blocks for the row log-sum-exp; pass 2
  recomputes the probabilities block by block, thresholds them and accumulates ``a @ v``. A hand-written backward
  walks the key blocks once more. Peak extra memory is ``O(Tq * block)`` per (batch, head): no ``Tq x Tk`` tensor.

Backward (m = 1[a > 0], dP = dO v^T, g = dP * m): ``dS = p * (g - rowsum(g * p))``; ``dtau_h = -sum g / n``;
``dbias[h, d] = sum over pairs at distance d of dS``. ``rowsum(g * p) = dO . (sum_j m p v_j)``, so the forward keeps
``Y = (m * p) @ v`` (only when a gradient is needed) and the backward needs a single pass.
"""
from __future__ import annotations


import torch

from .common import apply_softcap, default_scale, relative_distance
from .reference import expand_kv
from .validation import check_finite

IMPLS = ("reference", "chunked")
BIAS_BEYOND = ("zero", "clamp")


def _check(q, k, v, tau, bias, impl, bias_beyond, block, n_cap=None, allowed=None, softcap=None):
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if bias_beyond not in BIAS_BEYOND:
        raise ValueError(f"bias_beyond must be one of {BIAS_BEYOND}, got {bias_beyond!r}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be [B, H, T, D]; got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    b, hq, tq, d = q.shape
    if d < 1 or k.shape[1] < 1:
        raise ValueError(f"q/k/v need a head dim D >= 1 and at least one k/v head, got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}")
    if k.shape != v.shape or k.shape[0] != b or k.shape[-1] != d:
        raise ValueError(f"k and v must be [B, Hkv, Tk, {d}] with B={b}; got k {tuple(k.shape)}, v {tuple(v.shape)}")
    if hq % k.shape[1]:
        raise ValueError(f"q heads ({hq}) must be a multiple of kv heads ({k.shape[1]})")
    if tq > k.shape[2]:
        raise ValueError(f"more queries ({tq}) than keys ({k.shape[2]}): queries are aligned to the end of the keys")
    if tau.shape != (hq,):
        raise ValueError(f"tau must have shape [H]=({hq},) (one threshold per query head), got {tuple(tau.shape)}")
    if bias.dim() != 2 or bias.shape[0] != hq:
        raise ValueError(f"bias must have shape [H, W] with H={hq}, got {tuple(bias.shape)}")
    if bias.shape[1] < 1:
        raise ValueError(f"bias table width W must be >= 1, got W={bias.shape[1]}")
    if not isinstance(block, int) or block < 1:
        raise ValueError(f"block must be a positive int, got {block!r}")
    if n_cap is not None and (not isinstance(n_cap, int) or isinstance(n_cap, bool) or n_cap < 1):
        raise ValueError(f"n_cap must be None or an integer >= 1, got {n_cap!r}")
    if allowed is not None:
        want = (b, hq, tq, k.shape[2])
        if allowed.dtype != torch.bool or allowed.dim() != 4 or any(a not in (1, w) for a, w in zip(allowed.shape, want)):
            raise ValueError(f"allowed must be a bool mask broadcastable to [B, Hq, Tq, Tk]={want} (True = may "
                             f"attend), got {allowed.dtype} {tuple(allowed.shape)}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and softcap > 0):
        raise ValueError(f"softcap must be None or a float > 0, got {softcap!r}")
    for name, t in (("q", q), ("k", k), ("v", v), ("tau", tau), ("bias", bias)):
        check_finite(name, t)


def distance_bias(bias: torch.Tensor, dist: torch.Tensor, bias_beyond: str = "zero") -> torch.Tensor:
    """Look up ``b_h(d)`` for an integer distance tensor (any shape, ``d >= 0``): ``[H, *dist.shape]``."""
    w = bias.shape[1]
    idx = dist.clamp(0, w - 1)
    out = bias[:, idx]
    if bias_beyond == "zero":
        out = out * (dist < w).to(bias.dtype)
    return out


def _visible(tq, tk, n_cap, device, dtype):
    """Visible keys per query (``P + 1``), capped at ``n_cap`` for the threshold."""
    n = torch.arange(tk - tq + 1, tk + 1, device=device)
    return (n if n_cap is None else n.clamp(max=n_cap)).to(dtype)


def _weights(q, k, tau, bias, scale, bias_beyond, n_cap=None, allowed=None, softcap=None):
    """The dense weights ``a`` ``[B, Hq, Tq, Tk]``: the rule of the module docstring, stated once."""
    hq, tq = q.shape[1], q.shape[2]
    tk = k.shape[2]
    k = expand_kv(k, hq)
    dist = relative_distance(tq, tk, q.device)  # [Tq, Tk]
    vis = dist >= 0
    if allowed is not None:  # the model's own mask (padding, sliding window): n counts the keys it lets a query see
        vis = vis & allowed
    s = apply_softcap(torch.matmul(q, k.transpose(-1, -2)) * scale, softcap)
    s = (s + distance_bias(bias, dist, bias_beyond).to(q.dtype)).masked_fill(~vis, float("-inf"))
    p = torch.softmax(s, dim=-1)
    if allowed is None:
        n = _visible(tq, tk, n_cap, q.device, q.dtype)[None, :, None]  # visible keys per query
    else:
        p = p.nan_to_num(0.0)  # a row with no visible key (a padded query) keeps nothing
        n = vis.sum(-1, keepdim=True).clamp_min(1)
        n = (n if n_cap is None else n.clamp(max=n_cap)).to(q.dtype)
    thr = tau.to(q.dtype)[:, None, None] / n  # [.., H, Tq, 1]
    return torch.relu(p - thr) * vis  # mask again: with tau < 0 the threshold is negative and p = 0 would survive


def _reference(q, k, v, tau, bias, scale, bias_beyond, n_cap=None, allowed=None, softcap=None):
    a = _weights(q, k, tau, bias, scale, bias_beyond, n_cap, allowed, softcap)
    return torch.matmul(a, expand_kv(v, q.shape[1]))


class _Plan:
    """Block geometry shared by forward and backward (everything here is O(Tk * block))."""

    def __init__(self, q, k, tau, bias, block, bias_beyond, n_cap=None):
        b, hq, tq, d = q.shape
        hkv, tk = k.shape[1], k.shape[2]
        self.g = hq // hkv
        self.tq, self.tk, self.off = tq, tk, tk - tq
        self.block = min(block, tk)
        self.w = bias.shape[1]
        dev = q.device
        # Every key block sees the same (row, column) -> distance pattern up to a row shift: d = r - c with r the row
        # in a Tk-row template. One template, gathered once, serves every block (bias and causal mask at once).
        r = torch.arange(tk, device=dev)[:, None]
        c = torch.arange(self.block, device=dev)[None, :]
        dist = r - c  # [Tk, block]
        self.causal = (dist >= 0).to(q.dtype)
        tmpl = distance_bias(bias.detach(), dist, bias_beyond).to(q.dtype)  # [Hq, Tk, block]
        tmpl = tmpl.masked_fill(dist < 0, float("-inf"))
        self.tmpl = tmpl.view(hkv, self.g, tk, self.block)
        # Slot w collects what has no table entry (beyond W under "zero", or above the diagonal): dropped at the end.
        slot = dist.clamp(0, self.w - 1) if bias_beyond == "clamp" else torch.where(dist < self.w, dist, self.w)
        self.slot = torch.where(dist < 0, self.w, slot).reshape(-1)
        n = _visible(tq, tk, n_cap, dev, q.dtype)  # visible keys per query
        self.inv_n = (1.0 / n).view(1, 1, 1, tq, 1)
        self.thr = (tau.detach().to(q.dtype).view(hkv, self.g, 1, 1) * self.inv_n[0])  # [Hkv, G, Tq, 1]

    def blocks(self):
        """Yield (j0, j1, q0, r0): key block [j0, j1), first query row q0 that sees it, template row r0 for q0."""
        for j0 in range(0, self.tk, self.block):
            j1 = min(j0 + self.block, self.tk)
            q0 = max(0, j0 - self.off)
            r0 = self.off + q0 - j0
            yield j0, j1, q0, r0

    def mask_upper(self, x, j0, j1, r0):
        """Zero ``x`` above the diagonal in place. Needed after thresholding: with tau < 0 the threshold is negative,
        so a masked entry (p = 0) would otherwise survive. Only the first ``bk - r0`` rows can hold such entries."""
        rows = min(x.shape[-2], (j1 - j0) - r0)
        if rows > 0:
            x[..., :rows, :].mul_(self.causal[r0:r0 + rows, : j1 - j0])
        return x

    def scores(self, q5, k5, j0, j1, q0, r0):
        """Scaled, biased, causally masked scores for queries [q0, Tq) against keys [j0, j1): [B, Hkv, G, n, bk]."""
        s = torch.matmul(q5[:, :, :, q0:], k5[:, :, :, j0:j1].transpose(-1, -2))
        s += self.tmpl[:, :, r0:r0 + self.tq - q0, : j1 - j0]
        return s


class _ChunkedLazy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, tau, bias, scale, block, bias_beyond, n_cap):
        b, hq, tq, d = q.shape
        hkv = k.shape[1]
        plan = _Plan(q, k, tau, bias, block, bias_beyond, n_cap)
        g = plan.g
        q5 = (q * scale).view(b, hkv, g, tq, d)
        k5, v5 = k.unsqueeze(2), v.unsqueeze(2)
        lse = torch.full((b, hkv, g, tq, 1), float("-inf"), dtype=q.dtype, device=q.device)
        for j0, j1, q0, r0 in plan.blocks():  # pass 1: row log-sum-exp
            s = plan.scores(q5, k5, j0, j1, q0, r0)
            lse[:, :, :, q0:] = torch.logaddexp(lse[:, :, :, q0:], torch.logsumexp(s, dim=-1, keepdim=True))
        need_grad = any(ctx.needs_input_grad[:5])
        out = torch.zeros((b, hkv, g, tq, v.shape[-1]), dtype=q.dtype, device=q.device)
        y = torch.zeros_like(out) if need_grad else None
        for j0, j1, q0, r0 in plan.blocks():  # pass 2: recompute p, threshold, accumulate
            s = plan.scores(q5, k5, j0, j1, q0, r0)
            p = s.sub_(lse[:, :, :, q0:]).exp_()
            if need_grad:
                y[:, :, :, q0:] += torch.matmul(p * (p > plan.thr[:, :, q0:]), v5[:, :, :, j0:j1])
            a = plan.mask_upper(p.sub_(plan.thr[:, :, q0:]).clamp_min_(0), j0, j1, r0)
            out[:, :, :, q0:] += torch.matmul(a, v5[:, :, :, j0:j1])
        if need_grad:
            ctx.save_for_backward(q, k, v, tau, bias, lse, y)
            ctx.cfg = (scale, block, bias_beyond, n_cap)
        return out.view(b, hq, tq, -1)

    @staticmethod
    def backward(ctx, dout):
        q, k, v, tau, bias, lse, y = ctx.saved_tensors
        scale, block, bias_beyond, n_cap = ctx.cfg
        b, hq, tq, d = q.shape
        hkv = k.shape[1]
        plan = _Plan(q, k, tau, bias, block, bias_beyond, n_cap)
        g = plan.g
        q5 = (q * scale).view(b, hkv, g, tq, d)
        k5, v5 = k.unsqueeze(2), v.unsqueeze(2)
        do5 = dout.contiguous().view(b, hkv, g, tq, -1)
        rowsum = (do5 * y).sum(-1, keepdim=True)  # sum_j g_ij p_ij
        dq = torch.zeros_like(q5)
        dk = torch.zeros_like(k)
        dv = torch.zeros_like(v)
        dtau = torch.zeros((hkv, g), dtype=q.dtype, device=q.device)
        want_bias = ctx.needs_input_grad[4]
        dtmpl = torch.zeros((hkv, g, plan.tk, plan.block), dtype=q.dtype, device=q.device) if want_bias else None
        for j0, j1, q0, r0 in plan.blocks():
            nrow = tq - q0
            s = plan.scores(q5, k5, j0, j1, q0, r0)
            p = s.sub_(lse[:, :, :, q0:]).exp_()
            thr = plan.thr[:, :, q0:]
            a = plan.mask_upper((p - thr).clamp_min_(0), j0, j1, r0)
            m = a > 0
            do = do5[:, :, :, q0:]
            dv[:, :, j0:j1] += torch.matmul(a.transpose(-1, -2), do).sum(2)
            gm = torch.matmul(do, v5[:, :, :, j0:j1].transpose(-1, -2)).mul_(m)
            dtau -= (gm.sum(-1, keepdim=True) * plan.inv_n[:, :, :, q0:]).sum((0, 3, 4))
            ds = gm.sub_(rowsum[:, :, :, q0:]).mul_(p)
            dq[:, :, :, q0:] += torch.matmul(ds, k5[:, :, :, j0:j1])
            dk[:, :, j0:j1] += torch.matmul(ds.transpose(-1, -2), q5[:, :, :, q0:]).sum(2)
            if want_bias:
                dtmpl[:, :, r0:r0 + nrow, : j1 - j0] += ds.sum(0)
        dbias = None
        if want_bias:
            flat = dtmpl.view(hq, -1)
            acc = torch.zeros((hq, plan.w + 1), dtype=q.dtype, device=q.device)
            acc.index_add_(1, plan.slot, flat)
            dbias = acc[:, : plan.w].to(bias.dtype)
        dq = (dq * scale).view(b, hq, tq, d)
        return dq, dk, dv, dtau.view(hq).to(tau.dtype), dbias, None, None, None, None


def lazy_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    tau: torch.Tensor,
    bias: torch.Tensor,
    *,
    scale: float | None = None,
    impl: str = "chunked",
    block: int = 64,
    bias_beyond: str = "zero",
    n_cap: int | None = None,
    allowed: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal Elastic-Softmax attention (see module docstring). ``tau``: ``[Hq]``; ``bias``: ``[Hq, W]``, W >= 1.

    ``allowed``: an extra bool mask broadcastable to ``[B, Hq, Tq, Tk]`` (True = may attend; a pretrained model's
    padding or sliding window), intersected with causality; a query's ``n`` is then the number of keys it may see.
    ``softcap``: ``c * tanh(s / c)`` on the scaled logits before the bias (Gemma 2). Either takes the reference path:
    the retrofit's batches are unpadded full-attention windows, which keep the chunked path.

    Returns ``[B, Hq, Tq, D]`` (empty when there is no query). Non-finite ``q``, ``k``, ``v``, ``tau`` or ``bias`` is
    a ValueError naming it (the two implementations would otherwise disagree on where a NaN spreads: the reference
    multiplies masked values by 0). Both implementations agree to float rounding in outputs and in gradients of q, k, v,
    tau and bias; ``block`` (keys per block) only affects the chunked path's speed and memory.
    """
    _check(q, k, v, tau, bias, impl, bias_beyond, block, n_cap, allowed, softcap)
    scale = default_scale(q.shape[-1], scale)
    if impl == "reference" or q.numel() == 0 or allowed is not None or softcap is not None:
        # no query: the reference's empty result (the blocks need Tk >= 1)
        return _reference(q, k, v, tau, bias, scale, bias_beyond, n_cap, allowed, softcap)
    if q.dtype in (torch.float16, torch.bfloat16):
        # The chunked path keeps a running log-sum-exp and thresholds p - tau/n, both too coarse in 16 bits.
        f = lambda t: t.float()  # noqa: E731
        return _ChunkedLazy.apply(f(q), f(k), f(v), f(tau), f(bias), scale, block, bias_beyond, n_cap).to(q.dtype)
    return _ChunkedLazy.apply(q, k, v, tau, bias, scale, block, bias_beyond, n_cap)


def elastic_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    tau: torch.Tensor,
    bias: torch.Tensor,
    *,
    scale: float | None = None,
    bias_beyond: str = "zero",
    n_cap: int | None = None,
    allowed: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """The dense ``[B, Hq, Tq, Tk]`` weights ``a`` (zeros above the diagonal and where ``allowed`` is False), for
    diagnostics on short inputs."""
    _check(q, k, k, tau, bias, "reference", bias_beyond, 1, n_cap, allowed, softcap)
    return _weights(q, k, tau, bias, default_scale(q.shape[-1], scale), bias_beyond, n_cap, allowed, softcap)
