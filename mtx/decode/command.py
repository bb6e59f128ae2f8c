"""`mtx translate`: a stream of lines (a file or a pipe) in, one translation per line out, in order.

The command reads, translates and writes, each step its own piece. Reading (`read_windows`): the input's lines,
in windows of at most `READ_AHEAD_LINES` from a reader thread (`read_ahead`), so memory stays bounded and
reading overlaps decoding, each window with its lines of the --prefix or --score-reference file. A file's
windows are full ones, so that it is batched alike at every run; a pipe's hold what has arrived. Translating:
the translator (mtx.decode.translator) searches each window, or scores its given translations. Writing
(`write_lines`): a writer chosen once from the format and the flags (mtx.decode.output) turns each line's
result into its output line, and each window's lines are written and flushed before the next is decoded.
Lines are split at b"\\n" only, as `wc -l` and `paste` count them, and every translation is one line, so the
output has exactly the input's lines, in its order.

The decoding flags (--beam, --lenpen, --engine, --alignment, --format, ...) are not written here:
`with_flags_of(Request)` makes one per field of a request (mtx.decode.request: the recipe's `decode:` section and
what a call wants back), with the field's help, range and default, as fairseq's `gen_parser_from_dataclass` does.
A new decoding option is a new field; its flag follows.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import itertools
import os
import queue
import stat
import sys
import threading
import types
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, BinaryIO, Literal, NamedTuple

import typer

from mtx.config.decode import flag_name
from mtx.config.fields import bounds_of
from mtx.decode.request import CALL_ONLY, Request
from mtx.decode.shards import Shard, ShardOutput, file_identity
from mtx.errors import MtxError

if TYPE_CHECKING:
    from mtx.decode.engine import Dtype, Engine
    from mtx.decode.facts import ModelFacts
    from mtx.decode.output import ScoreWriter, SearchWriter
    from mtx.decode.translation import TranslationStats
    from mtx.devices import DeviceName
    from mtx.documents.document import Document, DocumentWriter

READ_AHEAD_LINES = 2000  # a window: enough sentences for length sorting to pay off, few enough to stream

Errors = Literal["strict", "replace"]


# ---------------------------------------------------------------------------------- flags made from fields


def flags_of(config: type) -> list[inspect.Parameter]:
    """One command-line flag per field of the dataclass `config`, as a keyword parameter of a Typer command:
    named after the field (`max_len_a`: `--max-len-a`), of its type (a Literal's values as the metavar,
    `gnmt|fairseq`; a bool a bare flag), with its help, its range and its default, and defaulting to None:
    unset, so that the checkpoint's recipe decides. The range is said, not enforced by Typer: the values are
    checked with the request's rules (`Request.problem_with`), so that a refusal reads the same everywhere."""
    hints = typing.get_type_hints(config)
    return [_flag(f, hints[f.name]) for f in dataclasses.fields(config)]


def _flag(f: dataclasses.Field, kind: Any) -> inspect.Parameter:
    metavar = None
    if typing.get_origin(kind) is Literal:
        metavar, kind = "|".join(typing.get_args(kind)), str
    elif typing.get_origin(kind) in (typing.Union, types.UnionType):  # `int | None`: the None is the flag's own
        (kind,) = [arg for arg in typing.get_args(kind) if arg is not type(None)]
    rule = f" Must be {bounds.phrase(with_note=False)}." if (bounds := bounds_of(f)) is not None else ""
    default = _shown(f.default) if f.name in CALL_ONLY else f"the recipe's, {_shown(f.default)}"
    option = typer.Option(flag_name(f.name), metavar=metavar, show_default=False,
                          help=f"{f.metadata['help']}{rule} [default: {default}]")
    return inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[kind | None, option])


def _shown(default: Any) -> str:
    """A default as a flag's help says it: a switch on or off, an option unset, a value as Python writes it."""
    if isinstance(default, bool):
        return "on" if default else "off"
    return "unset" if default is None else str(default)


