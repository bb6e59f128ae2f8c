"""Checkpoint → length-sorted batched decoding → detokenized lines in input order.

`Translator` is the core: normalised sentences in, n-best lists out, in the order given. Inside, the sentences are
encoded, sorted by length and packed into batches of similar length, so padding is rare. A batch's size, kept
within `batch_tokens`, is counted as training counts it (mtx.batching): sentences × the longer side, EOS
included, where the target side is the output length limit, because the decoder cache holds that many positions
for every beam whatever the translation's actual length.

`translate_sentences` (what the trainer's validation calls) and the `mtx translate` command share it. The command
feeds it windows of at most `READ_AHEAD_LINES` lines from a reader thread, so memory stays bounded, reading
overlaps decoding, and each window's output is written and flushed before the next is decoded.

Length limits. A source longer than the model's `max_positions` (EOS included) is truncated to fit, and counted
so the command can warn; translations are never split. The output of a source of n tokens (EOS not counted)
has at most floor(max_len_a · n + max_len_b) tokens before its EOS, and never more than max_positions - 1.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import queue
import sys
import threading
import time
import typing
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Literal

import torch

from mtx.devices import DeviceName, available_memory, choose_device, choose_dtype, half_precision_model
from mtx.errors import MtxError
from mtx.search import Hypothesis, LengthPenaltyStyle, search
from mtx.tokenizer import EOS, PAD, Tokenizer, normalize_text

READ_AHEAD_LINES = 2000  # a window: enough sentences for length sorting to pay off, few enough to stream
MAX_WORKERS = 8  # batches decoded at once on a CPU; beyond some number Python's own work would serialise them

Dtype = Literal["auto", "fp32", "bf16", "fp16", "int8"]
Errors = Literal["strict", "replace"]


def check_choice(flag: str, value: str, allowed: object) -> None:
    """A flag whose value must be one of a Literal type's values (the command line passes plain strings)."""
    choices = typing.get_args(allowed)
    if value not in choices:
        raise MtxError(f"{flag} {value!r} is not one of {', '.join(choices)}.")


@dataclass(frozen=True)
class DecodeOptions:
    """How to search; the defaults are the paper's (beam 4, α = 0.6, at most input length + 50 tokens)."""

    beam: int = 4
    lenpen: float = 0.6
    lenpen_style: LengthPenaltyStyle = "gnmt"
    max_len_a: float = 1.0
    max_len_b: int = 50
    min_len: int = 0
    nbest: int = 1

    def validate(self) -> None:
        """Flag values the search cannot honour, named by their command-line flags."""
        check_choice("--lenpen-style", self.lenpen_style, LengthPenaltyStyle)
        problems = [
            (self.beam >= 1, "--beam", self.beam, "must be at least 1"),
            (1 <= self.nbest <= self.beam, "--nbest", self.nbest, f"must be between 1 and --beam ({self.beam})"),
            (self.lenpen >= 0, "--lenpen", self.lenpen, "must be ≥ 0"),
            (self.max_len_a >= 0, "--max-len-a", self.max_len_a, "must be ≥ 0"),
            (self.max_len_b >= 1, "--max-len-b", self.max_len_b, "must be at least 1"),
            (self.min_len >= 0, "--min-len", self.min_len, "must be ≥ 0"),
        ]
        for ok, flag, value, what in problems:
            if not ok:
                raise MtxError(f"{flag} {value} {what}.")


@dataclass
class TranslationStats:
    """What a run did, for the summary line on standard error."""

    sentences: int = 0
    output_tokens: int = 0
    truncated: int = 0  # sources cut to the model's max_positions
    seconds: float = 0.0  # spent translating, not waiting for input

    def summary(self) -> str:
        rate = 1.0 / self.seconds if self.seconds > 0 else 0.0
        return (f"{self.sentences:,} sentences, {self.output_tokens:,} tokens in {self.seconds:.1f} s "
                f"({self.sentences * rate:,.1f} sentences/s, {self.output_tokens * rate:,.0f} tokens/s)")


