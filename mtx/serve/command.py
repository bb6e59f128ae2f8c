"""`mtx serve`: a checkpoint behind an HTTP endpoint, translating concurrent requests in shared batches.

The web stack (FastAPI, uvicorn) is the optional extra `mtx[serve]`, never one of mtx's own dependencies: it is
imported inside the command, and a missing package is a user error naming the extra. The socket is bound here,
before the server starts, so that a taken port is a clear error and `--port 0` (any free port) can say which
it got. SIGTERM and Ctrl-C drain: uvicorn stops accepting connections and answers those in flight, the decoding
processes decode what is queued, and the command returns, exit status 0.
"""

from __future__ import annotations

import contextlib
import math
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mtx.errors import MtxError, require_extra

if TYPE_CHECKING:
    from mtx.serve.service import TranslationService

EXTRA_MODULES = ("fastapi", "uvicorn", "fastapi_swagger")
JSON_ESCAPE_BYTES = 12  # the most bytes one character takes in a JSON body: a surrogate pair, "\\ud83d\\ude00"


def serve(
    model: Annotated[list[Path], typer.Option(
        "-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average). Given several times: an ensemble, "
        "as in mtx translate.")],
    host: Annotated[str, typer.Option(help="The address to listen on; 0.0.0.0 for every interface.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="The port; 0: any free one (the 'listening' log line names it).")] = 8080,
    batch_tokens: Annotated[int, typer.Option(
        help="A batch's size, counted as mtx translate counts it; requests are gathered up to this.")] = 4096,
    max_wait_ms: Annotated[float, typer.Option(
        metavar="MS", help="How long a request may wait for others to share its batch, when the batch is not full.")
    ] = 5.0,
    max_queue: Annotated[int, typer.Option(
        metavar="N", help="Sentences queued at most; past them a request gets 503 with Retry-After.")] = 1024,
    max_sentences: Annotated[int, typer.Option(metavar="N", help="Sentences per request at most (else 413).")] = 256,
    max_chars: Annotated[int, typer.Option(metavar="N", help="Characters per sentence at most (else 413).")] = 4096,
    max_beam: Annotated[int, typer.Option(metavar="N", help="The largest beam and nbest a request may ask for.")] = 16,
    timeout: Annotated[float, typer.Option(
        metavar="S", help="Seconds a request may take from its arrival, its body and the queue included; then 504 "
        "(408 while its body has not arrived).")] = 30.0,
    device: Annotated[str, typer.Option(metavar="auto|cpu|cuda", help="auto: cuda if there is one.")] = "auto",
    dtype: Annotated[str, typer.Option(
        metavar="auto|fp32|bf16|fp16|int8", help="As mtx translate's --dtype.")] = "auto",
    engine: Annotated[str, typer.Option(
        metavar="torch|ct2", help="What decodes, as mtx translate's --engine: torch, mtx's own search in worker "
        "processes that hold the model; ct2, CTranslate2 (mtx[ct2]) in this process, which refuses by name each "
        "option it cannot honour exactly (400).")] = "torch",
    threads: Annotated[int | None, typer.Option(
        help="CPU threads [default: one per core]. On a CPU, the engine decodes this many batches side by side, one "
        "thread each, as mtx translate --threads does: the torch engine's workers, CTranslate2's translators.")
    ] = None,
) -> None:
    """Serve translations over HTTP (needs mtx[serve]): POST /translate, GET /health, /metrics, /docs.

    Requests carry sentences and mtx translate's decoding options by the same names, and get the fields of
    mtx translate --format jsonl back. Sentences of concurrent requests that decode with the same options are
    decoded together, sorted by length, within --batch-tokens. Past --max-queue queued sentences a request gets
    503 at once; SIGTERM drains (stops accepting, answers what is queued) and exits 0.

    Example: mtx serve -m runs/demo/average.pt --port 8080, then
    curl -s localhost:8080/translate -d '{"text": ["The old friends tidy up his kitchen."], "beam": 4}'
    """
    require_extra("serve", EXTRA_MODULES, "mtx serve")
    import torch

    from mtx.checkpoint import require_checkpoint_file
    from mtx.config.decode import EngineName
    from mtx.decode.command import check_choice, set_threads
    from mtx.decode.engine import Dtype
    from mtx.devices import DeviceName
    from mtx.serve.service import Limits, TranslationService

    check_choice("--device", device, DeviceName)
    check_choice("--dtype", dtype, Dtype)
    check_choice("--engine", engine, EngineName)
    for path in model:
        require_checkpoint_file(path)
    set_threads(threads)
    for flag, value in (("--batch-tokens", batch_tokens), ("--max-queue", max_queue),
                        ("--max-sentences", max_sentences), ("--max-chars", max_chars), ("--max-beam", max_beam)):
        if value < 1:
            raise MtxError(f"{flag} {value} must be at least 1.")
    # Written so that NaN fails too, and infinity: a wait or a timeout for ever is no bound at all.
    if not (0 <= max_wait_ms < math.inf and 0 < timeout < math.inf):
        raise MtxError(f"--max-wait-ms ({max_wait_ms:g}) must be a finite number ≥ 0 and --timeout ({timeout:g}) a "
                       "finite number of seconds above 0.")
    limits = Limits(max_sentences=max_sentences, max_chars=max_chars, max_beam=max_beam, timeout=timeout)
    service = TranslationService(model, engine=engine, device=device, dtype=dtype, threads=torch.get_num_threads(),
                                 batch_tokens=batch_tokens, max_wait=max_wait_ms / 1000, max_queue=max_queue,
                                 limits=limits)
    run_server(service, bind(host, port), max_body=max_sentences * (max_chars * JSON_ESCAPE_BYTES + 16) + 2**16)
    if service.failure is not None:
        raise MtxError(f"The model could not be loaded: {service.failure}")


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), or a user error saying why not."""
    if not 0 <= port <= 65535:
        raise MtxError(f"--port {port} is not a port: give one between 1 and 65535, or 0 for any free one.")
    try:
        # The protocol number matters: asyncio sets TCP_NODELAY only on sockets that say IPPROTO_TCP, and without
        # it a keep-alive connection's answers wait for delayed acknowledgements (Nagle's algorithm).
        family, kind, protocol, _, _ = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                          proto=socket.IPPROTO_TCP)[0]
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as e:
        raise MtxError(f"Cannot listen on {host}:{port} ({e.strerror or e}): choose another --port (or --host), "
                       "or stop what uses it.") from None
    sock.listen(2048)
    return sock


def run_server(service: TranslationService, sock: socket.socket, max_body: int) -> None:
    """Serve on `sock` until SIGTERM or Ctrl-C (drained) or a failed load."""
    import uvicorn

    from mtx.serve.app import RequestLog, create_app
    from mtx.serve.events import UVICORN_LOGGING, log_event

    class Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            """uvicorn's own handling re-raises the signal once it has shut down, so the process would end by
            SIGTERM (status 143); a drained server's work is done, so it exits 0 instead."""
            if threading.current_thread() is not threading.main_thread():
                yield
                return

            def drain(number: int, frame: object) -> None:
                if not self.should_exit:
                    log_event(event="draining", signal=signal.Signals(number).name)
                    service.status = "draining"
                self.force_exit = self.should_exit and number == signal.SIGINT  # a second Ctrl-C: at once
                self.should_exit = True

            previous = {number: signal.signal(number, drain) for number in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for number, handler in previous.items():
                    signal.signal(number, handler)

    app = RequestLog(create_app(service, on_failed_load=lambda: setattr(server, "should_exit", True)), service,
                     max_body)
    config = uvicorn.Config(app, log_config=UVICORN_LOGGING, log_level="warning", access_log=False, lifespan="on",
                            timeout_graceful_shutdown=int(service.limits.timeout) + 5)
    server = Server(config)
    host, port = sock.getsockname()[:2]
    log_event(event="listening", url=f"http://{host if ':' not in host else f'[{host}]'}:{port}",
              models=[str(path) for path in service.checkpoints])
    server.run(sockets=[sock])
    log_event(event="stopped", sentences=service.metrics.sentences)
