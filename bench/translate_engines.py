"""Issue 57: `mtx translate`'s two engines, the whole command, against CTranslate2 called directly.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/translate.py --checkpoint runs/demo/average.pt \
        --input runs/demo/data/test.en [--threads 2] [--repeats 3] [--beams 4,1]

A trained checkpoint translates the lines of --input (every line, at its natural length: the search stops at EOS
or at the output limit a·n + b, as `mtx translate` decodes a file) on --threads threads, beam 4 and greedy, fp32
and int8. Systems:

  command.ct2.<dtype>     `mtx translate --engine ct2`: mtx.decode.command.translate_file called in this process on
                          the file, to an output file, timed from the moment its engine is open (the line it logs
                          after open_engine) to its summary line: reading, tokenising, grouping, decoding,
                          detokenising, writing and closing, without the model's loading or conversion (the folder
                          is cached beside the checkpoint by the first call, which the check below makes). In process
                          rather than a subprocess, so that the span is the command's own path and nothing else.
  command.torch.<dtype>   `mtx translate --engine torch`, timed alike. Its worker processes start within the span
                          (at the engine's first call with more than one batch); their start alone is measured too
                          (`command.torch.<dtype>.worker_start`: an engine opened with its workers started at once).
  ct2.<dtype>.inter1_intra2 / ct2.<dtype>.inter2_intra1
                          CTranslate2's Translator called directly on the same converted folder, in both layouts: the
                          file's sentences tokenised beforehand (not timed), one asynchronous translate_batch call per
                          output limit (CTranslate2 takes one max_decoding_length a call, so that is the only direct
                          way to the limit a·n + b, and so to the same outputs and the same work), each cut into
                          batches of --batch-tokens tokens (it sorts them by length), the same beam and length
                          penalty. With --max-len-a 0 every sentence has one limit, and the file is one call.

Every system uses the length penalty CTranslate2 has (fairseq's |Y|^α, `--lenpen-style fairseq`) with the
checkpoint's α, so a recipe that says gnmt is decoded with fairseq's by both engines. Before timing, the greedy fp32
lines of the two engines are compared (the share identical is printed), and direct CTranslate2's outputs with the
ct2 engine's. Then sentences/s of each system (median of --repeats interleaved rounds) and the issue's bar,
`translate.ct2_engine_over_direct`: the ct2 engine's sentences/s over direct CTranslate2's in its faster layout, at
least 0.90 at beam 4 fp32, beam 4 int8 and greedy fp32 (greedy int8 is printed too, without a bar).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import emit, emit_info

from mtx.decode.command import translate_file
from mtx.decode.ct2_engine import COMPUTE_TYPES, NEVER_PRODUCED
from mtx.decode.ct2_folder import converted_folder, token_strings
from mtx.decode.engines import open_engine
from mtx.decode.facts import ModelFacts
from mtx.decode.request import Request, default_alignment_layer
from mtx.tokenizer import EOS, normalize_text

ENGINE_OVER_DIRECT_BAR = 0.90  # the ct2 engine's whole command at least this share of direct CTranslate2's best
BARRED = {(4, "fp32"), (4, "int8"), (1, "fp32")}  # (beam, dtype) the bar holds at
OPTIONS = {"lenpen_style": "fairseq"}  # the one length penalty both engines have
DTYPES = ("fp32", "int8")

System = Callable[[int], tuple[list[str], float]]  # beam size → the output lines in input order, and the seconds


def compare_engines(args: argparse.Namespace) -> None:
    """The module docstring's measurement, as JSON lines on stdout."""
    import ctranslate2

    lines = args.input.read_text(encoding="utf-8").splitlines()
    facts = ModelFacts.read([args.checkpoint])
    options = {**OPTIONS, **({} if args.max_len_a is None else {"max_len_a": args.max_len_a})}
    request = Request.of(facts, options)
    with tempfile.TemporaryDirectory(prefix="translate_engines.") as scratch:
        systems: dict[str, System] = {}
        for dtype in DTYPES:
            for engine in ("ct2", "torch"):
                systems[f"command.{engine}.{dtype}"] = command_system(args, options, engine, dtype, Path(scratch))
        aligning = default_alignment_layer(facts.limits.decoder_layers)
        for dtype in DTYPES:
            compute_type = COMPUTE_TYPES[dtype]
            folder = converted_folder(args.checkpoint, None if dtype == "fp32" else compute_type, aligning)
            for inter, intra in ((1, args.threads), (args.threads, 1)):
                translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type,
                                                    inter_threads=inter, intra_threads=intra)
                systems[f"ct2.{dtype}.inter{inter}_intra{intra}"] = direct_system(translator, facts, request, lines,
                                                                                  args.batch_tokens)
        check_agreement(systems)
        for dtype in DTYPES:
            emit_info(f"command.torch.{dtype}.worker_start", seconds=worker_start(args, dtype))
        config = {"checkpoint": str(args.checkpoint), "input": str(args.input), "sentences": len(lines),
                  "threads": args.threads, "batch_tokens": args.batch_tokens, "device": "cpu",
                  "lenpen": request.lenpen, "max_len_a": request.max_len_a, "max_len_b": request.max_len_b,
                  **OPTIONS}
        for beam in (int(b) for b in args.beams.split(",")):
            seconds: dict[str, list[float]] = {name: [] for name in systems}
            for _ in range(args.repeats):  # rounds interleaving the systems, so that drifts in load hit all alike
                for name, system in systems.items():
                    seconds[name].append(system(beam)[1])
            rates = {}
            for name, samples in seconds.items():
                rates[name] = float(np.median([len(lines) / s for s in samples]))
                emit(f"{name}.beam{beam}.sentences_per_s", {**config, "system": name, "beam": beam},
                     [len(lines) / s for s in samples], "sentences/s")
            report_bar(beam, rates)


