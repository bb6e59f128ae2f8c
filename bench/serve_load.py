"""`mtx serve` under load: throughput and latency of single-sentence requests against `mtx translate`'s ceiling.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/serve_load.py [--engine torch ct2] [--concurrency 1 4 16 64]
        [--requests 2000]

A translation server batches the sentences of concurrent requests so that many small requests cost about what
one file of the same sentences costs, and it must not make a lone request wait for company. This measures both,
on the demo model and its 500 test sentences, all on 127.0.0.1, one thing at a time so that nothing competes
for the cores, and for each engine given (--engine E ...: the whole list below, one engine after the other):

  file          `mtx translate --engine E -i SENTENCES` as a subprocess, its own figure of sentences/s (the time
                its engine spent in its calls: the model's loading and conversion excluded, a torch engine's
                worker start included, as it starts them in its first call), the median of `--file-repeats`
                runs: the ceiling, what the same sentences cost as one file
  in process    this process opens the engine as `mtx translate --engine E --threads 1` does and times
                `engine.translate` of one sentence at a time (a request as the server makes it: jsonl, so flags
                and each token's log-probability), over the same sentences (or the first `--in-process`): the
                latency a request cannot beat, on one thread (a torch server's decoding process has one; a ct2
                server's translators one each); then its sentences/s at batches of 1 to 64 sentences: what the
                batches that concurrent requests form can reach at most, per worker
  serve         `python -m mtx serve --engine E` started as a subprocess (its stderr log to a file), polled on
                /health until ready (at most 120 s); then for each concurrency level, `--warmup` untimed requests, and
                `concurrency` clients, each on its own keep-alive connection, sending one-sentence POST /translate
                requests back to back (cycling through the sentences) until the level has sent `--requests` or
                run `--seconds`: sentences/s, latency p50 / p95 / p99 of the answered requests, 503 rejections
                (a client then waits the Retry-After, at most 1 s) and errors, and the share of the file's
                sentences/s. The server's mean batch over the level comes from /metrics (a histogram whose name
                contains "batch"), where it has one.

The client is asyncio speaking raw HTTP/1.1 (request bodies encoded once, before timing), so that it takes
little of the CPU it shares with the server. Last, the server is stopped with SIGTERM and must exit 0 (the exit
status of this script is 1 if it does not); a summary line holds the issue's goals:

  concurrency 16 reaches at least 70 % of the file's sentences/s;
  at concurrency 1 the median latency is within 1.3× the median in-process latency of one sentence at one thread
  (issue 57).

Every line on stdout is one JSON object: `name` (serve.<what>), `bench` ("serve"), `what`, and its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import set_threads, significant

from mtx.decode.engine import Engine
from mtx.decode.engines import open_engine
from mtx.decode.request import Request

LOOPBACK = "127.0.0.1"  # the only host this script talks to (the server is started on it; there is no --host)
READY_TIMEOUT_S = 120.0  # the server must answer /health with 200 within this
REQUEST_TIMEOUT_S = 60.0  # one request that takes longer is an error
STOP_TIMEOUT_S = 60.0  # SIGTERM: the server drains and exits within this, or is killed
RETRY_AFTER_CAP_S = 1.0  # a rejected client waits the server's Retry-After, at most this
IN_PROCESS_WARMUP = 5  # untimed one-sentence translations before the timed ones
BATCH_CURVE = (1, 4, 8, 16, 32, 64)  # batch sizes whose one-thread throughput is measured in process
BATCH_CURVE_SENTENCES = 256  # translated at each size (fewer where the sentences run out)
SHARE_GOAL = 0.70  # concurrency 16: at least this share of the file's sentences/s
SHARE_GOAL_CONCURRENCY = 16
LATENCY_GOAL = 1.30  # concurrency 1: median latency at most this × the in-process median at one thread
SUMMARY_LINE = re.compile(r"translated ([\d,]+) sentences, ([\d,]+) tokens in ([\d.]+) s "
                          r"\(([\d,.]+) sentences/s, ([\d,.]+) tokens/s\)")
METRIC_LINE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{.*\})?\s+(\S+)(\s+\S+)?$")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Sentences are read one per line; empty lines are skipped.")
    parser.add_argument("--model", type=Path, default=Path("runs/demo/average.pt"))
    parser.add_argument("--engine", dest="engines", nargs="+", choices=("torch", "ct2"), default=["torch"],
                        help="what decodes, each in turn: passed to `mtx serve` and `mtx translate`, and opened "
                        "in process")
    parser.add_argument("--lenpen-style", choices=("gnmt", "fairseq"), help="in each request, and to `mtx "
                        "translate` [default: the recipe's]; the ct2 engine has fairseq's only")
    parser.add_argument("--sentences", type=Path, default=Path("runs/demo/data/test.en"))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--requests", type=int, default=2000, help="at most this many requests per level")
    parser.add_argument("--seconds", type=float, default=60.0, help="and at most this long per level")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests before each level")
    parser.add_argument("--in-process", type=int, help="time the first N sentences in process, one at a time "
                        "[default: all, the set that the levels cycle through]")
    parser.add_argument("--file-repeats", type=int, default=3, help="runs of `mtx translate`; their median counts")
    parser.add_argument("--threads", type=int, default=2, help="of the server, `mtx translate` and in process")
    parser.add_argument("--beam", type=int, help="in each request, and to `mtx translate` [default: the recipe's]")
    parser.add_argument("--max-wait-ms", type=float, help="passed to `mtx serve` [default: its own]")
    parser.add_argument("--batch-tokens", type=int, help="passed to `mtx serve` and `mtx translate` [default: theirs]")
    parser.add_argument("--max-queue", type=int, help="passed to `mtx serve` [default: its own]")
    parser.add_argument("--port", type=int, default=0, help="the server's port on 127.0.0.1; 0: a free one")
    parser.add_argument("--server-log", type=Path, help="keep the server's stderr here [default: a temporary file]")
    args = parser.parse_args()
    if min(*args.concurrency, args.requests, args.in_process or 1, args.file_repeats) < 1 or args.seconds <= 0:
        parser.error("--concurrency, --requests, --seconds, --in-process and --file-repeats must be positive")
    sentences = [line for line in args.sentences.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not sentences:
        parser.error(f"{args.sentences} holds no sentence")
    emit("config", model=str(args.model), engines=args.engines, sentences_file=str(args.sentences),
         sentences=len(sentences), lenpen_style=args.lenpen_style,
         concurrency=args.concurrency, requests=args.requests, seconds=args.seconds, warmup=args.warmup,
         threads=args.threads, beam=args.beam, max_wait_ms=args.max_wait_ms, batch_tokens=args.batch_tokens,
         max_queue=args.max_queue)

    exit_codes = []
    for engine in args.engines:
        args.engine = engine  # what every step below decodes with
        with tempfile.TemporaryDirectory(prefix="serve_load.") as scratch:
            # The ceiling and the in-process latency first, while no server runs.
            file_rate = file_ceiling(args, Path(scratch))
            in_process = in_process_latency(args, sentences[: args.in_process])
            port = args.port or free_port()
            log_path = args.server_log or Path(scratch) / "server.log"
            levels, metrics, exit_code = serve_levels(args, sentences, port, log_path, file_rate)
        summarize(engine, levels, file_rate, in_process, metrics, exit_code)
        exit_codes.append(exit_code)
    if any(code != 0 for code in exit_codes):
        sys.exit(1)


def emit(what: str, **fields: Any) -> None:
    """One measurement as one JSON line on stdout, floats to five significant digits."""
    shown = {k: significant(v) if isinstance(v, float) else v for k, v in fields.items()}
    print(json.dumps({"name": f"serve.{what}", "bench": "serve", "what": what, **shown}), flush=True)


# ----------------------------------------------------------------------------------------- the ceiling


def file_ceiling(args: argparse.Namespace, scratch: Path) -> float:
    """`mtx translate` of the sentences as one file, `--file-repeats` times: the median of its sentences/s, each
    from its last stderr line (which leaves the model's loading out)."""
    command = [sys.executable, "-m", "mtx", "translate", "-m", str(args.model), "-i", str(args.sentences),
               "-o", str(scratch / "file.out"), "--threads", str(args.threads), "--engine", args.engine]
    command += optional_flags(args, "beam", "batch_tokens", "lenpen_style")
    rates, seconds = [], []
    for _ in range(args.file_repeats):
        done = subprocess.run(command, capture_output=True, text=True, timeout=3600)
        lines = done.stderr.strip().splitlines()
        match = SUMMARY_LINE.search(lines[-1]) if lines else None
        if done.returncode != 0 or match is None:
            raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
        count, tokens, took, rate = (float(g.replace(",", "")) for g in match.groups()[:4])
        rates.append(rate)
        seconds.append(took)
    rate = float(np.median(rates))
    emit("file", engine=args.engine, sentences=int(count), tokens=int(tokens), seconds=float(np.median(seconds)),
         sentences_per_s=rate,
         repeats=len(rates), min=min(rates), max=max(rates), command=" ".join(command[1:]))
    return rate


def optional_flags(args: argparse.Namespace, *names: str) -> list[str]:
    """`--flag value` for each of the options `names` given on this script's command line."""
    flags = []
    for name in names:
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name.replace('_', '-')}", str(value)]
    return flags


