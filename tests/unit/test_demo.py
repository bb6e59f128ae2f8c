"""The generated English→German demo corpus: deterministic, disjoint splits, and German that is right."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console

from mtx.analysis.aer import read_gold
from mtx.config.data import DemoSource
from mtx.config.loading import load_recipe
from mtx.data.demo import demo_splits, sample_pairs
from mtx.data.demo.clause import Clause, english, german_main, german_question, german_sub
from mtx.data.demo.lexicon import (
    ADJECTIVES,
    BE,
    NOUNS,
    VERBS,
    NounPhrase,
    number_de,
    number_en,
    ordinal_de,
    ordinal_en,
    prepositional,
)
from mtx.data.demo.words import Phrase, Word, gold_alignment
from mtx.data.prepare import prepare


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
    pairs = [(pair.en, pair.de) for pair in sample_pairs(3000, seed=7)]
    assert pairs == [(pair.en, pair.de) for pair in sample_pairs(3000, seed=7)]
    assert pairs != [(pair.en, pair.de) for pair in sample_pairs(3000, seed=8)]
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
    train, valid, test = ({pair.en for pair in splits[split]} for split in ("train", "valid", "test"))
    assert not train & valid and not train & test and not valid & test


@pytest.mark.slow
def test_at_least_200k_distinct_pairs() -> None:
    assert len(sample_pairs(200_000, seed=1)) == 200_000


# ------------------------------------------------------------------------------------- gold alignments


def _phrase(*parts: tuple[str, str]) -> Phrase:
    return Phrase.parts(*parts)


def test_gold_links_of_a_separable_verb_and_of_do_support() -> None:
    """"calls" is both parts of "ruft … an"; a question's "does" is a possible link of the finite verb."""
    man, doctor = _phrase(("the", "der"), ("man", "Mann")), _phrase(("the", "den"), ("doctor", "Arzt"))
    clause = Clause(man.en, man.de, "3sg", _verb("call"), "present", None, False, doctor.en, doctor.de)
    # the(0) man(1) calls(2) the(3) doctor(4) → der(0) Mann(1) ruft(2) den(3) Arzt(4) an(5)
    assert gold_alignment(english(clause), german_main(clause)) == "0-0 1-1 2-2 3-3 4-4 2-5"
    # does(0) the(1) man(2) call(3) the(4) doctor(5) → ruft(0) der(1) Mann(2) den(3) Arzt(4) an(5)
    assert gold_alignment(english(clause, question=True), german_question(clause)) == "0p0 3-0 1-1 2-2 4-3 5-4 3-5"
    pick_up = Clause(man.en, man.de, "3sg", _verb("pick up"), "present", None, False, [], [])
    # the(0) man(1) picks(2) up(3) → der(0) Mann(1) holt(2) ab(3); verb last: abholt ← picks up
    assert gold_alignment(english(pick_up), german_main(pick_up)) == "0-0 1-1 2-2 3-3"
    assert gold_alignment(english(pick_up), german_sub(pick_up)) == "0-0 1-1 2-2 3-2"


def test_gold_links_of_a_verb_final_clause_with_negation() -> None:
    """we(0) have(1) not(2) gone(3) into(4) the(5) garden(6) → wir(0) nicht(1) in(2) den(3) Garten(4)
    gegangen(5) sind(6): the participle and the auxiliary swap places and keep their links."""
    we = _phrase(("we", "wir"))
    clause = Clause(we.en, we.de, "1pl", _verb("go"), "perfect", None, True, [], [])
    clause.middle_de.append(Word("nicht", [clause.not_en]))
    garden = prepositional("into", "in", NounPhrase(_noun("garden"), False, "the").aligned("acc"))
    clause.rest_en += garden.en
    clause.middle_de += garden.de
    assert " ".join(german_sub(clause)) == "wir nicht in den Garten gegangen sind"
    assert gold_alignment(english(clause), german_sub(clause)) == "0-0 2-1 4-2 5-3 6-4 3-5 1-6"


