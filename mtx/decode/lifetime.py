"""A forked decoding process ends with the process that forked it, however that one ends.

`map_in_processes` (mtx.decode.translator) forks processes that each hold the model and decode batches. Killed
with SIGKILL (a pre-emption, `kill -9`, the kernel's out-of-memory killer), the parent runs no cleanup, and its
children, blocked on the pool's queue or busy with a batch no one will read, would live on with their memory and
cores. So each child asks, as it starts, to be killed when its parent goes: on Linux the kernel does it
(prctl(PR_SET_PDEATHSIG, SIGKILL)), at once and whatever the child is doing; elsewhere a daemon thread of the
child looks at its parent's pid every `WATCH_EVERY` seconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h
WATCH_EVERY = 0.5  # seconds between looks at the parent, where the kernel cannot be asked


def end_with_parent(parent: int) -> None:
    """Arrange for this process, forked by the process `parent`, to end when that one ends.

    The kernel's signal comes when the *thread* that forked this process ends: `map_in_processes`' caller, which
    waits for its children. The parent may have ended before the request was made, so that is checked after it:
    this process then has another parent already, and ends at once.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:
                os._exit(1)
            return
    threading.Thread(target=watch_parent, args=(parent,), name="mtx-watch-parent", daemon=True).start()


def watch_parent(parent: int) -> None:
    """End this process once `parent` is no longer its parent (it ended, and this one was adopted)."""
    while os.getppid() == parent:
        time.sleep(WATCH_EVERY)
    os._exit(1)
