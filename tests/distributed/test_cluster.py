"""Many ranks under a scheduler, on gloo processes: what a requeue, a lost lock, another allocation, a wrong
network interface, a node-local run directory, a dead rank and a skewed clock do to a run (issue 23).

Each test starts two processes as torchrun would (its environment variables, or torchrun itself) and reads what
each rank did from files, since a spawned process shares nothing with the test.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from support import NO_DROPOUT, WINDOW, free_port, join_group, prepared, recipe, run_ranks

from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.errors import MtxError
from mtx.train import distributed
from mtx.train.components import Hooks, build_run
from mtx.train.run_lock import RunLock
from mtx.train.trainer import Trainer, train

pytestmark = pytest.mark.dist


def outcome(out: str, rank: int, **fields: object) -> None:
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(fields))


def outcomes(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


# ------------------------------------------------------------------------------------------- the run's lock


def lock_lost_worker(rank: int, world: int, port: int, recipe_path: str, out: str, how: str) -> None:
    """Rank 0 holds the lock; after update 3 another command takes it over. `how`: "heartbeat" (rank 0's
    heartbeat has noticed: `lost`) or "silent" (nothing noticed it yet: only the check before a write can)."""
    ctx = join_group(rank, world, port)
    lock = None
    try:
        if rank == 0:
            lock = RunLock(Path(recipe_path).parent / "run", heartbeat=1000.0, stale_after=2000.0)
            lock.acquire()
        def taken_over_after_3(state, batches, update):
            stepped = update()
            if rank == 0 and state.step == 3:
                record = {"host": "gpu-node-9", "pid": 4242, "token": "taker", "command": "mtx train other.yaml"}
                lock.path.write_text(json.dumps(record))
                lock.lost = how == "heartbeat"
            return stepped

        run = recipe(Path(recipe_path), NO_DROPOUT, max_steps=20, save_every=5, log_every=1, validate_every=100)
        trainer = Trainer(build_run(run, ctx, Hooks(around_update=taken_over_after_3)), lock=lock)
        try:
            trainer.fit()
            outcome(out, rank, error=None, step=trainer.state.step)
        except MtxError as e:
            outcome(out, rank, error=str(e), step=trainer.state.step)
    finally:
        if lock is not None:
            lock.release()
        distributed.teardown()


@pytest.mark.parametrize("how", ["heartbeat", "silent"])
def test_a_lost_lock_stops_every_rank_before_its_next_checkpoint_write(tmp_path: Path, how: str) -> None:
    """Suspended past its heartbeat (PreemptMode=SUSPEND, an NFS stall), a run finds its lock taken over: every
    rank stops with a message naming the new holder, before writing step 5's checkpoint beside it."""
    path = prepared(tmp_path)
    run_ranks(lock_lost_worker, str(path), str(tmp_path), how)
    ranks = outcomes(tmp_path)
    for state in ranks:
        assert state["error"] and "taken over by another command (host gpu-node-9, pid 4242" in state["error"]
    assert [state["step"] for state in ranks] == ([3, 3] if how == "heartbeat" else [5, 5])
    assert not list((tmp_path / "run").glob("checkpoints/*.pt"))  # nothing written beside the new holder
    assert json.loads((tmp_path / "run" / "train.lock").read_text())["token"] == "taker"


# ------------------------------------------------------------------------------------ another allocation


def shape_worker(rank: int, world: int, port: int, recipe_path: str) -> None:
    ctx = join_group(rank, world, port)
    try:
        run = recipe(Path(recipe_path), NO_DROPOUT, update_freq=1, max_steps=3, save_every=100, log_every=1,
                     validate_every=100)
        Trainer(build_run(run, ctx)).fit()
    finally:
        distributed.teardown()


def test_a_two_rank_run_resumed_on_one_process_trains_what_it_would_have(tmp_path: Path) -> None:
    """2 ranks × update_freq 1 for 3 updates, then 1 process × update_freq 2 to update 6 (a smaller allocation,
    the same effective batch): the weights of one process × update_freq 2 trained straight to 6."""
    torch.set_num_threads(1)
    straight, resumed = prepared(tmp_path / "straight"), prepared(tmp_path / "resumed")
    settings = dict(update_freq=2, max_steps=6, save_every=100, log_every=1, validate_every=100)
    expected = Trainer(build_run(recipe(straight, NO_DROPOUT, **settings), distributed.setup("cpu")))
    expected.fit()
    run_ranks(shape_worker, str(resumed))
    continued = Trainer(build_run(recipe(resumed, NO_DROPOUT, **settings), distributed.setup("cpu")))
    assert (continued.state.step, continued.state.batch_in_epoch, continued.state.world) == (3, 6, 1)
    continued.fit()
    for name, tensor in expected.parts.model.state_dict().items():
        torch.testing.assert_close(continued.parts.model.state_dict()[name], tensor, atol=1e-5, rtol=0, msg=name)


