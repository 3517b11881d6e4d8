"""The single-process side of train/dist.py (multi-process runs: test_distributed.py): no process group without
torchrun, sample ranges, and the FSDP2 sharding plan, checked without a process group."""
import pytest
import torch

from focusattn.train import dist
from tests.conftest import tiny_model


def test_single_process_needs_no_process_group(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    dist.init()
    assert not torch.distributed.is_initialized()
    assert (dist.world(), dist.rank(), dist.is_main()) == (1, 0, True)
    assert dist.backend() == ("nccl" if torch.cuda.is_available() else "gloo")
    assert dist.mean_scalars({"loss": 2.0}) == {"loss": 2.0}
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 2.0)
    dist.average_gradients([p])
    assert torch.equal(p.grad, torch.full((3,), 2.0))
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(ValueError, match="WORLD_SIZE='two'"):
        dist.init()


def test_sample_ranges_split_the_global_batch():
    assert list(dist.sample_range(0, 3)) == [0, 1, 2]
    assert [list(dist.sample_range(5, 2, rank_=r, world_=3)) for r in range(3)] == [[30, 31], [32, 33], [34, 35]]


def test_fsdp_plan_shards_each_decoder_layer_then_the_root():
    from focusattn.focus.config import FocusConfig
    from focusattn.hf import compose, router_parameters

    model = tiny_model("llama")
    compose(model, FocusConfig(num_groups=4, group_dim=16, window=8))
    plan = dist.fsdp_plan(model)
    assert [type(m).__name__ for m in plan] == ["LlamaDecoderLayer", "LlamaDecoderLayer", "LlamaForCausalLM"]
    assert plan[-1] is model
    # every router sits inside a sharded layer, so ignored_params must keep them whole (shard keep_whole)
    routers = {id(p) for p in router_parameters(model)}
    inside = {id(p) for m in plan[:-1] for p in m.parameters()}
    assert routers and routers <= inside
    dist.shard(model, keep_whole=router_parameters(model))  # one process: nothing to shard, nothing changes
    assert not any(type(p).__name__ == "DTensor" for p in model.parameters())
    with pytest.raises(ValueError, match="--fsdp: Linear names no decoder-layer class"):
        dist.fsdp_plan(torch.nn.Linear(2, 2))
