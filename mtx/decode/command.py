"""`mtx translate`: a stream of lines (a file or a pipe) in, one translation per line out, in order.

The translator (mtx.decode.translator) is fed windows of at most `READ_AHEAD_LINES` lines from a reader thread, so
memory stays bounded, reading overlaps decoding, and each window's output is written and flushed before the
next is decoded. Lines are split at b"\\n" only, as `wc -l` and `paste` count them, and every translation
is one line, so the output has exactly the input's lines, in its order.

With `--alignment`, each translation is followed by " ||| " and its word alignment in Pharaoh format (the
convention of Moses' and Marian's tools): "source-target" word indices, 0-based, one link per target word
(mtx.decode.alignment). An empty input line then gives " ||| ", so that every output line splits into the same two
fields; with `--nbest`, where each hypothesis carries its own alignment, it still gives an empty line, as it
has no hypotheses.

With `--format jsonl`, each output line is instead one JSON object (`json_line`): what a pipeline wants to read
without parsing tabs and separators, with the subword tokens and their log-probabilities besides the text.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import typing
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, Literal

import torch

from mtx.config.recipe import DecodeConfig
from mtx.decode.alignment import default_alignment_layer, pharaoh
from mtx.decode.translator import Dtype, Translation, TranslationStats, Translator, prepare_model
from mtx.devices import DeviceName, choose_device
from mtx.errors import MtxError
from mtx.tokenizer import EOS, SPECIAL_TOKENS, Tokenizer

READ_AHEAD_LINES = 2000  # a window: enough sentences for length sorting to pay off, few enough to stream
ALIGNMENT_SEPARATOR = " ||| "  # between a translation and its alignment, as Moses and Marian write it

Errors = Literal["strict", "replace"]
OutputFormat = Literal["text", "jsonl"]


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


def format_nbest(nbest: list[Translation], with_scores: bool, with_alignment: bool = False) -> str:
    """One output line: the best text alone, or (for --nbest > 1) score<TAB>text pairs joined by tabs; with
    alignments, each text followed by " ||| " and its alignment (an empty 1-best line: the separator alone)."""

    def shown(translation: Translation) -> str:
        if not with_alignment:
            return translation.text
        return f"{translation.text}{ALIGNMENT_SEPARATOR}{pharaoh(translation.alignment or [])}"

    if not with_scores:
        return shown(nbest[0]) if nbest else (ALIGNMENT_SEPARATOR if with_alignment else "")
    return "\t".join(f"{translation.score:.4f}\t{shown(translation)}" for translation in nbest)


def json_fields(translation: Translation, tokenizer: Tokenizer, with_alignment: bool) -> dict[str, object]:
    """A hypothesis as JSON: its text and score, its subword tokens as the text spells them (each with the space
    before it, if any) followed by "</s>" for EOS, and one log-probability per token, EOS's last; with
    alignments, its (source word, target word) links."""
    fields: dict[str, object] = {
        "text": translation.text,
        "score": translation.score,
        "tokens": [*tokenizer.pieces(translation.tokens), SPECIAL_TOKENS[EOS]],
        "token_log_probs": list(translation.token_log_probs),
    }
    if with_alignment:
        fields["alignment"] = [list(link) for link in translation.alignment or []]
    return fields


def json_line(nbest: list[Translation], tokenizer: Tokenizer, with_nbest: bool, with_alignment: bool) -> str:
    """One input line's translation as one JSON object: the best hypothesis' fields, and (for --nbest > 1) the
    n-best list, best first, as "nbest". An empty input line has no hypothesis: an empty text, a null score,
    no tokens."""
    if nbest:
        line = json_fields(nbest[0], tokenizer, with_alignment)
    else:
        line = {"text": "", "score": None, "tokens": [], "token_log_probs": []}
        if with_alignment:
            line["alignment"] = []
    if with_nbest:
        line["nbest"] = [json_fields(translation, tokenizer, with_alignment) for translation in nbest]
    return json.dumps(line, ensure_ascii=False)


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
    from mtx.decode.ensemble import load_models

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
    models, tokenizer, checkpoint = load_models(checkpoints)
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