def with_flags_of(config: type) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """A decorator of a Typer command: its keyword parameter `options` becomes `flags_of(config)`, in its place
    (so `--help` lists them there), and the command is called with the flags the user set as `options`, a dict
    by field name that leaves out the unset ones. Typer reads the command's `__signature__` and annotations."""
    flags = flags_of(config)

    def decorate(command: Callable[..., None]) -> Callable[..., None]:
        signature = inspect.signature(command, eval_str=True)
        parameters = [p for own in signature.parameters.values() for p in (flags if own.name == "options" else [own])]

        @functools.wraps(command)
        def with_flags(**arguments: Any) -> None:
            options = {p.name: value for p in flags if (value := arguments.pop(p.name)) is not None}
            command(**arguments, options=options)

        with_flags.__signature__ = signature.replace(parameters=parameters)
        with_flags.__annotations__ = {**{p.name: p.annotation for p in parameters}, "return": None}
        return with_flags

    return decorate


# ------------------------------------------------------------------------------------------------ the command


@with_flags_of(Request)
def translate(
    model: Annotated[list[Path], typer.Option(
        "-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average). Given several times: an "
        "ensemble, which averages the models' next-token probabilities at every step; the models must share a "
        "tokenizer, and the first one's recipe sets the defaults and aligns.")],
    input_: Annotated[
        Path | None, typer.Option("-i", "--input", metavar="IN", help="Sentences, one per line [default: stdin].")
    ] = None,
    output: Annotated[
        Path | None, typer.Option("-o", "--output", metavar="OUT", help="Translations [default: stdout].")
    ] = None,
    *,
    options: dict[str, object],
    shard: Annotated[str | None, typer.Option(
        metavar="K/N", help="Translate only shard K of N (1 ≤ K ≤ N) of the -i file, one of N contiguous runs of its "
        "lines, to -o: the N outputs concatenated in order are the whole file's. Written to OUT.partial and renamed "
        "OUT when complete, beside OUT.json, what made it; run again after an interruption, it goes on from the first "
        "missing line, and a shard whose OUT the same command made is done. One process at a time (OUT.lock).")] = None,
    prefix: Annotated[Path | None, typer.Option(
        metavar="FILE", help="A target prefix per input line (an empty line: none): each translation starts with "
        "exactly that text, and the search goes on from it.")] = None,
    score_reference: Annotated[Path | None, typer.Option(
        metavar="FILE", help="Score the given translation of each line (one per line) instead of searching: "
        "'score<TAB>text', the score log P(Y|X) / lp(|Y|) that beam search would give it (--lenpen, "
        "--lenpen-style); --format jsonl adds log_prob and each token's log-probability. A line whose source or "
        "translation is longer than the model's positions is not scored: 'nan<TAB>text' (jsonl: null scores and "
        "the flag too_long_to_score), and counted.")] = None,
    batch_tokens: Annotated[
        int, typer.Option(help="Batch size: sentences × max(source length, output limit), EOS included.")
    ] = 4096,
    device: Annotated[str, typer.Option(metavar="auto|cpu|cuda", help="auto: cuda if there is one.")] = "auto",
    dtype: Annotated[
        str,
        typer.Option(metavar="auto|fp32|bf16|fp16|int8", help="auto: fp32 on CPU, bf16 (else fp16) on GPU; "
                     "int8: linear layers in 8-bit integers, each input row quantised on its own (a "
                     "sentence's translation does not depend on its batch), CPU only."),
    ] = "auto",
    threads: Annotated[int | None, typer.Option(
        help="CPU threads [default: PyTorch's, one per core]. On a CPU, up to this many batches are decoded "
             "side by side, in processes of one thread each.")] = None,
    errors: Annotated[
        str, typer.Option(metavar="strict|replace", help="Invalid UTF-8 input: stop with the line number, or U+FFFD.")
    ] = "strict",
) -> None:
    """Translate one sentence per line with beam search, keeping line count and order.

    Scores are log P(Y|X) / lp(|Y|) with fairseq's length penalty lp = |Y|^α (α = --lenpen), or GNMT's
    ((5 + |Y|) / 6)^α with --lenpen-style gnmt. --nbest N > 1 prints a line's N best on its line, each as
    'score<TAB>text', joined by tabs. Flags left unset take the checkpoint's recipe (decode:).
    Sources longer than the model's max_positions are truncated, with a warning that counts them (jsonl: flagged).
    --alignment aligns words by the cross-attention the search carries along each hypothesis.
    --sampling draws instead of searching; --prefix starts translations as given; --score-reference scores them.
    Several -m decode as an ensemble (e.g. models trained with different seeds), at the cost of running each.

    Example: mtx translate -m runs/demo/average.pt -i newstest2014.en -o out.de --beam 4 --lenpen 0.6
    """
    translate_file(model, input_, output, options=options, batch_tokens=batch_tokens, device=device, dtype=dtype,
                   threads=threads, errors=errors, log=sys.stderr.write, prefix_path=prefix,
                   reference_path=score_reference, shard=None if shard is None else Shard.parse(shard))