def command_system(args: argparse.Namespace, options: dict[str, object], engine: str, dtype: str, scratch: Path
                   ) -> System:
    """`mtx translate --engine ENGINE --dtype DTYPE` of the input file to a file, and the seconds from its engine
    being open (the line it logs after open_engine) to its summary line, both marked by the command's own log."""
    output = scratch / f"{engine}.{dtype}.out"

    def translate(beam: int) -> tuple[list[str], float]:
        marks: dict[str, float] = {}

        def log(message: str) -> None:
            if message.startswith(f"{args.checkpoint}: "):
                marks["open"] = time.perf_counter()
            elif message.startswith("translated "):
                marks["done"] = time.perf_counter()

        translate_file([args.checkpoint], args.input, output, options={**options, "engine": engine, "beam": beam},
                       batch_tokens=args.batch_tokens, device="cpu", dtype=dtype, threads=args.threads,
                       errors="strict", log=log)
        return output.read_text(encoding="utf-8").splitlines(), marks["done"] - marks["open"]

    return translate


def direct_system(translator, facts: ModelFacts, request: Request, lines: list[str], batch_tokens: int) -> System:
    """CTranslate2's translator on the lines, tokenised here once, as directly as it honours their output limits:
    one asynchronous translate_batch call per output limit (a·n + b; a call has one max_decoding_length), all
    submitted at once and each cut into batches of `batch_tokens` tokens; with max_len_a 0, one call of the whole
    file. Outputs detokenised as the engine does, untimed."""
    tokens = token_strings(facts.tokenizer, facts.limits.vocab_size)
    encoded = facts.encode(lines)
    groups: dict[int, list[int]] = {}  # output limit → the lines that have it
    for i, ids in enumerate(encoded):
        if ids is not None:
            ids = ids[: facts.limits.max_positions - 1]
            groups.setdefault(facts.limits.output_limit(request, len(ids)), []).append(i)
    sources = {limit: [[tokens[t] for t in [*encoded[i][: facts.limits.max_positions - 1], EOS]] for i in members]
               for limit, members in groups.items()}
    ids = {token: i for i, token in enumerate(tokens)}

    def translate(beam: int) -> tuple[list[str], float]:
        started = time.perf_counter()
        pending = [(members, translator.translate_batch(
            sources[limit], max_batch_size=batch_tokens, batch_type="tokens", asynchronous=True, beam_size=beam,
            length_penalty=request.lenpen, suppress_sequences=NEVER_PRODUCED, max_input_length=0,
            max_decoding_length=limit)) for limit, members in groups.items()]
        hypotheses = {i: result.result().hypotheses[0] for members, results in pending
                      for i, result in zip(members, results, strict=True)}
        seconds = time.perf_counter() - started
        present = sorted(hypotheses)
        texts = facts.tokenizer.decode_batch([[ids[t] for t in hypotheses[i]] for i in present])
        outputs = [""] * len(lines)
        for i, text in zip(present, texts, strict=True):
            outputs[i] = normalize_text(text)
        return outputs, seconds

    return translate


def check_agreement(systems: dict[str, System]) -> None:
    """Greedy search: the share of lines on which each engine agrees with the torch engine of its dtype, and
    direct CTranslate2 with the ct2 engine of its dtype (a first, untimed call of every system, which warms each
    up)."""
    greedy = {name: system(1)[0] for name, system in systems.items()}
    for name, outputs in greedy.items():
        dtype = next(dtype for dtype in DTYPES if f".{dtype}" in name)
        reference = f"command.torch.{dtype}" if name.startswith("command.") else f"command.ct2.{dtype}"
        same = sum(a == b for a, b in zip(outputs, greedy[reference], strict=True)) / len(outputs)
        emit_info(f"{name}.greedy_check", identical_to=reference, share_identical=same)


def worker_start(args: argparse.Namespace, dtype: str) -> float:
    """Seconds to start the torch engine's worker processes (each loads the checkpoint and warms up): an engine
    that holds no model itself starts them when it opens."""
    started = time.perf_counter()
    engine = open_engine("torch", [args.checkpoint], device="cpu", dtype=dtype, threads=args.threads,
                         batch_tokens=args.batch_tokens, log=lambda _: None, in_process=False)
    seconds = time.perf_counter() - started
    engine.close()
    return seconds


def report_bar(beam: int, rates: dict[str, float]) -> None:
    """`translate.ct2_engine_over_direct` for each dtype: the ct2 engine's whole command over direct CTranslate2
    in its faster layout; and the torch engine's over the same, for comparison."""
    for dtype in DTYPES:
        direct = {name: rate for name, rate in rates.items() if name.startswith(f"ct2.{dtype}.")}
        if not direct:
            continue
        best = max(direct, key=direct.get)
        ratio = rates[f"command.ct2.{dtype}"] / direct[best]
        barred = (beam, dtype) in BARRED
        emit_info("translate.ct2_engine_over_direct", beam=beam, dtype=dtype, direct=best, ratio=ratio,
                  bar=ENGINE_OVER_DIRECT_BAR if barred else None,
                  met=ratio >= ENGINE_OVER_DIRECT_BAR if barred else None)
        emit_info("translate.torch_engine_over_direct", beam=beam, dtype=dtype, direct=best,
                  ratio=rates[f"command.torch.{dtype}"] / direct[best])
