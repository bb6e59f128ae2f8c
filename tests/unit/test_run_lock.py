"""The run-directory lock: one holder, a refusal that names it, stale locks taken over, a heartbeat."""

import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from mtx.errors import MtxError
from mtx.train.run_lock import LOCK_NAME, RunLock

HOST = socket.gethostname()


def write_lock(run_dir: Path, age: float = 0.0, **fields) -> Path:
    """A lock file as another holder would leave it, its heartbeat `age` seconds old."""
    record = {"host": HOST, "pid": os.getpid(), "started": "2024-01-01T00:00:00+00:00", "token": "other",
              "command": "mtx train other.yaml"} | fields
    path = run_dir / LOCK_NAME
    run_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    set_age(path, age)
    return path


def set_age(path: Path, age: float) -> None:
    then = time.time() - age
    os.utime(path, (then, then))


def read_lock(run_dir: Path) -> dict:
    return json.loads((run_dir / LOCK_NAME).read_text())


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a running process other than this one."""
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    yield child.pid
    child.stdin.close()
    child.wait(timeout=10)


@pytest.fixture
def dead_pid() -> int:
    """The pid of a process that has exited (and been reaped, so it is not even a zombie)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=10)
    return child.pid


def test_acquire_writes_the_holder_and_release_removes_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run" / "nested"  # created if needed
    with RunLock(run_dir) as lock:
        record = read_lock(run_dir)
        assert record["host"] == HOST and record["pid"] == os.getpid() and record["token"] == lock.token
        assert record["started"] and "command" in record
        assert lock.replaced_stale is None and not lock.lost
    assert not (run_dir / LOCK_NAME).exists()
    assert [p.name for p in run_dir.iterdir()] == []  # no temp or takeover files left behind
    lock.release()  # a second release is harmless

    lock.acquire()  # and the same object can lock again
    assert read_lock(run_dir)["token"] == lock.token
    lock.release()


def test_a_second_lock_in_the_same_process_is_refused(tmp_path: Path) -> None:
    with RunLock(tmp_path) as first:
        with pytest.raises(MtxError) as refused:
            RunLock(tmp_path).acquire()
        message = str(refused.value)
        assert f"host {HOST}" in message and f"pid {os.getpid()}" in message
        assert str(tmp_path / LOCK_NAME) in message and "last heartbeat 0 s ago" in message
        assert read_lock(tmp_path)["token"] == first.token  # the refused attempt changed nothing
        with pytest.raises(RuntimeError):
            first.acquire()


def test_a_lock_of_another_live_process_is_refused(tmp_path: Path, live_pid: int) -> None:
    write_lock(tmp_path, pid=live_pid)
    with pytest.raises(MtxError) as refused:
        RunLock(tmp_path).acquire()
    message = str(refused.value)
    assert f"pid {live_pid}" in message and "(this machine)" in message and "`mtx train other.yaml`" in message
    assert "goes stale after 5 minutes" in message and f"kill {live_pid}" in message
    assert read_lock(tmp_path)["token"] == "other"


def test_a_lock_held_by_a_real_child_process(tmp_path: Path) -> None:
    code = ("import sys; from mtx.train.run_lock import RunLock; lock = RunLock(sys.argv[1]); lock.acquire(); "
            "print('locked', flush=True); sys.stdin.read(); lock.release()")
    child = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "locked"
        with pytest.raises(MtxError, match=f"pid {child.pid}"):
            RunLock(tmp_path).acquire()
    finally:
        child.stdin.close()
        child.wait(timeout=10)
    with RunLock(tmp_path) as lock:  # released by the child: free again, nothing stale
        assert lock.replaced_stale is None


def test_a_lock_whose_pid_is_dead_on_this_host_is_taken_over(tmp_path: Path, dead_pid: int) -> None:
    write_lock(tmp_path, pid=dead_pid)
    with RunLock(tmp_path) as lock:
        assert lock.replaced_stale is not None
        assert lock.replaced_stale["pid"] == dead_pid and lock.replaced_stale["token"] == "other"
        assert f"pid {dead_pid} is not running" in lock.replaced_stale["stale_reason"]
        assert read_lock(tmp_path)["token"] == lock.token
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_our_own_pid_with_a_token_we_never_took_is_stale(tmp_path: Path) -> None:
    # A restarted container: same hostname, same pid, but this process never took that lock.
    write_lock(tmp_path, pid=os.getpid(), token="from-before-the-restart")
    with RunLock(tmp_path) as lock:
        assert lock.replaced_stale["token"] == "from-before-the-restart"