def translate_file(checkpoints: Sequence[Path], input_path: Path | None, output_path: Path | None, *,
                   options: dict[str, object], batch_tokens: int, device: DeviceName, dtype: Dtype,
                   threads: int | None, errors: Errors, log: Callable[[str], None], prefix_path: Path | None = None,
                   reference_path: Path | None = None, shard: Shard | None = None) -> TranslationStats:
    """`mtx translate`: lines from `input_path` (or standard input) to `output_path` (or standard output).

    `options` holds the Request fields the user set (mtx.decode.request); the others come from the (first)
    checkpoint's recipe (`decode:`), then from the paper's defaults, so a checkpoint whose recipe predates a field
    still translates. Every option is checked against what the checkpoints say of themselves (`ModelFacts`) and
    against the engine's capabilities before any weights load and before anything is written. Several
    `checkpoints` translate as one ensemble (mtx.decode.ensemble). `prefix_path` gives a target prefix per line;
    `reference_path` a translation per line to score instead of searching (`Engine.score`). `shard` translates one
    shard of the input file, resumably (mtx.decode.shards).
    """
    from mtx.decode.workers import start_forkserver

    if device != "cuda" and options.get("engine") != "ct2" and (threads or os.cpu_count() or 1) > 1:
        start_forkserver()  # the torch engine's workers come from it: it imports torch while this process does
    from mtx.checkpoint import describe_checkpoint
    from mtx.decode.engine import Dtype
    from mtx.decode.engines import open_engine, refusal
    from mtx.decode.facts import ModelFacts
    from mtx.decode.translation import TranslationStats
    from mtx.devices import DeviceName

    for flag, value, allowed in (("--device", device, DeviceName), ("--dtype", dtype, Dtype),
                                 ("--errors", errors, Errors)):
        check_choice(flag, value, allowed)
    check_files(input_path, output_path)
    set_threads(threads)
    facts = ModelFacts.read(checkpoints)
    request = Request.of(facts, options)
    request.check(facts, given=options)
    companion = companion_file(input_path, prefix_path, reference_path, request)
    check_documents(request, companion)
    if (refused := refusal(request, facts, options, prefixes=prefix_path is not None)) is not None:
        raise MtxError(refused[1])
    with contextlib.ExitStack() as files:
        shard_output = None  # a shard's output, locked from before it is looked at until it is complete
        if shard is not None:
            shard_output = files.enter_context(claim_shard(shard, facts, input_path, output_path, log,
                                                           request=request, companion=companion, dtype=dtype,
                                                           errors=errors))
            if shard_output is None:  # complete already, made by this same translation
                return TranslationStats()
        engine = open_engine(request.engine, checkpoints, device=device, dtype=dtype, threads=torch_threads(),
                             batch_tokens=batch_tokens, log=log)
        files.callback(engine.close)
        for path, checkpoint in zip(checkpoints, facts.metadata, strict=True):
            log(f"{path}: {describe_checkpoint(checkpoint)}\n")
        show_progress = sys.stderr.isatty()
        source = files.enter_context(open(input_path, "rb")) if input_path is not None else sys.stdin.buffer
        lines = read_lines(source, str(input_path or "standard input"), errors)
        given = iter(()) if companion is None else read_lines(
            files.enter_context(open(companion.path, "rb")), str(companion.path), errors)
        skipped = 0  # the input's lines before the first one translated here (a shard's)
        if shard is None:
            sink = files.enter_context(open(output_path, "wb")) if output_path is not None else sys.stdout.buffer
        else:  # the shard's lines not yet written, and the file they are appended to
            sink, todo = resume_shard(shard, shard_output, input_path, log)
            files.enter_context(sink)
            lines, given = (itertools.islice(stream, todo.start, todo.stop) for stream in (lines, given))
            skipped = todo.start
        windows = read_windows(lines, companion, given, full=is_a_file(source))
        results, writer = translation_of(engine, facts, request, windows, skipped, scoring=reference_path is not None)
        write_lines(results, writer, sink, (lambda: log(f"\r{engine.stats.summary()}")) if show_progress else None)
        if shard_output is not None:
            shard_output.finish()
    report(engine.stats, facts.limits.max_positions, engine.provenance(), log, show_progress)
    return engine.stats


