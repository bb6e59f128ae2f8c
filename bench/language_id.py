"""Issue 56: language identifiers compared on real data, with wrong-language sides injected at three lengths.

    nice .venv/bin/python bench/language_id.py --corpus REAL_CORPUS [--pair en-de --other en-fr] [--clean 10000]
        [--per-band 900] [--debs coreutils tar ...] [--extra nl es it ...]

REAL_CORPUS is bench/real_corpus.py's folder. The first `--clean` training pairs of `--pair` are the clean pairs
(as clean as that corpus is). The wrong-language pairs are made from pairs further down: one side is replaced by
a line in another language, `--per-band` pairs for each length of that line, 1–3, 4–8 and 9 or more words. The
other languages are what a crawl mixes into a pair: the pair's own other language (untranslated text, swapped
sides), the `--other` pair's language, and the `--extra` languages, whose lines come from the translated
catalogs of the `--debs` packages in REAL_CORPUS/debs (the same catalogs, other languages). A line that also
occurs (case aside) on the replaced side of the corpus, such as "Status" in Dutch and German alike, is no wrong
language and is never injected.

Each identifier is asked about each side once (timed: pairs/s on one core, both sides, over the clean pairs);
each decision rule then gives one JSON line: the share of injected pairs it catches per length band and per
language, and the share of clean pairs it drops (overall and by the length of the pair's shorter side).

    confident_other@T  another language is the top candidate with a probability of at least T (mtx until issue 56)
    not_top            the side's language is not the top candidate
    below@R            the side's language scores below R times the top candidate's score

`restricted` identifiers choose among `--candidates` (plus the pair's languages) only; CLD2 and CLD3 cannot be
restricted, so they choose among all the languages they know. Only py3langid is an mtx dependency (mtx[langid]);
the others are installed for the comparison alone: pip install lingua-language-detector cld3-py pycld2 (pycld2
builds with gcc). About 10 minutes a pair on two cores, most of it lingua over all its languages.
"""

from __future__ import annotations

import argparse
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from common import emit_info
from real_corpus import ar_members, catalog_pairs, clean_entry, open_tar

from mtx.tokenizer import normalize_text

BANDS = ((1, 3, "1-3"), (4, 8, "4-8"), (9, 10**9, "9+"))
DEBS = ("coreutils", "tar", "wget", "gettext", "dpkg", "apt", "util-linux-locales", "libc-l10n", "e2fsprogs-l10n",
        "gnupg-l10n", "nautilus-data", "gnome-shell-common", "mc-data", "libglib2.0-data")
