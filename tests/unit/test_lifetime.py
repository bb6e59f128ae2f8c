"""mtx.decode.lifetime: the decoding workers (mtx.decode.workers) end with the process that started them, even one
killed with SIGKILL (they would otherwise live on, holding the model's memory, with nobody to read what they
decode)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mtx.decode.lifetime import end_with_parent

# A parent whose two workers each take a minute over a call: each worker says its pid first (`Probe.sleep`).
PROGRAM = f"""
import sys
sys.path.insert(0, {str(Path(__file__).resolve().parent.parent)!r})
from support import load_probe
from mtx.decode.workers import WorkerPool

WorkerPool(2, load_probe, 0).map("sleep", [(60,), (60,)])
"""


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.skipif(sys.platform == "win32", reason="no fork")
def test_decoding_processes_die_with_a_parent_killed_with_sigkill() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True)
    children = []
    try:
        while len(children) < 2:
            line = parent.stdout.readline()
            assert line, "the program ended before its children said their pids"
            children += [int(pid) for pid in line.split()]
        assert all(alive(pid) for pid in children)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 5.0
        while any(alive(pid) for pid in children) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(alive(pid) for pid in children)
    finally:
        parent.kill()
        for pid in children:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_worker_whose_parent_is_already_gone_ends_at_once() -> None:
    """The race the watcher closes: the parent ended before the worker began to watch it."""
    import multiprocessing

    context = multiprocessing.get_context("forkserver")
    reader, writer = context.Pipe(duplex=False)
    parent = context.Process(target=start_a_worker_and_end, args=(writer,))
    parent.start()
    worker = reader.recv()
    parent.join(timeout=30)
    deadline = time.monotonic() + 10.0
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(worker)


def start_a_worker_and_end(writer) -> None:
    """Start a worker that waits before watching, say its pid, and end at once (os._exit: no cleanup)."""
    import multiprocessing

    worker = multiprocessing.get_context("forkserver").Process(target=watch_late, daemon=False)
    worker.start()
    writer.send(worker.pid)
    os._exit(0)


def watch_late() -> None:
    time.sleep(1.0)  # its parent is gone by now
    end_with_parent()
    time.sleep(60)
