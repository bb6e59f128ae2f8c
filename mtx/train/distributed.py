"""One code path from one CPU to many nodes: torchrun's environment in, process groups and a device out.

torchrun (and `srun torchrun` under SLURM) sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for
every process it starts. Without them this is a single process and nothing distributed is initialised, so a
plain `mtx train` needs no launcher. NCCL joins GPUs; gloo joins CPU processes, which is how the tests check
that two processes train exactly as one process with gradient accumulation.

The trainer's own bookkeeping (token counts, stop requests, the checkpoint to resume) travels in small CPU
tensors and Python objects over a second, gloo group: agreeing on them over NCCL would copy them to the GPU
and make the host wait for all the GPU work queued before them, every update. gloo binds to the address the
host's name resolves to, which on many clusters is 127.0.1.1 or a management network: GLOO_SOCKET_IFNAME names
the interface it must use (the one of NCCL_SOCKET_IFNAME), and a gloo set-up that fails says so.

A collective that fails (a peer died, was killed, or failed on its own) is final for this process
(`PeersLostError`): it writes nothing more and exits. A rank that fails on its own first leaves a line in the
process group's store (`record_failure`), so the others can name it (`first_failure`); a rank killed outright
leaves none, and torchrun's summary names it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from mtx.devices import choose_device
from mtx.errors import MtxError, PeersLostError, first_line

_control: dist.ProcessGroup | None = None  # the gloo group for host-side agreement (the default one on CPUs)
_rank = 0
FAILURE_KEY = "mtx/first_failure"  # in the process group's store: the first rank that failed on its own, and why
T = TypeVar("T")


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
    global _control, _rank
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    _rank = rank
    chosen = choose_device(device, "train.device", index=int(os.environ.get("LOCAL_RANK", 0)))
    if chosen.type == "cuda":
        torch.cuda.set_device(chosen)
    under_torchrun = "TORCHELASTIC_RUN_ID" in os.environ
    if (world > 1 or under_torchrun) and not dist.is_initialized():
        limit = timedelta(seconds=timeout)
        if chosen.type == "cuda":
            dist.init_process_group(backend="nccl", timeout=limit, device_id=chosen)
            _control = _gloo_set_up(lambda: dist.new_group(backend="gloo", timeout=limit), rank)
        else:
            _gloo_set_up(lambda: dist.init_process_group(backend="gloo", timeout=limit), rank)
            _control = dist.group.WORLD
    return Context(rank, world, chosen)


def _gloo_set_up(make: Callable[[], T], rank: int) -> T:
    """`make()`, which sets up a gloo group; its failure in words a cluster user can act on."""
    try:
        return make()
    except (RuntimeError, ValueError) as e:  # gloo's errors are RuntimeErrors (DistError and its kin included)
        interface = os.environ.get("GLOO_SOCKET_IFNAME")
        now = f"GLOO_SOCKET_IFNAME is {interface!r}" if interface else "GLOO_SOCKET_IFNAME is not set"
        raise MtxError(
            f"Rank {rank} could not join the gloo group that the ranks agree over ({first_line(e, 200)}). gloo uses "
            f"the address that this host's name ({socket.gethostname()}) resolves to, unless GLOO_SOCKET_IFNAME "
            f"names a network interface; {now}. Set it on every node to the interface the nodes reach each other "
            "on, the one NCCL uses (e.g. export GLOO_SOCKET_IFNAME=ib0 NCCL_SOCKET_IFNAME=ib0; `ip -brief addr` "
            "lists them).") from None


def teardown() -> None:
    global _control
    if dist.is_initialized():
        dist.destroy_process_group()
    _control = None


def all_reduce_sum(values: torch.Tensor) -> torch.Tensor:
    """The element-wise sum over all ranks (in place, returned); the identity for a single process.

    A CPU tensor is summed over the gloo group, a GPU tensor over the default (NCCL) one."""
    if dist.is_initialized():
        group = _control if values.device.type == "cpu" else None
        _collective(lambda: dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group))
    return values


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (picklable Python values, e.g. lists of strings)."""
    if not dist.is_initialized():
        return [obj]
    gathered: list[Any] = [None] * dist.get_world_size()
    _collective(lambda: dist.all_gather_object(gathered, obj, group=_control))
    return gathered