def translation_of(engine: Engine, facts: ModelFacts, request: Request, windows: Iterator[Window], skipped: int,
                   scoring: bool) -> tuple[Iterator[Sequence[Any]], SearchWriter | ScoreWriter | DocumentWriter]:
    """Each window's results and the writer of their lines, chosen once: the given translations scored
    (--score-reference), the lines read as documents (paragraphs or markup, mtx.documents), or a search. `skipped`:
    the input's lines before the first one translated here (a shard's)."""
    from mtx.decode.output import score_writer, search_writer
    from mtx.documents.document import DocumentWriter, is_document, translate_documents

    first = request.line_offset + skipped

    def numbers(window: Window) -> range:
        return range(first + window.first, first + window.first + len(window.lines))

    if scoring:
        return ((engine.score(w.lines, w.given, request) for w in windows),
                score_writer(request.format, facts.tokenizer))
    if is_document(request):
        return ((translate_documents(engine, facts, read_window(w, request, facts, skipped), request, numbers(w))
                 for w in windows), DocumentWriter(facts.tokenizer, request.format == "jsonl"))
    return ((engine.translate(facts.encode(w.lines, request.target_lang), request, numbers(w), w.given or None)
             for w in windows), search_writer(request.format, facts.tokenizer, request.nbest > 1, request.alignment))


def check_documents(request: Request, companion: Companion | None) -> None:
    """Lines read as documents (--split-sentences, --markup) are translated whole: no prefix or given translation
    goes with them, and splitting needs its segmenter, checked before any weights load."""
    from mtx.documents.document import is_document
    from mtx.documents.sentences import segmenter_missing

    if not is_document(request):
        return
    mode = "--split-sentences" if request.split_sentences else f"--markup {request.markup}"
    if companion is not None:
        raise MtxError(f"{companion.flag} does not go with {mode}: its lines are of whole input lines, which are "
                       "translated sentence by sentence.")
    if request.split_sentences and (missing := segmenter_missing()) is not None:
        raise MtxError(f"--split-sentences: {missing}.")


def read_window(window: Window, request: Request, facts: ModelFacts, first: int) -> list[Document]:
    """A window's lines taken apart as documents; markup that cannot be read is refused with its line's number."""
    from mtx.documents.document import UnreadableLine, read_documents

    try:
        return read_documents(window.lines, request, facts)
    except UnreadableLine as e:
        raise MtxError(f"line {first + window.first + e.index + 1:,}: {e}") from None


def check_choice(flag: str, value: str, allowed: object) -> None:
    """A flag whose value must be one of a Literal type's values (the command line passes plain strings)."""
    choices = typing.get_args(allowed)
    if value not in choices:
        raise MtxError(f"{flag} {value!r} is not one of {', '.join(choices)}.")


def check_files(input_path: Path | None, output_path: Path | None) -> None:
    """The input is a file (or standard input) that the output would not overwrite."""
    if input_path is not None and not input_path.is_file():
        raise MtxError(f"Input file {input_path} does not exist: pass a text file with one sentence per line.")
    if input_path is not None and output_path is not None and output_path.resolve() == input_path.resolve():
        raise MtxError(f"-o {output_path} is also the input file: writing it would destroy the input.")


