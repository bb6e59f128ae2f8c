"""Issue 41: what each cleaning filter of `mtx prepare` removes of injected noise, and what it loses of clean pairs.

    .venv/bin/python bench/cleaning.py --corpus REAL_CORPUS [--pair en-de --other en-fr] [--pairs 20000] [--noise 0.2]

REAL_CORPUS is bench/real_corpus.py's folder. The first `--pairs` training pairs of `--pair` are the clean pairs
(as clean as that corpus is: its own noise counts against a filter here); a `--noise` share more is added, in four
kinds of equal number, each made from clean pairs further down the corpus and recorded:

    wrong_language  the target replaced by the `--other` pair's target of another sentence (French for en-de)
    shuffled        the target replaced by this corpus' target of another sentence (a misalignment)
    copy            the target replaced by the source (an untranslated copy)
    number          a number of the source changed in the target (or one appended to the target)

Each filter of mtx.data.cleaning runs alone, at the setting docs/guides/data.md suggests (language identification
also at the other `--ratios`), and then all of them at once (`all`); each gives one JSON line: the share of each kind of
noise it drops, the share of the clean pairs it drops, and pairs/s on one core (the whole of `PairCleaner` on
normalised text, as prepare's workers run it).
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import re
import time
from pathlib import Path

from common import emit_info

from mtx.config.data import FilterConfig
from mtx.data.cleaning import PairCleaner
from mtx.tokenizer import normalize_text

NONE = FilterConfig()  # every cleaning filter off
SUGGESTED = {  # each filter alone, at the setting the data guide suggests
    "copies": {"copies": True},
    "numbers": {"numbers": True},
    "placeholders": {"placeholders": True},
    "urls": {"urls": True},
    "min_letters": {"min_letters": 0.5},
    "max_repeats": {"max_repeats": 4},
    "max_word_len": {"max_word_len": 50},
    "max_foreign_script": {"max_foreign_script": 0.1},
    "language_id": {"language_id": True},
}
KINDS = ("wrong_language", "shuffled", "copy", "number")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="bench/real_corpus.py's folder")
    parser.add_argument("--pair", default="en-de")
    parser.add_argument("--other", default="en-fr", help="the pair whose targets are the wrong-language noise")
    parser.add_argument("--pairs", type=int, default=20_000)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--ratios", type=float, nargs="*", default=[0.01, 0.2],
                        help="language identification's language_id_ratio values to try besides the default")
    args = parser.parse_args()
    src_lang, tgt_lang = args.pair.split("-")
    sources = read(args.corpus / args.pair / f"train.{src_lang}")
    targets = read(args.corpus / args.pair / f"train.{tgt_lang}")
    other = read(args.corpus / args.other / f"train.{args.other.split('-')[1]}")
    clean = list(zip(sources[: args.pairs], targets[: args.pairs], strict=True))
    noisy = inject(sources[args.pairs :], targets[args.pairs :], other, int(args.pairs * args.noise), args.seed)
    emit_info("cleaning.corpus", pair=args.pair, clean=len(clean), noise={k: len(v) for k, v in noisy.items()})
    settings = {name: dataclasses.replace(NONE, **change) for name, change in SUGGESTED.items()}
    for ratio in args.ratios:  # how much likelier another language must be
        settings[f"language_id@{ratio}"] = dataclasses.replace(NONE, language_id=True, language_id_ratio=ratio)
    settings["all"] = dataclasses.replace(NONE, **{k: v for change in SUGGESTED.values() for k, v in change.items()})
    for name, filt in settings.items():
        cleaner = PairCleaner(filt, src_lang, tgt_lang)
        started = time.perf_counter()
        clean_dropped = sum(cleaner(s, t) is not None for s, t in clean)
        seconds = time.perf_counter() - started
        removed = {kind: round(sum(cleaner(s, t) is not None for s, t in pairs) / max(1, len(pairs)), 4)
                   for kind, pairs in noisy.items()}
        emit_info("cleaning.filter", filter=name, setting=SUGGESTED.get(name, name),
                  noise_removed=removed, clean_lost=round(clean_dropped / len(clean), 4),
                  pairs_per_s=round(len(clean) / seconds))


def read(path: Path) -> list[str]:
    return [normalize_text(line) for line in path.read_text(encoding="utf-8").splitlines()]


def inject(sources: list[str], targets: list[str], other: list[str], count: int, seed: int
           ) -> dict[str, list[tuple[str, str]]]:
    """`count` noisy pairs, a quarter of each kind, made from the pairs given (none of them among the clean)."""
    rng = random.Random(seed)
    each = count // len(KINDS)
    rows = rng.sample(range(len(sources)), each * len(KINDS))
    noisy: dict[str, list[tuple[str, str]]] = {kind: [] for kind in KINDS}
    for n, i in enumerate(rows):
        kind, src, tgt = KINDS[n % len(KINDS)], sources[i], targets[i]
        if kind == "wrong_language":
            tgt = other[rng.randrange(len(other))]
        elif kind == "shuffled":
            tgt = targets[rng.randrange(len(targets))]
        elif kind == "copy":
            tgt = src
        else:
            numbers = re.findall(r"\d+", src)
            tgt = tgt.replace(numbers[0], str(int(numbers[0]) + 1), 1) if numbers and numbers[0] in tgt \
                else f"{tgt} {rng.randrange(2, 100)}"
        noisy[kind].append((src, tgt))
    return noisy


if __name__ == "__main__":
    main()