# ------------------------------------------------------------------------------------- in-process latency


def in_process_latency(args: argparse.Namespace, sentences: list[str]) -> dict[str, float]:
    """Milliseconds to translate each sentence alone with the engine opened here on one thread, given each as the
    server gives it (a jsonl request); the engine is closed afterwards, before the server starts."""
    set_threads(1)
    engine = open_engine(args.engine, [args.model], device="auto", dtype="auto", threads=1,
                         batch_tokens=args.batch_tokens or 4096, log=lambda _: None)
    request = Request.of(engine.facts, {"engine": args.engine, "format": "jsonl",
                                        **optional_fields(args, "beam", "lenpen_style")})
    encoded = engine.facts.encode(sentences)
    for ids in encoded[:IN_PROCESS_WARMUP]:
        engine.translate([ids], request, [0])
    seconds = []
    for ids in encoded:
        started = time.perf_counter()
        engine.translate([ids], request, [0])
        seconds.append(time.perf_counter() - started)
    batch_curve(engine, request, encoded)
    device = engine.provenance()["device"]
    engine.close()
    del engine
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    set_threads(args.threads)
    ms = np.array(seconds) * 1000
    figures = {"p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
               "mean_ms": float(ms.mean())}
    emit("in_process_one_sentence", sentences=len(ms), engine=args.engine, device=device, threads=1,
         beam=request.beam, **figures)
    return figures


