"""FlexAttention formulation of the hard Focus mask, for comparison with the decomposed kernel.

The same rule as :func:`focusattn.kernels.reference.focus_allowed`, written as a ``mask_mod`` over a per-token group
bitmask, so FlexAttention's block mask can skip key blocks that are entirely outside window and groups.

What works on CPU with torch 2.13: ``torch.compile(flex_attention)`` runs, but only for inference and without the
LSE output (inductor: "torch.compile on CPU only supports inference and `return_lse` is not supported yet"). On CPU
we therefore use the compiled kernel when no gradient and no LSE are needed and the eager implementation otherwise
(exact, but it materialises the ``[Tq, Tk]`` scores, so it is a test oracle there, not a fast path); on CUDA the
compiled kernel always (it has both).
"""
from __future__ import annotations

import functools
import warnings

import torch

from .backends import logger
from .common import apply_softcap, default_scale, group_bits
from .lse import acc
from .validation import empty_focus_result, validate_focus_inputs


def focus_mask_mod(membership, window: int, tq: int, key_padding_mask=None, query_membership=None):
    """``mask_mod(b, h, q_idx, kv_idx)`` for queries aligned to the end of ``membership``'s keys;
    ``query_membership`` ``[B, Tq, K]``: the queries' own groups (query and key roles), else the keys' rows."""
    bits = group_bits(membership)
    offset = membership.shape[1] - tq
    words = bits.shape[-1]
    # the queries' bits, indexed by q_idx + qoff (roles: their own tensor, indexed by q_idx alone)
    qbits, qoff = (bits, offset) if query_membership is None else (group_bits(query_membership), 0)

    def mask_mod(b, h, q_idx, kv_idx):
        qi = q_idx + offset
        qr = q_idx + qoff
        shared = (qbits[b, qr, 0] & bits[b, kv_idx, 0]) != 0
        for w in range(1, words):
            shared = shared | ((qbits[b, qr, w] & bits[b, kv_idx, w]) != 0)
        ok = (kv_idx <= qi) & ((qi - kv_idx <= window) | shared)
        if key_padding_mask is not None:
            ok = ok & key_padding_mask[b, kv_idx]
        return ok

    return mask_mod


def focus_block_mask(membership, window: int, tq: int, key_padding_mask=None, query_membership=None):
    from torch.nn.attention.flex_attention import create_block_mask

    bsz, tk, _ = membership.shape
    return create_block_mask(focus_mask_mod(membership, window, tq, key_padding_mask, query_membership), bsz, None,
                             tq, tk, device=membership.device)


@functools.cache
def _compiled_flex():
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_focus_attention(q, k, v, membership, window, *, scale=None, softcap=None, key_padding_mask=None,
                         return_lse=False, block_mask=None, compile: bool | None = None, validate=True,
                         query_membership=None):
    """Focus attention via FlexAttention. ``block_mask``: reuse one built by :func:`focus_block_mask` (building it
    is O(Tq Tk / 128^2) mask_mod evaluations, worth caching across layers). ``compile``: None = when allowed.
    ``validate=False`` skips the checks of :mod:`.validation` (``focus_attention`` has done them).
    ``query_membership``: query and key roles (see :func:`focusattn.kernels.api.focus_attention`); a ``block_mask``
    passed in must have been built with the same one."""
    if validate:
        validate_focus_inputs(q, k, v, membership, window, scale=scale, softcap=softcap,
                              key_padding_mask=key_padding_mask, query_membership=query_membership)
    if q.numel() == 0:  # FlexAttention's block mask cannot be built over zero rows
        out, lse = empty_focus_result(q, k, v, membership, window, scale=scale, softcap=softcap,
                                      key_padding_mask=key_padding_mask)
        return (out, lse) if return_lse else out
    from torch.nn.attention.flex_attention import AuxRequest, flex_attention

    tq = q.shape[2]
    if block_mask is None:
        block_mask = focus_block_mask(membership, window, tq, key_padding_mask, query_membership)
    score_mod = None
    if softcap is not None:
        def score_mod(score, b, h, q_idx, kv_idx):
            return apply_softcap(score, softcap)
    scale = default_scale(q.shape[-1], scale)
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    # compiled flex on CUDA has gradients and LSE; on CPU (torch 2.13) it has neither
    can_compile = q.device.type != "cpu" or (not needs_grad and not return_lse)
    if compile is None:
        compile = can_compile
    if compile and not can_compile and q.device.type == "cpu":
        logger.info("flex: compiled CPU FlexAttention supports neither gradients nor LSE; running eager")
        compile = False
    fn = _compiled_flex() if compile else flex_attention
    gqa = q.shape[1] != k.shape[1]
    with warnings.catch_warnings():  # eager use is deliberate here (see module docstring)
        warnings.filterwarnings("ignore", message=".*without torch.compile.*")
        if return_lse:
            out, aux = fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa,
                          return_aux=AuxRequest(lse=True))
            return out, acc(aux.lse)
        return fn(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale, enable_gqa=gqa)
