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
type is taken as JSON (`curl -d` sends a form's) and every error is a 400 whose message names the field. It is
read within --timeout: a client that sends less than its Content-Length gets 408, not a connection held open.

The OpenAPI document states every rule the service enforces but one (a sentence's length in tokens): each
option's range and the server's limits in its field's schema (`request_model`), the rules between fields and
against the model as the request's (`TranslationService.request_rules`). So a request the document admits is
translated, which tests/integration/test_serve_fuzz.py checks with a fuzzer.

Every answer that is not a translation is {"error": message} (and "field" where one is at fault), Starlette's own
404 and 405 included: no traceback reaches a client. `RequestLog` writes one JSON line per request on standard
error, with its latency (and a fault's traceback, a decoding process's with it), and counts it for /metrics.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import json
import threading
import time
import traceback
import typing
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, create_model
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from mtx import __version__
from mtx.config.decode import SAMPLING_ONLY, DecodeConfig
from mtx.config.fields import bounds_of
from mtx.decode import request as requests
from mtx.errors import first_line, is_out_of_memory
from mtx.serve.events import log_event
from mtx.serve.service import Limits, RequestError, TranslationService

PATHS = ("/translate", "/health", "/metrics", "/docs", "/openapi.json")  # counted by path; others as "other"
CLIENT_CLOSED = 499  # the log's status of a request whose client left before sending it whole (nginx's)
EXAMPLE = "The old friends tidy up his kitchen."


def _whole(value: Any) -> Any:
    """1.0 as 1: a JSON number without a fraction is an integer however it is written (JSON Schema's rule, so the
    OpenAPI schema's); 1.5 and "1" stay as they are, for the strict model to refuse."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


WholeNumber = Annotated[int, BeforeValidator(_whole)]  # an integer option's type


def _wire_type(kind: Any) -> Any:
    """An option's Python type as the request model takes it: int, also within `int | None`, as WholeNumber."""
    if kind is int:
        return WholeNumber
    return WholeNumber | None if kind == int | None else kind


def request_model(limits: Limits) -> type[BaseModel]:
    """POST /translate's body on a server with these limits: a `Request`'s fields (mtx.decode.request) by their
    names, `mtx translate`'s options, but those the server fixes for every request (`PER_PROCESS`: the engine,
    the format); each with its help and, in its JSON schema, its range (mtx.config.fields) and
    the server's limits, so that the OpenAPI document states what the checks enforce. The checks themselves are
    the service's (`TranslationService.job`), not pydantic's, so that a refusal reads as the recipe's and the
    command's do; the model checks only types (strictly: "4" is not a beam) and unknown options."""
    caps = {"beam": limits.max_beam, "nbest": limits.max_beam}
    notes = {"beam": f"At most {limits.max_beam} (--max-beam) and the model's vocabulary; with sampling, 1 (or unset).",
             "nbest": f"At most beam, unless sampling; at most {limits.max_beam} (--max-beam) either way.",
             **{name: "Only with sampling: otherwise unset." for name in SAMPLING_ONLY},
             "alignment_layer": "Only with alignment; one of the model's decoder layers.",
             "target_lang": "One of the model's target languages."}

    def option(f: dataclasses.Field, kind: Any, default: Any, suffix: str = "") -> tuple[Any, Any]:
        finite = kind in (float, float | None)
        schema = bounds.json_schema(finite) if (bounds := bounds_of(f)) is not None else {}
        if f.name in caps:
            schema["maximum"] = min(schema.get("maximum", caps[f.name]), caps[f.name])
        description = " ".join(part for part in (f.metadata["help"], notes.get(f.name), suffix) if part)
        return kind, Field(default, description=description, json_schema_extra=schema or None)

    types, recipes = typing.get_type_hints(requests.Request), {f.name for f in dataclasses.fields(DecodeConfig)}

    def field_of(f: dataclasses.Field) -> tuple[Any, Any]:
        """A recipe's option is nullable (null: the recipe's); a request's own has its default."""
        if f.name in recipes:
            return option(f, _wire_type(types[f.name]) | None, None, "[default: the model's recipe]")
        return option(f, _wire_type(types[f.name]), f.default)

    return create_model(
        "TranslateRequest",
        __config__=ConfigDict(extra="forbid", strict=True),
        __doc__="Sentences to translate and how: `mtx translate`'s options, by its names; unset ones (absent or "
        "null) take the checkpoint's recipe.",
        text=(list[str], Field(
            description=f"The sentences, one string each (a line of `mtx translate`'s input): at most "
            f"{limits.max_sentences:,} (--max-sentences), each of at most {limits.max_chars:,} characters "
            "(--max-chars) and no longer in tokens than the model's positions; else 413.", examples=[[EXAMPLE]],
            json_schema_extra={"maxItems": limits.max_sentences,
                               "items": {"type": "string", "maxLength": limits.max_chars}})),
        **{f.name: field_of(f) for f in dataclasses.fields(requests.Request) if f.name not in requests.PER_PROCESS},
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


class DocumentSentence(SentenceTranslation):
    source: str = Field(description="The sentence as it was translated: cut from the string, its markup out.")


class DocumentTranslation(BaseModel):
    text: str = Field(description="The string translated sentence by sentence, joined back with its whitespace, "
                                  "its markup put back around the aligned words.")
    flags: list[str] = Field(description="The flags of any of its sentences.")
    sentences: list[DocumentSentence] = Field(description="Each sentence, in order, with its translation's fields.")


class TranslateResponse(BaseModel):
    translations: list[SentenceTranslation | DocumentTranslation] = Field(
        description="One per string of text: a sentence's fields; with split_sentences or markup, a document's.")


class ErrorResponse(BaseModel):
    error: str
    field: str | None = Field(None, description="The request's field at fault, where one is.")


class Health(BaseModel):
    status: Literal["loading", "ready", "failed", "draining"]
    error: str | None = None


RETRY_AFTER = {"Retry-After": {"description": "Seconds after which to retry.", "required": True,
                               "schema": {"type": "integer", "minimum": 1}}}
ERRORS = {status: {"model": ErrorResponse, "description": description, **extra} for status, description, extra in (
    (400, "Invalid JSON, a field of the wrong type, an unknown option, a value out of its range, or options that do "
          "not go together (each field's description says with what).", {}),
    (408, "The body did not arrive within --timeout: shorter than its Content-Length, or sent too slowly.", {}),
    (413, "Too many sentences, a sentence too long in characters or in tokens, a body too large for either.", {}),
    (500, "A fault of the server; its log has the traceback.", {}),
    (503, "The queue is full, the server is loading or shutting down, a decoding process stopped, or memory ran out.",
     {"headers": RETRY_AFTER}),
    (504, "Not translated within the server's --timeout.", {}))}


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
                  "decoded together (dynamic batching).",
                  exception_handlers={StarletteHTTPException: _refused, Exception: _failed})
    model = request_model(service.limits)

    @app.post("/translate", response_model=TranslateResponse, responses=ERRORS)
    async def translate(request: Request) -> Response:
        """Translate sentences, each answered with the fields of `mtx translate --format jsonl`."""
        arrived, timeout = time.monotonic(), service.limits.timeout
        try:  # a body shorter than its Content-Length would otherwise be waited for as long as the client stays
            raw = await asyncio.wait_for(request.body(), timeout)
        except asyncio.TimeoutError:
            return _error(request, RequestError(408, f"the body did not arrive within {timeout:g} s (--timeout): it "
                                                "is shorter than its Content-Length, or was sent too slowly."),
                          headers={"Connection": "close"})  # what is left of it must not be read as a request
        except ClientDisconnect:
            request.state.error = "the client closed the connection before sending the whole body"
            return Response(status_code=CLIENT_CLOSED)  # to nobody: the status is the log's
        try:
            body = model.model_validate_json(raw)
        except ValidationError as e:
            return _error(request, RequestError(400, *_validation_message(e, model)))
        request.state.sentences = len(body.text)
        options = {k: v for k, v in body.model_dump(exclude={"text"}).items() if v is not None}  # null: unset
        try:
            translations = await service.translate(body.text, options, arrived)
        except RequestError as e:
            return _error(request, e)
        return Response(json.dumps({"translations": translations}, ensure_ascii=False), media_type="application/json")

    app.openapi = functools.partial(_openapi_document, app, model, service)

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


def _openapi_document(app: FastAPI, model: type[BaseModel], service: TranslationService) -> dict[str, Any]:
    """FastAPI's document, with the body of POST /translate that FastAPI does not see (`translate` reads it): the
    request model's schema and the rules that only the loaded model can state (its recipe's options stand for the
    unset ones, its layers bound alignment_layer)."""
    document = copy.deepcopy(FastAPI.openapi(app))
    schema = {**model.model_json_schema(), **service.request_rules()}
    document["paths"]["/translate"]["post"]["requestBody"] = {
        "required": True, "content": {"application/json": {"schema": schema}}}
    return document


async def _refused(request: Request, error: StarletteHTTPException) -> JSONResponse:
    """Starlette's own refusals (a path that is not one, a method the path does not take), in this server's form;
    405 keeps its Allow header."""
    path = request.url.path
    if error.status_code == 404:
        message = f"{path} is not a path of this server; its paths are {', '.join(PATHS)}."
    elif error.status_code == 405:
        message = f"{path} does not take {request.method}, only {(error.headers or {}).get('Allow', 'other methods')}."
    else:
        message = f"{error.detail}."
    return _error(request, RequestError(error.status_code, message), headers=error.headers)


async def _failed(request: Request, error: Exception) -> JSONResponse:
    """A fault of mtx, or of the machine: logged whole (a decoding process's traceback with it), summarised to the
    client."""
    if is_out_of_memory(error):
        answer = RequestError(503, "out of memory: send fewer sentences, or ask for a smaller beam.", retry_after=1)
    else:
        answer = RequestError(500, f"internal error ({type(error).__name__}: {first_line(error)}).")
    return _error(request, answer, logged="".join(traceback.format_exception(error)))


def _error(request: Request, error: RequestError, logged: str | None = None,
           headers: Mapping[str, str] | None = None) -> JSONResponse:
    """The answer to a request that gets no translations; `logged`: what the log line says instead of its
    message (a traceback)."""
    request.state.error = logged or error.message
    retry = {"Retry-After": str(error.retry_after)} if error.retry_after is not None else {}
    body = {"error": error.message, **({"field": error.field} if error.field else {})}
    return JSONResponse(body, status_code=error.status, headers={**(headers or {}), **retry})


def _validation_message(error: ValidationError, model: type[BaseModel]) -> tuple[str, str | None]:
    """The first problem of a body, as (a message naming the field, the field)."""
    problem = error.errors()[0]
    location, kind = problem["loc"], problem["type"]
    field = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in location).lstrip(".") or None
    if kind == "json_invalid":
        return f"the body is not valid JSON ({problem['ctx']['error']}).", None
    if field is None:
        return 'the body must be a JSON object, such as {"text": ["Hello."]}.', None
    if kind == "extra_forbidden":
        options = ", ".join(name for name in model.model_fields)
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
        started, state, status = time.monotonic(), scope.setdefault("state", {}), None

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
        except Exception:
            if status is None:  # unanswered: uvicorn answers 500, and logs the error
                raise
            # Starlette re-raises what its error handler (`_failed`) answered, whose line below has the traceback.
        finally:
            seconds, path = time.monotonic() - started, scope["path"]
            status = status or 500
            self.service.metrics.request_done(path if path in PATHS else "other", status,
                                              seconds if path == "/translate" else None)
            client = scope.get("client")
            known = {key: state[key] for key in ("sentences", "error") if key in state}
            log_event(event="request", method=scope["method"], path=path, status=status,
                      ms=round(1000 * seconds, 2), client=f"{client[0]}:{client[1]}" if client else None, **known)
