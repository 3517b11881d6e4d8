"""The CUDA paths of the decomposed kernel against the dense reference (skipped without a GPU; run on a GPU machine
with ``scripts/gpu_check.sh``)."""
import pytest
import torch

from focusattn.kernels.api import focus_attention
from focusattn.kernels.backends import flash_attn_varlen
from focusattn.kernels.reference import dense_focus_attention
from tests.conftest import random_membership

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _problem(dtype, t=300, top_k=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = torch.randn(2, 6, t, 64, generator=gen), *(torch.randn(2, 2, t, 64, generator=gen) for _ in "kv")
    memb = random_membership(2, t, 5, top_k, gen=gen)
    kpm = torch.ones(2, t, dtype=torch.bool)
    kpm[1, :17] = False
    dev = torch.device("cuda")
    return (*(x.to(dev, dtype) for x in (q, k, v)), memb.to(dev), kpm.to(dev))


@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_cuda_fp32_outputs_and_gradients(top_k):
    q, k, v, memb, kpm = _problem(torch.float32, top_k=top_k)
    go = torch.randn_like(q)

    def run(fn):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        out = fn(*leaves)
        return (out.detach(), *torch.autograd.grad((out * go).sum(), leaves))

    ref = run(lambda a, b, c: dense_focus_attention(a, b, c, memb, 16, key_padding_mask=kpm))
    got = run(lambda a, b, c: focus_attention(a, b, c, memb, 16, key_padding_mask=kpm, backend="decomposed"))
    for r, g in zip(ref, got):
        assert (r - g).abs().max() <= 1e-4  # TF32 may be on for matmuls


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("top_k", [1, 2, 3])
def test_cuda_half_precision_forward(dtype, top_k):
    """fp16/bf16 forward: flash-attn varlen for the unmasked parts when installed, the generic engine otherwise."""
    q, k, v, memb, _ = _problem(dtype, top_k=top_k)
    ref = dense_focus_attention(q.float(), k.float(), v.float(), memb, 16)
    out = focus_attention(q, k, v, memb, 16, backend="decomposed")
    assert out.dtype == dtype
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)


def test_report_varlen_engine():
    """Not an assertion about speed: records in the log whether flash-attn varlen was usable on this machine."""
    print("flash_attn varlen:", flash_attn_varlen() is not None)
