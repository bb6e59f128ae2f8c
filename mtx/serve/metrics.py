"""What `GET /metrics` reports, in Prometheus' text format (version 0.0.4), which every scraper reads.

Three counters, three gauges and three histograms cover what an operator watches: how many requests, sentences
and batches there were and how requests ended (`mtx_requests_total` by status code), how full the queue is and
how many requests are being decoded, how large the batches that dynamic batching formed are, and how long
requests took end to end and waited in the queue. They are written
here rather than with prometheus_client: a few dozen lines against one more package in the extra.

Every update holds one lock: the event loop counts requests while the decoding threads count batches.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)  # seconds
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)  # sentences


class Histogram:
    """Counts of observations at or below each bucket's upper bound, their sum and their number."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound (+Inf's own share)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def lines(self, name: str) -> list[str]:
        cumulative, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            out.append(f'{name}_bucket{{le="{"+Inf" if bound == float("inf") else _number(bound)}"}} {cumulative}')
        return [*out, f"{name}_sum {_number(self.sum)}", f"{name}_count {self.count}"]


class Metrics:
    """The server's counters, gauges and histograms, and their exposition."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}  # (path, status code) → requests
        self.sentences = 0  # translated (empty ones included)
        self.batches = 0
        self.batch_sizes = Histogram(BATCH_BUCKETS)
        self.latency = Histogram(LATENCY_BUCKETS)
        self.queue_wait = Histogram(LATENCY_BUCKETS)
        self.provenance: dict[str, str] = {}  # what decodes (`Engine.provenance`), once the engine is open

    def request_done(self, path: str, status: int, seconds: float | None) -> None:
        """A request answered; `seconds` its latency, for a translation request (None for the others)."""
        with self._lock:
            self.requests[path, status] = self.requests.get((path, status), 0) + 1
            if seconds is not None:
                self.latency.observe(seconds)

    def batch_decoded(self, sentences: int, waits: Sequence[float]) -> None:
        """A batch of `sentences` decoded; `waits` how long each of its requests waited in the queue."""
        with self._lock:
            self.batches += 1
            self.sentences += sentences
            self.batch_sizes.observe(sentences)
            for wait in waits:
                self.queue_wait.observe(wait)

    def exposition(self, depth: tuple[int, int, int]) -> str:
        """The metrics, with the queue's gauges from `depth`: requests and sentences queued, requests being
        decoded (the batcher's own counts, read when scraped)."""
        queued_requests, queued_sentences, decoding_requests = depth
        with self._lock:
            out = [
                "# HELP mtx_engine_info What decodes: the engine, its version, compute type, device and CPU.",
                "# TYPE mtx_engine_info gauge",
                *([f"mtx_engine_info{{{_labels(self.provenance)}}} 1"] if self.provenance else []),
                "# HELP mtx_requests_total HTTP requests answered, by path and status code.",
                "# TYPE mtx_requests_total counter",
                *(f'mtx_requests_total{{path="{path}",code="{code}"}} {count}'
                  for (path, code), count in sorted(self.requests.items())),
                "# HELP mtx_sentences_total Sentences translated.",
                "# TYPE mtx_sentences_total counter",
                f"mtx_sentences_total {self.sentences}",
                "# HELP mtx_batches_total Batches decoded.",
                "# TYPE mtx_batches_total counter",
                f"mtx_batches_total {self.batches}",
                "# HELP mtx_queue_requests Translation requests waiting for the engine.",
                "# TYPE mtx_queue_requests gauge",
                f"mtx_queue_requests {queued_requests}",
                "# HELP mtx_queue_sentences Sentences waiting for the engine (the queue's bound counts these).",
                "# TYPE mtx_queue_sentences gauge",
                f"mtx_queue_sentences {queued_sentences}",
                "# HELP mtx_decoding_requests Translation requests being decoded.",
                "# TYPE mtx_decoding_requests gauge",
                f"mtx_decoding_requests {decoding_requests}",
                "# HELP mtx_batch_sentences Sentences per decoded batch, gathered from concurrent requests.",
                "# TYPE mtx_batch_sentences histogram",
                *self.batch_sizes.lines("mtx_batch_sentences"),
                "# HELP mtx_request_duration_seconds Translation requests' latency, arrival to answer.",
                "# TYPE mtx_request_duration_seconds histogram",
                *self.latency.lines("mtx_request_duration_seconds"),
                "# HELP mtx_queue_wait_seconds Time a translation request waited before its batch was decoded.",
                "# TYPE mtx_queue_wait_seconds histogram",
                *self.queue_wait.lines("mtx_queue_wait_seconds"),
            ]
        return "\n".join(out) + "\n"


def _number(value: float) -> str:
    """A sample value as Prometheus writes it: integers without a fractional part."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _labels(values: dict[str, str]) -> str:
    """Prometheus labels, each value escaped as its text format asks (backslash, double quote, line break)."""
    escaped = {key: value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
               for key, value in values.items()}
    return ",".join(f'{key}="{value}"' for key, value in escaped.items())
