"""Decoding workers: processes of their own, each with its own instance of the model, started once and given calls.

Beam search over small batches spends much of its time in Python between PyTorch's operations, and Python runs one
thread at a time (the GIL): threads decoding batches side by side in one process take turns at it and gain little
over one (bench/README.md, "Batches side by side in processes"). Processes decode side by side instead, one per
share of the CPU threads, or one with the GPU; `mtx translate` and `mtx serve` both use them, through the torch
engine (mtx.decode.torch_engine), which hands each worker one batch at a time.

A worker is started once, for the life of its engine, not forked for each call: a fork copies a process whose
reader thread and PyTorch thread pool are running, which Python 3.12 warns about and which can deadlock. Workers
come from the forkserver (a clean process started once, which imports torch and mtx once, and forks each worker
from itself), or are spawned where there is none; each loads its model from the checkpoint files (`WorkerSetup`),
warms up, and says it is ready. A call goes through a pipe: (method, arguments) to the worker's engine, its result
or its error back. An error comes back with its traceback, formatted in the worker (a traceback cannot be
pickled), as the error's cause: a log then shows where in the worker it arose.

A worker that dies in a call (killed for memory, a crash) is restarted, and only that call is lost
(`WorkerDied`); a worker ends when its engine's process does, however it ends (mtx.decode.lifetime), and Ctrl-C
is left to that process, which stops the workers once they have finished.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import queue
import signal
import threading
import traceback
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from mtx.errors import MtxError, first_line

PRELOAD = ["torch", "mtx.decode.torch_engine"]  # what the forkserver imports once, for every worker it forks


class WorkerTraceback(Exception):
    """The traceback of an error in a worker, as the worker formatted it: the cause of the error raised in its
    place, so that formatting that error shows both (as concurrent.futures does)."""


class WorkerDied(MtxError):
    """A worker ended during a call (killed for memory, a crash); `restarted`: a new one took its place, so only
    that call is lost."""

    def __init__(self, message: str, restarted: bool) -> None:
        super().__init__(message)
        self.restarted = restarted


def serve_calls(connection: Connection, load: Callable[[Any], Any], setup: Any) -> None:
    """The worker: `load(setup)` (which loads the model and warms up), say so, then answer each call received, a
    method of what `load` returned, until told to stop (None), or until its parent is gone (the pipe closed)."""
    from mtx.decode.lifetime import end_with_parent

    end_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        target = load(setup)
    except Exception as e:  # the engine's process says why
        connection.send(("failed", str(e) if isinstance(e, MtxError) else f"{type(e).__name__}: {first_line(e)}"))
        return
    connection.send(("ready", None))
    while (call := _next_call(connection)) is not None:
        method, arguments = call
        try:
            connection.send(("done", getattr(target, method)(*arguments)))
        except Exception as e:  # the caller raises it, and logs where it arose
            error = e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}")
            connection.send(("error", (error, traceback.format_exc())))


def _next_call(connection: Connection) -> tuple | None:
    try:
        return connection.recv()
    except (EOFError, OSError):
        return None


def _picklable(error: Exception) -> bool:
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return False
    return True


def worker_context() -> multiprocessing.context.BaseContext:
    """How to start a worker: from the forkserver where the platform has one (its workers fork from a clean,
    single-threaded process that has imported torch and the torch engine once), else spawned. Never a fork of the
    engine's own process, whose other threads (a reader, PyTorch's pool, a server's loop; `import torch` alone
    starts one) could hold a lock that the child would wait for for ever."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


def start_forkserver() -> None:
    """Start the forkserver now, in the background, where there is one: its import of torch, the longest part of a
    worker's start, then runs while the caller imports and loads its own (`mtx translate` calls this first)."""
    if "forkserver" in multiprocessing.get_all_start_methods():
        from multiprocessing import forkserver

        worker_context()
        threading.Thread(target=forkserver.ensure_running, name="mtx-forkserver", daemon=True).start()


