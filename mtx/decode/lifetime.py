"""A decoding worker ends with the process that started it, however that one ends.

The workers (mtx.decode.workers) each hold a model and decode batches. Killed with SIGKILL (a pre-emption, `kill
-9`, the kernel's out-of-memory killer), the process that started them runs no cleanup, and its workers, busy with
a batch no one will read, would live on with their memory and cores. The kernel's own remedy, PR_SET_PDEATHSIG,
follows the process that forked the worker, which is the forkserver, not the engine's process; and the forkserver
itself waits for its children. So each worker watches its starter instead: multiprocessing hands every child a
sentinel of the process that asked for it (`multiprocessing.parent_process().sentinel`), which becomes readable
the moment that process is gone, and a daemon thread of the worker waits on it and ends the worker.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from multiprocessing.connection import wait


def end_with_parent() -> None:
    """Arrange for this process, started by multiprocessing, to end at once when the process that started it ends
    (at once, too, if that one has ended already)."""
    parent = multiprocessing.parent_process()
    if parent is None:  # not a child of multiprocessing: nobody to end with
        return
    threading.Thread(target=_watch, args=(parent.sentinel,), name="mtx-watch-parent", daemon=True).start()


def _watch(sentinel: int) -> None:
    wait([sentinel])
    os._exit(1)
