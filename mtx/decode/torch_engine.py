"""The torch engine: mtx's own search (mtx.decode.search), the reference engine, with every option.

It holds the model(s) prepared once (`prepare_model`: weights laid out for the CPU, or int8, or half precision on a
GPU) and, on a CPU with several threads, a pool of workers (mtx.decode.workers), each with its own copy, started
as the engine opens (they load while this process does) and kept for the engine's life. A call is planned here, as the
translator plans it (`Translator`: sentences sorted by length and cut into batches of `batch_tokens`); its batches
go to the workers, one each, and are decoded side by side, or are decoded here one after the other where there
is one batch, one thread, or a GPU. Every output is the same either way, since each batch is searched alone.

Why several workers of one thread rather than one search on all the threads: decoding is a long chain of small
operations (a step of beam 4 over 32 sentences of the `small` model multiplies 128-row matrices), and each
parallel operation wakes the other threads and waits for them. Batches side by side keep every core busy instead,
and decode more sentences a second (bench/README.md, "Batches side by side in processes").

The server's process holds no model (`in_process=False`): every call goes to its workers, which are started with
the engine, so the server is ready only once they are warm.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from mtx.data.batching import decoding_batches
from mtx.decode.engine import Dtype, cpu_instructions
from mtx.decode.facts import ModelFacts
from mtx.decode.request import Request
from mtx.decode.translation import Scored, Source, Translation, TranslationStats
from mtx.decode.translator import Translator, load_prepared
from mtx.decode.workers import WorkerPool, _quiet
from mtx.devices import choose_device, choose_dtype
from mtx.model import int8
from mtx.model.transformer import Transformer

MAX_WORKERS = 8  # batches decoded side by side on a CPU, a worker process each holding its batch's search
DTYPE_NAMES = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}  # as --dtype names them
# Warm-up sentences: a short and a longer one, so that the first calls meet no first-call costs.
WARM_UP = ["Hello.", "The old friends met again in the small town where they had grown up, and talked for hours."]


@dataclass(frozen=True)
class WorkerSetup:
    """What a worker loads: the same engine as its parent's, from the files, on `threads` PyTorch threads."""

    checkpoints: tuple[Path, ...]
    device: str
    dtype: Dtype
    threads: int
    batch_tokens: int
    side_by_side: int  # the workers decoding at once, each a batch: what a batch's memory check counts on