@contextlib.contextmanager
def claim_shard(shard: Shard, facts: ModelFacts, input_path: Path | None, output_path: Path | None,
                log: Callable[[str], None], *, request: Request, companion: Companion | None, dtype: str,
                errors: str) -> Iterator[ShardOutput | None]:
    """The shard's output (mtx.decode.shards), its lock held while the context lasts, described by what makes
    its lines: the input, the shard, the models and every option that changes an output line (the request, whose
    engine is one); None, said in the log, where that output is complete already. The request is resolved from
    the checkpoints' metadata, so a finished shard is recognised, or refused, before any weights load. A shard
    needs an input file to count the lines of and an output file to resume."""
    if input_path is None or output_path is None:
        raise MtxError(f"--shard {shard} needs -i and -o files: the input's lines are counted to cut it into "
                       "shards, and the output is written so that an interrupted shard can go on.")
    resolved = dataclasses.replace(request, alignment_layer=request.aligning_layer(facts.limits.decoder_layers))
    description = {"shard": str(shard), "input": file_identity(input_path),
                   "models": [file_identity(path) for path in facts.checkpoints],
                   "companion": None if companion is None else [companion.flag, file_identity(companion.path)],
                   "request": dataclasses.asdict(resolved), "dtype": dtype, "errors": errors}
    with ShardOutput(output_path, description) as output:
        if (old := output.lock.replaced_stale) is not None:
            log(f"shard {shard}: took over the lock of a stopped process (host {old.get('host')}, pid "
                f"{old.get('pid')}: {old.get('stale_reason')}).\n")
        if output.is_done():
            log(f"shard {shard}: {output_path} is complete, made by this same translation; delete it and "
                f"{output.record.name} to translate the shard again.\n")
            yield None
        else:
            yield output


def resume_shard(shard: Shard, output: ShardOutput, input_path: Path, log: Callable[[str], None]
                 ) -> tuple[BinaryIO, range]:
    """OUT.partial open to append to, and the indices of the shard's input lines it does not hold yet."""
    from mtx.data.corpora import count_lines

    written, sink = output.resume()
    span = shard.lines(count_lines(input_path))
    resumed = f", from line {span.start + written + 1:,} ({written:,} already in {output.partial})" if written else ""
    log(f"shard {shard}: lines {span.start + 1:,}–{span.stop:,} of {input_path}{resumed}\n")
    return sink, range(span.start + written, span.stop)


def torch_threads() -> int:
    """The CPU threads an engine may use: --threads as `set_threads` gave it to PyTorch, or PyTorch's own count."""
    import torch

    return torch.get_num_threads()


def set_threads(threads: int | None) -> None:
    """`--threads` checked and given to PyTorch (None: PyTorch's own count, one per core)."""
    import torch

    if threads is None:
        return
    cores = os.cpu_count() or 1
    if not 1 <= threads <= 4 * cores:
        raise MtxError(f"--threads {threads} must be between 1 and 4 × this machine's {cores} cores.")
    torch.set_num_threads(threads)


# ---------------------------------------------------------------------------------------------------- reading


@dataclass(frozen=True)
class Companion:
    """The file that gives each input line a line of its own: --prefix's prefixes or --score-reference's
    translations."""

    flag: str
    path: Path


def companion_file(input_path: Path | None, prefix_path: Path | None, reference_path: Path | None,
                   request: Request) -> Companion | None:
    """The --prefix or --score-reference file, once the flags are known to agree; line counts are compared
    before any decoding where the input is a file (standard input is checked as it is read)."""
    from mtx.data.corpora import count_lines

    if prefix_path is not None and reference_path is not None:
        raise MtxError("--prefix and --score-reference do not go together: a given translation is scored whole.")
    if reference_path is not None:
        contradicting = [flag for flag, on in (("--sampling", request.sampling), ("--alignment", request.alignment),
                                               ("--nbest", request.nbest != 1)) if on]
        if contradicting:
            raise MtxError(f"--score-reference scores the given translations and searches for none: "
                           f"{', '.join(contradicting)} do not apply to it.")
    flag, path = ("--prefix", prefix_path) if prefix_path is not None else ("--score-reference", reference_path)
    if path is None:
        return None
    if not path.is_file():
        raise MtxError(f"{flag} {path} does not exist: pass a text file with one line per input line.")
    if input_path is not None and (theirs := count_lines(path)) != (ours := count_lines(input_path)):
        raise MtxError(f"{flag} {path} has {theirs:,} lines but the input {input_path} has {ours:,}: give one line "
                       "per input line (an empty line: none).")
    return Companion(flag, path)


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


