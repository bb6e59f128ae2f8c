"""The generated English→German demo corpus: deterministic, disjoint splits, and German that is right."""

from __future__ import annotations

import pytest

from mtx.config import DemoSource
from mtx.demo import demo_splits, sample_pairs
from mtx.demo.clause import Clause, english, german_main, german_question, german_sub
from mtx.demo.lexicon import (
    ADJECTIVES,
    BE,
    NOUNS,
    VERBS,
    NounPhrase,
    number_de,
    number_en,
    ordinal_de,
    ordinal_en,
)


def _noun(en: str):
    return next(n for n in NOUNS if n.en == en)


def _adjective(en: str):
    return next(a for a in ADJECTIVES if a.en == en)


def _verb(en: str):
    return next(v for v in VERBS if v.en[0] == en)


@pytest.mark.parametrize("n, en, de", [
    (2, "two", "zwei"), (16, "sixteen", "sechzehn"), (21, "twenty-one", "einundzwanzig"),
    (70, "seventy", "siebzig"), (100, "one hundred", "einhundert"),
    (321, "three hundred twenty-one", "dreihunderteinundzwanzig"),
    (2047, "two thousand forty-seven", "zweitausendsiebenundvierzig"),
    (9999, "nine thousand nine hundred ninety-nine", "neuntausendneunhundertneunundneunzig"),
])
def test_numbers(n: int, en: str, de: str) -> None:
    assert (number_en(n), number_de(n)) == (en, de)


@pytest.mark.parametrize("n, en, de", [
    (1, "first", "ersten"), (3, "third", "dritten"), (7, "seventh", "siebten"), (12, "twelfth", "zwölften"),
    (20, "twentieth", "zwanzigsten"), (21, "twenty-first", "einundzwanzigsten"), (30, "thirtieth", "dreißigsten"),
])
def test_date_ordinals(n: int, en: str, de: str) -> None:
    assert (ordinal_en(n), ordinal_de(n)) == (en, de)


@pytest.mark.parametrize("det, noun, plural, adjective, case, negated, en, de", [
    ("a", "dog", False, "big", "nom", False, "a big dog", "ein großer Hund"),
    ("a", "dog", False, "big", "acc", False, "a big dog", "einen großen Hund"),
    ("a", "dog", False, "big", "dat", False, "a big dog", "einem großen Hund"),
    ("a", "dog", False, None, "acc", True, "a dog", "keinen Hund"),
    ("", "dog", True, "big", "acc", True, "big dogs", "keine großen Hunde"),
    ("the", "house", False, "old", "nom", False, "the old house", "das alte Haus"),
    ("a", "apple", False, None, "nom", False, "an apple", "ein Apfel"),
    ("this", "cat", True, None, "dat", False, "these cats", "diesen Katzen"),
    ("our", "child", True, "tired", "dat", False, "our tired children", "unseren müden Kindern"),
    ("her", "book", False, "red", "nom", False, "her red book", "ihr rotes Buch"),
    ("the", "student", False, None, "acc", False, "the student", "den Studenten"),
    ("321", "cow", True, "black", "acc", False, "three hundred twenty-one black cows",
     "dreihunderteinundzwanzig schwarze Kühe"),
])
def test_noun_phrase_agreement(det, noun, plural, adjective, case, negated, en, de) -> None:
    phrase = NounPhrase(_noun(noun), plural, det, _adjective(adjective) if adjective else None)
    assert phrase.en() == en
    assert phrase.de(case, negated=negated) == de


def _clause(verb, tense: str, **fields) -> Clause:
    values = dict(subject_en="the man", subject_de="der Mann", person="3sg", verb=verb, tense=tense, modal=None,
                  negated=False, rest_en=["the dog"], middle_de=["den Hund"])
    return Clause(**{**values, **fields})


def test_word_order_in_main_subordinate_and_question_clauses() -> None:
    perfect = _clause(_verb("see"), "perfect", time_en="today", time_de="heute")
    assert " ".join(english(perfect)) == "the man has seen the dog today"
    assert " ".join(german_main(perfect)) == "der Mann hat heute den Hund gesehen"
    assert " ".join(german_main(perfect, with_time=False, fronted=True)) == "hat der Mann den Hund gesehen"
    assert " ".join(german_sub(perfect)) == "der Mann heute den Hund gesehen hat"
    separable = _clause(_verb("call"), "present", rest_en=["the doctor"], middle_de=["den Arzt"])
    assert " ".join(german_main(separable)) == "der Mann ruft den Arzt an"
    assert " ".join(german_sub(separable)) == "der Mann den Arzt anruft"
    assert " ".join(english(separable, question=True)) == "does the man call the doctor"
    assert " ".join(german_question(separable)) == "ruft der Mann den Arzt an"
    motion = _clause(_verb("go"), "perfect", person="1pl", subject_en="we", subject_de="wir", negated=True,
                     rest_en=["into the garden"], middle_de=["nicht", "in den Garten"])
    assert " ".join(english(motion)) == "we have not gone into the garden"
    assert " ".join(german_sub(motion)) == "wir nicht in den Garten gegangen sind"
    copula = _clause(BE, "past", person="3pl", subject_en="the dogs", subject_de="die Hunde", rest_en=["tired"],
                     middle_de=["müde"])
    assert " ".join(english(copula, question=True)) == "were the dogs tired"
    assert " ".join(german_question(copula)) == "waren die Hunde müde"


def test_sentences_are_deterministic_short_and_one_to_one() -> None:
    pairs = sample_pairs(3000, seed=7)
    assert pairs == sample_pairs(3000, seed=7)
    assert pairs != sample_pairs(3000, seed=8)
    assert len({en for en, _ in pairs}) == len(pairs)
    assert all(2 <= len(en.split()) <= 20 and len(de.split()) <= 20 for en, de in pairs)
    assert all(en[0].isupper() and en[-1] in ".?" and de[-1] == en[-1] for en, de in pairs)
    german = " ".join(de for _, de in pairs)
    for feature in (", dass ", ", weil ", ", ob ", "Wenn ", "Als ", " nicht", " kein", " um halb ", " am ",
                    "und", " ins ", " zum "):
        assert feature in german, feature


def test_splits_are_disjoint() -> None:
    splits = demo_splits(DemoSource(pairs=2000, valid=200, test=200, seed=3))
    assert [len(splits[s]) for s in ("train", "valid", "test")] == [2000, 200, 200]
    train = {en for en, _ in splits["train"]}
    valid = {en for en, _ in splits["valid"]}
    test = {en for en, _ in splits["test"]}
    assert not train & valid and not train & test and not valid & test


@pytest.mark.slow
def test_at_least_200k_distinct_pairs() -> None:
    assert len(sample_pairs(200_000, seed=1)) == 200_000
