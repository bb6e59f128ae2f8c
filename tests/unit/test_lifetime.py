"""mtx.decode.lifetime: the processes `map_in_processes` forks end with their parent, even one killed with
SIGKILL (they would otherwise live on, holding the model's memory, with nobody to read what they decode)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from mtx.decode.lifetime import end_with_parent

# A parent that decodes, in two forked processes, two batches that take a minute: each child says its pid first,
# in one write (print's text and its newline are two writes, which the two children's can interleave in the pipe).
PROGRAM = """
import os, sys, time
from mtx.decode.translator import map_in_processes

def decode(item):
    os.write(1, f"{os.getpid()}\\n".encode())
    time.sleep(60)

map_in_processes(decode, [0, 1], at_once=2, threads_each=1)
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


@pytest.mark.skipif(sys.platform == "win32", reason="no fork")
def test_a_child_whose_parent_is_already_gone_ends_at_once() -> None:
    """The race the check after the request closes: the parent ended before the child asked to end with it."""
    child = os.fork()
    if child == 0:  # the child, told a parent that is not its own (as if its parent had ended and it was adopted)
        end_with_parent(os.getppid() + 1_000_000)
        time.sleep(10)
        os._exit(0)  # not reached when end_with_parent ends this process, as it must
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 1