def test_gold_links_of_numbers_contractions_and_kein() -> None:
    cows = NounPhrase(_noun("cow"), True, "321", _adjective("black")).aligned("acc")
    assert " ".join(cows.de) == "dreihunderteinundzwanzig schwarze Kühe"
    assert gold_alignment(cows.en, cows.de) == "0-0 1-0 2-0 3-1 4-2"  # the compound ← three hundred twenty-one
    garden = prepositional("in", "in", NounPhrase(_noun("garden"), False, "the").aligned("dat"))
    assert (" ".join(garden.de), gold_alignment(garden.en, garden.de)) == ("im Garten", "0-0 1-0 2-1")
    not_ = Word("not")
    dog = NounPhrase(_noun("dog"), False, "a").aligned("acc", negation=not_)
    assert (" ".join(dog.de), gold_alignment([not_, *dog.en], dog.de)) == ("keinen Hund", "0-0 1-0 2-1")


def test_gold_alignment_of_a_generated_sentence() -> None:
    """Checked by hand: a fronted "when" clause (verb last), then verb first, and "holten … ab" ← "picked up"."""
    pair = sample_pairs(7, seed=5)[6]
    assert pair.en == ("When the quiet boy heard our friend next to our good school, girls picked up this table "
                       "without our student.")
    assert pair.de == ("Als der leise Junge unseren Freund neben unserer guten Schule hörte, holten Mädchen diesen "
                       "Tisch ohne unseren Studenten ab.")
    assert pair.alignment == ("0-0 1-1 2-2 3-3 5-4 6-5 7-6 8-6 9-7 10-8 11-9 4-10 13-11 12-12 15-13 16-14 17-15 "
                              "18-16 19-17 14-18")


def test_every_german_word_is_linked_within_both_sentences() -> None:
    pairs = sample_pairs(3000, seed=7)
    for pair in pairs:
        gold = read_gold(pair.alignment)
        en_words, de_words = len(pair.en.split()), len(pair.de.split())
        assert all(0 <= i < en_words and 0 <= j < de_words for i, j in gold.possible), pair
        assert {j for _, j in gold.possible} == set(range(de_words)), pair  # no German word from nothing
    links = " ".join(p.alignment for p in pairs)
    assert "p" in links  # possible links occur: "do", "to", clock times


def test_prepare_writes_gold_alignments_line_by_line(tmp_path: Path) -> None:
    recipe = {"name": "demo", "run_dir": str(tmp_path / "run"), "data": {
        "source": {"demo": {"pairs": 300, "valid": 20, "test": 30, "seed": 4}}, "bpe": {"vocab_size": 400}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    data = tmp_path / "run" / "data"
    held_out = demo_splits(DemoSource(pairs=300, valid=20, test=30, seed=4))
    for split in ("valid", "test"):
        lines = [(data / f"{split}.{lang}").read_text(encoding="utf-8").splitlines() for lang in ("en", "de", "align")]
        assert list(zip(*lines, strict=True)) == [(pair.en, pair.de, pair.alignment) for pair in held_out[split]]
    assert not (data / "train.align").exists()


def test_the_module_writes_the_corpus_and_monolingual_text_apart_from_it(tmp_path) -> None:
    """`python -m mtx.data.demo OUT/`: the splits `data.source.demo` reads, as files, and monolingual German
    that translates none of their English sentences (so no test reference leaks into back-translation)."""
    from mtx.data.demo.__main__ import main

    main([str(tmp_path), "--pairs", "200", "--valid", "20", "--test", "30", "--monolingual", "300"])
    splits = demo_splits(DemoSource(pairs=200, valid=20, test=30))
    for split, pairs in splits.items():
        for side in ("en", "de"):
            assert (tmp_path / f"{split}.{side}").read_text(encoding="utf-8").splitlines() == [
                getattr(pair, side) for pair in pairs]
    mono = (tmp_path / "mono.de").read_text(encoding="utf-8").splitlines()
    parallel_german = {pair.de for pairs in splits.values() for pair in pairs}
    assert len(mono) == len(set(mono)) == 300 and not set(mono) & parallel_german
