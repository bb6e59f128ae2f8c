"""The model behind `mtx serve`: loaded and warmed up once, then each request checked, queued and answered.

It knows nothing of HTTP beyond the status codes its errors carry (mtx.serve.app wires it to FastAPI), so its
rules hold whatever serves it:

- a request's options are `mtx translate`'s, by the same names, on top of the checkpoint's recipe (`decode:`),
  and are checked as the command checks its flags, each error naming the field (400);
- a request holds at most `max_sentences` sentences of at most `max_chars` characters, none longer in tokens
  than the model's positions, and asks for a beam and an n-best list of at most `max_beam` (413, 400);
- its own options (`RequestOptions`: alignment, alignment_layer, line_offset) are in their ranges, and
  alignment_layer, given only with alignment, is one of the model's decoder layers (400);
- the queue has room or the request is refused at once (503 with the seconds after which to retry); a request
  not answered within `timeout` seconds gets 504, and its sentences are dropped if not yet decoded;
- each sentence's answer holds the fields of `mtx translate --format jsonl`.

The rules that one field's range cannot say (one field against another, or against the model) are also written
as JSON Schema (`request_rules`), for the OpenAPI document: a request that document admits is one `job` takes,
except for a sentence's length in tokens, which no schema can count.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mtx.config.decode import SAMPLING_ONLY, DecodeConfig
from mtx.config.fields import Bounds, bounds_problems, setting
from mtx.decode.translator import Dtype, Translator
from mtx.errors import MtxError, first_line
from mtx.serve.batcher import Batcher, Draining, Job, QueueFull
from mtx.serve.events import log_event
from mtx.serve.metrics import Metrics
from mtx.serve.worker import WorkerDied, WorkerProcess

# A request's options that are the recipe's decoding fields (the others: RequestOptions).
DECODE_OPTIONS = tuple(f.name for f in dataclasses.fields(DecodeConfig))
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


@dataclass(frozen=True)
class RequestOptions:
    """A request's options that are not the recipe's: declared as its fields are (mtx.config.fields), so that the
    ranges checked here are the ones the OpenAPI schema states."""

    alignment: bool = setting(False, "Add each translation's word alignment: [source, target] word indices, 0-based "
                              "(mtx translate --alignment).")
    alignment_layer: int | None = setting(
        None, "With alignment: the decoder layer (0-based) whose cross-attention aligns [default: mtx translate's].",
        bounds=Bounds(0))
    line_offset: int = setting(0, "The index of the first sentence in the text it was cut from: sampling's draws "
                               "depend on each sentence's index.", bounds=Bounds(0))


class TranslationService:
    """The loaded model(s), the batcher that decodes for them, and the rules of a request."""

    def __init__(self, checkpoints: Sequence[Path], *, device: str, dtype: Dtype, threads: int, batch_tokens: int,
                 max_wait: float, max_queue: int, limits: Limits) -> None:
        self.checkpoints, self.device_name, self.dtype, self.threads = list(checkpoints), device, dtype, threads
        self.batch_tokens, self.max_wait, self.max_queue, self.limits = batch_tokens, max_wait, max_queue, limits
        self.metrics = Metrics()
        self.status: Status = "loading"
        self.failure: str | None = None
        self.batcher: Batcher | None = None
        self.workers: list[WorkerProcess] = []
        self.checkpoint: dict[str, Any] | None = None  # the first model's, once loaded: its recipe's options
        self.decoder_layers: int | None = None  # set last by `_load`: once it is, so is all a request is checked by

    def load(self) -> None:
        """Load the models, start the decoding workers and warm each up; then the service is ready. An error (a
        corrupt checkpoint, a device that is not there) leaves it failed, with the message in `failure`."""
        try:
            self._load()
        except Exception as e:  # a user error as it is; anything else (out of memory) by its first line
            self.failure = str(e) if isinstance(e, MtxError) else f"{type(e).__name__}: {first_line(e)}"
            self.status = "failed"
            log_event(event="failed", error=self.failure)

    def _load(self) -> None:
        from mtx.checkpoint import describe_checkpoint
        from mtx.decode.ensemble import load_models
        from mtx.decode.translator import decoding_workers
        from mtx.devices import choose_device

        started = time.monotonic()
        target = choose_device(self.device_name, "--device")
        workers, threads_each = decoding_workers(target, self.threads, self.threads)
        self.workers = [WorkerProcess(number, self.checkpoints, device=self.device_name, dtype=self.dtype,
                                      threads=threads_each, batch_tokens=self.batch_tokens)
                        for number in range(workers)]
        # Meanwhile, this process reads the checkpoints for what it checks requests against.
        self.models, self.tokenizer, loaded = load_models(self.checkpoints)
        self.checkpoint = loaded[0]
        self.decoder_layers = len(self.models[0].decoder_layers)
        for worker in self.workers:
            worker.wait_ready()
        self.batcher = Batcher([worker.decode for worker in self.workers], batch_tokens=self.batch_tokens,
                               max_wait=self.max_wait, max_queue=self.max_queue, metrics=self.metrics)
        self.batcher.start()
        if self.status == "loading":  # not already draining
            self.status = "ready"
        log_event(event="ready", models=[f"{path}: {describe_checkpoint(checkpoint)}" for path, checkpoint in
                                         zip(self.checkpoints, loaded, strict=True)],
                  device=str(target), workers=workers, threads_each=threads_each,
                  pids=[worker.process.pid for worker in self.workers],
                  seconds=round(time.monotonic() - started, 3))

    def drain(self) -> None:
        """Take no more requests, answer those queued, stop the workers."""
        self.status = "draining"
        if self.batcher is not None:
            self.batcher.close()
        for worker in self.workers:
            worker.stop()

    def job(self, text: list[str], options: dict[str, Any]) -> Job:
        """A request as a queued job, once every rule of the module's docstring holds (else RequestError)."""
        from mtx.tokenizer import normalize_text

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
        decode_options = {k: v for k, v in options.items() if k in DECODE_OPTIONS}
        decode = DecodeConfig.of_checkpoint(self.checkpoint, **decode_options)
        problem = decode.first_problem(lambda name: name, " = ", vocabulary=self.models[0].vocab_size)
        if problem is not None:
            raise RequestError(400, problem[1], problem[0])
        if decode.sampling and decode_options.get("beam", 1) != 1:
            raise RequestError(400, f"sampling draws each token, beam = {decode.beam} searches: give one or the "
                               "other (with sampling, nbest = N draws N samples).", "beam")
        for name in ("beam", "nbest"):
            if getattr(decode, name) > limits.max_beam:
                raise RequestError(400, f"{name} = {getattr(decode, name)} is more than this server allows, "
                                   f"{limits.max_beam} (--max-beam).", name)
        request = RequestOptions(**{k: v for k, v in options.items() if k not in DECODE_OPTIONS})
        for name, what in bounds_problems(request):
            raise RequestError(400, f"{name} = {getattr(request, name)!r} {what}.", name)
        alignment_layer = self._alignment_layer(request)
        # Every option is checked by now: the translator is made to count a batch's tokens as its batches do.
        translator = Translator(self.models, self.tokenizer, decode, self.batch_tokens, alignment_layer=alignment_layer)
        normalized = [normalize_text(sentence) for sentence in text]
        cost = 0
        for index, ids in enumerate(self.tokenizer.encode_batch(normalized)):
            if len(ids) + 1 > translator.max_positions:
                raise RequestError(413, f"text[{index}] is {len(ids):,} tokens long; the model reads at most "
                                   f"{translator.max_positions - 1:,} (its positions less EOS): split it.",
                                   f"text[{index}]")
            if normalized[index]:
                cost += max(len(ids), translator.output_limit(len(ids))) + 1  # as the translator's batches count
        return Job(list(text), [request.line_offset + i for i in range(len(text))], (decode, alignment_layer),
                   cost)

    def _alignment_layer(self, request: RequestOptions) -> int | None:
        """The decoder layer that aligns, when the request asks for alignments (mtx translate's default layer)."""
        from mtx.decode.alignment import default_alignment_layer

        layer = request.alignment_layer
        if not request.alignment:
            if layer is not None:
                raise RequestError(400, "alignment_layer only applies with alignment = true.", "alignment_layer")
            return None
        if layer is None:
            return default_alignment_layer(self.decoder_layers)
        if layer >= self.decoder_layers:
            raise RequestError(400, f"alignment_layer = {layer} is not a layer of this model, whose decoder layers "
                               f"are numbered 0 to {self.decoder_layers - 1}.", "alignment_layer")
        return layer

    def request_rules(self) -> dict[str, Any]:
        """`job`'s rules that no one field's range says, as JSON Schema keywords of the request's object (for its
        OpenAPI schema); none before the model is loaded, as an unset option takes its recipe's value.

        - without sampling: topk, topp and temperature unset, and nbest at most beam (one branch per beam);
        - with sampling: beam unset or 1; with either, beam and nbest at most `max_beam`, however set;
        - alignment_layer only with alignment, and one of the model's decoder layers;
        - beam at most the model's vocabulary.
        """
        if self.decoder_layers is None:
            return {}
        recipe, widest = DecodeConfig.of_checkpoint(self.checkpoint), self.limits.max_beam
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
        return {"allOf": [{"anyOf": [*searches, sampling]}, {"anyOf": aligning},
                          {"properties": {"alignment_layer": {"maximum": self.decoder_layers - 1},
                                          "beam": {"maximum": self.models[0].vocab_size}}}]}

    async def translate(self, text: list[str], options: dict[str, Any], arrived: float) -> list[dict[str, object]]:
        """The translations of a request's sentences, each as `mtx translate --format jsonl` writes a line;
        `arrived`: when the request did (time.monotonic()), from which its timeout counts."""
        from mtx.decode.output import json_object

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
        decode, alignment_layer = job.options
        return [json_object(nbest, self.tokenizer, decode.nbest > 1, alignment_layer is not None, with_flags=True)
                for nbest in nbests]


def _object(*rules: tuple[str, dict[str, Any], bool]) -> dict[str, Any]:
    """JSON Schema of an object whose every (name, schema, unset_passes) holds: its field `name` matches `schema`
    (which admits no null, unless it is NULL: the field must be unset) or, where `unset_passes` (its recipe's value
    would match), is absent or null."""
    required = [name for name, _, unset_passes in rules if not unset_passes]
    return {"properties": {name: {"anyOf": [NULL, schema]} if unset_passes and schema != NULL else schema
                           for name, schema, unset_passes in rules}, **({"required": required} if required else {})}
