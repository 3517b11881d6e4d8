"""Benchmark routings: Zipf memberships are imbalanced top-k, captured ones read back exactly."""
import pytest
import torch
from safetensors.torch import save_file

from focusattn.bench.common import captured_membership, load_captured, work_ratio, worst_layer, zipf_membership
from focusattn.bench.prefill import run_kernel_bench


def test_zipf_membership_is_top_k_and_imbalanced():
    m = zipf_membership(4000, 8, 2, seed=0, s=1.0)
    assert m.shape == (1, 4000, 8) and bool((m.sum(-1) == 2).all())
    sizes = m[0].sum(0)
    assert sizes[0] > 2 * sizes[-1]  # group 0 is the giant one
    assert torch.equal(zipf_membership(100, 8, 1, seed=3), zipf_membership(100, 8, 1, seed=3))


def test_captured_membership_roundtrip_and_worst_layer(tmp_path):
    i = torch.arange(50)
    balanced = torch.stack([i % 4, (i + 1) % 4, (i + 2) % 4], -1)  # layer 0: groups in turn
    giant = torch.tensor([0, 1, 2]).repeat(50, 1)  # layer 1: every token's first choice is group 0
    top = torch.stack([balanced, giant])
    path = tmp_path / "r.safetensors"
    save_file({"top_groups": top.to(torch.uint8)}, str(path), metadata={"num_groups": "4"})
    loaded, meta = load_captured(path)
    assert torch.equal(loaded, top) and meta["num_groups"] == "4"
    assert worst_layer(loaded, 50, 4) == 1
    m = captured_membership(loaded, 20, 4, 2, layer=1)
    assert m.shape == (1, 20, 4) and bool(m[0, :, :2].all()) and not bool(m[0, :, 2:].any())
    assert torch.equal(captured_membership(loaded, 50, 4, 1, layer=0)[0].sum(0), torch.full((4,), 50 // 4 + 0) +
                       torch.tensor([1, 1, 0, 0]))
    with pytest.raises(ValueError, match="exceeds the captured"):
        captured_membership(loaded, 51, 4, 1, layer=0)
    with pytest.raises(ValueError, match="groups must be"):
        run_kernel_bench(tmp_path / "b", lengths=(16,), groups=(8,), top_ks=(1,), routing="captured",
                         routing_file=path, progress=False, flex=False, decode_len=0)


def test_work_ratio_counts_intersections():
    """Top-2 of 2 groups: both groups hold every token, and the intersection is subtracted: 3 full triangles."""
    m = torch.ones(1, 64, 2, dtype=torch.bool)
    assert work_ratio(m, 0) == pytest.approx(1 / 3)


def test_cpu_model_names_the_chip_and_its_matrix_extensions(tmp_path):
    """Whole-model ratios depend on the chip (AMX or not), so benchmarks record it from /proc/cpuinfo."""
    from focusattn.bench.common import cpu_model
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx2 avx512f amx_bf16\n\n"
                    "processor\t: 1\nmodel name\t: Other\nflags\t\t: fpu\n")
    assert cpu_model(str(info)) == "Some Xeon [amx_bf16 avx512f avx2]"
    info.write_text("processor\t: 0\nmodel name\t: Plain\nflags\t\t: fpu sse2\n")
    assert cpu_model(str(info)) == "Plain"
    assert cpu_model(str(tmp_path / "missing"))  # no /proc: the platform's name, never an error
