"""A decoding worker: a process of its own with its own instance of the model.

Beam search over small batches spends much of its time in Python between PyTorch's operations, and Python runs
one thread at a time (the GIL): decoding threads in the server's process would take turns with each other and
with the event loop that reads and answers requests. Separate processes decode side by side instead, one per
share of the CPU threads (as `mtx translate --threads` decodes batches side by side), or one with the GPU.

The server's process sends a batch (its sentences, their indices for sampling's draws, the decoding options)
through a pipe and gets the n-best lists back; spawned, not forked, so no PyTorch thread pool is inherited. A
batch's error comes back with its traceback, formatted in the worker (a traceback cannot be pickled), as the
error's cause: the server's log then shows where in the worker it arose, not only where the server re-raised it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import traceback
from collections.abc import Sequence
from multiprocessing.connection import Connection
from pathlib import Path

from mtx.config.recipe import DecodeConfig
from mtx.decode.translator import Dtype, Translation
from mtx.errors import MtxError, first_line
from mtx.serve.events import log_event

# Warm-up sentences: a short and a longer one, so the first requests meet no first-call costs.
WARM_UP = ["Hello.", "The old friends met again in the small town where they had grown up, and talked for hours."]


class WorkerTraceback(Exception):
    """The traceback of an error in a worker's process, as that process formatted it: the cause of the error the
    server's process raises in its place, so that formatting that error shows both (as concurrent.futures does)."""


class WorkerDied(MtxError):
    """A decoding worker's process ended while it decoded a batch (killed for memory, a crash); `restarted`: a
    new one took its place, so only that batch's requests are lost."""

    def __init__(self, message: str, restarted: bool) -> None:
        super().__init__(message)
        self.restarted = restarted


def serve_batches(connection: Connection, checkpoints: Sequence[Path], device: str, dtype: Dtype, threads: int,
                  batch_tokens: int) -> None:
    """The worker process: load and warm up, say so, then decode each batch received until told to stop (None).

    Ctrl-C reaches every process of the terminal's group, this one too: it is the server's to drain, which then
    stops the workers once they have decoded what is queued, so here it is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    from mtx.decode.flags import FlagThresholds
    from mtx.decode.translator import Translator, load_prepared

    torch.set_num_threads(threads)
    try:
        prepared, tokenizer, loaded = load_prepared(checkpoints, device, dtype)
        thresholds = FlagThresholds.of_checkpoint(loaded[0])

        def translator(decode: DecodeConfig, alignment_layer: int | None) -> Translator:
            return Translator(prepared, tokenizer, decode, batch_tokens, alignment_layer=alignment_layer,
                              flag_thresholds=thresholds)

        with torch.inference_mode():
            translator(DecodeConfig.of_checkpoint(loaded[0]), None).translate(WARM_UP)
    except Exception as e:  # the server's process says why, and exits 1
        connection.send(("failed", str(e) if isinstance(e, MtxError) else f"{type(e).__name__}: {first_line(e)}"))
        return
    connection.send(("ready", None))
    while (batch := _next_batch(connection)) is not None:
        sentences, lines, (decode, alignment_layer) = batch
        try:
            with torch.inference_mode():
                connection.send(("done", translator(decode, alignment_layer).translate(sentences, lines)))
        except Exception as e:  # the server's process answers the batch's requests with it, and logs where it arose
            error = e if _picklable(e) else RuntimeError(f"{type(e).__name__}: {e}")
            connection.send(("error", (error, traceback.format_exc())))


def _next_batch(connection: Connection) -> tuple | None:
    """The next batch from the server's process; None when it says stop, or when it is gone (killed: the pipe's
    other end closed), after which there is no one to decode for."""
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


class WorkerProcess:
    """The server's handle on one decoding worker: start it, wait until it is warm, send it batches, restart it if
    it dies, stop it. One thread of the server's batcher uses it at a time, so the pipe needs no lock."""

    def __init__(self, number: int, checkpoints: Sequence[Path], *, device: str, dtype: Dtype, threads: int,
                 batch_tokens: int) -> None:
        self.number = number
        self._arguments = (list(checkpoints), device, dtype, threads, batch_tokens)
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve_batches, name=f"mtx-serve-worker-{self.number}", daemon=True,
                                       args=(theirs, *self._arguments))
        self.process.start()
        theirs.close()

    def wait_ready(self) -> None:
        """Return once the worker has loaded the model and warmed up; its load's error as an MtxError."""
        try:
            kind, message = self.connection.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise MtxError(f"decoding worker {self.number} stopped while loading the model (exit status "
                           f"{self.process.exitcode}).") from None
        if kind == "failed":
            raise MtxError(message)

    def decode(self, sentences: list[str], lines: list[int], options: tuple[DecodeConfig, int | None]
               ) -> list[list[Translation]]:
        """The n-best lists of a batch's sentences; the worker's error, raised here."""
        try:
            self.connection.send((sentences, lines, options))
            kind, value = self.connection.recv()
        except (EOFError, OSError):  # the process is gone (BrokenPipeError, ConnectionResetError, EOF)
            raise self._restart() from None
        if kind == "error":
            error, worker_traceback = value
            raise error from WorkerTraceback(f"in decoding worker {self.number}:\n{worker_traceback}")
        return value

    def stop(self) -> None:
        """Let the worker finish and exit (it has no batch: the batcher has drained)."""
        with contextlib.suppress(OSError):
            self.connection.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def _restart(self) -> WorkerDied:
        """Start a new worker in place of a dead one; the error to answer the lost batch's requests with."""
        self.process.join(timeout=5)
        status = self.process.exitcode
        self.connection.close()
        log_event(event="worker_died", worker=self.number, exit_status=status)
        what = f"decoding worker {self.number} stopped (exit status {status}) while decoding this request"
        try:
            self._start()
            self.wait_ready()
        except MtxError as e:
            return WorkerDied(f"{what}, and could not be restarted ({e}): restart the server.", restarted=False)
        log_event(event="worker_restarted", worker=self.number, pid=self.process.pid)
        return WorkerDied(f"{what}; it was restarted: retry.", restarted=True)