class TorchEngine:
    """mtx's search over `models` (None: they live in the workers only), for any request."""

    name = "torch"

    def __init__(self, facts: ModelFacts, models: list[Transformer] | None, *, batch_tokens: int,
                 device: torch.device, setup: WorkerSetup | None = None, workers: int = 1,
                 every_ending: bool = False, log=_quiet, pool: WorkerPool | None = None) -> None:
        self.facts, self.models, self.batch_tokens, self.device = facts, models, batch_tokens, device
        self.stats = TranslationStats()
        self.every_ending = every_ending
        self._setup, self._workers, self._log = setup, workers, log
        self._pool = pool  # started already (`open_torch_engine`), or at the first call that needs it
        self._starting = threading.Lock()
        self._counting = threading.Lock()
        self.dtype = _dtype_name(models[0]) if models is not None else _named_dtype(setup.dtype, device)
        if models is None and pool is None:  # the server's process: the workers are all there is, started now
            self._start_pool()

    @property
    def parallelism(self) -> int:
        """Calls worth making at once: one per worker."""
        return self._workers

    def translate(self, sources: Sequence[Source], request: Request, lines: Sequence[int],
                  prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
        started = time.perf_counter()
        batches = self._plan(sources, request) if self._side_by_side() else None
        if batches is None or (len(batches) <= 1 and self.models is not None):
            results, stats = self.translate_here(sources, request, lines, prefixes)
        else:
            answers = self._pool_of_workers().map("translate_here", [
                ([sources[j] for j in batch], request, [lines[j] for j in batch],
                 None if prefixes is None else [prefixes[j] for j in batch]) for batch in batches])
            results, stats = [[] for _ in sources], TranslationStats(sentences=sum(s is None for s in sources))
            for batch, (translated, its_stats) in zip(batches, answers, strict=True):
                for j, nbest in zip(batch, translated, strict=True):
                    results[j] = nbest
                stats.add(its_stats)
        self._count(stats, time.perf_counter() - started)
        return results

    @torch.inference_mode()
    def translate_here(self, sources: Sequence[Source], request: Request, lines: Sequence[int],
                       prefixes: Sequence[str] | None = None) -> tuple[list[list[Translation]], TranslationStats]:
        """`translate` in this process, and what it did: what a worker answers a call with."""
        translator = self._translator(request)
        return translator.translate_tokens(sources, lines, prefixes), translator.stats

    def score(self, sentences: Sequence[str], translations: Sequence[str], request: Request) -> list[Scored]:
        started = time.perf_counter()
        if self.models is None:  # no model here to plan with: one worker scores the whole call
            results, stats = self._pool_of_workers().call("score_here", sentences, translations, request)
            self._count(stats, time.perf_counter() - started)
            return results

        def score_batches(calls: list[tuple[list[list[int]], list[list[int]]]]) -> list[list[Translation]]:
            if len(calls) > 1 and self._side_by_side():
                return self._pool_of_workers().map("score_batch_here", [(*call, request) for call in calls])
            return [self.score_batch_here(*call, request) for call in calls]

        translator = self._translator(request)
        results = translator.forced_scores(sentences, translations, score_batches)
        self._count(translator.stats, time.perf_counter() - started)
        return results

    @torch.inference_mode()
    def score_here(self, sentences: Sequence[str], translations: Sequence[str], request: Request
                   ) -> tuple[list[Scored], TranslationStats]:
        """`score` in this process, and what it did: what a worker answers a call with."""
        translator = self._translator(request)
        return translator.forced_scores(sentences, translations), translator.stats

    @torch.inference_mode()
    def score_batch_here(self, sources: list[list[int]], given: list[list[int]], request: Request
                         ) -> list[Translation]:
        """One batch of given translations scored in this process: what a worker answers a call with."""
        return self._translator(request).score_tokens(sources, given)

    def provenance(self) -> dict[str, str]:
        return {"engine": "torch", "version": torch.__version__, "compute_type": self.dtype,
                "device": self.device.type, "cpu": cpu_instructions()}

    def close(self) -> None:
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def _translator(self, request: Request) -> Translator:
        """A translator of this one request over the models."""
        return Translator(self.models, self.facts.tokenizer, request,
                          self.batch_tokens, alignment_layer=request.aligning_layer(self.facts.limits.decoder_layers),
                          doubt_thresholds=self.facts.doubts if request.details else None, lexicon=self.facts.lexicon,
                          targets=self.facts.targets, every_ending=self.every_ending,
                          side_by_side=self._workers)

    def _side_by_side(self) -> bool:
        """Whether batches go to workers: there are several, or the models live nowhere else."""
        return (self._setup is not None and self._workers > 1) or self.models is None

    def _plan(self, sources: Sequence[Source], request: Request) -> list[list[int]]:
        """The indices of `sources` in the batches the translator would cut them into (empty ones left out)."""
        limits = self.facts.limits
        todo = [i for i, ids in enumerate(sources) if ids is not None]
        lengths = [min(len(sources[i]), limits.max_positions - 1) + 1 for i in todo]
        outputs = [limits.output_limit(request, n - 1) for n in lengths]
        return [[todo[k] for k in batch] for batch in decoding_batches(lengths, outputs, self.batch_tokens)]

    def _pool_of_workers(self) -> WorkerPool:
        with self._starting:
            if self._pool is None:
                self._start_pool()
            return self._pool

    def _start_pool(self) -> None:
        self._pool = WorkerPool(self._workers, load_in_process, self._setup, self._log)

    def pids(self) -> list[int]:
        """The workers' process ids, for the log; none where it decodes in this process."""
        return [] if self._pool is None else self._pool.pids()

    def _count(self, stats: TranslationStats, seconds: float) -> None:
        with self._counting:
            self.stats.add(dataclasses.replace(stats, seconds=seconds))


def _dtype_name(model: Transformer) -> str:
    """The numeric format a prepared model computes in, as --dtype names it."""
    if any(isinstance(module, int8.Int8Linear) for module in model.modules()):
        return "int8"
    return DTYPE_NAMES[model.tgt_embed.weight.dtype]


def _named_dtype(requested: Dtype, device: torch.device) -> str:
    """The numeric format `--dtype requested` gives on `device`, as --dtype names it (auto resolved)."""
    if requested == "int8":
        return "int8"
    return DTYPE_NAMES[choose_dtype(requested, device, "--dtype")]


def workers_for(device: torch.device, threads: int) -> tuple[int, int]:
    """How to spend `threads` CPU threads: (workers, threads each). A CPU decodes up to `threads` batches side by
    side, a worker each, single-threaded, and only the threads no worker needs go to the workers' operations; a
    GPU decodes one batch at a time."""
    if device.type != "cpu" or threads <= 1:
        return 1, threads
    workers = min(threads, MAX_WORKERS)
    return workers, max(1, threads // workers)


def open_torch_engine(checkpoints: Sequence[Path], *, device: str, dtype: Dtype, threads: int, batch_tokens: int,
                      in_process: bool = True, log=_quiet) -> TorchEngine:
    """The torch engine over the checkpoint files: the models prepared here (unless not `in_process`), and the
    workers that load the same, started first, without waiting for them (mtx.decode.workers), so that they load
    while this process does."""
    target = choose_device(device, "--device")
    workers, threads_each = workers_for(target, threads)
    setup = WorkerSetup(tuple(checkpoints), device, dtype, threads_each, batch_tokens, workers)
    if not in_process:
        return TorchEngine(ModelFacts.read(checkpoints), None, batch_tokens=batch_tokens, device=target, setup=setup,
                           workers=workers, log=log)
    pool = WorkerPool(workers, load_in_process, setup, log, wait=False) if workers > 1 else None
    try:
        models, tokenizer, metadata = load_prepared(checkpoints, device, dtype)
    except BaseException:
        if pool is not None:
            pool.close()
        raise
    return TorchEngine(ModelFacts.of_metadata(checkpoints, tokenizer, metadata), models, batch_tokens=batch_tokens,
                       device=target, setup=setup if workers > 1 else None, workers=workers, log=log, pool=pool)


def load_in_process(setup: WorkerSetup) -> TorchEngine:
    """A worker's engine, on the setup's threads: its models here, batches decoded here, warmed up."""
    torch.set_num_threads(setup.threads)
    models, tokenizer, metadata = load_prepared(setup.checkpoints, setup.device, setup.dtype)
    engine = TorchEngine(ModelFacts.of_metadata(setup.checkpoints, tokenizer, metadata), models,
                         batch_tokens=setup.batch_tokens, device=next(models[0].parameters()).device,
                         workers=setup.side_by_side)
    engine.translate_here(engine.facts.encode(WARM_UP), Request.of(engine.facts, {}), range(len(WARM_UP)))
    return engine


def engine_of_model(model: Transformer, facts: ModelFacts, batch_tokens: int = 4096,
                    every_ending: bool = False) -> TorchEngine:
    """An engine over a model already in memory (an average being tuned, a checkpoint being inspected), decoding
    in this process."""
    return TorchEngine(facts, [model], batch_tokens=batch_tokens, device=next(model.parameters()).device,
                       every_ending=every_ending)
