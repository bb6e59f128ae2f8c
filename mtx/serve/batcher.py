"""Dynamic batching: the sentences of concurrent requests decoded together, by the engine's workers.

The batch decoder is what makes `mtx translate` fast, and a server that decoded each request alone would waste
it: single-sentence requests would each cost a whole search. So requests wait in one bounded queue, and a
feeding thread takes the oldest one together with every queued request that decodes with the same options, up
to `batch_tokens` (counted as the translator counts them). When the batch is not yet full and other requests
are in the server (queued, or being decoded), it gathers for at most `max_wait` seconds after the oldest arrived:
their clients are likely to send more. A request alone in the server is decoded at once, as no other is in
sight to share its batch, so a lone client's latency is the translator's. The translator then sorts the
sentences by length and decodes them as one call; each request gets its own results back, in its order.

A feeding thread of the server's process hands its batches to the engine (mtx.decode.engine), one thread per
call the engine takes at once (its `parallelism`: the torch engine's workers, CTranslate2's translators). One
feeding thread gathers at a time while the others wait for the engine, so under load a batch forms while the
previous one is decoded.

The queue is bounded in sentences: past `max_queue`, `submit` refuses at once (QueueFull, with the seconds after
which the queue should have room), so overload never builds an unbounded backlog. `close` stops taking requests
and lets the feeding threads finish what is queued: the server's drain.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mtx.decode.request import Request
from mtx.decode.translation import Source, Translation
from mtx.serve.metrics import Metrics

if TYPE_CHECKING:
    from mtx.documents.document import Document

# An engine's `translate`: a batch's sentences, the request they decode with, each one's index for sampling's
# draws, to their n-best lists.
DecodeBatch = Callable[[list[Source], Request, list[int]], list[list[Translation]]]


class QueueFull(Exception):
    """The queue has no room for a request; `retry_after` is when it should have, in whole seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"the queue is full: retry after {retry_after} s")
        self.retry_after = retry_after


class Draining(Exception):
    """The server is shutting down and takes no more requests."""


@dataclass(eq=False)
class Job:
    """One request's sentences (token ids), waiting for a feeding thread.

    `request` is how they decode, handed to the engine (requests with equal options share batches),
    `lines` each sentence's index for sampling's draws, and `cost` their tokens as the translator's batches count
    them. The feeding thread answers through `future`.
    """

    sentences: list[Source]
    lines: list[int]
    request: Request
    cost: int
    documents: Sequence[Document] = ()  # the request's strings taken apart, whose sentences these are (mtx.documents)
    future: Future[list[list[Translation]]] = field(default_factory=Future)
    enqueued: float = field(default_factory=time.monotonic)


class Batcher:
    """The queue and its feeding threads, one per call the engine takes at once (see the module's docstring)."""

    def __init__(self, decoders: Sequence[DecodeBatch], *, batch_tokens: int, max_wait: float, max_queue: int,
                 metrics: Metrics) -> None:
        self.decoders = list(decoders)
        self.batch_tokens, self.max_wait, self.max_queue = batch_tokens, max_wait, max_queue
        self.metrics = metrics
        self._queue: deque[Job] = deque()
        self._queued_sentences = 0
        self._decoding = 0  # requests being decoded
        self._changed = threading.Condition()
        self._gathering = threading.Lock()  # held by the one feeding thread that forms the next batch
        self._closing = False
        self._threads: list[threading.Thread] = []
        self._sentences_per_second = 0.0  # a moving average of the decoders' combined rate, for Retry-After

    def start(self) -> None:
        """Start the feeding threads, one per decoder."""
        for number, decoder in enumerate(self.decoders):
            thread = threading.Thread(target=self._work, args=(decoder,), name=f"mtx-serve-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def submit(self, job: Job) -> Future[list[list[Translation]]]:
        """Queue `job`; its future holds the n-best lists of its sentences, in order. A request alone is always
        taken, however large (the request limits bound it); past `max_queue` sentences others are refused."""
        with self._changed:
            if self._closing:
                raise Draining()
            if self._queue and self._queued_sentences + len(job.sentences) > self.max_queue:
                raise QueueFull(self._retry_after())
            self._queue.append(job)
            self._queued_sentences += len(job.sentences)
            self._changed.notify_all()
        return job.future

    def depth(self) -> tuple[int, int, int]:
        """Requests and sentences queued, and requests being decoded: the gauges of /metrics."""
        with self._changed:
            return len(self._queue), self._queued_sentences, self._decoding

    def close(self) -> None:
        """Take no more requests, decode those queued, and return when the feeding threads have stopped."""
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        for thread in self._threads:
            thread.join()

    def _retry_after(self) -> int:
        rate = self._sentences_per_second
        return max(1, math.ceil(self._queued_sentences / rate)) if rate > 0 else 1

    def _work(self, decoder: DecodeBatch) -> None:
        while (jobs := self._next_batch()) is not None:
            self._decode(decoder, jobs)

    def _next_batch(self) -> list[Job] | None:
        """The next batch's jobs, once gathered; None when closing and nothing is left."""
        with self._gathering, self._changed:
            while True:
                while not self._queue:
                    if self._closing:
                        return None
                    self._changed.wait()
                first = self._queue[0]
                deadline = time.monotonic() + self.max_wait
                others_in_server = len(self._queue) > 1 or self._decoding > 0
                while others_in_server and not self._closing and self._cost_like(first) < self.batch_tokens:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._changed.wait(left)
                jobs = self._take_like(first)
                if jobs:  # else every one of them had timed out: look again
                    return jobs

    def _cost_like(self, first: Job) -> int:
        return sum(job.cost for job in self._queue if job.request == first.request)

    def _take_like(self, first: Job) -> list[Job]:
        """Remove from the queue the oldest jobs with `first`'s options, within `batch_tokens` (`first` at
        least); those whose request gave up waiting (a cancelled future) are dropped."""
        taken, kept, cost = [], deque(), 0
        for job in self._queue:
            if job.request == first.request and (job is first or cost + job.cost <= self.batch_tokens):
                cost += job.cost
                taken.append(job)
            else:
                kept.append(job)
        self._queue = kept
        sentences = sum(len(job.sentences) for job in taken)
        self._queued_sentences -= sentences
        running = [job for job in taken if job.future.set_running_or_notify_cancel()]
        self._decoding += len(running)
        return running

    def _decode(self, decoder: DecodeBatch, jobs: list[Job]) -> None:
        started = time.monotonic()
        sentences = [sentence for job in jobs for sentence in job.sentences]
        try:
            nbests = decoder(sentences, jobs[0].request, [line for job in jobs for line in job.lines])
        except BaseException as e:  # handed to each request, which answers with it
            for job in jobs:
                job.future.set_exception(e)
            return
        finally:
            with self._changed:
                self._decoding -= len(jobs)
        seconds = max(time.monotonic() - started, 1e-6)
        rate = len(self.decoders) * len(sentences) / seconds
        self._sentences_per_second = 0.8 * self._sentences_per_second + 0.2 * rate
        self.metrics.batch_decoded(len(sentences), [started - job.enqueued for job in jobs])
        start = 0
        for job in jobs:
            job.future.set_result(nbests[start : start + len(job.sentences)])
            start += len(job.sentences)
