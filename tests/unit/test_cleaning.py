"""The cleaning filters of crawled corpora (mtx.data.cleaning): each drops its kind of noise, keeps the clean pair
that looks most like it, and names itself; a filter left off drops nothing."""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import pickle
import sys
from multiprocessing.connection import Connection

import pytest

from mtx.config.data import FilterConfig
from mtx.data.cleaning import PairCleaner, foreign_share, is_copy, language_likelihood, letter_share, longest_run
from mtx.data.manifest import FILTERS
from mtx.errors import MtxError

EVERY_FILTER = FilterConfig(copies=True, numbers=True, placeholders=True, urls=True, min_letters=0.5, max_repeats=3,
                            max_word_len=30, max_foreign_script=0.1)

# (source, target, the filter that drops it, or None: a clean pair that looks like that noise)
CASES = [
    ("Hello, world!", "hello world", "copy"),
    ("Open the file.", "Öffne die Datei.", None),
    ("Page 3 of 1,000", "Seite 3 von 1.000", None),
    ("Page 3 of 10", "Seite 4 von 10", "numbers"),
    ("Save %s to {0}.", "Speichere {0} unter %s.", None),
    ("Delete %1$s?", "%1$s löschen?", None),
    ("Delete %s?", "Löschen?", "placeholders"),
    ("Half: 50% of the files", "Hälfte: 50 % der Dateien", None),  # a percentage, not printf's "% d"
    ("Press {key} to go on.", "Drücke {taste}, um weiterzumachen.", "placeholders"),
    ("See https://example.org/docs.", "Siehe https://example.org/docs.", None),
    ("Write to help@example.org", "Schreiben Sie an hilfe@example.org", "urls"),
    ("12:00 - 13:00 | 3 >> 4", "12:00 - 13:00 | 3 >> 4 Uhr", "non_letters"),
    ("the the the the cat", "die Katze", "repeats"),
    ("the the the cat", "die die die Katze", None),
    ("the key deadbeefcafebabedeadbeefcafebabedeadbeef", "der Schlüssel", "long_word"),
    ("A tiny house", "Ein winziges Häuschen", None),
    ("A tiny house", "Крошечный домик", "script"),
]


@pytest.mark.parametrize(("src", "tgt", "expected"), CASES)
def test_each_filter_drops_its_noise_and_keeps_the_clean_pair_like_it(src: str, tgt: str, expected: str | None
                                                                       ) -> None:
    assert PairCleaner(EVERY_FILTER, "en", "de")(src, tgt) == expected


def test_a_filter_left_off_drops_nothing() -> None:
    assert all(PairCleaner(FilterConfig(), "en", "de")(src, tgt) is None for src, tgt, _ in CASES)  # the defaults


def test_every_filter_is_counted_in_the_manifest_in_the_order_it_runs() -> None:
    names = [name for _, _, name in CASES if name]
    assert sorted(set(names), key=FILTERS.index) == [n for n in FILTERS if n in names]
    order = [FILTERS.index(name) for name in ("ratio", "copy", "numbers", "placeholders", "urls", "non_letters",
                                              "repeats", "long_word", "script", "language", "duplicate")]
    assert order == sorted(order)


def test_the_measures_behind_the_filters() -> None:
    assert is_copy("Berlin.", "berlin") and not is_copy("...", "!!!")  # nothing but punctuation is no copy
    assert letter_share("ab 12") == 0.5 and letter_share("   ") == 1.0
    assert longest_run("a b b b c b") == 3 and longest_run("") == 0
    assert foreign_share("Москва and Kyiv", frozenset({"LATIN"})) == pytest.approx(6 / 13)
    assert foreign_share("12 !", frozenset({"LATIN"})) == 0.0


def test_a_language_whose_script_mtx_does_not_know_is_not_checked() -> None:
    only_script = FilterConfig(max_foreign_script=0.0)
    assert PairCleaner(only_script, "xx", "de")("Крошечный домик", "Ein Häuschen") is None
    assert PairCleaner(only_script, "sr", "de")("Крошечный домик", "Ein Häuschen") is None  # Cyrillic or Latin
    assert PairCleaner(only_script, "ru", "de")("A tiny house", "Ein Häuschen") == "script"


def test_the_cleaner_travels_to_the_worker_processes() -> None:
    cleaner = PairCleaner(EVERY_FILTER, "en", "de")
    assert pickle.loads(pickle.dumps(cleaner))("Page 3", "Seite 4") == "numbers"