# What an identifier says of a side that should be in a language: (another language is the top candidate, the
# side's language's score, the top candidate's score).
Stats = tuple[bool, float, float]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="bench/real_corpus.py's folder")
    parser.add_argument("--pair", default="en-de")
    parser.add_argument("--other", default="en-fr", help="a pair whose target language is injected too")
    parser.add_argument("--clean", type=int, default=10_000)
    parser.add_argument("--per-band", type=int, default=900, help="injected pairs per length band")
    parser.add_argument("--debs", nargs="*", default=list(DEBS), help="packages whose catalogs give --extra lines")
    parser.add_argument("--extra", nargs="*", default=["nl", "es", "it", "pt", "pl", "da", "sv"])
    parser.add_argument("--candidates", nargs="*", default=["en", "de", "fr", "es", "it", "nl", "pt", "pl"],
                        help="what restricted identifiers choose among, besides the pair's languages")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    src_lang, tgt_lang = args.pair.split("-")
    other_lang = args.other.split("-")[1]
    folder = args.corpus / args.pair
    sources, targets = read(folder / f"train.{src_lang}"), read(folder / f"train.{tgt_lang}")
    clean = list(zip(sources[: args.clean], targets[: args.clean], strict=True))
    lines = {src_lang: sources[args.clean :], tgt_lang: targets[args.clean :],
             other_lang: read(args.corpus / args.other / f"train.{other_lang}"),
             **catalog_lines(args.corpus / "debs", args.debs, args.extra)}
    known = {src_lang: set(map(str.casefold, sources)), tgt_lang: set(map(str.casefold, targets))}
    injected = inject((src_lang, tgt_lang), lines, known, args.per_band, args.seed)
    emit_info("language_id.corpus", pair=args.pair, clean=len(clean),
              lines={lang: len(found) for lang, found in lines.items()},
              injected={band: len(pairs) for band, pairs in injected.items()})
    candidates = sorted({*args.candidates, src_lang, tgt_lang})
    for name, identify in identifiers(candidates):
        started = time.perf_counter()
        clean_stats = [(identify(s, src_lang), identify(t, tgt_lang)) for s, t in clean]
        per_s = len(clean) / (time.perf_counter() - started)
        noisy_stats = {band: [(lang, identify(text, side_lang)) for lang, text, side_lang in pairs]
                       for band, pairs in injected.items()}
        for rule_name, rule in RULES.items():
            if name.startswith("cld") and rule_name.startswith("below"):
                continue  # CLD2 and CLD3 give the top language's score alone
            clean_dropped = [rule(*s) or rule(*t) for s, t in clean_stats]
            by_band = {band: [dropped for dropped, pair in zip(clean_dropped, clean, strict=True)
                              if band_of(min(len(pair[0].split()), len(pair[1].split()))) == band]
                       for _, _, band in BANDS}
            caught = {band: [(lang, rule(*stats)) for lang, stats in found] for band, found in noisy_stats.items()}
            languages = sorted({lang for found in caught.values() for lang, _ in found})
            emit_info("language_id.rule", identifier=name, rule=rule_name, pair=args.pair,
                      recall={band: share(hit for _, hit in found) for band, found in caught.items()},
                      recall_4_plus=share(hit for band in ("4-8", "9+") for _, hit in caught[band]),
                      recall_by_language={lang: share(hit for found in caught.values() for other, hit in found
                                                      if other == lang) for lang in languages},
                      clean_lost=share(clean_dropped),
                      clean_lost_by_band={band: share(dropped) for band, dropped in by_band.items()},
                      pairs_per_s=round(per_s))


def confident_other(threshold: float) -> Callable[[bool, float, float], bool]:
    return lambda other, _score, top: other and top >= threshold


def below(ratio: float) -> Callable[[bool, float, float], bool]:
    return lambda _other, score, top: score < ratio * top


RULES: dict[str, Callable[[bool, float, float], bool]] = {
    **{f"confident_other@{t}": confident_other(t) for t in (0.5, 0.9)},
    "not_top": lambda other, _score, _top: other,
    **{f"below@{r}": below(r) for r in (0.5, 0.2, 0.1, 0.05, 0.02, 0.01)},
}


def read(path: Path) -> list[str]:
    return [normalize_text(line) for line in path.read_text(encoding="utf-8").splitlines()]


def band_of(words: int) -> str:
    return next(name for low, high, name in BANDS if low <= words <= high)


def share(flags: Iterator[bool] | list[bool]) -> float:
    flags = list(flags)
    return round(sum(flags) / max(1, len(flags)), 4)


def catalog_lines(debs: Path, packages: list[str], languages: list[str]) -> dict[str, list[str]]:
    """The translated lines of `languages` in the catalogs of `packages` (their .debs in `debs`), cleaned as
    bench/real_corpus.py cleans its pairs, in file order without repeats."""
    catalog = re.compile(rf"(?:^|/)({'|'.join(map(re.escape, languages))})/LC_MESSAGES/[^/]+\.mo$")
    found: dict[str, dict[str, None]] = {lang: {} for lang in languages}
    for package in packages:
        for deb in sorted(debs.glob(f"{package}_*.deb")):
            with open_tar(ar_members(deb.read_bytes()), "data") as data_tar:
                for member in data_tar:
                    match = catalog.search(member.name) if member.isfile() else None
                    if match:
                        for msgid, msgstr in catalog_pairs(data_tar.extractfile(member).read()):
                            for _, line in clean_entry(msgid, msgstr):
                                found[match.group(1)].setdefault(normalize_text(line))
    return {lang: list(lines) for lang, lines in found.items()}


