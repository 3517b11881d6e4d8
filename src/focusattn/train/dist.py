"""Data parallelism on torch.distributed, set up from torchrun's environment: one process per device, a process
group only when ``WORLD_SIZE`` > 1 (gloo on CPU, nccl on CUDA), nothing at all in a single process.

How a step is shared: every rank takes its own slice of the global batch (``sample_range``), runs forward/backward
on a replica of the trainable weights, and ``average_gradients`` all-reduces the trainable gradients once per step
(after gradient accumulation) before clipping and the optimizer step, so every replica takes the same step. This is
what DDP does, minus its overlap of communication with backward; done by hand it works unchanged whether the
frozen base is replicated or sharded by FSDP2 (``shard``, ``--fsdp``), and frozen parameters need no
``find_unused_parameters``.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as tdist


def _env_int(name: str, default: int) -> int:
    v = os.environ.get(name)
    try:
        return int(v) if v not in (None, "") else default
    except ValueError:
        raise ValueError(f"environment variable {name}={v!r} is not an integer (set by torchrun)") from None


def backend() -> str:
    """The collective backend for this machine: nccl when CUDA is there, gloo on CPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def init() -> None:
    """Join the process group torchrun describes (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR/PORT``);
    a no-op in a single process or when already joined."""
    if _env_int("WORLD_SIZE", 1) <= 1 or tdist.is_initialized():
        return
    if torch.cuda.is_available():
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0))
    tdist.init_process_group(backend())


def close() -> None:
    if tdist.is_initialized():
        tdist.destroy_process_group()


def world() -> int:
    return tdist.get_world_size() if tdist.is_initialized() else 1


def rank() -> int:
    return tdist.get_rank() if tdist.is_initialized() else 0


def is_main() -> bool:
    """Rank 0 alone logs, shows progress bars and writes files (metrics, checkpoints, adapters, summaries)."""
    return rank() == 0


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def barrier() -> None:
    if world() > 1:
        tdist.barrier()


def sample_range(index: int, per_rank: int, *, rank_: int | None = None, world_: int | None = None) -> range:
    """Global sample numbers of micro-batch ``index`` (``step * grad_accum + micro``) on one rank.

    The global micro-batch ``index`` is samples ``[index * G, (index + 1) * G)`` with ``G = world * per_rank``;
    rank r takes the r-th contiguous slice of ``per_rank``. Ranks never overlap, together they cover every sample
    once, and the global batch (hence the run) is the same as one process taking ``G`` samples at a time.
    """
    r = rank() if rank_ is None else rank_
    w = world() if world_ is None else world_
    first = (index * w + r) * per_rank
    return range(first, first + per_rank)


def mean_scalars(values: dict[str, float]) -> dict[str, float]:
    """The mean of each scalar over the ranks (the global batch's loss when every rank's batch is the same size)."""
    if world() == 1 or not values:
        return values
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device())
    tdist.all_reduce(t)
    return {k: float(v) / world() for k, v in zip(keys, t.tolist())}


def average_gradients(params) -> None:
    """All-reduce the gradients of ``params`` into their mean over the ranks (one collective per dtype)."""
    if world() == 1:
        return
    grads = [p.grad for p in params if p.grad is not None and not is_sharded(p.grad)]  # FSDP2 averaged those
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for g in grads:
        by_dtype.setdefault(g.dtype, []).append(g)
    for gs in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in gs])
        tdist.all_reduce(flat)
        flat /= world()
        i = 0
        for g in gs:
            g.copy_(flat[i:i + g.numel()].view_as(g))
            i += g.numel()


def fsdp_plan(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules FSDP2 shards, innermost first: every block the model names unsplittable (transformers'
    ``_no_split_modules``, the decoder layers), then the model itself (embeddings, final norm, head)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"--fsdp: {type(model).__name__} names no decoder-layer class (_no_split_modules); "
                         "it cannot be sharded layer by layer")
    blocks = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not blocks:
        raise ValueError(f"--fsdp: no module of {sorted(names)} found in {type(model).__name__}")
    return [*blocks, model]


def shard(model: torch.nn.Module, *, keep_whole: list[torch.nn.Parameter] = ()) -> None:
    """Shard ``model`` with FSDP2 ``fully_shard`` over all ranks: every ``fsdp_plan`` block, then the root.

    Retrofit (``--fsdp``): the frozen base is sharded and the trainable routers stay whole on every rank
    (``keep_whole``, FSDP2's ``ignored_params``), so the optimizer, clipping, checkpoints and adapters see plain
    tensors and ``average_gradients`` syncs them. Lab (``train-lm --fsdp``): every parameter is sharded and trained
    as a shard; FSDP2 reduce-scatters the mean gradient itself (``average_gradients`` skips sharded ones), and
    ``full_state`` / ``full_optimizer_state`` gather whole tensors for checkpoints. A no-op in one process."""
    if world() == 1:
        return
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device().type, (world(),))
    ignored = set(keep_whole)
    for m in fsdp_plan(model):
        fully_shard(m, mesh=mesh, ignored_params=ignored or None)


def is_sharded(t: torch.Tensor) -> bool:
    """A DTensor shard (FSDP2) rather than a whole tensor."""
    return type(t).__name__ == "DTensor" and hasattr(t, "full_tensor")


def _sharded(model: torch.nn.Module) -> bool:
    return any(is_sharded(p) for p in model.parameters())


def _full_options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    return StateDictOptions(full_state_dict=True)


def full_state(model: torch.nn.Module) -> dict:
    """``model.state_dict()`` with every tensor whole on every rank (a collective when sharded: every rank calls
    it), so a checkpoint written by rank 0 does not depend on the process count or on ``--fsdp``."""
    if not _sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict
    return {k: v.detach().cpu() for k, v in get_model_state_dict(model, options=_full_options()).items()}


def load_full_state(model: torch.nn.Module, state: dict) -> None:
    """Put whole tensors (``full_state``'s) back into a model, sharded or not."""
    if not _sharded(model):
        model.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_model_state_dict
    set_model_state_dict(model, state, options=_full_options())


def full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The optimizer's state with whole tensors (collective when the model is sharded: every rank calls it)."""
    if not _sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict
    return get_optimizer_state_dict(model, optimizer, options=_full_options())


def load_full_optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    if not _sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    set_optimizer_state_dict(model, optimizer, state, options=_full_options())


def scalar(t) -> float:
    """A Python float from a tensor that may be a (replicated) DTensor, e.g. clipping's total norm under FSDP2."""
    return float(t.full_tensor().item() if is_sharded(t) else t.item())