# (source, target, dropped by language identification for en → de): short lines in the wrong language among them
LANGUAGE_CASES = [
    ("The cat sleeps on the warm mat.", "Die Katze schläft auf der warmen Matte.", False),
    ("The cat sleeps on the warm mat.", "The cat sleeps on the warm mat, really.", True),  # untranslated
    ("The cat sleeps on the warm mat.", "Le chat dort sur le tapis chaud.", True),
    ("Die Katze schläft auf der warmen Matte.", "Die Katze schläft auf der warmen Matte.", True),  # swapped
    ("Open the file", "Öffne die Datei", False),
    ("Open the file", "Open the file", True),  # three words: far likelier English than German
    ("Open the file", "Ouvrir le fichier", True),
    ("Öffne die Datei", "Öffne die Datei", True),  # a German source
    ("Save as", "Speichern unter", False),
    ("Save as", "Save as", True),
    ("Version", "Version", False),  # the same word in both languages
    ("Status", "Status", False),
    ("OK", "Gut", False),  # too short to tell
    ("Open file", "Open file", False),  # as likely German or Dutch as English: what 1-3 words cannot catch
]


@pytest.mark.parametrize(("src", "tgt", "dropped"), LANGUAGE_CASES)
def test_language_identification_drops_a_side_far_likelier_in_another_language(src: str, tgt: str, dropped: bool
                                                                               ) -> None:
    pytest.importorskip("py3langid")
    cleaner = PairCleaner(dataclasses.replace(FilterConfig(), language_id=True), "en", "de")
    assert (cleaner(src, tgt) == "language") is dropped


def test_the_language_likelihood_is_against_the_likeliest_language() -> None:
    pytest.importorskip("py3langid")
    assert language_likelihood("Datei öffnen", "de") == 1.0  # German is the likeliest
    assert language_likelihood("Datei öffnen", "en") < 0.01
    assert language_likelihood("Open file", "de") > language_likelihood("Open the file", "de")  # a word more
    assert 0 < language_likelihood("Save as", "de") < FilterConfig().language_id_ratio


def test_a_higher_ratio_drops_more_short_lines() -> None:
    pytest.importorskip("py3langid")
    strict = PairCleaner(dataclasses.replace(FilterConfig(), language_id=True, language_id_ratio=0.5), "en", "de")
    assert strict("Open file", "Open file") == "language"
    assert strict("Open the file", "Öffne die Datei") is None


def test_language_identification_without_its_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "py3langid", None)  # an import of it fails, as where it is not installed
    with pytest.raises(MtxError, match=r"mtx\[langid\]"):
        PairCleaner(dataclasses.replace(FilterConfig(), language_id=True), "en", "de")


LONG = 100_000
# Lines of 10^5 characters without a space, in the shapes that make a backtracking pattern scan the rest of the
# line again from each of its characters (quadratic: a minute or more for one pair), as a hostile or broken crawl
# may hold them.
HOSTILE = {
    "letters": "a" * LONG,
    "addresses": "a@" * (LONG // 2),
    "dotted address": "a." * (LONG // 4) + "@" + "a" * (LONG // 2),
    "urls": "http://" * (LONG // 7),
    "www": "www.!" * (LONG // 5),
    "digits": "1" * LONG,
    "percents": "%" * LONG,
    "printf flags": "%" + "0" * LONG,
    "printf position": "%" + "1" * LONG,
    "braces": "{" + "a" * LONG,
}
SINGLE_FILTERS = {name: dataclasses.replace(FilterConfig(), **{name: value}) for name, value in (
    ("copies", True), ("numbers", True), ("placeholders", True), ("urls", True), ("min_letters", 0.5),
    ("max_repeats", 3), ("max_word_len", 30), ("max_foreign_script", 0.1))}
BOUND_S = 5.0  # per pair: each filter takes milliseconds on such a pair, a quadratic one a minute


def _clean_hostile_pairs(done: Connection, filters: dict[str, FilterConfig]) -> None:
    """In a forked child: each filter alone on each hostile pair, telling the parent as each one ends, once every
    cleaner has run on a short pair (language identification loads its model then)."""
    cleaners = [PairCleaner(filt, "en", "de") for filt in filters.values()]
    for cleaner in cleaners:
        cleaner("Open the file.", "Öffne die Datei.")
    done.send(True)
    for cleaner in cleaners:
        for line in HOSTILE.values():
            cleaner(line, line)
            done.send(True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="runs the filters in a forked child, to stop one that hangs")
def test_every_filter_is_linear_in_the_line_length() -> None:
    filters = dict(SINGLE_FILTERS)
    with contextlib.suppress(ImportError):
        import py3langid  # noqa: F401  (the language filter is checked where its extra is installed)

        filters["language_id"] = dataclasses.replace(FilterConfig(), language_id=True)
    context = multiprocessing.get_context("fork")
    done, child_end = context.Pipe(duplex=False)
    child = context.Process(target=_clean_hostile_pairs, args=(child_end, filters), daemon=True)
    child.start()
    try:
        assert done.poll(60), "the filters did not start within 60 s"
        done.recv()
        for name in filters:
            for shape in HOSTILE:
                assert done.poll(BOUND_S), f"{name} took over {BOUND_S} s on a pair of {LONG:,} characters ({shape})"
                done.recv()
    finally:
        child.kill()
        child.join()
