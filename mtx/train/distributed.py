"""One code path from one CPU to many nodes: torchrun's environment in, process groups and a device out.

torchrun (and `srun torchrun` under SLURM) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for
every process it starts. Without them this is a single process and nothing distributed is initialised, so a
plain `mtx train` needs no launcher. NCCL joins GPUs; gloo joins CPU processes, which is how the tests check
that two processes train exactly as one process with gradient accumulation.

The trainer's own bookkeeping (token counts, stop requests, the checkpoint to resume) travels in small CPU
tensors and Python objects over a second, gloo group: agreeing on them over NCCL would copy them to the GPU
and make the host wait for all the GPU work queued before them, every update.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from mtx.devices import choose_device

_control: dist.ProcessGroup | None = None  # the gloo group for host-side agreement (the default one on CPUs)


@dataclass(frozen=True)
class Context:
    """Where this process stands: its rank among `world` processes, and the device it computes on."""

    rank: int
    world: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        """Rank 0 alone writes files and prints progress."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def setup(device: str = "auto", timeout: float = 1800.0) -> Context:
    """Choose the device (`auto`, `cpu` or `cuda`) and, under torchrun, join the process groups: even as its
    only process, so that one GPU under torchrun runs the code of many (NCCL included).

    `timeout` (seconds) bounds how long a collective waits for a rank that does not arrive, such as the
    others while rank 0 writes a checkpoint to a slow shared filesystem; past it the run fails instead of
    hanging.
    """
    global _control
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    chosen = choose_device(device, "train.device", index=int(os.environ.get("LOCAL_RANK", 0)))
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if (world > 1 or under_torchrun) and not dist.is_initialized():
        limit = timedelta(seconds=timeout)
        if chosen.type == "cuda":
            dist.init_process_group(backend="nccl", timeout=limit, device_id=chosen)
            _control = dist.new_group(backend="gloo", timeout=limit)
        else:
            dist.init_process_group(backend="gloo", timeout=limit)
            _control = dist.group.WORLD
    return Context(rank, world, chosen)


def teardown() -> None:
    global _control
    if dist.is_initialized():
        dist.destroy_process_group()
    _control = None


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over all ranks (in place, returned); the identity for a single process.

    A CPU tensor is summed over the gloo group, a GPU tensor over the default (NCCL) one."""
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM, group=_control if values.device.type == "cpu" else None)
    return values


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (picklable Python values, e.g. lists of strings)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj, group=_control)
    return gathered


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (what the other ranks pass is ignored)."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0, group=_control)
    return holder[0]


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier(group=_control)
