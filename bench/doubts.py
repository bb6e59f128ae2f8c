"""Issue 25: how many translations each doubt (a "flag" of `mtx translate --format jsonl`) marks, and whether
they are worse.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/doubts.py runs/demo-ema --steps 200 500

For each step checkpoint of the run (its translating weights, as `mtx translate` loads them), the run's test set
is translated (the recipe's beam) with flags; one JSON line per checkpoint and flag: the lines it marks, and the
mean sentence chrF (sacreBLEU) of the marked lines against the unmarked ones, and of all lines with any flag.
Thresholds are the checkpoint's `data_stats`; a checkpoint written before they existed gets them measured on the
run's prepared training data, as the trainer would have.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from common import emit_info
from sacrebleu.metrics import CHRF

from mtx.checkpoint import load_model
from mtx.config.recipe import DecodeConfig
from mtx.data.prepared import load_split
from mtx.decode.doubts import DoubtThresholds, training_statistics
from mtx.decode.translator import Translator

FLAGS = ("loop", "length_ratio", "copied", "low_log_prob")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path)
    parser.add_argument("--steps", type=int, nargs="+", required=True)
    args = parser.parse_args()
    data = args.run / "data"
    split = load_split(data, "train")
    measured = training_statistics(split.src_lens, split.tgt_lens, lambda i: (split.src(i), split.tgt(i)))
    chrf = CHRF()
    for step in args.steps:
        model, tokenizer, checkpoint = load_model(args.run / "checkpoints" / f"step_{step}.pt")
        lang = checkpoint["recipe"]["data"]
        sources = (data / f"test.{lang['src_lang']}").read_text(encoding="utf-8").splitlines()
        refs = (data / f"test.{lang['tgt_lang']}").read_text(encoding="utf-8").splitlines()
        thresholds = DoubtThresholds.of_checkpoint({"data_stats": checkpoint.get("data_stats", measured)})
        translator = Translator(model, tokenizer, DecodeConfig.of_checkpoint(checkpoint, nbest=1),
                                doubt_thresholds=thresholds)
        best = [nbest[0] for nbest in translator.translate(sources)]
        scores = [chrf.sentence_score(t.text, [ref]).score for t, ref in zip(best, refs, strict=True)]
        config = {"run": str(args.run), "step": step, "sentences": len(sources),
                  "length_ratio": list(thresholds.length_ratio), "copied": thresholds.copied,
                  "min_mean_log_prob": thresholds.min_mean_log_prob, "loop": thresholds.loop,
                  "mean_chrf": round(sum(scores) / len(scores), 2)}
        for name in (*FLAGS, "any"):
            marked = [name in t.doubts if name != "any" else bool(t.doubts) for t in best]
            inside = [s for s, m in zip(scores, marked, strict=True) if m]
            outside = [s for s, m in zip(scores, marked, strict=True) if not m]
            emit_info(f"flags.{name}", **config, marked=len(inside),
                      chrf_marked=round(sum(inside) / len(inside), 2) if inside else None,
                      chrf_unmarked=round(sum(outside) / len(outside), 2) if outside else None)


if __name__ == "__main__":
    main()