@dataclass
class Translator:
    """A model, its tokenizer and decoding options: sentences in, n-best (text, score) lists out."""

    model: torch.nn.Module
    tokenizer: Tokenizer
    options: DecodeOptions = field(default_factory=DecodeOptions)
    batch_tokens: int = 4096
    stats: TranslationStats = field(default_factory=TranslationStats)

    def __post_init__(self) -> None:
        self.options.validate()
        if self.batch_tokens < 1:
            raise MtxError(f"--batch-tokens {self.batch_tokens} must be at least 1.")
        if self.options.beam > self.model.vocab_size:
            raise MtxError(f"--beam {self.options.beam} is more than the model's {self.model.vocab_size:,} "
                           "vocabulary tokens: beams are distinct continuations, so there cannot be more.")
        self.max_positions: int = self.model.cfg.max_positions
        self.device = next(self.model.parameters()).device

    def translate(self, sentences: list[str]) -> list[list[tuple[str, float]]]:
        """The n-best (text, score) pairs of each sentence, best first; an empty sentence gets an empty list."""
        started = time.perf_counter()
        texts = [normalize_text(s) for s in sentences]
        todo = [i for i, text in enumerate(texts) if text]
        sources = [self._source(ids) for ids in self.tokenizer.encode_batch([texts[i] for i in todo])]
        limits = [self._output_limit(len(ids) - 1) for ids in sources]
        costs = [max(len(ids), limit + 1) for ids, limit in zip(sources, limits, strict=True)]
        results: list[list[tuple[str, float]]] = [[] for _ in sentences]
        batches = plan_batches([len(ids) for ids in sources], costs, self.batch_tokens)
        workers, threads_each = decoding_workers(self.device, torch.get_num_threads(), len(batches))
        self._check_memory([(len(b), max(len(sources[j]) for j in b), max(limits[j] for j in b)) for b in batches],
                           workers)
        decoded_batches = map_in_threads(
            lambda batch: self._decode([sources[j] for j in batch], [limits[j] for j in batch]),
            batches, workers, threads_each)
        for batch, nbests in zip(batches, decoded_batches, strict=True):
            # Normalised like the training targets, so no output can hold a line break or a tab, even if a
            # model emits the byte token of one.
            decoded = self.tokenizer.decode_batch([h.tokens for nbest in nbests for h in nbest])
            texts_out = iter(normalize_text(text) for text in decoded)
            for j, nbest in zip(batch, nbests, strict=True):
                results[todo[j]] = [(next(texts_out), h.score) for h in nbest]
                self.stats.output_tokens += len(nbest[0].tokens)
        self.stats.sentences += len(sentences)
        self.stats.seconds += time.perf_counter() - started
        return results

    def _check_memory(self, batches: list[tuple[int, int, int]], workers: int) -> None:
        """Refuse, before allocating anything, a search whose state cannot fit in memory (`--beam 100000`).

        `batches` holds (sentences, longest source, longest output limit) per batch; `workers` of them are
        decoded at once.
        """
        needed = workers * max(self._search_bytes(*batch) for batch in batches)
        available = available_memory(self.device)
        if needed > available:
            raise MtxError(
                f"Beam {self.options.beam} needs about {needed / 2**20:,.0f} MiB for the decoder's cache and "
                f"scores of its largest batch{'es' if workers > 1 else ''}, but only {available / 2**20:,.0f} MiB "
                f"of {'GPU ' if self.device.type == 'cuda' else ''}memory is available: lower --beam or "
                "--batch-tokens (or --threads, which decodes batches side by side).")

    def _search_bytes(self, sentences: int, source_len: int, limit: int) -> int:
        """The memory a search of one batch allocates: the self-attention cache of every row (a beam) and
        its spare for reordering, the per-sentence cross-attention cache, and a few (rows, V) score arrays."""
        cfg, rows, positions = self.model.cfg, sentences * self.options.beam, limit + 1
        element = self.model.tgt_embed.weight.element_size()
        cache = element * cfg.layers_dec * 2 * cfg.d_model * (2 * rows * positions + sentences * source_len)
        return cache + 3 * 4 * rows * self.model.vocab_size + 8 * rows * positions

    def _source(self, ids: list[int]) -> list[int]:
        """Token ids plus EOS, cut to the model's positions if need be (and counted)."""
        if len(ids) + 1 > self.max_positions:
            self.stats.truncated += 1
            ids = ids[: self.max_positions - 1]
        return [*ids, EOS]

    def _output_limit(self, source_tokens: int) -> int:
        """The most tokens before EOS for a source of `source_tokens` (EOS not counted)."""
        o = self.options
        return min(math.floor(o.max_len_a * source_tokens + o.max_len_b), self.max_positions - 1)

    def _decode(self, sources: list[list[int]], limits: list[int]) -> list[list[Hypothesis]]:
        rows = [torch.tensor(ids) for ids in sources]
        src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD).to(self.device)
        o = self.options
        return search(self.model, src, src == PAD, torch.tensor(limits), beam=o.beam, lenpen=o.lenpen,
                      lenpen_style=o.lenpen_style, min_len=o.min_len, nbest=o.nbest)


