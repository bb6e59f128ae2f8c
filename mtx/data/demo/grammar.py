"""The demo grammar: what each sentence says, drawn from one seeded random source (mtx.data.demo.clause orders it).

Every choice — sentence shape, tense, words, numbers, times — is one draw from the same `random.Random`, in a
fixed order, so a seed always gives the same corpus: changing the order of the draws changes every sentence
after it. Each sentence pair comes with its gold word alignment (mtx.data.demo.words), made from the same parts.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from mtx.data.demo.clause import Clause, english, german_main, german_question, german_sub
from mtx.data.demo.lexicon import (
    ADJECTIVES,
    BE,
    DAYS,
    MODALS,
    MONTHS,
    NOUNS,
    PRONOUNS,
    SAYING,
    VERBS,
    Adjective,
    Modal,
    Noun,
    NounPhrase,
    number_de,
    number_en,
    ordinal_de,
    ordinal_en,
    prepositional,
)
from mtx.data.demo.words import AlignedPair, Phrase, Word, english_words, translating


class Grammar:
    """Draws sentences from a seeded random source: the same seed gives the same corpus."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, items: list) -> Any:
        return self.rng.choice(items)

    # ---------------------------------------------------------------------------------- sentences

    def sentence(self) -> AlignedPair:
        kind = self.rng.random()
        if kind < 0.42:
            clause = self.clause(time=True)
            if clause.time_de and self.chance(0.5):  # fronted adverbial: the verb stays second
                en = [*clause.time_en, *english(clause, with_time=False)]
                de = [*clause.time_de, *german_main(clause, with_time=False, fronted=True)]
            else:
                en, de = english(clause), german_main(clause)
            return _finish([en], [de], ".")
        if kind < 0.52:
            clause = self.clause(time=True, question=True)
            return _finish([english(clause, question=True)], [german_question(clause)], "?")
        if kind < 0.68:
            return self.reported()
        if kind < 0.84:
            main, reason = self.clause(time=True), self.clause(time=False)
            because = english_words("because")
            return _finish([[*english(main), *because, *english(reason)]],
                           [german_main(main), [*translating("weil", because), *german_sub(reason)]], ".")
        tense = self.pick(["present", "past"])
        condition, main = self.clause(time=False, tense=tense), self.clause(time=False, tense=tense)
        when = english_words("when")
        conj = translating("wenn" if tense == "present" else "als", when)
        return _finish([[*when, *english(condition)], english(main)],
                       [[*conj, *german_sub(condition)], german_main(main, fronted=True)], ".")

    def reported(self) -> AlignedPair:
        """"She says that …" → "Sie sagt, dass …"; "I do not know whether …" → "Ich weiß nicht, ob …"."""
        subject, person = self.subject("person", short=True)
        inner = self.clause(time=self.chance(0.3))
        if self.chance(0.2):
            verb = SAYING[1]
            tense = self.pick(["present", "past"])
            main = Clause(subject.en, subject.de, person, verb, tense, None, True, [], [])
            main.middle_de.append(Word("nicht", [main.not_en]))
            conjunction = english_words("whether")
            de_conjunction = translating("ob", conjunction)
        else:
            verb = self.pick(SAYING)
            main = Clause(subject.en, subject.de, person, verb, self.pick(["present", "past"]), None, False, [], [])
            conjunction = english_words("that")
            de_conjunction = translating("dass", conjunction)
        return _finish([[*english(main), *conjunction, *english(inner)]],
                       [german_main(main), [*de_conjunction, *german_sub(inner)]], ".")

    # ------------------------------------------------------------------------------------ clauses

    def clause(self, time: bool, tense: str | None = None, question: bool = False) -> Clause:
        tense = tense or self.pick(["present", "present", "past", "past", "perfect", "modal"])
        modal = self.pick(MODALS) if tense == "modal" else None
        if modal:
            tense = self.pick(["present", "past"])
        negated = not question and self.chance(0.25) and not (modal and modal.de[0] == "muss")
        kind = self.rng.random()
        if kind < 0.15 and not (modal and modal.en[0] == "want to"):
            clause = self.copula(tense, modal, negated)
        else:
            clause = self.action(tense, modal, negated)
        if time and self.chance(0.35):
            adverbial = self.time(tense if not modal else "modal-" + tense)
            clause.time_en, clause.time_de = adverbial.en, adverbial.de
        return clause

    def subject(self, kinds: str, short: bool = False) -> tuple[Phrase, str]:
        """(the subject in English and German nominative, its person): a pronoun or a noun phrase."""
        if kinds != "any" and "person" in _kinds(kinds) and self.chance(0.3):
            en, de, person = self.pick(PRONOUNS)
            return Phrase.parts((en, de)), person
        phrase = self.noun_phrase(kinds, numbers=False, adjective=not short)
        return phrase.aligned("nom"), phrase.person

    def action(self, tense: str, modal: Modal | None, negated: bool) -> Clause:
        verb = self.pick(VERBS)
        subject, person = self.subject(verb.subject)
        clause = Clause(subject.en, subject.de, person, verb, tense, modal, negated, [], [])
        kein = False
        if verb.frame == "dat+acc":
            recipients, things = verb.objects.split(";")
            recipient = self.noun_phrase(recipients, numbers=False)
            thing = self.noun_phrase(things, numbers=not negated)
            kein = negated and thing.negatable
            _add(clause, recipient.aligned("dat") + thing.aligned("acc", clause.not_en if kein else None))
        elif verb.frame in ("acc", "dat"):
            obj = self.noun_phrase(verb.objects, numbers=not negated and verb.frame == "acc")
            kein = negated and verb.frame == "acc" and obj.negatable
            _add(clause, obj.aligned(verb.frame, clause.not_en if kein else None))
        if negated and not kein:
            clause.middle_de.append(Word("nicht", [clause.not_en]))
        if verb.motion and self.chance(0.6):
            _add(clause, self.direction())
        elif self.chance(0.3):
            _add(clause, self.place())
        elif verb.subject == "person" and self.chance(0.2):
            _add(clause, self.company())
        return clause

    def copula(self, tense: str, modal: Modal | None, negated: bool) -> Clause:
        """"The dog is (not) tired / in the garden"; persons also "seven years old"."""
        kind = self.rng.random()
        if kind < 0.45:
            adjective = self.pick(ADJECTIVES)
            subject, person = self.subject(adjective.kinds)
            predicate = Phrase.parts((adjective.en, adjective.de))
        elif kind < 0.8:
            subject, person = self.subject("animate")
            predicate = self.place()
        else:
            subject, person = self.subject("person")
            age = self.rng.randint(2, 99)
            predicate = Phrase.parts((number_en(age), number_de(age)), ("years", "Jahre"), ("old", "alt"))
        clause = Clause(subject.en, subject.de, person, BE, tense, modal, negated, [], [])
        if negated:
            clause.middle_de.append(Word("nicht", [clause.not_en]))
        _add(clause, predicate)
        return clause

    # ------------------------------------------------------------------------------------ phrases

    def noun_phrase(self, kinds: str, numbers: bool, adjective: bool = True) -> NounPhrase:
        noun = self.pick(_nouns_of(kinds))
        plural = self.chance(0.3)
        if plural:
            dets = ["the", "the", "this", "my", "our", "his", "her", ""] + (["#"] * 4 if numbers else [])
        else:
            dets = ["the", "the", "the", "a", "a", "this", "my", "our", "his", "her"]
        det = self.pick(dets)
        if det == "#":
            det = str(self.quantity())
        chosen = self.adjective(noun) if adjective and self.chance(0.25) else None
        return NounPhrase(noun, plural, det, chosen)

    def adjective(self, noun: Noun) -> Adjective:
        return self.pick(_adjectives_for(noun))

    def quantity(self) -> int:
        """Mostly small numbers, some compounds up to the thousands (never x01: "hunderteins Hunde")."""
        while True:
            n = self.rng.choice([self.rng.randint(2, 12), self.rng.randint(13, 99), self.rng.randint(100, 999),
                                 self.rng.randint(1000, 9999)])
            if n < 100 or n % 100 != 1:
                return n

    def definite_phrase(self, kinds: str) -> NounPhrase:
        noun = self.pick(_nouns_of(kinds))
        det = self.pick(["the", "the", "the", "this", "my", "our", "his", "her"])
        chosen = self.adjective(noun) if self.chance(0.15) else None
        return NounPhrase(noun, self.chance(0.15), det, chosen)

    def place(self) -> Phrase:
        """Where something is: two-way prepositions with the dative."""
        en_prep, de_prep, kinds = self.pick([("in", "in", "enclosed"), ("behind", "hinter", "place,vehicle"),
                                             ("in front of", "vor", "place,vehicle"),
                                             ("next to", "neben", "place,vehicle,furniture"),
                                             ("under", "unter", "furniture,vehicle"), ("on", "auf", "furniture")])
        return prepositional(en_prep, de_prep, self.definite_phrase(kinds).aligned("dat"))

    def direction(self) -> Phrase:
        """Where something goes: "into" takes the accusative, "to" is zu with the dative."""
        en_prep, de_prep, case, kinds = self.pick([("into", "in", "acc", "enclosed"), ("to", "zu", "dat", "place"),
                                                   ("through", "durch", "acc", "through")])
        return prepositional(en_prep, de_prep, self.definite_phrase(kinds).aligned(case))

    def company(self) -> Phrase:
        en_prep, de_prep, case = self.pick([("with", "mit", "dat"), ("for", "für", "acc"), ("without", "ohne", "acc")])
        return prepositional(en_prep, de_prep, self.definite_phrase("person,animal").aligned(case))

    def time(self, tense: str) -> Phrase:
        """A time adverbial that fits the tense (no "yesterday" with the English perfect)."""
        if tense == "perfect":
            return Phrase.parts(("today", "heute"))
        options = ["day", "clock", "date", "part"]
        options.append("yesterday" if tense.endswith("past") else "tomorrow")
        if tense == "present":
            options += ["today", "every day"]
        choice = self.pick(options)
        if choice == "yesterday":
            return Phrase.parts(("yesterday", "gestern"))
        if choice == "tomorrow":
            return Phrase.parts(("tomorrow", "morgen"))
        if choice == "today":
            return Phrase.parts(("today", "heute"))
        if choice == "every day":
            return Phrase.parts(("every", "jeden"), ("day", "Tag"))
        if choice == "part":
            part = self.pick([("morning", "Morgen"), ("evening", "Abend"), ("afternoon", "Nachmittag")])
            return Phrase.parts(("in the", "am"), part)
        if choice == "day":
            return Phrase.parts(("on", "am"), self.pick(DAYS))
        if choice == "date":
            en, de, days = self.pick(MONTHS)
            day = self.rng.randint(1, days)
            return Phrase.parts(("on the", "am"), (ordinal_en(day), ordinal_de(day)), ("of", ""), (en, de))
        return self.clock()

    def clock(self) -> Phrase:
        """"at half past seven" = "um halb acht": German names the coming hour."""
        hour = self.rng.randint(1, 12)
        following = hour % 12 + 1
        style = self.rng.random()
        if style < 0.3:
            return Phrase.parts(("at", "um"), (number_en(hour), number_de(hour)), ("o'clock", "Uhr"))
        if style < 0.5:  # "halb acht" is half an hour before eight: "acht" and "past" are loose translations
            at, half, past, hour_en = english_words(f"at half past {number_en(hour)}")
            return Phrase([at, half, past, hour_en], [Word("um", [at]), Word("halb", [half], [past]),
                                                      Word(_hour_de(following), possible=[hour_en])])
        if style < 0.65:
            return Phrase.parts(("at", "um"), ("a quarter", "Viertel"), ("past", "nach"),
                                (number_en(hour), _hour_de(hour)))
        if style < 0.8:
            return Phrase.parts(("at", "um"), ("a quarter", "Viertel"), ("to", "vor"),
                                (number_en(following), _hour_de(following)))
        minute = self.pick([m for m in range(10, 60) if m not in (15, 30, 45)])
        at, hour_en, minute_en = english_words(f"at {number_en(hour)} {number_en(minute)}")
        return Phrase([at, hour_en, minute_en], [Word("um", [at]), Word(number_de(hour), [hour_en]),
                                                 Word("Uhr", possible=[hour_en]), Word(number_de(minute), [minute_en])])


