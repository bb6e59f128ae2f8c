"""`mtx translate`: a stream of lines (a file or a pipe) in, one translation per line out, in order.

The translator (mtx.decode.translator) is fed windows of at most `READ_AHEAD_LINES` lines from a reader thread,
so memory stays bounded, reading overlaps decoding, and each window's output is written and flushed before the
next is decoded. Lines are split at b"\\n" only, as `wc -l` and `paste` count them, and every translation is one
line (mtx.decode.output), so the output has exactly the input's lines, in its order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import sys
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, BinaryIO, Literal

import typer

from mtx.errors import MtxError

if TYPE_CHECKING:
    from mtx.decode.translator import Dtype, TranslationStats
    from mtx.devices import DeviceName

READ_AHEAD_LINES = 2000  # a window: enough sentences for length sorting to pay off, few enough to stream

Errors = Literal["strict", "replace"]
OutputFormat = Literal["text", "jsonl"]


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
    beam: Annotated[int | None, typer.Option(help="Beam size; 1 is greedy search. [default: the recipe's, 4]")] = None,
    lenpen: Annotated[
        float | None,
        typer.Option(help="Length penalty α: score = log P(Y|X) / lp(|Y|), |Y| counting EOS. [default: recipe's, 1.0]"),
    ] = None,
    lenpen_style: Annotated[
        str | None,
        typer.Option(metavar="gnmt|fairseq", help="lp(|Y|) = |Y|^α (fairseq) or ((5 + |Y|) / 6)^α (GNMT, the "
                     "paper's). [default: recipe's, fairseq]"),
    ] = None,
    max_len_a: Annotated[
        float | None, typer.Option(help="Output ≤ a · source tokens + b (EOS not counted). [default: recipe's, 1.0]")
    ] = None,
    max_len_b: Annotated[int | None, typer.Option(help="See --max-len-a. [default: recipe's, 50]")] = None,
    min_len: Annotated[int | None, typer.Option(help="Output at least N tokens. [default: recipe's, 0]")] = None,
    nbest: Annotated[
        int | None, typer.Option(help="Print the N best, each line 'score<TAB>text' pairs joined by tabs (N > 1). "
                                 "[default: recipe's, 1]")
    ] = None,
    no_repeat_ngram: Annotated[int | None, typer.Option(
        metavar="N", help="Never produce an n-gram of N tokens twice in a translation (a remedy for loops). "
        "[default: recipe's, 0: allowed]")] = None,
    sampling: Annotated[bool | None, typer.Option(
        "--sampling", help="Draw each token from the model's distribution instead of searching (back-translation); "
        "--nbest N draws N samples. A line's samples depend on --seed, its index in the input and the model only, "
        "not on --batch-tokens, --threads or the device. [default: the recipe's, off]", show_default=False)] = None,
    topk: Annotated[int | None, typer.Option(
        metavar="K", help="With --sampling: draw from the K most probable tokens only. [default: all]")] = None,
    topp: Annotated[float | None, typer.Option(
        metavar="P", help="With --sampling: draw from the fewest most probable tokens whose probabilities sum to at "
        "least P (nucleus sampling). [default: 1, all]")] = None,
    temperature: Annotated[float | None, typer.Option(
        metavar="T", help="With --sampling: divide the log-probabilities by T: below 1 sharper, above 1 flatter. "
        "[default: 1]")] = None,
    seed: Annotated[int | None, typer.Option(help="With --sampling: the seed of the draws. [default: 1]")] = None,
    line_offset: Annotated[int, typer.Option(
        metavar="N", help="The index of the input's first line in a larger file it was cut from, so that a shard's "
        "samples are those the whole file would get (split -l L; shard k takes --line-offset k·L).")] = 0,
    prefix: Annotated[Path | None, typer.Option(
        metavar="FILE", help="A target prefix per input line (an empty line: none): each translation starts with "
        "exactly that text, and the search goes on from it.")] = None,
    score_reference: Annotated[Path | None, typer.Option(
        metavar="FILE", help="Score the given translation of each line (one per line) instead of searching: "
        "'score<TAB>text', the score log P(Y|X) / lp(|Y|) that beam search would give it (--lenpen, "
        "--lenpen-style); --format jsonl adds log_prob and each token's log-probability.")] = None,
    batch_tokens: Annotated[
        int, typer.Option(help="Batch size: sentences × max(source length, output limit), EOS included.")
    ] = 4096,
    device: Annotated[str, typer.Option(metavar="auto|cpu|cuda", help="auto: cuda if there is one.")] = "auto",
    dtype: Annotated[
        str,
        typer.Option(metavar="auto|fp32|bf16|fp16|int8", help="auto: fp32 on CPU, bf16 (else fp16) on GPU; "
                     "int8: dynamically quantized linear layers, CPU only."),
    ] = "auto",
    threads: Annotated[int | None, typer.Option(
        help="CPU threads [default: PyTorch's, one per core]. On a CPU, up to this many batches are decoded "
             "side by side on one thread each.")] = None,
    errors: Annotated[
        str, typer.Option(metavar="strict|replace", help="Invalid UTF-8 input: stop with the line number, or U+FFFD.")
    ] = "strict",
    alignment: Annotated[bool, typer.Option(
        "--alignment", help="Follow each translation with ' ||| ' and its word alignment in Pharaoh format: "
        "'source-target' word indices, 0-based, one link per target word (Moses' and Marian's convention). An "
        "empty input line gives ' ||| ' (with --nbest > 1: an empty line).")] = False,
    alignment_layer: Annotated[int | None, typer.Option(
        metavar="N", help="With --alignment: the decoder layer (0-based) whose cross-attention, heads averaged, "
        "aligns. [default: the last layer of a decoder of one or two layers, else the penultimate]")] = None,
    format_: Annotated[str, typer.Option(
        "--format", metavar="text|jsonl", help="jsonl: one JSON object per input line instead of a text line: "
        "text, score, tokens (the subwords, then </s>), token_log_probs (one per token), flags (why the "
        "translation deserves a human look: loop, length_ratio, copied, low_log_prob), with --alignment "
        "alignment ([source, target] pairs), with --nbest > 1 nbest (a list of such objects).")] = "text",
) -> None:
    """Translate one sentence per line with beam search, keeping line count and order.

    Scores are log P(Y|X) / lp(|Y|) with GNMT's length penalty lp = ((5 + |Y|) / 6)^α (α = --lenpen), or
    fairseq's |Y|^α with --lenpen-style fairseq. Flags left unset take the checkpoint's recipe (decode:).
    Sources longer than the model's max_positions are truncated, with a warning that counts them.
    --alignment aligns words by the cross-attention the search carries along each hypothesis.
    --sampling draws instead of searching; --prefix starts translations as given; --score-reference scores them.
    Several -m decode as an ensemble (e.g. models trained with different seeds), at the cost of running each.

    Example: mtx translate -m runs/demo/average.pt -i newstest2014.en -o out.de --beam 4 --lenpen 0.6
    """
    chosen = dict(beam=beam, lenpen=lenpen, lenpen_style=lenpen_style, max_len_a=max_len_a, max_len_b=max_len_b,
                  min_len=min_len, nbest=nbest, no_repeat_ngram=no_repeat_ngram, sampling=sampling, topk=topk,
                  topp=topp, temperature=temperature, seed=seed)
    options = {k: v for k, v in chosen.items() if v is not None}
    translate_file(model, input_, output, options=options, batch_tokens=batch_tokens, device=device, dtype=dtype,
                   threads=threads, errors=errors, log=sys.stderr.write, alignment=alignment,
                   alignment_layer=alignment_layer, output_format=format_, line_offset=line_offset,
                   prefix_path=prefix, reference_path=score_reference)


def set_threads(threads: int | None) -> None:
    """`--threads` checked and given to PyTorch (None: PyTorch's own count, one per core)."""
    import torch

    if threads is None:
        return
    cores = os.cpu_count() or 1
    if not 1 <= threads <= 4 * cores:
        raise MtxError(f"--threads {threads} must be between 1 and 4 × this machine's {cores} cores.")
    torch.set_num_threads(threads)


def check_choice(flag: str, value: str, allowed: object) -> None:
    """A flag whose value must be one of a Literal type's values (the command line passes plain strings)."""
    choices = typing.get_args(allowed)
    if value not in choices:
        raise MtxError(f"{flag} {value!r} is not one of {', '.join(choices)}.")


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


def translate_file(checkpoints: Sequence[Path], input_path: Path | None, output_path: Path | None, *,
                   options: dict[str, object], batch_tokens: int, device: DeviceName, dtype: Dtype,
                   threads: int | None, errors: Errors, log: Callable[[str], None], alignment: bool = False,
                   alignment_layer: int | None = None, output_format: OutputFormat = "text", line_offset: int = 0,
                   prefix_path: Path | None = None, reference_path: Path | None = None) -> TranslationStats:
    """`mtx translate`: lines from `input_path` (or standard input) to `output_path` (or standard output).

    Several `checkpoints` translate as one ensemble (mtx.decode.ensemble), every model on the same device in the same
    format. `options` holds the DecodeConfig fields the user set; the others come from the (first) checkpoint's
    recipe (`decode:`), then from the paper's defaults (DecodeConfig's), so a checkpoint whose recipe predates a
    field still translates. `alignment` adds word alignments from the decoder layer `alignment_layer` (0-based;
    None: `default_alignment_layer`) of the first model, which only applies with it. `output_format` "jsonl"
    writes `json_line`s instead of text lines. `line_offset` is the index of the input's first line in a larger
    file (sampling's draws depend on it). `prefix_path` gives a target prefix per line; `reference_path` a
    translation per line to score instead of searching (`Translator.score`).
    """
    from mtx.checkpoint import describe_checkpoint
    from mtx.config.recipe import DecodeConfig
    from mtx.decode.alignment import default_alignment_layer
    from mtx.decode.flags import FlagThresholds
    from mtx.decode.output import format_nbest, json_line
    from mtx.decode.translator import Dtype, Translation, Translator, load_prepared
    from mtx.devices import DeviceName

    check_choice("--device", device, DeviceName)
    check_choice("--dtype", dtype, Dtype)
    check_choice("--errors", errors, Errors)
    check_choice("--format", output_format, OutputFormat)
    if alignment_layer is not None and not alignment:
        raise MtxError("--alignment-layer only applies with --alignment.")
    if input_path is not None and not input_path.is_file():
        raise MtxError(f"Input file {input_path} does not exist: pass a text file with one sentence per line.")
    if input_path is not None and output_path is not None and output_path.resolve() == input_path.resolve():
        raise MtxError(f"-o {output_path} is also the input file: writing it would destroy the input.")
    set_threads(threads)
    companion = _companion_file(input_path, prefix_path, reference_path, options, alignment, line_offset)
    prepared, tokenizer, loaded = load_prepared(checkpoints, device, dtype)
    for path, checkpoint in zip(checkpoints, loaded, strict=True):
        log(f"{path}: {describe_checkpoint(checkpoint)}\n")
    checkpoint = loaded[0]
    if alignment and alignment_layer is None:
        alignment_layer = default_alignment_layer(len(prepared[0].decoder_layers))
    decode = DecodeConfig.of_checkpoint(checkpoint, **options)
    thresholds = FlagThresholds.of_checkpoint(checkpoint) if output_format == "jsonl" else None
    translator = Translator(prepared, tokenizer, decode, batch_tokens, alignment_layer=alignment_layer,
                            flag_thresholds=thresholds)

    show_progress, with_scores = sys.stderr.isatty(), translator.decode.nbest > 1

    def output_line(nbest: list[Translation]) -> str:
        if output_format == "jsonl":
            return json_line(nbest, tokenizer, with_scores, alignment, with_flags=True)
        return format_nbest(nbest, with_scores, alignment)

    def scored_line(scored: Translation | None) -> str:
        if output_format == "text":
            return "" if scored is None else f"{scored.score:.4f}\t{scored.text}"
        line = json.loads(json_line([] if scored is None else [scored], tokenizer, False, False))
        return json.dumps({**line, "log_prob": None if scored is None else sum(scored.token_log_probs)},
                          ensure_ascii=False)

    def output_lines(window: list[str], given: list[str], first_line: int) -> list[str]:
        if reference_path is not None:
            return [scored_line(scored) for scored in translator.score(window, given, first_line - line_offset)]
        nbests = translator.translate(window, first_line, prefixes=given or None)
        return [output_line(nbest) for nbest in nbests]

    with contextlib.ExitStack() as files:
        source = files.enter_context(open(input_path, "rb")) if input_path is not None else sys.stdin.buffer
        sink = files.enter_context(open(output_path, "wb")) if output_path is not None else sys.stdout.buffer
        lines = read_lines(source, str(input_path or "standard input"), errors)
        given_lines = iter(()) if companion is None else read_lines(
            files.enter_context(open(companion[1], "rb")), str(companion[1]), errors)
        done = 0
        try:
            for window in read_ahead(lines, READ_AHEAD_LINES):
                given = list(itertools.islice(given_lines, len(window)))  # none without a companion file
                if companion is not None and len(given) < len(window):
                    raise MtxError(f"{companion[0]} {companion[1]} has {done + len(given):,} lines, but the input has "
                                   f"more: its line {done + len(given) + 1:,} has no line of {companion[1]} to go with "
                                   "it. Give one line per input line (an empty line: none).")
                sink.write("".join(f"{line}\n" for line in output_lines(window, given, line_offset + done)).encode())
                sink.flush()
                done += len(window)
                if show_progress:
                    log(f"\r{translator.stats.summary()}")
        except BrokenPipeError:
            # The reader of standard output left (`mtx translate ... | head`): stop quietly, as Unix tools do,
            # with standard output pointed at /dev/null so that Python's final flush does not complain.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        if companion is not None and next(given_lines, None) is not None:
            raise MtxError(f"{companion[0]} {companion[1]} has more lines than the input's {done:,}: give one line per "
                           "input line.")
    stats = translator.stats
    if show_progress:
        log("\n")
    if stats.truncated:
        log(f"warning: {stats.truncated:,} sentences were longer than the model's {translator.max_positions} "
            f"positions and were truncated to their first {translator.max_positions - 1} tokens; split such "
            "lines to translate them whole.\n")
    log(f"translated {stats.summary()}\n")
    return stats


def _companion_file(input_path: Path | None, prefix_path: Path | None, reference_path: Path | None,
                    options: dict[str, object], alignment: bool, line_offset: int) -> tuple[str, Path] | None:
    """(its flag, the file) of --prefix or --score-reference, once the options are known to agree; line counts
    are compared before any decoding where the input is a file (standard input is checked as it is read)."""
    from mtx.data.corpora import count_lines

    if line_offset < 0:
        raise MtxError(f"--line-offset {line_offset} must be ≥ 0: the index of the input's first line in the file "
                       "it was cut from.")
    if options.get("sampling") and options.get("beam", 1) != 1:
        raise MtxError(f"--sampling draws each token, --beam {options['beam']} searches: give one or the other "
                       "(with --sampling, --nbest N draws N samples).")
    if prefix_path is not None and reference_path is not None:
        raise MtxError("--prefix and --score-reference do not go together: a given translation is scored whole.")
    if reference_path is not None:
        contradicting = [flag for flag, on in (("--sampling", options.get("sampling")), ("--alignment", alignment),
                                               ("--nbest", options.get("nbest", 1) != 1)) if on]
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
    return flag, path
