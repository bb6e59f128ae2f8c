"""Which valid sentences tell a run's length ratio: the first N, N spread over the set, or all of them.

Validation decodes `train.valid_max_sentences` valid sentences to log BLEU and the length ratio while a run
trains. This translates a checkpoint's whole valid split once, as validation does (greedy unless --beam), and
scores three subsets of it: the first N lines, N lines spread evenly over the set (`spread_lines`, what
validation takes), and every line. One JSON line per subset on stdout.

    .venv/bin/python bench/valid_sample.py -m runs/quality/en-de/defaults-seed1/checkpoints/step_2000.pt \\
        --data runs/quality/en-de/data-defaults --tgt de
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from mtx.checkpoint import load_model
from mtx.config.decode import DecodeConfig
from mtx.decode.translator import translate_sentences
from mtx.score.metrics import corpus_bleu_and_ratio
from mtx.train.run_data import spread_lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True, help="a prepared data folder (valid.<src>, valid.<tgt>)")
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", required=True)
    parser.add_argument("--sentences", type=int, default=200, help="N [default: 200, the quality grid's]")
    parser.add_argument("--beam", type=int, default=1, help="[default: 1, validation's default]")
    args = parser.parse_args()
    model, tokenizer, _ = load_model(args.model)
    sources, refs = ((args.data / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
                     for lang in (args.src, args.tgt))
    hyps = translate_sentences(model, tokenizer, sources, DecodeConfig(beam=args.beam))
    subsets = {"first": list(range(min(args.sentences, len(sources)))),
               "spread": spread_lines([""] * len(sources), args.sentences), "all": list(range(len(sources)))}
    for name, lines in subsets.items():
        bleu, ratio = corpus_bleu_and_ratio([hyps[i] for i in lines], [refs[i] for i in lines])
        print(json.dumps({"name": "valid_sample", "model": str(args.model), "subset": name, "sentences": len(lines),
                          "bleu": round(bleu, 2), "ratio": round(ratio, 3)}))


if __name__ == "__main__":
    main()