def is_a_file(stream: BinaryIO) -> bool:
    """Whether `stream` reads a regular file (`-i`, or `< file`), rather than a pipe, a terminal or memory."""
    try:
        return stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
    except (OSError, ValueError):  # no descriptor (io.UnsupportedOperation is both), or a closed one
        return False


_END = object()


def read_ahead(lines: Iterable[str], window: int, full: bool = False) -> Iterator[list[str]]:
    """Windows of up to `window` lines, read by a background thread into a bounded queue.

    A window holds whatever has arrived, at least one line: a slow pipe gets each line translated as soon
    as it comes, a fast one gets full windows. With `full` (a file, which never makes anyone wait), every
    window but the last holds `window` lines, however fast the reading went: a file is batched the same way
    at every run, so that its translation is the same under any load. An error while reading (invalid UTF-8)
    is raised after the lines before it have been handed out.
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
            if full:
                item = pending.get()
            else:
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


class Window(NamedTuple):
    """A window of input lines, as the translator takes them."""

    first: int  # the index of its first line in the input (not counting --line-offset)
    lines: list[str]
    given: list[str]  # the companion file's line for each line; none without one


def read_windows(lines: Iterable[str], companion: Companion | None, given: Iterator[str], full: bool = False
                 ) -> Iterator[Window]:
    """`lines` in windows of at most `READ_AHEAD_LINES` (`read_ahead`; `full` ones from a file), each with as
    many lines of the companion file, read from `given` (empty without one); a companion with fewer lines than
    the input, or more, is refused when the reading finds it out."""
    done = 0
    for window in read_ahead(lines, READ_AHEAD_LINES, full):
        theirs = list(itertools.islice(given, len(window)))
        if companion is not None and len(theirs) < len(window):
            raise MtxError(f"{companion.flag} {companion.path} has {done + len(theirs):,} lines, but the input has "
                           f"more: its line {done + len(theirs) + 1:,} has no line of {companion.path} to go with it. "
                           "Give one line per input line (an empty line: none).")
        yield Window(done, window, theirs)
        done += len(window)
    if companion is not None and next(given, None) is not None:
        raise MtxError(f"{companion.flag} {companion.path} has more lines than the input's {done:,}: give one line "
                       "per input line.")


# ---------------------------------------------------------------------------------------------------- writing


def write_lines(results: Iterable[Sequence[Any]], writer: SearchWriter | ScoreWriter | DocumentWriter, sink: BinaryIO,
                progress: Callable[[], None] | None) -> None:
    """Each window's `results` as output lines (`writer.line`), written and flushed as one, then `progress`.
    A reader of standard output that leaves (`mtx translate ... | head`) stops the translation quietly."""
    try:
        for window in results:
            sink.write("".join(f"{writer.line(result)}\n" for result in window).encode())
            sink.flush()
            if progress is not None:
                progress()
    except BrokenPipeError:
        # As Unix tools do, with standard output pointed at /dev/null so that Python's final flush does not
        # complain.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def report(stats: TranslationStats, max_positions: int, provenance: dict[str, str], log: Callable[[str], None],
           after_progress: bool) -> None:
    """What the run did, on standard error: the count of truncated sources, if any, and the summary line with what
    computed it (`after_progress`: on a line of its own, below the progress line)."""
    if after_progress:
        log("\n")
    if stats.truncated:
        log(f"warning: {stats.truncated:,} sentences were longer than the model's {max_positions} "
            f"positions and were truncated to their first {max_positions - 1} tokens; split such "
            "lines to translate them whole.\n")
    if stats.too_long_to_score:
        log(f"warning: {stats.too_long_to_score:,} lines had a source or translation longer than the model's "
            f"{max_positions} positions and were not scored (score nan; jsonl: null, flag "
            "too_long_to_score).\n")
    made_by = ", ".join(f"{key} {value}" for key, value in provenance.items())
    log(f"translated {stats.summary()} ({made_by})\n")