def _add(clause: Clause, phrase: Phrase) -> None:
    """A phrase after the verb group in English and in the German middle field."""
    clause.rest_en += phrase.en
    clause.middle_de += phrase.de


def _hour_de(hour: int) -> str:
    return "eins" if hour == 1 else number_de(hour)


@cache
def _nouns_of(kinds: str) -> list[Noun]:
    return [n for n in NOUNS if n.kinds & _kinds(kinds)]


@cache
def _adjectives_for(noun: Noun) -> list[Adjective]:
    return [a for a in ADJECTIVES if _kinds(a.kinds) & noun.kinds]


@cache
def _kinds(kinds: str) -> frozenset[str]:
    wanted = set(kinds.split(","))
    if "animate" in wanted:
        wanted |= {"person", "animal"}
    if "any" in wanted:
        wanted |= {"person", "animal", "thing", "food", "place"}
    return frozenset(wanted)


def _finish(en: list[list[Word]], de: list[list[Word]], mark: str) -> AlignedPair:
    """The sentence pair from its clauses' words, joined by commas, capitalised and punctuated, and the gold
    alignment of its words (mtx.data.demo.words.Word): punctuation joins a word, so the words stay as many."""
    return AlignedPair(_written(en, mark), _written(de, mark), [w for clause in en for w in clause],
                       [w for clause in de for w in clause])


def _written(clauses: list[list[Word]], mark: str) -> str:
    text = ", ".join(" ".join(words) for words in clauses)
    return text[0].upper() + text[1:] + mark