def optional_fields(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The request fields among `names` given on this script's command line."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def batch_curve(engine: Engine, request: Request, encoded: list) -> None:
    """The engine's sentences/s on one thread, as each of the server's decoding processes (torch) or translators
    (ct2) decodes on a CPU, at the batch sizes that concurrent requests can form: what bounds the server's
    throughput at a given concurrency."""
    for size in (size for size in BATCH_CURVE if size <= len(encoded)):
        batches = [encoded[start: start + size] for start in range(0, len(encoded) - size + 1, size)]
        batches = batches[: max(1, BATCH_CURVE_SENTENCES // size)]
        engine.translate(batches[0], request, range(size))
        started = time.perf_counter()
        for batch in batches:
            engine.translate(batch, request, range(len(batch)))
        rate = sum(len(batch) for batch in batches) / (time.perf_counter() - started)
        emit("in_process_batch", engine=request.engine, batch=size, batches=len(batches), threads=1,
             sentences_per_s=rate)


# ---------------------------------------------------------------------------------------------- the server


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    """`mtx serve` of the model on 127.0.0.1:`port`, with this script's server options (`python -m mtx`, which
    runs the command line's entry point, as `mtx` does)."""
    return [sys.executable, "-m", "mtx", "serve", "-m", str(args.model), "--host", LOOPBACK, "--port", str(port),
            "--threads", str(args.threads), "--engine", args.engine,
            *optional_flags(args, "max_wait_ms", "batch_tokens", "max_queue")]


def start_server(command: list[str], log_path: Path) -> subprocess.Popen:
    """The server as a subprocess, its stdout and stderr (a JSON line per request) appended to `log_path`, so
    that no pipe fills up and blocks it."""
    with open(log_path, "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)


def wait_until_ready(server: subprocess.Popen, port: int, log_path: Path) -> float:
    """Poll GET /health until it answers 200 (the model loaded and warmed up): the seconds it took."""
    started = time.perf_counter()
    while time.perf_counter() - started < READY_TIMEOUT_S:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with {server.returncode} before it was ready; the end of its "
                               f"log:\n{log_tail(log_path)}")
        with contextlib.suppress(OSError, http.client.HTTPException, ValueError, AttributeError):
            status, body = http_get(port, "/health")
            if status == 200 and json.loads(body).get("status") == "ready":
                return time.perf_counter() - started
        time.sleep(0.2)
    raise RuntimeError(f"the server was not ready (GET /health → 200) within {READY_TIMEOUT_S:.0f} s; the end of "
                       f"its log:\n{log_tail(log_path)}")


def stop_server(server: subprocess.Popen) -> int:
    """SIGTERM, which drains the server: its exit status (it is killed if it has not exited in a minute)."""
    server.send_signal(signal.SIGTERM)
    try:
        return server.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()
        raise RuntimeError(f"the server had not exited {STOP_TIMEOUT_S:.0f} s after SIGTERM; killed") from None


def log_tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    return "(no log)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        return probe.getsockname()[1]


def http_get(port: int, path: str) -> tuple[int, str]:
    """A plain GET to the server (health, metrics): status and body."""
    connection = http.client.HTTPConnection(LOOPBACK, port, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        return response.status, response.read().decode("utf-8", errors="replace")
    finally:
        connection.close()


def batch_histograms(port: int) -> dict[str, tuple[float, float]]:
    """(sum, count) of every histogram or summary on /metrics whose name contains "batch", over its labels."""
    try:
        status, text = http_get(port, "/metrics")
    except (OSError, http.client.HTTPException):
        return {}
    if status != 200:
        return {}
    totals: dict[str, float] = {}
    for line in text.splitlines():
        match = METRIC_LINE.match(line.strip())
        if match is None or line.startswith("#"):
            continue
        with contextlib.suppress(ValueError):
            totals[match[1]] = totals.get(match[1], 0.0) + float(match[3])
    return {name[: -len("_sum")]: (total, totals[name[: -len("_sum")] + "_count"])
            for name, total in totals.items()
            if name.endswith("_sum") and "batch" in name and name[: -len("_sum")] + "_count" in totals}


def mean_batches(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]
                 ) -> dict[str, float]:
    """Each batch histogram's mean over the observations between two scrapes."""
    means = {}
    for name, (total, count) in after.items():
        total0, count0 = before.get(name, (0.0, 0.0))
        if count > count0:
            means[name] = significant((total - total0) / (count - count0))
    return means


def headline_batch(means: dict[str, float]) -> float | None:
    """The mean batch size: a batch histogram counting sentences or requests if there is one, else the first."""
    for name, mean in means.items():
        if any(word in name for word in ("size", "sentences", "requests")):
            return mean
    return next(iter(means.values()), None)


# ---------------------------------------------------------------------------------------------- the client


class Connection:
    """One keep-alive HTTP/1.1 connection to the server, speaking just enough of the protocol."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(LOOPBACK, self.port, limit=1 << 20)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def post(self, request: bytes) -> tuple[int, dict[str, str], bytes]:
        """Send one whole request; the response's status, headers (lower-case names) and body."""
        if self.writer is None:
            await self.open()
        assert self.reader is not None and self.writer is not None
        self.writer.write(request)
        head = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        status = int(head[0].split(" ", 2)[1])
        headers = {}
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name:
                headers[name.strip().lower()] = value.strip()
        if "content-length" in headers:
            body = await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            body = await self._chunked()
        else:  # the body runs to the end of the connection
            body = await self.reader.read()
            headers["connection"] = "close"
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, headers, body

    async def _chunked(self) -> bytes:
        assert self.reader is not None
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
        while await self.reader.readuntil(b"\r\n") != b"\r\n":  # trailers
            pass
        return b"".join(parts)


def translate_requests(sentences: list[str], port: int, fields: dict[str, Any]) -> list[bytes]:
    """The whole POST /translate request of each sentence alone, with the options `fields`, encoded once."""
    requests = []
    for sentence in sentences:
        body = json.dumps({"text": [sentence], **fields}).encode()
        head = (f"POST /translate HTTP/1.1\r\nHost: {LOOPBACK}:{port}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n")
        requests.append(head.encode() + body)
    return requests


@dataclass
class Level:
    """What one run of back-to-back requests did."""

    sent: int = 0
    ok: int = 0
    rejected: int = 0
    errors: int = 0
    first_error: str | None = None
    latencies: list[float] = field(default_factory=list)  # seconds, of the answered (200) requests
    seconds: float = 0.0
    stopped_by: str = "requests"

    def error(self, what: str) -> None:
        self.errors += 1
        self.first_error = self.first_error or what


async def drive(connections: list[Connection], requests: list[bytes], count: int, seconds: float) -> Level:
    """Each connection's client sends requests back to back, the next of the cycle through `requests`, until
    `count` requests have been sent or `seconds` have passed."""
    level = Level()
    started = time.perf_counter()
    deadline = started + seconds

    async def client(connection: Connection) -> None:
        while level.sent < count:
            if time.perf_counter() >= deadline:
                level.stopped_by = "time"
                return
            request = requests[level.sent % len(requests)]
            level.sent += 1
            sent = time.perf_counter()
            try:
                status, headers, body = await asyncio.wait_for(connection.post(request), REQUEST_TIMEOUT_S)
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                    ValueError, IndexError) as e:
                level.error(f"{type(e).__name__}: {e}")
                connection.close()  # reopened by the next request
                if isinstance(e, ConnectionRefusedError):
                    return  # the server is gone
                continue
            latency = time.perf_counter() - sent
            if status == 200:
                problem = check_answer(body)
                if problem:
                    level.error(problem)
                else:
                    level.ok += 1
                    level.latencies.append(latency)
            elif status == 503:
                level.rejected += 1
                await asyncio.sleep(retry_after(headers))
            else:
                level.error(f"HTTP {status}: {body[:200].decode('utf-8', errors='replace')}")

    await asyncio.gather(*(client(connection) for connection in connections))
    level.seconds = time.perf_counter() - started
    return level


def check_answer(body: bytes) -> str | None:
    """Why a 200 answer to one sentence is not one translation, or None."""
    try:
        translations = json.loads(body)["translations"]
        if len(translations) == 1 and isinstance(translations[0]["text"], str):
            return None
    except (ValueError, KeyError, TypeError, IndexError):
        pass
    return f"not one translation: {body[:200].decode('utf-8', errors='replace')}"


def retry_after(headers: dict[str, str]) -> float:
    try:
        return min(max(float(headers.get("retry-after", "0")), 0.0), RETRY_AFTER_CAP_S)
    except ValueError:
        return RETRY_AFTER_CAP_S


async def run_level(port: int, requests: list[bytes], concurrency: int, args: argparse.Namespace) -> Level:
    """One concurrency level: `concurrency` connections, warmed up by `args.warmup` requests, then timed."""
    connections = [Connection(port) for _ in range(concurrency)]
    try:
        for connection in connections:
            await connection.open()
        if args.warmup:
            await drive(connections[: args.warmup], requests, args.warmup, args.seconds)
        return await drive(connections, requests, args.requests, args.seconds)
    finally:
        for connection in connections:
            connection.close()


# ------------------------------------------------------------------------------------------------- levels


def serve_levels(args: argparse.Namespace, sentences: list[str], port: int, log_path: Path, file_rate: float
                 ) -> tuple[dict[int, dict[str, Any]], dict[str, float], int | None]:
    """Start the server, run every concurrency level against it, stop it: each level's figures, the mean of
    every batch histogram over the whole run, and the server's exit status."""
    requests = translate_requests(sentences, port, optional_fields(args, "beam", "lenpen_style"))
    command = server_command(args, port)
    server = start_server(command, log_path)
    levels: dict[int, dict[str, Any]] = {}
    try:
        ready_s = wait_until_ready(server, port, log_path)
        emit("server_ready", engine=args.engine, seconds=ready_s, port=port, command=" ".join(command[1:]))
        start_metrics = batch_histograms(port)
        for concurrency in args.concurrency:
            before = batch_histograms(port)
            level = asyncio.run(run_level(port, requests, concurrency, args))
            if server.poll() is not None:
                raise RuntimeError(f"the server exited with {server.returncode} during concurrency {concurrency}; "
                                   f"the end of its log:\n{log_tail(log_path)}")
            levels[concurrency] = level_figures(args.engine, concurrency, level, file_rate,
                                                mean_batches(before, batch_histograms(port)))
        run_means = mean_batches(start_metrics, batch_histograms(port))
        exit_code = stop_server(server)
        emit("server_stopped", engine=args.engine, exit_code=exit_code)
        return levels, run_means, exit_code
    finally:
        if server.poll() is None:  # an error on the way: never leave a server behind
            server.kill()
            server.wait()


def level_figures(engine: str, concurrency: int, level: Level, file_rate: float, batches: dict[str, float]
                  ) -> dict[str, Any]:
    ms = np.array(level.latencies) * 1000
    rate = level.ok / level.seconds if level.seconds > 0 else 0.0
    figures: dict[str, Any] = {
        "engine": engine, "concurrency": concurrency, "requests": level.sent, "ok": level.ok,
        "rejected_503": level.rejected, "errors": level.errors, "seconds": level.seconds,
        "stopped_by": level.stopped_by, "sentences_per_s": rate,
        **{f"p{q}_ms": float(np.percentile(ms, q)) if len(ms) else None for q in (50, 95, 99)},
        "share_of_file": rate / file_rate,
    }
    if batches:
        figures["mean_batch"] = batches
    if level.first_error:
        figures["first_error"] = level.first_error
    emit("serve", **figures)
    return figures


def summarize(engine: str, levels: dict[int, dict[str, Any]], file_rate: float, in_process: dict[str, float],
              run_means: dict[str, float], exit_code: int | None) -> None:
    """The issue's two goals for one engine, and whether each was met (None where its level was not run)."""
    busy, lone = levels.get(SHARE_GOAL_CONCURRENCY), levels.get(1)
    share = busy["share_of_file"] if busy else None
    ratio = lone["p50_ms"] / in_process["p50_ms"] if lone and lone["p50_ms"] is not None else None
    summary: dict[str, Any] = {
        "engine": engine, "file_sentences_per_s": file_rate,
        f"c{SHARE_GOAL_CONCURRENCY}_share_of_file": share, "share_goal": SHARE_GOAL,
        "share_met": None if share is None else share >= SHARE_GOAL,
        "c1_p50_ms": lone["p50_ms"] if lone else None, "in_process_p50_ms": in_process["p50_ms"],
        "c1_p50_over_in_process": ratio, "latency_goal": LATENCY_GOAL,
        "latency_met": None if ratio is None else ratio <= LATENCY_GOAL,
        "server_exit_code": exit_code,
    }
    if run_means:
        summary["mean_batch_size"] = headline_batch(run_means)
        summary["mean_batch"] = run_means
    emit("summary", **summary)


if __name__ == "__main__":
    main()
