"""Words that know their translation: the demo's gold word alignment is built with its sentences.

A German word of the demo holds the English words it translates. The grammar makes both sentences from the same
parts (a noun phrase, a verb group, a time), so it knows these links without guessing, and the word-order
rules of mtx.data.demo.clause move the words and their links together. Links are of the two kinds of Och & Ney's
gold alignments (2003, "A Systematic Comparison of Various Statistical Alignment Models"): sure, where an
annotator would not hesitate, and possible, where the correspondence is real but loose. The choices:

- a phrase translated as a whole links every word of it to every word of its translation, sure: a German
  number compound to all of the English number's words ("dreihunderteinundzwanzig" ← "three hundred
  twenty-one"), a contraction to the preposition and the article ("im" ← "in the"), a preposition to all of
  its English words ("vor" ← "in front of"), a verb to all of a phrasal verb's words ("sucht" ← "looks for");
- a separable verb's two parts both translate the English verb ("ruft … an" ← "calls"), and with an English
  particle, each part its own word ("holt … ab" ← "picks up");
- "nicht" translates "not"; "kein" translates "not" and the "a" it replaces ("keinen Hund" ← "not … a dog");
- English "do" in negations and questions has no German word of its own: it carries the tense and person that
  German puts on the finite verb, so it is a possible link of that verb; so is the "to" of "want to" for
  the German infinitive;
- where German says it differently, the words are possible links: "um halb acht" ← "at half past seven" links
  "halb" to "half" sure, and to "past", and "acht" to "seven", possible; the "Uhr" of "um sieben Uhr zwanzig"
  ← "at seven twenty" is a possible link of the hour;
- English words with no German counterpart are left unaligned: the "of" of a date ("on the first of May" →
  "am ersten Mai").

Word indices count the whitespace-separated words of the sentences as the corpus writes them, punctuation
attached ("sagt," and "Hund." are one word each). The Pharaoh line lists sure links as "i-j" and possible
ones as "ipj" (English word i, German word j, 0-based), the convention of the alignment-scripts of Zenkel et
al. (2019); mtx.analysis.aer reads it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class AlignedPair:
    """A demo sentence pair and the words it is made of, which know their gold word alignment. The alignment
    line is made only when asked for: the training split, most of the corpus, never needs it."""

    en: str
    de: str
    en_words: list[Word]
    de_words: list[Word]

    @property
    def alignment(self) -> str:
        """The gold word alignment, a Pharaoh line (English → German)."""
        return gold_alignment(self.en_words, self.de_words)


class Word(str):
    """A word of a demo sentence: a string, so the sentence is the words joined; a German word also holds
    the English words it translates (`sure`) and those it loosely corresponds to (`possible`).

    English words are told apart by identity, not by spelling: a sentence may hold "the" twice.
    """

    sure: tuple[Word, ...]
    possible: tuple[Word, ...]

    def __new__(cls, text: str, sure: Iterable[Word] = (), possible: Iterable[Word] = ()) -> Word:
        word = super().__new__(cls, text)
        word.sure, word.possible = tuple(sure), tuple(possible)
        return word


def english_words(text: str) -> list[Word]:
    """The words of an English phrase, each its own word for German ones to link to."""
    return [Word(w) for w in text.split()]


def translating(text: str, sure: Sequence[Word] = (), possible: Sequence[Word] = ()) -> list[Word]:
    """The words of a German phrase that translates `sure` as a whole: each of its words links to each."""
    return [Word(w, sure, possible) for w in text.split()]


@dataclass
class Phrase:
    """A phrase in both languages, its German words linked to its English ones."""

    en: list[Word]
    de: list[Word]

    @classmethod
    def parts(cls, *parts: tuple[str, str]) -> Phrase:
        """(English, German) parts in the same order in both languages, each part's German words translating
        its English words as a whole; an empty side is a word with no counterpart."""
        en: list[Word] = []
        de: list[Word] = []
        for en_text, de_text in parts:
            words = english_words(en_text)
            en += words
            de += translating(de_text, words)
        return cls(en, de)

    def __add__(self, other: Phrase) -> Phrase:
        return Phrase(self.en + other.en, self.de + other.de)


def gold_alignment(en: Sequence[Word], de: Sequence[Word]) -> str:
    """The links of the German words `de` to the English words `en` as a Pharaoh line: "i-j" for a sure link,
    "ipj" for a possible one, in German word order, then English."""
    position = {id(word): i for i, word in enumerate(en)}
    if len(position) != len(en):
        raise ValueError("an English word object occurs twice in the sentence: its links would be ambiguous")
    links = set()
    for j, word in enumerate(de):
        links |= {(j, position[id(e)], "-") for e in word.sure}
        links |= {(j, position[id(e)], "p") for e in word.possible}
    return " ".join(f"{i}{kind}{j}" for j, i, kind in sorted(links))
