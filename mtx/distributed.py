"""One code path from one CPU to many nodes: torchrun's environment in, a process group and a device out.

torchrun (and `srun torchrun` under SLURM) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for
every process it starts. Without them this is a single process and nothing distributed is initialised, so a
plain `mtx train` needs no launcher. NCCL joins GPUs; gloo joins CPU processes, which is how the tests check
that two processes train exactly as one process with gradient accumulation.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from mtx.errors import MtxError


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


def setup(device: str = "auto") -> Context:
    """Choose the device (`auto`, `cpu` or `cuda`) and, under torchrun, join the process group."""
    if device == "cuda" and not torch.cuda.is_available():
        raise MtxError("train.device = 'cuda' but PyTorch sees no CUDA GPU here: set train.device to auto or cpu, "
                       "or run on a machine with a GPU and a CUDA build of PyTorch.")
    use_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if use_cuda:
        torch.cuda.set_device(local_rank)
        chosen = torch.device("cuda", local_rank)
    else:
        chosen = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo", device_id=chosen if use_cuda else None)
    return Context(rank, world, chosen)


def teardown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over all ranks (in place, returned); the identity for a single process."""
    if dist.is_initialized():
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (picklable Python values, e.g. lists of strings)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()