def test_another_hosts_lock_is_stale_only_without_a_heartbeat(tmp_path: Path) -> None:
    write_lock(tmp_path, host="gpu-node-17", pid=4242, age=10.0)
    with pytest.raises(MtxError) as refused:
        RunLock(tmp_path, stale_after=60.0, heartbeat=1.0).acquire()
    message = str(refused.value)
    assert "host gpu-node-17, pid 4242" in message and "last heartbeat 10 s ago" in message
    assert "goes stale after 60 s" in message and "(this machine)" not in message

    set_age(tmp_path / LOCK_NAME, 61.0)
    with RunLock(tmp_path, stale_after=60.0, heartbeat=1.0) as lock:
        assert lock.replaced_stale["host"] == "gpu-node-17" and lock.replaced_stale["pid"] == 4242
        assert "no heartbeat for 61 s" in lock.replaced_stale["stale_reason"]
        assert read_lock(tmp_path)["token"] == lock.token


def test_the_heartbeat_refreshes_the_lock(tmp_path: Path) -> None:
    with RunLock(tmp_path, stale_after=1.0, heartbeat=0.05) as lock:
        path = tmp_path / LOCK_NAME
        set_age(path, 100.0)
        assert wait_for(lambda: time.time() - path.stat().st_mtime < 1.0)
        assert not lock.lost
        # So another command, seeing that heartbeat, refuses even with a short stale_after.
        with pytest.raises(MtxError):
            RunLock(tmp_path, stale_after=1.0, heartbeat=0.05).acquire()


def test_the_heartbeat_never_recreates_a_removed_lock(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, stale_after=1.0, heartbeat=0.05)
    lock.acquire()
    (tmp_path / LOCK_NAME).unlink()
    assert wait_for(lambda: lock.lost)
    assert not (tmp_path / LOCK_NAME).exists()
    lock.release()
    assert not (tmp_path / LOCK_NAME).exists()


def test_release_keeps_a_lock_another_holder_took_over(tmp_path: Path) -> None:
    lock = RunLock(tmp_path, stale_after=1.0, heartbeat=0.05)
    lock.acquire()
    write_lock(tmp_path, host="gpu-node-3", token="taker", age=0.0)
    assert wait_for(lambda: lock.lost)
    set_age(tmp_path / LOCK_NAME, 0.5)
    time.sleep(0.2)  # several heartbeats: none of them touches the taker's lock
    assert time.time() - (tmp_path / LOCK_NAME).stat().st_mtime > 0.5
    lock.release()
    assert read_lock(tmp_path)["token"] == "taker"


def test_a_torn_lock_is_taken_over_once_it_is_old(tmp_path: Path) -> None:
    path = tmp_path / LOCK_NAME
    path.write_text('{"host": "gpu-no')
    with pytest.raises(MtxError, match="is being locked by another `mtx train` right now"):
        RunLock(tmp_path).acquire()  # young: its writer may be about to finish it

    set_age(path, 30.0)
    with RunLock(tmp_path) as lock:
        assert "unreadable lock file" in lock.replaced_stale["stale_reason"]
        assert read_lock(tmp_path)["token"] == lock.token


def test_a_lock_without_a_valid_pid_counts_as_torn(tmp_path: Path) -> None:
    write_lock(tmp_path, pid=0, age=30.0)  # pid 0 would make os.kill signal our own process group
    with RunLock(tmp_path) as lock:
        assert "unreadable lock file" in lock.replaced_stale["stale_reason"]


