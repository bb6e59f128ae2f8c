"""`mtx translate`: a stream of lines (a file or a pipe) in, one translation per line out, in order.

The translator (mtx.decode.translator) is fed windows of at most `READ_AHEAD_LINES` lines from a reader thread,
so memory stays bounded, reading overlaps decoding, and each window's output is written and flushed before the
next is decoded. Lines are split at b"\\n" only, as `wc -l` and `paste` count them, and every translation is one
line (mtx.decode.output), so the output has exactly the input's lines, in its order.
"""

from __future__ import annotations

import contextlib
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
        typer.Option(help="Length penalty α: score = log P(Y|X) / lp(|Y|), |Y| counting EOS. [default: recipe's, 0.6]"),
    ] = None,
    lenpen_style: Annotated[
        str | None,
        typer.Option(metavar="gnmt|fairseq", help="lp(|Y|) = ((5 + |Y|) / 6)^α (GNMT, the paper's) or |Y|^α. "
                     "[default: recipe's, gnmt]"),
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
        "text, score, tokens (the subwords, then </s>), token_log_probs (one per token), with --alignment "
        "alignment ([source, target] pairs), with --nbest > 1 nbest (a list of such objects).")] = "text",
) -> None:
    """Translate one sentence per line with beam search, keeping line count and order.

    Scores are log P(Y|X) / lp(|Y|) with GNMT's length penalty lp = ((5 + |Y|) / 6)^α (α = --lenpen), or
    fairseq's |Y|^α with --lenpen-style fairseq. Flags left unset take the checkpoint's recipe (decode:).
    Sources longer than the model's max_positions are truncated, with a warning that counts them.
    --alignment aligns words after the search, with one more pass of the translations through the decoder.
    Several -m decode as an ensemble (e.g. models trained with different seeds), at the cost of running each.

    Example: mtx translate -m runs/demo/average.pt -i newstest2014.en -o out.de --beam 4 --lenpen 0.6
    """
    chosen = dict(beam=beam, lenpen=lenpen, lenpen_style=lenpen_style, max_len_a=max_len_a, max_len_b=max_len_b,
                  min_len=min_len, nbest=nbest)
    options = {k: v for k, v in chosen.items() if v is not None}
    translate_file(model, input_, output, options=options, batch_tokens=batch_tokens, device=device, dtype=dtype,
                   threads=threads, errors=errors, log=sys.stderr.write, alignment=alignment,
                   alignment_layer=alignment_layer, output_format=format_)


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
                   alignment_layer: int | None = None, output_format: OutputFormat = "text") -> TranslationStats:
    """`mtx translate`: lines from `input_path` (or standard input) to `output_path` (or standard output).

    Several `checkpoints` translate as one ensemble (mtx.decode.ensemble), every model on the same device in the same
    format. `options` holds the DecodeConfig fields the user set; the others come from the (first) checkpoint's
    recipe (`decode:`), then from the paper's defaults (DecodeConfig's), so a checkpoint whose recipe predates a
    field still translates. `alignment` adds word alignments from the decoder layer `alignment_layer` (0-based;
    None: `default_alignment_layer`) of the first model, which only applies with it. `output_format` "jsonl"
    writes `json_line`s instead of text lines.
    """
    import torch

    from mtx.checkpoint import describe_checkpoint
    from mtx.config.recipe import DecodeConfig
    from mtx.decode.alignment import default_alignment_layer
    from mtx.decode.ensemble import load_models
    from mtx.decode.output import format_nbest, json_line
    from mtx.decode.translator import Dtype, Translation, Translator, prepare_model
    from mtx.devices import DeviceName, choose_device

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
    if threads is not None:
        cores = os.cpu_count() or 1
        if not 1 <= threads <= 4 * cores:
            raise MtxError(f"--threads {threads} must be between 1 and 4 × this machine's {cores} cores.")
        torch.set_num_threads(threads)
    target = choose_device(device, "--device")
    models, tokenizer, loaded = load_models(checkpoints)
    for path, checkpoint in zip(checkpoints, loaded, strict=True):
        log(f"{path}: {describe_checkpoint(checkpoint)}\n")
    checkpoint = loaded[0]
    if alignment and alignment_layer is None:
        alignment_layer = default_alignment_layer(len(models[0].decoder_layers))
    prepared = [prepare_model(model, target, dtype) for model in models]
    decode = DecodeConfig.of_checkpoint(checkpoint, **options)
    translator = Translator(prepared, tokenizer, decode, batch_tokens, alignment_layer=alignment_layer)

    show_progress, with_scores = sys.stderr.isatty(), translator.decode.nbest > 1

    def output_line(nbest: list[Translation]) -> str:
        if output_format == "jsonl":
            return json_line(nbest, tokenizer, with_scores, alignment)
        return format_nbest(nbest, with_scores, alignment)

    with contextlib.ExitStack() as files:
        source = files.enter_context(open(input_path, "rb")) if input_path is not None else sys.stdin.buffer
        sink = files.enter_context(open(output_path, "wb")) if output_path is not None else sys.stdout.buffer
        lines = read_lines(source, str(input_path or "standard input"), errors)
        try:
            for window in read_ahead(lines, READ_AHEAD_LINES):
                nbests = translator.translate(window)
                sink.write("".join(f"{output_line(nbest)}\n" for nbest in nbests).encode())
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