def inject(langs: tuple[str, str], lines: dict[str, list[str]], known: dict[str, set[str]], per_band: int,
           seed: int) -> dict[str, list[tuple[str, str, str]]]:
    """Per length band, `per_band` wrong-language sides as (the injected line's language, the line, the language
    the side should be in): a random side, in a language drawn evenly from those that side may not be in, from
    lines not among the clean pairs. Only the injected side is asked about: the other is that of a clean pair."""
    rng = random.Random(seed)
    pools: dict[tuple[int, str], dict[str, list[str]]] = {}
    for side, lang in enumerate(langs):
        for other, found in lines.items():
            if other == lang:
                continue
            for _, _, band in BANDS:
                pools.setdefault((side, band), {})[other] = [
                    line for line in found if band_of(max(1, len(line.split()))) == band
                    and line.casefold() not in known[lang] and re.search(r"[^\W\d_]", line)]
    injected: dict[str, list[tuple[str, str, str]]] = {}
    for _, _, band in BANDS:
        injected[band] = []
        for _ in range(per_band):
            side = rng.randrange(2)
            pool = {lang: found for lang, found in pools[(side, band)].items() if found}
            other = rng.choice(sorted(pool))
            injected[band].append((other, rng.choice(pool[other]), langs[side]))
    return injected


def identifiers(candidates: list[str]) -> Iterator[tuple[str, Callable[[str, str], Stats]]]:
    """Each identifier, as a function of (text, the language it should be in) to `Stats`."""
    yield "py3langid", py3langid_stats(None)
    yield "py3langid restricted", py3langid_stats(candidates)
    yield "lingua", lingua_stats(None, low_accuracy=False)
    yield "lingua low-accuracy", lingua_stats(None, low_accuracy=True)
    yield "lingua restricted", lingua_stats(candidates, low_accuracy=False)
    yield "lingua restricted low-accuracy", lingua_stats(candidates, low_accuracy=True)
    yield "cld3", cld3_stats()
    yield "cld2", cld2_stats()


def py3langid_stats(candidates: list[str] | None) -> Callable[[str, str], Stats]:
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    identifier = LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)
    if candidates is not None:
        identifier.set_languages(candidates)

    def stats(text: str, lang: str) -> Stats:
        ranked = identifier.rank(text)
        return ranked[0][0] != lang, float(dict(ranked).get(lang, 0.0)), float(ranked[0][1])
    return stats


def lingua_stats(candidates: list[str] | None, low_accuracy: bool) -> Callable[[str, str], Stats]:
    from lingua import IsoCode639_1, Language, LanguageDetectorBuilder

    languages = [Language.from_iso_code_639_1(getattr(IsoCode639_1, code.upper())) for code in candidates or []]
    builder = (LanguageDetectorBuilder.from_languages(*languages) if languages
               else LanguageDetectorBuilder.from_all_languages())
    detector = (builder.with_low_accuracy_mode() if low_accuracy else builder).with_preloaded_language_models().build()

    def stats(text: str, lang: str) -> Stats:
        values = detector.compute_language_confidence_values(text)
        if not values or values[0].value == 0:
            return False, 1.0, 1.0  # nothing to go by: no letters
        scores = {v.language.iso_code_639_1.name.lower(): v.value for v in values}
        top = values[0].language.iso_code_639_1.name.lower()
        return top != lang, scores.get(lang, 0.0), values[0].value
    return stats


def cld3_stats() -> Callable[[str, str], Stats]:
    import gcld3

    identifier = gcld3.NNetLanguageIdentifier(min_num_bytes=0, max_num_bytes=1000)

    def stats(text: str, lang: str) -> Stats:
        found = identifier.FindLanguage(text=text)
        top = found.language.split("-")[0]
        if top == "und":
            return False, 1.0, 1.0
        return top != lang, found.probability if top == lang else 0.0, found.probability
    return stats


def cld2_stats() -> Callable[[str, str], Stats]:
    import pycld2

    def stats(text: str, lang: str) -> Stats:
        try:
            reliable, _, details = pycld2.detect(text, bestEffort=True)
        except pycld2.error:
            return False, 1.0, 1.0
        top = details[0][1]
        score = 1.0 if reliable else 0.5  # CLD2 says whether it is sure, not how sure
        if top == "un":
            return False, 1.0, 1.0
        return top != lang, score if top == lang else 0.0, score
    return stats


if __name__ == "__main__":
    main()