def broadcast_object(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (what the other ranks pass is ignored)."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    _collective(lambda: dist.broadcast_object_list(holder, src=0, group=_control))
    return holder[0]


def barrier() -> None:
    if dist.is_initialized():
        _collective(lambda: dist.barrier(group=_control))


def _collective(call: Callable[[], Any]) -> None:
    try:
        call()
    except RuntimeError as e:
        if not is_peer_failure(e):
            raise
        raise peers_lost(e) from None


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective failing because a peer is gone, rather than an error of this rank's own:
    what NCCL raises (DistBackendError), and gloo's errors of a connection the peer closed or reset."""
    if isinstance(error, (PeersLostError, dist.DistError)):
        return True
    message = str(error)
    return isinstance(error, RuntimeError) and any(
        sign in message for sign in ("gloo", "NCCL", "Connection closed by peer", "Connection reset by peer"))


def peers_lost(error: BaseException) -> PeersLostError:
    """The final error of a rank whose collective failed: why, which rank failed first when one said so, and
    that the checkpoints written so far are whole."""
    if isinstance(error, PeersLostError):
        return error
    first = first_failure()
    cause = (f"{first} failed first" if first else
             "another rank stopped without a word (killed, or its node failed: torchrun's summary names it)")
    return PeersLostError(
        f"Rank {_rank} stops: a collective with the other ranks failed ({first_line(error, 200)}); {cause}. It writes "
        "no checkpoint: those written before are whole, and the same command resumes from the newest once every "
        "rank can run.")


def record_failure(error: BaseException) -> None:
    """Leave, for the other ranks, the first line of this rank's own failure in the process group's store,
    unless another rank's is there already: they name it when their collectives fail."""
    store = _store()
    if store is None:
        return
    # The store is another process's (rank 0's, or torchrun's), which may be gone too.
    with contextlib.suppress(Exception):
        store.compare_set(FAILURE_KEY, "", f"rank {_rank} ({socket.gethostname()}: {first_line(error, 200)})")


def first_failure() -> str | None:
    """The failure a rank recorded first, if any rank did and the store can still be reached."""
    store = _store()
    try:
        if store is not None and store.check([FAILURE_KEY]):
            return store.get(FAILURE_KEY).decode()
    except Exception:  # the store went with the process that held it
        pass
    return None


def _store() -> dist.Store | None:
    if not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except (AttributeError, RuntimeError, ValueError):  # a PyTorch without it: failures go unnamed
        return None


def check_shared_directory(directory: Path) -> None:
    """Refuse a run directory that the ranks do not share: rank 0 writes a random token into it and every rank
    reads it back. On node-local disks a requeue that puts rank 0 on another node would find no checkpoint and
    start over from step 0, and the ranks would resume from different steps."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    token = secrets.token_hex(8) if _rank == 0 else None
    probe = directory / f".shared-check-{broadcast_object(token)}"
    if _rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        probe.write_text(probe.name)
    barrier()
    try:
        seen = probe.read_text() == probe.name
    except OSError:
        seen = False
    views = all_gather_objects((seen, socket.gethostname()))
    blind = [f"rank {rank} on {host}" for rank, (ok, host) in enumerate(views) if not ok]
    barrier()
    if _rank == 0:
        probe.unlink(missing_ok=True)
    if blind:
        raise MtxError(
            f"The run directory {directory} is not shared by all ranks: {', '.join(blind)} cannot see a file rank "
            f"0 ({views[0][1]}) wrote there. Every node must see the same "
            "run directory, or a requeue that puts rank 0 on another node finds no checkpoint and starts over: set "
            "the recipe's run_dir (or run from a working directory) on a filesystem all nodes mount, such as NFS "
            "or Lustre.")

