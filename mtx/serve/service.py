"""The model behind `mtx serve`: its engine opened once, then each request checked, queued, answered.

It knows nothing of HTTP beyond the status codes its errors carry (mtx.serve.app wires it to FastAPI), so its
rules hold whatever serves it:

- a request's options are `mtx translate`'s, by the same names, on top of the checkpoint's recipe (`decode:`),
  and are checked as the command checks its flags, each error naming the field (400);
- a request holds at most `max_sentences` sentences of at most `max_chars` characters, none longer in tokens
  than the model's positions (each is tokenised once, here, and handed to the engine as token ids),
  and asks for a beam and an n-best list of at most `max_beam` (413, 400);
- its options are a `Request`'s fields (mtx.decode.request), but those the server fixes for every request (the
  engine, `mtx serve --engine`; the format, JSON), checked by the request's own rules (400), then by the engine's
  capability table: an option the engine cannot honour exactly is refused by name (400), never changed;
- the queue has room or the request is refused at once (503 with the seconds after which to retry); a request
  not answered within `timeout` seconds gets 504, and its sentences are dropped if not yet decoded;
- each sentence's answer holds the fields of `mtx translate --format jsonl`.

Requests are checked against what the checkpoints say of themselves (`ModelFacts`: vocabulary, positions,
decoder layers; the recipe's decoding options; the tokenizer), read without their weights. With the torch engine
only its workers (mtx.decode.workers) hold a model, so the server's own process costs what the web stack and a
tokenizer cost, whatever the model's size; CTranslate2's translators live in the server's process, where they
release the GIL while they decode.

The rules that one field's range cannot say (one field against another, or against the model) are also written
as JSON Schema (`request_rules`), for the OpenAPI document: a request that document admits is one `job` takes,
except for a sentence's length in tokens, which no schema can count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from mtx.config.decode import SAMPLING_ONLY, EngineName
from mtx.decode.engine import Dtype
from mtx.decode.engines import open_engine, refusal
from mtx.decode.request import Request
from mtx.decode.translation import Source
from mtx.decode.workers import WorkerDied
from mtx.documents.document import Document, UnreadableLine, engine_request, is_document, read_documents
from mtx.documents.sentences import segmenter_missing
from mtx.errors import MtxError, first_line
from mtx.serve.batcher import Batcher, Draining, Job, QueueFull
from mtx.serve.events import log_event
from mtx.serve.metrics import Metrics

if TYPE_CHECKING:
    from mtx.decode.engine import Engine
    from mtx.decode.facts import ModelFacts

NULL = {"type": "null"}  # JSON Schema's null: an option left unset

Status = Literal["loading", "ready", "failed", "draining"]


class RequestError(Exception):
    """A request that cannot be answered with translations: its HTTP status, a message, the field at fault."""

    def __init__(self, status: int, message: str, field: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.field, self.retry_after = status, message, field, retry_after


@dataclass(frozen=True)
class Limits:
    """What one request may ask for (`mtx serve`'s flags)."""

    max_sentences: int
    max_chars: int
    max_beam: int  # also bounds nbest: the search's memory grows with both
    timeout: float  # seconds from arrival to answer


class TranslationService:
    """The engine, the batcher that feeds it, and the rules of a request."""

    def __init__(self, checkpoints: Sequence[Path], *, engine: EngineName, device: str, dtype: Dtype, threads: int,
                 batch_tokens: int, max_wait: float, max_queue: int, limits: Limits,
                 open_engine: Callable[..., Engine] = open_engine) -> None:
        self.checkpoints, self.engine_name, self.device_name = list(checkpoints), engine, device
        self.dtype, self.threads, self.batch_tokens = dtype, threads, batch_tokens
        self.max_wait, self.max_queue, self.limits = max_wait, max_queue, limits
        self.open_engine = open_engine
        self.metrics = Metrics()
        self.status: Status = "loading"
        self.failure: str | None = None
        self.batcher: Batcher | None = None
        self.engine: Engine | None = None
        self.facts: ModelFacts | None = None  # set last by `_load`: once it is, so is all a request is checked by

    def load(self) -> None:
        """Open the engine (the torch engine's workers load the models and warm up) and start the batcher; then
        the service is ready. An error (a corrupt checkpoint, a device that is not there) leaves it failed, with
        the message in `failure`."""
        try:
            self._load()
        except Exception as e:  # a user error as it is; anything else (out of memory) by its first line
            self.failure = str(e) if isinstance(e, MtxError) else f"{type(e).__name__}: {first_line(e)}"
            self.status = "failed"
            log_event(event="failed", error=self.failure)

    def _load(self) -> None:
        from mtx.checkpoint import describe_checkpoint

        started = time.monotonic()
        engine = self.open_engine(self.engine_name, self.checkpoints, device=self.device_name, dtype=self.dtype,
                                  threads=self.threads, batch_tokens=self.batch_tokens, log=lambda text: None,
                                  in_process=False, events=log_event)
        self.engine, self.metrics.provenance = engine, engine.provenance()
        self.batcher = Batcher([engine.translate] * engine.parallelism, batch_tokens=self.batch_tokens,
                               max_wait=self.max_wait, max_queue=self.max_queue, metrics=self.metrics)
        self.batcher.start()
        self.facts = engine.facts
        if self.status == "loading":  # not already draining
            self.status = "ready"
        defaults = Request.of(engine.facts, {"engine": engine.name})
        if (refused := refusal(defaults, engine.facts, (), lambda name: name, " = ")) is not None:
            log_event(event="recipe_refused", field=refused[0], error=refused[1] + " Each request must then set it.")
        log_event(event="ready", models=[f"{path}: {describe_checkpoint(checkpoint)}" for path, checkpoint in
                                         zip(self.checkpoints, engine.facts.metadata, strict=True)],
                  **engine.provenance(), decoding_processes=engine.parallelism, pids=engine.pids(),
                  seconds=round(time.monotonic() - started, 3))

    def drain(self) -> None:
        """Take no more requests, answer those queued, close the engine (its workers stop)."""
        self.status = "draining"
        if self.batcher is not None:
            self.batcher.close()
        if self.engine is not None:
            self.engine.close()

    def job(self, text: list[str], options: dict[str, Any]) -> Job:
        """A request as a queued job, once every rule of the module's docstring holds (else RequestError)."""
        if self.status != "ready":
            raise RequestError(503, f"the server is {self.status}" + (": retry shortly" if self.status == "loading"
                                                                      else ""), retry_after=1)
        limits = self.limits
        if len(text) > limits.max_sentences:
            raise RequestError(413, f"text has {len(text):,} sentences; this server takes at most "
                               f"{limits.max_sentences:,} per request (--max-sentences): split the request.", "text")
        for index, sentence in enumerate(text):
            if len(sentence) > limits.max_chars:
                raise RequestError(413, f"text[{index}] has {len(sentence):,} characters; this server takes at most "
                                   f"{limits.max_chars:,} per sentence (--max-chars): split it.", f"text[{index}]")
        facts, engine = self.facts, self.engine
        request = Request.of(facts, {**options, "engine": engine.name, "format": "jsonl"})
        problem = request.problem_with(facts, lambda name: name, " = ", given=options)
        if problem is None:
            problem = refusal(request, facts, options, lambda name: name, " = ")
        if problem is not None:
            raise RequestError(400, problem[1], problem[0])
        for name in ("beam", "nbest"):
            if getattr(request, name) > limits.max_beam:
                raise RequestError(400, f"{name} = {getattr(request, name)} is more than this server allows, "
                                   f"{limits.max_beam} (--max-beam).", name)
        documents, sentences, owners = self._documents(text, request)
        sources, cost = self._sources(sentences, owners, request, bool(documents))
        lines = [request.line_offset + i for i in owners]
        searched = engine_request(request) if documents else request
        # equal requests share batches
        return Job(sources, lines, dataclasses.replace(searched, line_offset=0), cost, documents)

    def _documents(self, text: list[str], request: Request) -> tuple[list[Document], list[str], list[int]]:
        """The strings taken apart as documents (none where the request reads them as sentences), the sentences to
        translate, and the index in `text` of each; markup that cannot be read is refused (400)."""
        if not is_document(request):
            return [], text, list(range(len(text)))
        if request.split_sentences and (missing := segmenter_missing()) is not None:
            raise RequestError(400, f"split_sentences: {missing} on the server.", "split_sentences")
        try:
            documents = read_documents(text, request, self.facts)
        except UnreadableLine as e:
            raise RequestError(400, f"text[{e.index}]: {e}", f"text[{e.index}]") from None
        sentences = [source for document in documents for source in document.sources()]
        return documents, sentences, [i for i, document in enumerate(documents) for _ in document.sentences]

    def _sources(self, sentences: list[str], owners: list[int], request: Request, split: bool = False
                 ) -> tuple[list[Source], int]:
        """Each sentence's token ids (None: empty once normalised), as the engine reads them, and their cost,
        counted as the engine's batches count it; a sentence longer than the model's positions is refused (413),
        where `mtx translate` would truncate it, naming the string of `text` it is (`owners`; `split`: of which it is
        a sentence)."""
        limits, cost = self.facts.limits, 0
        sources = self.facts.encode(sentences, request.target_lang)
        for ids, index in zip(sources, owners, strict=True):
            if ids is None:
                continue
            if len(ids) + 1 > limits.max_positions:
                which = "a sentence of " if split else ""
                raise RequestError(413, f"{which}text[{index}] is {len(ids):,} tokens long; the model reads at most "
                                   f"{limits.max_positions - 1:,} (its positions less EOS): split it.",
                                   f"text[{index}]")
            cost += max(len(ids), limits.output_limit(request, len(ids))) + 1
        return sources, cost

    def request_rules(self) -> dict[str, Any]:
        """`job`'s rules that no one field's range says, as JSON Schema keywords of the request's object (for its
        OpenAPI schema); none before the model is loaded, as an unset option takes its recipe's value.

        - without sampling: topk, topp and temperature unset, and nbest at most beam (one branch per beam);
        - with sampling: beam unset or 1; with either, beam and nbest at most `max_beam`, however set;
        - alignment_layer only with alignment, and one of the model's decoder layers;
        - beam at most the model's vocabulary;
        - shortlist at most the translations per source token of the checkpoint's lexical table (0: it has none);
        - target_lang one of the model's target languages (mtx.decode.target_lang);
        - with split_sentences or markup, nbest 1 and no alignment (a string is translated as one text).
        """
        if self.facts is None:
            return {}
        facts = self.facts
        recipe, widest = facts.defaults, self.limits.max_beam
        if any(unset is None and getattr(recipe, name) is not None for name, unset in SAMPLING_ONLY.items()):
            searches = []  # the recipe samples with an option that a request cannot unset (null is the recipe's)
        else:
            unset_options = [(name, NULL if unset is None else {"const": unset}, getattr(recipe, name) == unset)
                             for name, unset in SAMPLING_ONLY.items()]
            searches = [_object(("sampling", {"const": False}, not recipe.sampling), *unset_options,
                                ("beam", {"const": beam}, recipe.beam == beam),
                                ("nbest", {"type": "integer", "maximum": beam}, recipe.nbest <= beam))
                        for beam in range(1, widest + 1)]
        sampling = _object(("sampling", {"const": True}, recipe.sampling),
                           ("beam", {"const": 1}, recipe.beam <= widest),
                           ("nbest", {"type": "integer", "maximum": widest}, recipe.nbest <= widest))
        aligning = [_object(("alignment", {"const": True}, False)), _object(("alignment_layer", NULL, True))]
        sentences = [_object(("markup", {"const": "none"}, True),
                             ("split_sentences", {"const": False}, not recipe.split_sentences)),
                     _object(("nbest", {"const": 1}, recipe.nbest == 1), ("alignment", {"const": False}, True))]
        return {"allOf": [{"anyOf": [*searches, sampling]}, {"anyOf": aligning}, {"anyOf": sentences},
                          {"properties": {"alignment_layer": {"maximum": facts.limits.decoder_layers - 1},
                                          "beam": {"maximum": facts.limits.vocab_size},
                                          "shortlist": {"maximum": facts.lexicon_width},
                                          "target_lang": {"enum": [*facts.targets.languages, None]}}}]}

    async def translate(self, text: list[str], options: dict[str, Any], arrived: float) -> list[dict[str, object]]:
        """The translations of a request's sentences, each as `mtx translate --format jsonl` writes a line;
        `arrived`: when the request did (time.monotonic()), from which its timeout counts."""
        from mtx.decode.output import json_object
        from mtx.documents.document import document_object, join_documents

        job = self.job(text, options)
        if self.batcher is None:
            raise RequestError(503, "the server is loading: retry shortly", retry_after=1)
        try:
            future = self.batcher.submit(job)
        except QueueFull as e:
            raise RequestError(503, f"the server is at capacity ({self.max_queue:,} sentences queued at most, "
                               "--max-queue): retry later.", retry_after=e.retry_after) from None
        except Draining:
            raise RequestError(503, "the server is shutting down.", retry_after=1) from None
        left = self.limits.timeout - (time.monotonic() - arrived)
        try:
            nbests = await asyncio.wait_for(asyncio.wrap_future(future), timeout=max(left, 0.001))
        except asyncio.TimeoutError:
            raise RequestError(504, f"not translated within {self.limits.timeout:g} s (--timeout): the server is "
                               "busy, or the request asks for much; retry later or send fewer sentences.") from None
        except WorkerDied as e:
            if not e.restarted:
                self.failure, self.status = str(e), "failed"
                log_event(event="failed", error=self.failure)
            raise RequestError(503, str(e), retry_after=1) from None
        except MtxError as e:
            raise RequestError(400, str(e)) from None
        if job.documents:
            return [document_object(d, self.facts.tokenizer) for d in join_documents(job.documents, nbests)]
        nbest, aligned = job.request.nbest > 1, job.request.alignment
        return [json_object(each, self.facts.tokenizer, nbest, aligned, with_doubts=True) for each in nbests]


def _object(*rules: tuple[str, dict[str, Any], bool]) -> dict[str, Any]:
    """JSON Schema of an object whose every (name, schema, unset_passes) holds: its field `name` matches `schema`
    (which admits no null, unless it is NULL: the field must be unset) or, where `unset_passes` (its recipe's value
    would match), is absent or null."""
    required = [name for name, _, unset_passes in rules if not unset_passes]
    return {"properties": {name: {"anyOf": [NULL, schema]} if unset_passes and schema != NULL else schema
                           for name, schema, unset_passes in rules}, **({"required": required} if required else {})}