def race_for(run_dir: Path, takers: int) -> tuple[list[RunLock], list[MtxError]]:
    """`takers` threads of this process acquire the lock of `run_dir` at the same moment."""
    start = threading.Barrier(takers)
    won: list[RunLock] = []
    refused: list[MtxError] = []

    def take() -> None:
        lock = RunLock(run_dir)
        start.wait()
        try:
            lock.acquire()
            won.append(lock)
        except MtxError as e:
            refused.append(e)

    threads = [threading.Thread(target=take) for _ in range(takers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return won, refused


def test_of_threads_taking_one_stale_lock_exactly_one_wins(tmp_path: Path) -> None:
    for attempt in range(10):
        run_dir = tmp_path / str(attempt)
        write_lock(run_dir, host="gpu-node-9", age=1000.0)
        won, refused = race_for(run_dir, takers=4)
        assert len(won) == 1 and len(refused) == 3, (won, refused)
        assert read_lock(run_dir)["token"] == won[0].token
        won[0].release()
        assert list(run_dir.iterdir()) == []


def test_of_processes_taking_one_stale_lock_exactly_one_wins(tmp_path: Path) -> None:
    # Each process waits for a line on stdin, so all of them are started (imports done) before any tries.
    code = ("import sys; from mtx.errors import MtxError; from mtx.train.run_lock import RunLock; "
            "lock = RunLock(sys.argv[1]); sys.stdin.readline()\n"
            "try:\n    lock.acquire(); print('won', flush=True); sys.stdin.read(); lock.release()\n"
            "except MtxError:\n    print('refused', flush=True)")
    for attempt in range(3):
        run_dir = tmp_path / str(attempt)
        write_lock(run_dir, host="gpu-node-9", age=1000.0)
        children = [subprocess.Popen([sys.executable, "-c", code, str(run_dir)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True) for _ in range(4)]
        for child in children:
            child.stdin.write("go\n")
        for child in children:
            child.stdin.flush()
        outcomes = [child.stdout.readline().strip() for child in children]
        winners = [child for child, outcome in zip(children, outcomes, strict=True) if outcome == "won"]
        try:
            assert sorted(outcomes) == ["refused"] * 3 + ["won"], outcomes
            assert read_lock(run_dir)["pid"] == winners[0].pid
        finally:
            for child in children:
                child.stdin.close()
                child.wait(timeout=10)
        assert list(run_dir.iterdir()) == []


def test_heartbeat_must_come_before_staleness() -> None:
    with pytest.raises(ValueError, match="heartbeat < stale_after"):
        RunLock(Path("."), stale_after=10.0, heartbeat=10.0)


JOB_VARIABLES = ("SLURM_JOB_ID", "SLURM_RESTART_COUNT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT")


@pytest.fixture
def no_job(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment outside any scheduler's job, whatever the one the tests run in."""
    for name in JOB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_requeued_slurm_job_takes_over_the_lock_of_its_earlier_run_at_once(tmp_path: Path, no_job) -> None:
    """Rank 0 SIGKILLed on node A left a lock with a fresh heartbeat; SLURM's requeue (same job id, restart
    count one up) lands on node B and takes it over at once instead of exiting 1 and ending the chain."""
    no_job.setenv("SLURM_JOB_ID", "81234")
    no_job.setenv("SLURM_RESTART_COUNT", "1")
    write_lock(tmp_path, host="gpu-node-17", pid=4242, age=2.0, job="slurm:81234", restart=0)
    with RunLock(tmp_path, stale_after=300.0, heartbeat=1.0) as lock:
        assert "restart 0 of this job (slurm:81234)" in lock.replaced_stale["stale_reason"]
        record = read_lock(tmp_path)
        assert (record["job"], record["restart"], record["token"]) == ("slurm:81234", 1, lock.token)


def test_a_fresh_lock_of_another_job_or_of_this_very_run_is_refused(tmp_path: Path, no_job) -> None:
    no_job.setenv("SLURM_JOB_ID", "81234")  # first run: SLURM sets no SLURM_RESTART_COUNT
    for fields in (dict(job="slurm:99999", restart=0),  # another job: its own lock, alive
                   dict(job="slurm:81234", restart=0),  # the same incarnation: not ours to take
                   dict(job="slurm:81234", restart=2),  # a later incarnation
                   {}):  # a lock of an mtx from before jobs were recorded
        write_lock(tmp_path, host="gpu-node-17", pid=4242, age=2.0, **fields)
        with pytest.raises(MtxError, match="in use by another `mtx train`"):
            RunLock(tmp_path, stale_after=300.0, heartbeat=1.0).acquire()


def test_torchrun_restarts_count_like_requeues_and_an_unnamed_run_names_no_job(tmp_path: Path, no_job) -> None:
    no_job.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun without --rdzv-id: every run is "none"
    write_lock(tmp_path, host="gpu-node-17", pid=4242, age=2.0, job="torchrun:none", restart=0)
    with pytest.raises(MtxError):
        RunLock(tmp_path, stale_after=300.0, heartbeat=1.0).acquire()
    no_job.setenv("TORCHELASTIC_RUN_ID", "wmt-big")
    no_job.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    write_lock(tmp_path, host="gpu-node-17", pid=4242, age=2.0, job="torchrun:wmt-big", restart=2)
    with RunLock(tmp_path, stale_after=300.0, heartbeat=1.0) as lock:
        assert "restart 2 of this job (torchrun:wmt-big)" in lock.replaced_stale["stale_reason"]


def test_still_held_reads_the_lock_now_and_names_the_new_holder(tmp_path: Path, no_job) -> None:
    """A holder suspended past its heartbeat finds, before its next write, that the lock is another's."""
    lock = RunLock(tmp_path, stale_after=300.0, heartbeat=100.0)  # no heartbeat will run during the test
    lock.acquire()
    try:
        assert lock.still_held() and not lock.lost
        write_lock(tmp_path, host="gpu-node-3", pid=77, token="taker", command="mtx train big.yaml")
        assert not lock.still_held() and lock.lost
        assert lock.holder() == "host gpu-node-3, pid 77, `mtx train big.yaml`"
    finally:
        lock.release()
    assert read_lock(tmp_path)["token"] == "taker"
