"""Issue 38: what a vocabulary shortlist costs in quality and gains in speed, on a trained model.

    .venv/bin/python bench/shortlist.py --checkpoint RUN/checkpoints/step_800.pt --data RUN/data \
        [--iterations 0 5] [--translations 10 20 50 100] [--frequent 100] [--beam 4] [--sentences 2000]
    .venv/bin/python bench/shortlist.py --data RUN/data --no-decode --iterations 5 --pairs 10000 50000 0

For each lexical table (IBM Model 1 after each of `--iterations`, learnt from the data folder's training split,
or from an evenly spread sample of each of `--pairs` of its pairs, 0 for all: data.lexicon.pairs,
mtx.data.lexicon) and each number of translations per source token: how many of the test references' tokens
the shortlists hold (coverage) and how large they are (tokens a sentence), without decoding; then, decoding
the test set with the checkpoint (whose table is replaced by the one measured) through `mtx translate`'s
Translator: BLEU and chrF (sacreBLEU) and sentences/s, beside the whole vocabulary's. One JSON line per row.
Times are comparable within one run only, on a quiet machine. Coverage alone (--no-decode) needs no checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import time
from pathlib import Path

import numpy as np
import sacrebleu
import torch
from common import emit_info, set_threads

from mtx.config.decode import DecodeConfig
from mtx.data.lexicon import Lexicon, learn_lexicon
from mtx.data.prepared import load_manifest, load_split
from mtx.decode.shortlist import Shortlist
from mtx.decode.translator import Translator, load_prepared
from mtx.tokenizer import Tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, help="the model to decode with (not needed with --no-decode)")
    parser.add_argument("--data", type=Path, required=True, help="the run's prepared data folder")
    parser.add_argument("--iterations", type=int, nargs="+", default=[0, 5])
    parser.add_argument("--pairs", type=int, nargs="+", default=[0], help="sample sizes to learn from (0: all)")
    parser.add_argument("--translations", type=int, nargs="+", default=[10, 20, 50, 100])
    parser.add_argument("--frequent", type=int, default=100)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--decode", action=argparse.BooleanOptionalAction, default=True,
                        help="translate the test set (else coverage only)")
    args = parser.parse_args()
    if args.decode and args.checkpoint is None:
        parser.error("--checkpoint is needed to decode (or give --no-decode)")
    set_threads(args.threads)
    manifest = load_manifest(args.data)
    src_lang, tgt_lang = manifest["src_lang"], manifest["tgt_lang"]
    sources = (args.data / f"test.{src_lang}").read_text(encoding="utf-8").splitlines()[: args.sentences]
    references = (args.data / f"test.{tgt_lang}").read_text(encoding="utf-8").splitlines()[: args.sentences]
    test, train = load_split(args.data, "test"), load_split(args.data, "train")
    if args.decode:
        models, tokenizer, metadata = load_prepared([args.checkpoint], "cpu", "fp32")
        decode = dataclasses.replace(DecodeConfig.of_checkpoint(metadata[0]), beam=args.beam)
    else:
        tokenizer = Tokenizer.from_file(args.data / "tokenizer.json")

    def translate(shortlist: int, lexicon: Lexicon | None = None) -> dict[str, float]:
        translator = Translator(models, tokenizer, dataclasses.replace(decode, shortlist=shortlist,
                                                                         shortlist_frequent=args.frequent),
                                lexicon=lexicon)
        started = time.perf_counter()
        hypotheses = [nbest[0].text if nbest else "" for nbest in translator.translate(sources)]
        seconds = time.perf_counter() - started
        return {"bleu": round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2),
                "chrf": round(sacrebleu.corpus_chrf(hypotheses, [references]).score, 2),
                "sentences_per_s": round(len(sources) / seconds, 1)}

    if args.decode:
        emit_info("shortlist.whole_vocabulary", beam=args.beam, **translate(0))
    for iterations, pairs in itertools.product(args.iterations, args.pairs):
        started = time.perf_counter()
        lexicon = learn_lexicon(train, tokenizer.vocab_size, max(args.translations), iterations, pairs or None)
        learnt = round(time.perf_counter() - started, 1)
        for k in args.translations:
            sets = Shortlist(lexicon, k, args.frequent).candidates([test.src(i) for i in range(len(sources))])
            held = sum(int(np.isin(test.tgt(i), own).sum()) for i, own in enumerate(sets))
            row = {"iterations": iterations, "pairs": lexicon.pairs, "learnt_in_s": learnt, "translations": k,
                   "frequent": args.frequent,
                   "coverage": round(held / sum(len(test.tgt(i)) for i in range(len(sources))), 4),
                   "tokens_a_sentence": round(float(np.mean([len(own) for own in sets])), 1)}
            if args.decode:
                row.update(beam=args.beam, **translate(k, lexicon))
            emit_info("shortlist", **row)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
