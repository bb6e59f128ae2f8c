"""Issue 14: what `mtx translate --alignment` costs beam-4 translation, measured in the same run.

    .venv/bin/python bench/alignment_cost.py [--checkpoint runs/demo/average.pt] [--repeats 5]

The sentences are the checkpoint's run's test set (runs/demo/data/test.en after `make demo`), translated by
`mtx.decode.translator.Translator` as `mtx translate` translates them, beam 4, on 2 threads (batches decoded side by
side, one thread each), with and without word alignments from the default alignment layer. Two models:

  trained       the checkpoint itself, whose translations end where the model ends them
  <preset>      a model of the `--preset` shape (default `base`) with random weights and a joint BPE of
                `--vocab` tokens (default 32,000, the paper's En-Fr size) learnt on synthetic news-like text
                (bench/prepare.py's Zipf pseudo-words), `--preset-sentences` of its sentences, every output
                forced to `--tokens` tokens (min_len = max_len): a full-size model's decoder and output layer

The runs interleave (plain, aligned, plain, ...); each line gives the median CPU seconds per pass over the test
set (the process's threads together: on a shared machine, other programs swing the wall-clock time of a
2-thread run far more than the work it does), and an info line the ratio aligned / plain, against the issue's
bar of 1.15.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from common import build_model, emit, emit_info, set_threads, time_interleaved
from prepare import write_corpus

from mtx.checkpoint import load_model
from mtx.config.recipe import DecodeConfig
from mtx.decode.request import default_alignment_layer
from mtx.decode.translator import Translator
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer

BAR = 1.15  # the bound on aligned / plain time


def measure(name: str, model: Transformer, tokenizer: Tokenizer, decode: DecodeConfig, sentences: list[str],
            args: argparse.Namespace) -> None:
    layer = default_alignment_layer(len(model.decoder_layers))
    plain = Translator(model, tokenizer, decode)
    aligned = Translator(model, tokenizer, decode, alignment_layer=layer)
    times = time_interleaved({"plain": lambda: plain.translate(sentences),
                              "aligned": lambda: aligned.translate(sentences)}, args.repeats,
                             clock=time.process_time)
    config = {"model": name, "sentences": len(sentences), "beam": decode.beam, "threads": args.threads,
              "alignment_layer": layer}
    for kind, samples in times.items():
        emit(f"translate.{kind}", config, samples, "cpu_s")
    ratio = sorted(times["aligned"])[len(times["aligned"]) // 2] / sorted(times["plain"])[len(times["plain"]) // 2]
    emit_info("alignment.cost", model=name, ratio=ratio, bar=BAR, within_bar=ratio <= BAR)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, default=Path("runs/demo/average.pt"))
    parser.add_argument("--test", type=Path, help="[default: the checkpoint's run's data/test.en]")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--tokens", type=int, default=30, help="output tokens per sentence of the preset model")
    parser.add_argument("--sentences", type=int, default=500)
    parser.add_argument("--preset-sentences", type=int, default=50, help="sentences for the --preset model")
    parser.add_argument("--vocab", type=int, default=32000, help="BPE tokens of the --preset model")
    parser.add_argument("--synthetic-pairs", type=int, default=100_000,
                        help="synthetic pairs the --preset model's BPE is learnt on (fewer: a quick run)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    test = args.test or args.checkpoint.parent / "data" / "test.en"
    if not args.checkpoint.is_file() or not test.is_file():
        raise SystemExit(f"{args.checkpoint} or {test} is missing: run `make demo` first, or pass --checkpoint/--test")
    set_threads(args.threads)
    model, tokenizer, _ = load_model(args.checkpoint, "cpu")
    sentences = test.read_text(encoding="utf-8").splitlines()[: args.sentences]
    measure("trained", model.eval(), tokenizer, DecodeConfig(beam=4), sentences, args)
    fixed = DecodeConfig(beam=4, max_len_a=0.0, max_len_b=args.tokens, min_len=args.tokens)
    tokenizer, sentences = synthetic_tokenizer(args.vocab, args.synthetic_pairs)
    measure(args.preset, build_model(args.preset, tokenizer.vocab_size).eval(), tokenizer, fixed,
            sentences[: args.preset_sentences], args)


def synthetic_tokenizer(vocab: int, pairs: int) -> tuple[Tokenizer, list[str]]:
    """A joint BPE of `vocab` tokens learnt on `pairs` synthetic pairs, and their source sentences."""
    with tempfile.TemporaryDirectory() as folder:
        source, target = write_corpus(Path(folder), pairs)
        sources = source.read_text(encoding="utf-8").splitlines()
        tokenizer = Tokenizer.train([*sources, *target.read_text(encoding="utf-8").splitlines()], vocab)
    return tokenizer, sources


if __name__ == "__main__":
    main()