class Worker:
    """One worker process: start it, wait until it is warm, call it, restart it if it dies, stop it. One thread
    uses it at a time (`WorkerPool` hands it out), so its pipe needs no lock."""

    def __init__(self, number: int, load: Callable[[Any], Any], setup: Any, log: Callable[..., None]) -> None:
        self.number, self.load, self.setup, self.log = number, load, setup, log
        self._start()

    def _start(self) -> None:
        context = worker_context()
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve_calls, name=f"mtx-decoding-{self.number}", daemon=True,
                                       args=(theirs, self.load, self.setup))
        self.process.start()
        theirs.close()

    def wait_ready(self) -> None:
        """Return once the worker has loaded the model and warmed up; its load's error as an MtxError."""
        try:
            kind, message = self.connection.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise MtxError(f"decoding process {self.number} stopped while loading the model (exit status "
                           f"{self.process.exitcode}).") from None
        if kind == "failed":
            raise MtxError(message)

    def call(self, method: str, *arguments: Any) -> Any:
        """The worker's engine's `method(*arguments)`; its error, raised here."""
        try:
            self.connection.send((method, arguments))
            kind, value = self.connection.recv()
        except (EOFError, OSError):  # the process is gone (BrokenPipeError, ConnectionResetError, EOF)
            raise self._restart() from None
        if kind == "error":
            error, its_traceback = value
            raise error from WorkerTraceback(f"in decoding process {self.number}:\n{its_traceback}")
        return value

    def stop(self, at_once: bool = False) -> None:
        """Let the process finish and exit; `at_once`: end it now (it has nothing of anyone's to finish)."""
        if at_once:
            self.process.kill()
        with contextlib.suppress(OSError):
            self.connection.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def _restart(self) -> WorkerDied:
        """Start a new worker in place of a dead one; the error to answer the lost call with."""
        self.process.join(timeout=5)
        status = self.process.exitcode
        self.connection.close()
        self.log(event="decoding_process_died", process=self.number, exit_status=status)
        what = f"decoding process {self.number} stopped (exit status {status}) during this call"
        try:
            self._start()
            self.wait_ready()
        except MtxError as e:
            return WorkerDied(f"{what}, and could not be restarted ({e}): start again.", restarted=False)
        self.log(event="decoding_process_restarted", process=self.number, pid=self.process.pid)
        return WorkerDied(f"{what}; it was restarted: retry.", restarted=True)


def _quiet(**_: Any) -> None:
    """The log of workers whose restarts nobody records (`mtx translate`'s: the error says it)."""


class WorkerPool:
    """`count` workers, each answering calls with the methods of `load(setup)` (a module-level function and a
    picklable value: they go to the worker by pickle), started at once; a call takes a free worker, once all are
    ready. `wait`: wait for them now; else at the first call, so that they load while their starter does too."""

    def __init__(self, count: int, load: Callable[[Any], Any], setup: Any, log: Callable[..., None] = _quiet,
                 wait: bool = True) -> None:
        self.workers: list[Worker] = []
        self._ready, self._waiting = False, threading.Lock()
        self._free: queue.Queue[Worker] = queue.Queue()
        self._threads = ThreadPoolExecutor(count, thread_name_prefix="mtx-decoding")
        self._failed: BaseException | None = None
        # Started from a thread of its own: starting waits for the forkserver, which may still be importing torch.
        self._starting = threading.Thread(target=self._start, args=(count, load, setup, log), name="mtx-starting",
                                          daemon=True)
        self._starting.start()
        if wait:
            self.wait_ready()

    def _start(self, count: int, load: Callable[[Any], Any], setup: Any, log: Callable[..., None]) -> None:
        try:
            for number in range(count):
                self.workers.append(Worker(number, load, setup, log))
        except BaseException as e:  # raised by `wait_ready`, in the caller's thread
            self._failed = e

    def __len__(self) -> int:
        return len(self.workers)

    def wait_ready(self) -> None:
        """Return once every worker has loaded its model and warmed up; a load's error as an MtxError."""
        with self._waiting:
            if self._ready:
                return
            self._starting.join()
            try:
                if self._failed is not None:
                    raise self._failed
                for worker in self.workers:
                    worker.wait_ready()
            except BaseException:
                self.close()
                raise
            for worker in self.workers:
                self._free.put(worker)
            self._ready = True

    def call(self, method: str, *arguments: Any) -> Any:
        """`method(*arguments)` on a free worker, waiting for one if all are busy."""
        self.wait_ready()
        worker = self._free.get()
        try:
            return worker.call(method, *arguments)
        finally:
            self._free.put(worker)

    def map(self, method: str, calls: Sequence[tuple]) -> list:
        """[method(*arguments) for arguments in calls], in order, as many at once as there are workers; an error
        is raised when its call's turn comes."""
        self.wait_ready()
        return list(self._threads.map(lambda arguments: self.call(method, *arguments), calls))

    def pids(self) -> list[int]:
        self._starting.join()
        return [worker.process.pid for worker in self.workers]

    def close(self) -> None:
        """Stop every worker, once those that are busy have finished; workers never used end at once."""
        self._starting.join()
        self._threads.shutdown(wait=True)
        for worker in self.workers:
            worker.stop(at_once=not self._ready)