def compiled_worker(rank: int, world: int, port: int, recipe_path: str, compiled: bool) -> None:
    """train.compile under DDP. On a CPU the path through torch.compile is what is tested, not inductor's C++
    build: the graphs are compiled by AOTAutograd without generating code (as gpu_check does on a CPU)."""
    import functools

    torch.compile = functools.partial(torch.compile, backend="aot_eager")
    ctx = join_group(rank, world, port)
    try:
        run = recipe(Path(recipe_path), NO_DROPOUT, compile=compiled, max_steps=6, log_every=1, save_every=100,
                     validate_every=100)
        Trainer(build_run(run, ctx)).fit()
    finally:
        distributed.teardown()


def test_compiled_training_under_ddp_gives_eager_ddps_losses(tmp_path: Path) -> None:
    """torch.compile inside DistributedDataParallel (its all-reduce hooked into the compiled backward): two
    ranks' updates give the losses and gradient norms of eager DDP."""
    logs = []
    for compiled in (False, True):
        path = prepared(tmp_path / str(compiled))
        run_ranks(compiled_worker, str(path), compiled)
        lines = [json.loads(line) for line in (path.parent / "run" / "metrics.jsonl").read_text().splitlines()]
        logs.append([(e["step"], e["loss"], e["grad_norm"]) for e in lines if e["event"] == "train"])
    eager, compiled = logs
    assert [step for step, _, _ in compiled] == [1, 2, 3, 4, 5, 6]
    for (_, loss, norm), (_, expected_loss, expected_norm) in zip(compiled, eager, strict=True):
        assert loss == pytest.approx(expected_loss, rel=1e-4) and norm == pytest.approx(expected_norm, rel=1e-3)


# -------------------------------------------------------------------------------------- start-up checks


def gloo_interface_worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "mtxnosuch0"
    try:
        join_group(rank, world, port)
        outcome(out, rank, error=None)
    except MtxError as e:
        outcome(out, rank, error=str(e))
    finally:
        distributed.teardown()


def test_a_gloo_set_up_that_fails_names_gloo_socket_ifname(tmp_path: Path) -> None:
    run_ranks(gloo_interface_worker, str(tmp_path))
    for rank, state in enumerate(outcomes(tmp_path)):
        assert state["error"].startswith(f"Rank {rank} could not join the gloo group"), state
        assert "GLOO_SOCKET_IFNAME is 'mtxnosuch0'" in state["error"] and "NCCL_SOCKET_IFNAME" in state["error"]


def shared_directory_worker(rank: int, world: int, port: int, base: str, out: str, node_local: bool) -> None:
    """`check_shared_directory` of runs/demo under `base`; with `node_local`, each rank in a working directory
    of its own, the run directory relative to it: what node-local disks give every node."""
    work = Path(base) / (f"node{rank}" if node_local else "shared")
    work.mkdir(exist_ok=True)
    os.chdir(work)
    join_group(rank, world, port)
    try:
        distributed.check_shared_directory(Path("runs/demo"))
        outcome(out, rank, error=None)
    except MtxError as e:
        outcome(out, rank, error=str(e))
    finally:
        distributed.teardown()


def test_a_run_directory_that_the_ranks_do_not_share_is_refused(tmp_path: Path) -> None:
    run_ranks(shared_directory_worker, str(tmp_path), str(tmp_path), True)
    for state in outcomes(tmp_path):
        assert "The run directory runs/demo is not shared by all ranks: rank 1 on" in state["error"]
        assert "starts over" in state["error"]
    assert list((tmp_path / "node0" / "runs" / "demo").iterdir()) == []  # the probe is removed


def test_a_shared_run_directory_passes_the_check(tmp_path: Path) -> None:
    run_ranks(shared_directory_worker, str(tmp_path), str(tmp_path), False)
    assert [state["error"] for state in outcomes(tmp_path)] == [None, None]
    assert list((tmp_path / "shared" / "runs" / "demo").iterdir()) == []


def skewed_clock_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    """Rank 1's clock jumps 5 s ahead once its trainer is built: near train.max_time, the ranks' clocks
    disagree on whether it is reached."""
    ctx = join_group(rank, world, port)
    ahead = [0.0]  # rank 1's clock: the real one, then 5 s ahead once the trainer is built
    try:
        run = recipe(Path(recipe_path), NO_DROPOUT, max_steps=1000, max_time="60s", save_every=100, validate_every=100)
        trainer = Trainer(build_run(run, ctx, Hooks(clock=lambda: time.monotonic() + ahead[0])))
        if rank == 1:
            ahead[0] = 5.0
        state = trainer.fit()
        outcome(out, rank, error=None, step=state.step)
    except Exception as e:  # a broken collective is what this test catches
        outcome(out, rank, error=f"{type(e).__name__}: {e}")
    finally:
        distributed.teardown()