def decoding_workers(device: torch.device, threads: int, batches: int) -> tuple[int, int]:
    """How to spend `threads` CPU threads on `batches` batches: (batches decoded at once, threads each).

    Decoding is a long chain of small operations (a step of beam 4 over 32 sentences of the `small` model
    multiplies 128-row matrices), and each parallel operation wakes the other threads and waits for them. Two
    batches decoded side by side on one thread each keep both cores busy instead, and decode more sentences a
    second than one batch at a time on two threads (bench/README.md). So a CPU decodes up to `threads` batches
    at once, single-threaded each, and only the threads no batch needs go to the batches' operations; a GPU
    decodes one batch at a time.
    """
    if device.type != "cpu" or batches <= 1:
        return 1, threads
    workers = min(threads, batches, MAX_WORKERS)
    return workers, max(1, threads // workers)


def map_in_threads(fn: Callable, items: Sequence, workers: int, threads_each: int) -> list:
    """[fn(item) for item in items], `workers` at a time, each worker's PyTorch operations on `threads_each`
    threads; PyTorch's thread count in the calling thread is as it was afterwards."""
    if workers <= 1:
        return [fn(item) for item in items]
    threads = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="mtx-decode", initializer=torch.set_num_threads,
                                initargs=(threads_each,)) as pool:
            return list(pool.map(fn, items))
    finally:
        torch.set_num_threads(threads)  # also resets the MKL count the workers' setting changed


def plan_batches(lengths: list[int], costs: list[int], batch_tokens: int) -> list[list[int]]:
    """Indices by length, longest first, cut into batches of at most `batch_tokens` = count × largest cost.

    Longest first, so a batch too big for the device fails at once rather than after hours. A sentence that
    costs more than the budget still gets a batch of its own.
    """
    batches: list[list[int]] = []
    largest = 0
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        if batches and (len(batches[-1]) + 1) * max(largest, costs[i]) <= batch_tokens:
            batches[-1].append(i)
            largest = max(largest, costs[i])
        else:
            batches.append([i])
            largest = costs[i]
    return batches


def translate_sentences(model, tokenizer, sentences: list[str], *, beam: int, lenpen: float, max_len_a: float,
                        max_len_b: int, min_len: int = 0, batch_tokens: int = 4096) -> list[str]:
    """The best translation of each (normalised) sentence, in order: what validation BLEU needs.

    `model` is an unwrapped mtx Transformer; it is put in eval mode for the search and back as it was after.
    """
    options = DecodeOptions(beam=beam, lenpen=lenpen, max_len_a=max_len_a, max_len_b=max_len_b, min_len=min_len)
    translator = Translator(model, tokenizer, options, batch_tokens)
    was_training = model.training
    model.eval()
    try:
        nbests = translator.translate(sentences)
    finally:
        model.train(was_training)
    if translator.stats.truncated:
        warnings.warn(f"{translator.stats.truncated} sentences were truncated to the model's "
                      f"{translator.max_positions} positions.", stacklevel=2)
    return [nbest[0][0] if nbest else "" for nbest in nbests]


# -------------------------------------------------------------------------------------------- the command


def read_lines(stream: BinaryIO, name: str, errors: Errors) -> Iterator[str]:
    """Lines split at b"\\n" only (a form feed or U+2028 inside a line keeps it one line), decoded as UTF-8."""
    for number, raw in enumerate(stream, start=1):
        try:
            yield raw.decode("utf-8", errors=errors).rstrip("\r\n")
        except UnicodeDecodeError as e:
            raise MtxError(
                f"{name}, line {number}: invalid UTF-8 at byte {e.start + 1} of the line ({raw[e.start:e.end]!r}). "
                "Convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8), or pass --errors replace to "
                "translate such bytes as U+FFFD."
            ) from None


_END = object()


def read_ahead(lines: Iterable[str], window: int) -> Iterator[list[str]]:
    """Windows of up to `window` lines, read by a background thread into a bounded queue.

    A window holds whatever has arrived, at least one line: a slow pipe gets each line translated as soon
    as it comes, a fast one gets full windows. An error while reading (invalid UTF-8) is raised after the
    lines before it have been handed out.
    """
    pending: queue.Queue = queue.Queue(maxsize=window)

    def produce() -> None:
        try:
            for line in lines:
                pending.put(line)
            pending.put(_END)
        except BaseException as e:  # handed to the consumer, which raises it in its own thread
            pending.put(e)

    threading.Thread(target=produce, name="mtx-read-ahead", daemon=True).start()
    while True:
        batch, item = [], pending.get()
        while item is not _END and not isinstance(item, BaseException):
            batch.append(item)
            if len(batch) == window:
                break
            try:
                item = pending.get_nowait()
            except queue.Empty:
                break
        if batch:
            yield batch
        if item is _END:
            return
        if isinstance(item, BaseException):
            raise item


def format_nbest(nbest: list[tuple[str, float]], with_scores: bool) -> str:
    """One output line: the best text alone, or (for --nbest > 1) score<TAB>text pairs joined by tabs."""
    if not with_scores:
        return nbest[0][0] if nbest else ""
    return "\t".join(f"{score:.4f}\t{text}" for text, score in nbest)


