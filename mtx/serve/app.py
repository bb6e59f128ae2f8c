"""`mtx serve`'s HTTP interface: the translation service (mtx.serve.service) as a FastAPI application.

    POST /translate   {"text": [...], options...} → {"translations": [...]}, one object per sentence, with the
                      fields of `mtx translate --format jsonl`; the options are `mtx translate`'s, by its names
    GET  /health      200 {"status": "ready"} once the model is loaded and warmed up; 503 before, and after a
                      failed load
    GET  /metrics     Prometheus text (mtx.serve.metrics)
    GET  /docs        the OpenAPI page (Swagger UI 5, served from the extra's fastapi-swagger: no network needed);
                      /openapi.json the schema

FastAPI for the typed request model (pydantic, strict: "4" is not a beam) that both checks bodies and writes
the OpenAPI schema, on uvicorn. The body is read and checked here rather than by FastAPI, so that any content
type is taken as JSON (`curl -d` sends a form's) and every error is a 400 whose message names the field.

Every answer that is not a translation is {"error": message} (and "field" where one is at fault): no traceback
reaches a client. `RequestLog` writes one JSON line per request on standard error, with its latency, and counts
it for /metrics.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
import traceback
import typing
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from mtx import __version__
from mtx.config.recipe import DecodeConfig
from mtx.errors import first_line, is_out_of_memory
from mtx.serve.events import log_event
from mtx.serve.service import RequestError, TranslationService

PATHS = ("/translate", "/health", "/metrics", "/docs", "/openapi.json")  # counted by path; others as "other"


def _decode_option(f: dataclasses.Field, kind: Any) -> tuple[Any, Any]:
    return kind | None, Field(None, description=f"{f.metadata['help']} [default: the model's recipe]")


_DECODE_TYPES = typing.get_type_hints(DecodeConfig)
TranslateRequest = create_model(
    "TranslateRequest",
    __config__=ConfigDict(extra="forbid", strict=True),
    __doc__="Sentences to translate and how: `mtx translate`'s options, by its names; unset ones take the "
    "checkpoint's recipe.",
    text=(list[str], Field(description="The sentences, one string each (a line of `mtx translate`'s input).",
                           examples=[["The old friends tidy up his kitchen."]])),
    **{f.name: _decode_option(f, _DECODE_TYPES[f.name]) for f in dataclasses.fields(DecodeConfig)},
    alignment=(bool, Field(False, description="Add each translation's word alignment: [source, target] word "
                                              "indices, 0-based (mtx translate --alignment).")),
    alignment_layer=(int | None, Field(None, description="With alignment: the decoder layer (0-based) whose "
                                       "cross-attention aligns. [default: mtx translate's]")),
    line_offset=(int, Field(0, description="The index of the first sentence in the text it was cut from: sampling's "
                                           "draws depend on each sentence's index.")),
)


class Hypothesis(BaseModel):
    text: str
    score: float | None = Field(description="log P(Y|X) / lp(|Y|); null for an empty sentence.")
    tokens: list[str] = Field(description="The subword tokens as the text spells them, then </s>.")
    token_log_probs: list[float] = Field(description="One per token, </s>'s last.")
    alignment: list[list[int]] | None = Field(None, description="With alignment: [source, target] word pairs.")


class SentenceTranslation(Hypothesis):
    flags: list[str] = Field(description="Why the translation deserves a human look: loop, length_ratio, copied, "
                                         "low_log_prob.")
    nbest: list[Hypothesis] | None = Field(None, description="With nbest > 1: the n best, best first.")


class TranslateResponse(BaseModel):
    translations: list[SentenceTranslation]


class ErrorResponse(BaseModel):
    error: str
    field: str | None = Field(None, description="The request's field at fault, where one is.")


class Health(BaseModel):
    status: Literal["loading", "ready", "failed", "draining"]
    error: str | None = None


ERRORS = {status: {"model": ErrorResponse, "description": description} for status, description in (
    (400, "Invalid JSON, a field of the wrong type, an unknown option or a value out of range."),
    (413, "Too many sentences, a sentence too long in characters or in tokens."),
    (503, "The queue is full (Retry-After says when to retry), or the server is loading or shutting down."),
    (504, "Not translated within the server's --timeout."))}


def create_app(service: TranslationService, on_failed_load: Callable[[], None]) -> FastAPI:
    """The application; it loads the model in the background at start-up (/health says when it is ready) and
    calls `on_failed_load` if it cannot; at shutdown, once uvicorn has answered what was in flight, it drains."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        def load() -> None:
            service.load()
            if service.status == "failed":
                on_failed_load()

        threading.Thread(target=load, name="mtx-serve-load", daemon=True).start()
        yield
        service.drain()

    app = FastAPI(title="mtx serve", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Machine translation with an mtx model. Sentences of concurrent requests are "
                  "decoded together (dynamic batching).")

    @app.post("/translate", response_model=TranslateResponse, responses=ERRORS, openapi_extra={"requestBody": {
        "required": True, "content": {"application/json": {"schema": TranslateRequest.model_json_schema()}}}})
    async def translate(request: Request) -> Response:
        """Translate sentences, each answered with the fields of `mtx translate --format jsonl`."""
        try:
            body = TranslateRequest.model_validate_json(await request.body())
        except ValidationError as e:
            return _error(request, RequestError(400, *_validation_message(e)))
        request.state.sentences = len(body.text)
        options = {k: v for k, v in body.model_dump(exclude={"text"}).items() if v is not None}  # null: unset
        try:
            translations = await service.translate(body.text, options)
        except RequestError as e:
            return _error(request, e)
        except Exception as e:  # a fault of mtx, or the machine's: logged whole, summarised to the client
            if is_out_of_memory(e):
                error = RequestError(503, "out of memory: send fewer sentences, or ask for a smaller beam.",
                                     retry_after=1)
            else:
                error = RequestError(500, f"internal error ({type(e).__name__}: {first_line(e)}).")
            return _error(request, error, logged=traceback.format_exc())
        return Response(json.dumps({"translations": translations}, ensure_ascii=False), media_type="application/json")

    @app.get("/health", response_model=Health, responses={503: {"model": Health, "description": "Not ready."}})
    async def health() -> JSONResponse:
        """Ready once the model is loaded and warmed up."""
        body = {"status": service.status, **({"error": service.failure} if service.failure else {})}
        return JSONResponse(body, status_code=200 if service.status == "ready" else 503)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def metrics() -> PlainTextResponse:
        """Requests, sentences, queue depth, batch sizes and latencies, in Prometheus' text format."""
        depth = service.batcher.depth() if service.batcher is not None else (0, 0, 0)
        return PlainTextResponse(service.metrics.exposition(depth), media_type="text/plain; version=0.0.4")

    app.mount("/docs/static", StaticFiles(directory=str(resources.files("fastapi_swagger.resources"))),
              name="swagger-ui")

    @app.get("/docs", include_in_schema=False)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="mtx serve",
                                   swagger_js_url="/docs/static/swagger-ui-bundle.js",
                                   swagger_css_url="/docs/static/swagger-ui.css",
                                   swagger_favicon_url="/docs/static/favicon-32x32.png")

    return app


