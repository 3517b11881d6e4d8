"""Backend names, lazy capability detection and the ``"auto"`` choice.

Nothing here imports optional packages at import time: ``flash_attn`` is probed on first use (importing it can take
seconds and print CUDA warnings), and FlexAttention's module is only imported by :mod:`.flex` when asked for.
"""
from __future__ import annotations

import functools
import importlib.util
import logging

import torch

logger = logging.getLogger("focusattn")

BACKENDS = ("auto", "dense", "decomposed", "flex", "flex-sorted")

# dtypes PyTorch's fused ops (CPU flash, CUDA memory-efficient) accept; others (float64) take the generic chunked path.
FUSED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Compiled FlexAttention on CPU (torch 2.13): inference only and no LSE output ("torch.compile on CPU only supports
# inference and `return_lse` is not supported yet"); the eager fallback materialises [Tq, Tk] scores.
FLEX_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


@functools.cache
def cpu_flash_available() -> bool:
    """PyTorch's CPU flash-attention op that also returns the per-row LSE (private aten op, so probe for it)."""
    return hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu") and hasattr(
        torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward"
    )


def cuda_fused_available() -> bool:
    """PyTorch's CUDA memory-efficient attention op (LSE out, global O/LSE in the backward), once a tiny probe
    against plain matmul/softmax passed (:func:`.decomposed.fused.cuda_fused_status`; a failure is logged)."""
    if not torch.cuda.is_available():
        return False
    from .decomposed.fused import cuda_fused_status

    return cuda_fused_status()[0]


@functools.cache
def flash_attn_varlen():
    """``flash_attn.flash_attn_varlen_func`` when flash-attn is installed and CUDA is usable, else ``None``."""
    if not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None:
        return None
    try:
        from flash_attn import flash_attn_varlen_func  # type: ignore
    except Exception as exc:  # broken CUDA builds raise all sorts of errors on import
        logger.warning("flash_attn is installed but failed to import (%s); using PyTorch kernels", exc)
        return None
    return flash_attn_varlen_func


@functools.cache
def flex_available() -> bool:
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def check_backend(backend: str, q: torch.Tensor, needs_grad: bool = False) -> str:
    """Validate ``backend`` for ``q``'s device/dtype (and whether a backward pass is needed) and resolve ``"auto"``;
    raise ValueError naming ``backend``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if not q.dtype.is_floating_point:
        raise ValueError(f"backend {backend!r} needs floating-point q/k/v, got {q.dtype}")
    if backend in ("flex", "flex-sorted"):
        if not flex_available():
            raise ValueError(f"backend {backend!r} needs torch.nn.attention.flex_attention (torch >= 2.5)")
        if q.dtype not in FLEX_DTYPES:
            raise ValueError(f"backend {backend!r} cannot run dtype {q.dtype}")
        if needs_grad and q.device.type == "cpu":
            raise ValueError(f"backend {backend!r} has no backward on CPU in torch {torch.__version__} "
                             "(FlexAttention itself refuses it); use backend='decomposed' or 'dense' for gradients")
    if backend == "auto":
        # The decomposed path runs on every device/dtype (generic chunked kernels when no fused op applies).
        backend = "decomposed"
        _log_auto_choice(q.device.type, str(q.dtype), backend)
    return backend


@functools.cache
def _log_auto_choice(device: str, dtype: str, choice: str) -> None:
    """Logged once per (device, dtype): enough to know what ran without flooding a decode loop."""
    if device == "cpu":
        engine = "cpu-flash" if cpu_flash_available() else "generic chunked"
    elif device == "cuda" and cuda_fused_available():  # which varlen kernel: decomposed.driver._packed_varlen
        engine = "cuda-mem-efficient, part A packed into one variable-length call"
    else:
        engine = "generic chunked"
    logger.info("focus_attention backend='auto' -> per call (kernels/dispatch.py: causal / masked below the measured "
                "break-even / %r) on %s/%s (same-group engine: %s)", choice, device, dtype, engine)
