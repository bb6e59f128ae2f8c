"""A decoding process: a process of its own with its own instance of the model.

Beam search over small batches spends much of its time in Python between PyTorch's operations, and Python runs
one thread at a time (the GIL): decoding threads in the server's process would take turns with each other and
with the event loop that reads and answers requests. Separate processes decode side by side instead, one per
share of the CPU threads (as `mtx translate --threads` decodes batches side by side), or one with the GPU. They
are the only processes of a server that hold the weights.

The server's process sends a batch (its sentences as token ids, tokenised once when the request was checked;
their indices for sampling's draws; how to decode them, `BatchOptions`) through a pipe and gets the n-best lists
back; spawned, not forked, so no PyTorch thread pool is inherited. A batch's error comes back with its
traceback, formatted in the decoding process (a traceback cannot be pickled), as the error's cause: the server's
log then shows where in that process it arose, not only where the server re-raised it.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from mtx.config.decode import DecodeConfig
from mtx.decode.translator import Dtype, Translation
from mtx.errors import MtxError, first_line
from mtx.serve.events import log_event

# Warm-up sentences: a short and a longer one, so the first requests meet no first-call costs.
WARM_UP = ["Hello.", "The old friends met again in the small town where they had grown up, and talked for hours."]

# A sentence as the server hands it over: its token ids (EOS not included), or None for a sentence that is empty
# once normalised, which gets no translation.
Source = list[int] | None


@dataclass(frozen=True)
class BatchOptions:
    """How a batch decodes: the search's options and the decoder layer that aligns (None: no alignments).
    Requests whose options are equal share batches."""

    decode: DecodeConfig
    alignment_layer: int | None = None


class DecodingProcessTraceback(Exception):
    """The traceback of an error in a decoding process, as that process formatted it: the cause of the error the
    server's process raises in its place, so that formatting that error shows both (as concurrent.futures does)."""


class DecodingProcessDied(MtxError):
    """A decoding process ended while it decoded a batch (killed for memory, a crash); `restarted`: a new one
    took its place, so only that batch's requests are lost."""

    def __init__(self, message: str, restarted: bool) -> None:
        super().__init__(message)
        self.restarted = restarted


def serve_batches(connection: Connection, checkpoints: Sequence[Path], device: str, dtype: Dtype, threads: int,
                  batch_tokens: int) -> None:
    """The decoding process: load and warm up, say so, then decode each batch received until told to stop (None).

    Ctrl-C reaches every process of the terminal's group, this one too: it is the server's to drain, which then
    stops the decoding processes once they have decoded what is queued, so here it is ignored."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    from mtx.data.lexicon import Lexicon
    from mtx.decode.doubts import DoubtThresholds
    from mtx.decode.translator import Translator, load_prepared

    torch.set_num_threads(threads)
    try:
        prepared, tokenizer, loaded = load_prepared(checkpoints, device, dtype)
        thresholds, lexicon = DoubtThresholds.of_checkpoint(loaded[0]), Lexicon.of_checkpoint(loaded[0])

        def translator(options: BatchOptions) -> Translator:
            return Translator(prepared, tokenizer, options.decode, batch_tokens,
                              alignment_layer=options.alignment_layer, doubt_thresholds=thresholds, lexicon=lexicon)

        with torch.inference_mode():
            translator(BatchOptions(DecodeConfig.of_checkpoint(loaded[0]))).translate(WARM_UP)
    except Exception as e:  # the server's process says why, and exits 1
        connection.send(("failed", str(e) if isinstance(e, MtxError) else f"{type(e).__name__}: {first_line(e)}"))
        return
    connection.send(("ready", None))
    while (batch := _next_batch(connection)) is not None:
        sources, lines, options = batch
        try:
            with torch.inference_mode():
                connection.send(("done", translator(options).translate_tokens(sources, lines)))
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


class DecodingProcess:
    """The server's handle on one decoding process: start it, wait until it is warm, send it batches, restart it
    if it dies, stop it. One feeding thread of the server's batcher uses it at a time, so the pipe needs no lock."""

    def __init__(self, number: int, checkpoints: Sequence[Path], *, device: str, dtype: Dtype, threads: int,
                 batch_tokens: int) -> None:
        self.number = number
        self._arguments = (list(checkpoints), device, dtype, threads, batch_tokens)
        self._start()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        self.connection, theirs = context.Pipe()
        self.process = context.Process(target=serve_batches, name=f"mtx-serve-decoding-{self.number}", daemon=True,
                                       args=(theirs, *self._arguments))
        self.process.start()
        theirs.close()

    def wait_ready(self) -> None:
        """Return once the process has loaded the model and warmed up; its load's error as an MtxError."""
        try:
            kind, message = self.connection.recv()
        except (EOFError, OSError):
            self.process.join(timeout=5)
            raise MtxError(f"decoding process {self.number} stopped while loading the model (exit status "
                           f"{self.process.exitcode}).") from None
        if kind == "failed":
            raise MtxError(message)

    def decode(self, sources: list[Source], lines: list[int], options: BatchOptions) -> list[list[Translation]]:
        """The n-best lists of a batch's sentences; the decoding process's error, raised here."""
        try:
            self.connection.send((sources, lines, options))
            kind, value = self.connection.recv()
        except (EOFError, OSError):  # the process is gone (BrokenPipeError, ConnectionResetError, EOF)
            raise self._restart() from None
        if kind == "error":
            error, its_traceback = value
            raise error from DecodingProcessTraceback(f"in decoding process {self.number}:\n{its_traceback}")
        return value

    def stop(self) -> None:
        """Let the process finish and exit (it has no batch: the batcher has drained)."""
        with contextlib.suppress(OSError):
            self.connection.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()

    def _restart(self) -> DecodingProcessDied:
        """Start a new decoding process in place of a dead one; the error to answer the lost batch's requests
        with."""
        self.process.join(timeout=5)
        status = self.process.exitcode
        self.connection.close()
        log_event(event="decoding_process_died", process=self.number, exit_status=status)
        what = f"decoding process {self.number} stopped (exit status {status}) while decoding this request"
        try:
            self._start()
            self.wait_ready()
        except MtxError as e:
            return DecodingProcessDied(f"{what}, and could not be restarted ({e}): restart the server.",
                                       restarted=False)
        log_event(event="decoding_process_restarted", process=self.number, pid=self.process.pid)
        return DecodingProcessDied(f"{what}; it was restarted: retry.", restarted=True)