def _error(request: Request, error: RequestError, logged: str | None = None) -> JSONResponse:
    """The answer to a request that gets no translations; `logged`: what the log line says instead of its
    message (a traceback)."""
    request.state.error = logged or error.message
    headers = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else None
    body = {"error": error.message, **({"field": error.field} if error.field else {})}
    return JSONResponse(body, status_code=error.status, headers=headers)


def _validation_message(error: ValidationError) -> tuple[str, str | None]:
    """The first problem of a body, as (a message naming the field, the field)."""
    problem = error.errors()[0]
    location, kind = problem["loc"], problem["type"]
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".") or None
    if kind == "json_invalid":
        return f"the body is not valid JSON ({problem['ctx']['error']}).", None
    if field is None:
        return 'the body must be a JSON object, such as {"text": ["Hello."]}.', None
    if kind == "extra_forbidden":
        options = ", ".join(name for name in TranslateRequest.model_fields)
        return f"{field} is not an option of POST /translate; the options are {options}.", field
    if kind == "missing":
        return f"{field} is missing: the sentences to translate, as a list of strings.", field
    given = json.dumps(problem.get("input"), ensure_ascii=False)
    return f"{field}: {problem['msg'].lower()}, not {given if len(given) <= 60 else given[:57] + '...'}.", field


class RequestLog:
    """ASGI middleware: one JSON line per request (status, latency, sentences, error), its count and latency for
    /metrics, and 413 at once for a body larger than any acceptable request (before it is read)."""

    def __init__(self, app: Any, service: TranslationService, max_body: int) -> None:
        self.app, self.service, self.max_body = app, service, max_body

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, state, status = time.monotonic(), scope.setdefault("state", {}), 500

        async def sending(message: dict) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            length = int(dict(scope["headers"]).get(b"content-length", b"0") or 0)
            if length > self.max_body:
                state["error"] = f"body of {length:,} bytes"
                await JSONResponse({"error": f"the body has {length:,} bytes; this server takes at most "
                                             f"{self.max_body:,} (--max-sentences × --max-chars)."},
                                   status_code=413)(scope, receive, sending)
                return
            await self.app(scope, receive, sending)
        finally:
            seconds, path = time.monotonic() - started, scope["path"]
            self.service.metrics.request_done(path if path in PATHS else "other", status,
                                              seconds if path == "/translate" else None)
            client = scope.get("client")
            known = {key: state[key] for key in ("sentences", "error") if key in state}
            log_event(event="request", method=scope["method"], path=path, status=status,
                      ms=round(1000 * seconds, 2), client=f"{client[0]}:{client[1]}" if client else None, **known)