def prepare_model(model: torch.nn.Module, device: torch.device, dtype: Dtype) -> torch.nn.Module:
    """The model on `device` in the numeric format asked for, converted in place (as `nn.Module.to` does).

    auto: fp32 on a CPU; on a GPU bf16 where it is native, else fp16 (mtx.devices, as training decides).
    Half precision keeps LayerNorm and the positional table in float32 (`half_precision_model`). int8
    quantises the weights of every nn.Linear dynamically (activations are quantised on the fly per batch),
    which only CPUs run. That includes the output projection, a large share of the decoding time in fp32: it
    gets an int8 copy of the shared embedding matrix as `model.output_proj`, while the embedding lookups keep
    reading the fp32 matrix.
    """
    if dtype == "int8":
        if device.type != "cpu":
            raise MtxError("--dtype int8 runs on CPUs only: add --device cpu, or use --dtype bf16/fp16 on a GPU.")
        model = model.cpu()
        model.output_proj = tied_output_projection(model.tgt_embed)
        with warnings.catch_warnings():  # torch.ao's deprecation notice is not the user's concern
            warnings.simplefilter("ignore")
            return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    torch_dtype = choose_dtype(dtype, device, "--dtype")
    model = model.to(device)
    return model if torch_dtype == torch.float32 else half_precision_model(model, torch_dtype)


def tied_output_projection(embed: torch.nn.Embedding) -> torch.nn.Linear:
    """An nn.Linear (D → V, no bias) whose weight is the embedding matrix itself, not a copy: what
    `Transformer.output_logits` computes, as a module that `quantize_dynamic` can convert."""
    projection = torch.nn.Linear(embed.embedding_dim, embed.num_embeddings, bias=False, device="meta")
    projection.weight = embed.weight
    return projection


def translate_file(checkpoint: Path, input_path: Path | None, output_path: Path | None, *,
                   options: dict[str, object], batch_tokens: int, device: DeviceName, dtype: Dtype,
                   threads: int | None, errors: Errors, log: Callable[[str], None]) -> TranslationStats:
    """`mtx translate`: lines from `input_path` (or standard input) to `output_path` (or standard output).

    `options` holds the DecodeOptions fields the user set; the others come from the checkpoint's recipe
    (`decode:`), then from the paper's defaults.
    """
    from mtx.checkpoint import load_model

    check_choice("--device", device, DeviceName)
    check_choice("--dtype", dtype, Dtype)
    check_choice("--errors", errors, Errors)
    if input_path is not None and not input_path.is_file():
        raise MtxError(f"Input file {input_path} does not exist: pass a text file with one sentence per line.")
    if input_path is not None and output_path is not None and output_path.resolve() == input_path.resolve():
        raise MtxError(f"-o {output_path} is also the input file: writing it would destroy the input.")
    if threads is not None:
        cores = os.cpu_count() or 1
        if not 1 <= threads <= 4 * cores:
            raise MtxError(f"--threads {threads} must be between 1 and 4 × this machine's {cores} cores.")
        torch.set_num_threads(threads)
    target = choose_device(device, "--device")
    model, tokenizer, checkpoint = load_model(checkpoint, "cpu")
    recipe_decode = (checkpoint.get("recipe") or {}).get("decode") or {}
    known = {f.name for f in dataclasses.fields(DecodeOptions)}
    chosen = {**{k: v for k, v in recipe_decode.items() if k in known}, **options}
    translator = Translator(prepare_model(model, target, dtype), tokenizer, DecodeOptions(**chosen), batch_tokens)

    show_progress, with_scores = sys.stderr.isatty(), translator.options.nbest > 1
    with contextlib.ExitStack() as files:
        source = files.enter_context(open(input_path, "rb")) if input_path is not None else sys.stdin.buffer
        sink = files.enter_context(open(output_path, "wb")) if output_path is not None else sys.stdout.buffer
        lines = read_lines(source, str(input_path or "standard input"), errors)
        try:
            for window in read_ahead(lines, READ_AHEAD_LINES):
                nbests = translator.translate(window)
                sink.write("".join(f"{format_nbest(nbest, with_scores)}\n" for nbest in nbests).encode())
                sink.flush()
                if show_progress:
                    log(f"\r{translator.stats.summary()}")
        except BrokenPipeError:
            # The reader of standard output left (`mtx translate ... | head`): stop quietly, as Unix tools do,
            # with standard output pointed at /dev/null so that Python's final flush does not complain.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    stats = translator.stats
    if show_progress:
        log("\n")
    if stats.truncated:
        log(f"warning: {stats.truncated:,} sentences were longer than the model's {translator.max_positions} "
            f"positions and were truncated to their first {translator.max_positions - 1} tokens; split such "
            "lines to translate them whole.\n")
    log(f"translated {stats.summary()}\n")
    return stats
