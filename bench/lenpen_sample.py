"""How many valid sentences choosing α needs: the α chosen on N of them, spread over the set, against all.

`mtx average` and the end of `mtx train` choose the length penalty's α on the run's valid split (mtx.train.
tune_lenpen), one beam search over it. On a large valid split that search is the cost, so they take at most
`TUNE_SENTENCES` (mtx/config/decode.py) spread evenly over it. This searches a checkpoint's whole valid split
once, keeping every hypothesis that ends (mtx.decode.lenpen_choice.endings), chooses α on N spread lines of it
for each N (`spread_lines` over the set as one language pair: a model of one pair), and scores each choice on all
the lines: what choosing on N loses against choosing on all. Where the run's data has a test split, each choice
is also scored there, searched the same way once: the loss out of the sample. One JSON line per N on stdout.

    .venv/bin/python bench/lenpen_sample.py -m runs/quality/en-de/defaults-seed1/checkpoints/step_2000.pt
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from mtx.config.loading import recipe_from_dict
from mtx.decode.lenpen_choice import best_under, choose_among, endings
from mtx.decode.search import LengthPenalty
from mtx.score.metrics import corpus_bleu_and_ratio
from mtx.train.run_data import spread_lines
from mtx.train.tune_lenpen import ValidToTune, searcher


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, required=True, help="a checkpoint inside its run folder")
    parser.add_argument("--sentences", type=int, nargs="+", default=[100, 200, 500, 1000])
    args = parser.parse_args()
    checkpoint = torch.load(args.model, map_location="cpu", weights_only=True)
    valid = ValidToTune.of_run(checkpoint, args.model, most=None)
    engine = searcher(checkpoint, "cpu")
    started = time.perf_counter()
    nbests = endings(engine, valid.sources, valid.decode)
    seconds = time.perf_counter() - started
    on_all = choose_among(nbests, valid.refs, valid.decode)
    best = {s.alpha: s for s in on_all.scores}[on_all.chosen]
    test = test_split(checkpoint, valid.data_dir)
    test_endings = endings(engine, test[0], valid.decode) if test else []
    for most in [*args.sentences, len(nbests)]:
        lines = spread_lines([""] * len(nbests), most)
        alpha = choose_among([nbests[i] for i in lines], [valid.refs[i] for i in lines], valid.decode).chosen
        hyps = best_under(nbests, LengthPenalty(alpha, valid.decode.lenpen_style))
        bleu, ratio = corpus_bleu_and_ratio(hyps, valid.refs)
        record = {"name": "lenpen_sample", "model": str(args.model), "sentences": len(lines), "alpha": alpha,
                  "valid_bleu": round(bleu, 2), "valid_ratio": round(ratio, 3), "loss": round(best.bleu - bleu, 2),
                  "search_seconds": round(seconds * len(lines) / len(nbests), 1)}
        if test:
            scored = corpus_bleu_and_ratio(best_under(test_endings, LengthPenalty(alpha, valid.decode.lenpen_style)),
                                           test[1])
            record |= {"test_bleu": round(scored[0], 2), "test_ratio": round(scored[1], 3)}
        print(json.dumps(record), flush=True)


def test_split(checkpoint: dict, data_dir: Path) -> tuple[list[str], list[str]] | None:
    """The test split beside the valid one in the run's prepared data (sources, references), if it has one."""
    data = recipe_from_dict(checkpoint["recipe"]).data
    texts = [data_dir / f"test.{lang}" for lang in (data.src_lang, data.tgt_lang)]
    if not all(path.is_file() for path in texts):
        return None
    sources, refs = (path.read_text(encoding="utf-8").splitlines() for path in texts)
    return sources, refs


if __name__ == "__main__":
    main()