def test_the_ranks_agree_on_whether_there_is_anything_left_to_do(tmp_path: Path) -> None:
    """A run resumed 2 s short of train.max_time: rank 1, whose clock is ahead, must not decide alone that
    there is nothing to do while rank 0 waits for it in the first collective. Both stop at the same step."""
    path = prepared(tmp_path)
    train(recipe(path, NO_DROPOUT, max_steps=2, save_every=2, validate_every=100))
    checkpoint_path = tmp_path / "run" / "checkpoints" / "step_2.pt"
    checkpoint = load_checkpoint(checkpoint_path)
    checkpoint["train_state"]["progress"]["train_seconds"] = 58.0
    torch.save(checkpoint, checkpoint_path)
    run_ranks(skewed_clock_worker, str(path), str(tmp_path))
    assert outcomes(tmp_path) == [{"error": None, "step": 2}, {"error": None, "step": 2}]


# ------------------------------------------------------------------------------------------- a dead rank


def failing_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    """Rank 1 fails on its own (as out of memory on its longest batch would) at update 3; what rank 0 says."""
    ctx = join_group(rank, world, port)
    try:
        def fails_at_3(state, batches, update):
            if rank == 1 and state.step == 3:
                raise MtxError("the longest batch did not fit")
            return update()

        run = recipe(Path(recipe_path), NO_DROPOUT, max_steps=20, save_every=2, log_every=1, validate_every=100)
        trainer = Trainer(build_run(run, ctx, Hooks(around_update=fails_at_3)))
        try:
            trainer.fit()
        except Exception as e:
            if distributed.is_peer_failure(e):
                outcome(out, rank, error=str(distributed.peers_lost(e)), final=True)
                return
            distributed.record_failure(e)
            outcome(out, rank, error=str(e), final=False)
    finally:
        if rank == 1:
            distributed.teardown()


def test_the_survivor_of_a_failed_rank_stops_at_once_and_names_it(tmp_path: Path) -> None:
    path = prepared(tmp_path)
    started = time.monotonic()
    mp.spawn(failing_worker, args=(2, free_port(), str(path), str(tmp_path)), nprocs=2, join=True)
    assert time.monotonic() - started < 60
    survivor, failed = outcomes(tmp_path)
    assert failed == {"error": "the longest batch did not fit", "final": False}
    assert survivor["final"] and survivor["error"].startswith("Rank 0 stops: a collective with the other ranks failed")
    assert "rank 1 (" in survivor["error"] and "the longest batch did not fit) failed first" in survivor["error"]
    assert [step for step, _ in step_checkpoints(tmp_path / "run" / "checkpoints")] == [2]


def test_kill_9_of_one_rank_ends_torchrun_in_time_with_whole_checkpoints(tmp_path: Path) -> None:
    """A node failure, as torchrun sees it: one worker killed outright. The survivor's next collective fails
    and it exits non-zero at once with one line, writing nothing; torchrun returns well within its
    --shutdown-timeout, and every checkpoint on disk is whole."""
    path = prepared(tmp_path)
    metrics, checkpoints = tmp_path / "run" / "metrics.jsonl", tmp_path / "run" / "checkpoints"
    # torchrun looks at its workers every 3 s, not every 0.1 s: the survivor's failed collective, not torchrun
    # noticing the death first and stopping the survivor before it can say why, is what is under test
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
               str(free_port()), f"--shutdown-timeout={WINDOW}", "--monitor-interval=3", "-m", "mtx", "train",
               str(path), "--set", "train.log_every=1", "--set", "train.max_steps=1000000", "--set",
               "train.save_every=3"]
    process = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 7):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "torchrun did not start training within 2 minutes"
        time.sleep(0.05)
    workers = subprocess.run(["pgrep", "-P", str(process.pid)], capture_output=True, text=True).stdout.split()
    rank_1 = next(int(pid) for pid in workers if b"RANK=1\0" in Path(f"/proc/{pid}/environ").read_bytes())
    killed = time.monotonic()
    os.kill(rank_1, signal.SIGKILL)
    _, err = process.communicate(timeout=120)
    took = time.monotonic() - killed
    assert process.returncode != 0
    assert took < WINDOW - 10, f"torchrun took {took:.1f} s to end\n{err}"
    assert "Rank 0 stops: a collective with the other ranks failed" in err
    assert "another rank stopped without a word" in err and "[rank0]: Traceback" not in err
    assert not list(checkpoints.glob(".*.tmp"))
    for step, checkpoint in step_checkpoints(checkpoints):
        assert load_checkpoint(checkpoint)["step"] == step
