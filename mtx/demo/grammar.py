"""The demo grammar: what each sentence says, drawn from one seeded random source (mtx.demo.clause orders it).

Every choice — sentence shape, tense, words, numbers, times — is one draw from the same `random.Random`, in a
fixed order, so a seed always gives the same corpus: changing the order of the draws changes every sentence
after it.
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

from mtx.demo.clause import Clause, english, german_main, german_question, german_sub
from mtx.demo.lexicon import (
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
    preposition,
)


class Grammar:
    """Draws sentences from a seeded random source: the same seed gives the same corpus."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p

    def pick(self, items: list) -> Any:
        return self.rng.choice(items)

    # ---------------------------------------------------------------------------------- sentences

    def sentence(self) -> tuple[str, str]:
        kind = self.rng.random()
        if kind < 0.42:
            clause = self.clause(time=True)
            if clause.time_de and self.chance(0.5):  # fronted adverbial: the verb stays second
                en = f"{clause.time_en} " + " ".join(english(clause, with_time=False))
                de = f"{clause.time_de} " + " ".join(german_main(clause, with_time=False, fronted=True))
            else:
                en, de = " ".join(english(clause)), " ".join(german_main(clause))
            return _finish(en, "."), _finish(de, ".")
        if kind < 0.52:
            clause = self.clause(time=True, question=True)
            return _finish(" ".join(english(clause, question=True)), "?"), \
                _finish(" ".join(german_question(clause)), "?")
        if kind < 0.68:
            return self.reported()
        if kind < 0.84:
            main, reason = self.clause(time=True), self.clause(time=False)
            en = " ".join(english(main)) + " because " + " ".join(english(reason))
            de = " ".join(german_main(main)) + ", weil " + " ".join(german_sub(reason))
            return _finish(en, "."), _finish(de, ".")
        tense = self.pick(["present", "past"])
        condition, main = self.clause(time=False, tense=tense), self.clause(time=False, tense=tense)
        en = "when " + " ".join(english(condition)) + ", " + " ".join(english(main))
        conj = "wenn" if tense == "present" else "als"
        de = f"{conj} " + " ".join(german_sub(condition)) + ", " + " ".join(
            german_main(main, fronted=True))
        return _finish(en, "."), _finish(de, ".")

    def reported(self) -> tuple[str, str]:
        """"She says that …" → "Sie sagt, dass …"; "I do not know whether …" → "Ich weiß nicht, ob …"."""
        subject_en, subject_de, person = self.subject("person", short=True)
        inner = self.clause(time=self.chance(0.3))
        if self.chance(0.2):
            verb = SAYING[1]
            tense = self.pick(["present", "past"])
            main = Clause(subject_en, subject_de, person, verb, tense, None, True, [], ["nicht"])
            en = " ".join(english(main)) + " whether " + " ".join(english(inner))
            de = " ".join(german_main(main)) + ", ob " + " ".join(german_sub(inner))
        else:
            verb = self.pick(SAYING)
            main = Clause(subject_en, subject_de, person, verb, self.pick(["present", "past"]), None, False, [], [])
            en = " ".join(english(main)) + " that " + " ".join(english(inner))
            de = " ".join(german_main(main)) + ", dass " + " ".join(german_sub(inner))
        return _finish(en, "."), _finish(de, ".")

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
            clause.time_en, clause.time_de = self.time(tense if not modal else "modal-" + tense)
        return clause

    def subject(self, kinds: str, short: bool = False) -> tuple[str, str, str]:
        """(English, German nominative, person): a pronoun or a noun phrase."""
        if kinds != "any" and "person" in _kinds(kinds) and self.chance(0.3):
            return self.pick(PRONOUNS)
        phrase = self.noun_phrase(kinds, numbers=False, adjective=not short)
        return phrase.en(), phrase.de("nom"), phrase.person

    def action(self, tense: str, modal: Modal | None, negated: bool) -> Clause:
        verb = self.pick(VERBS)
        subject_en, subject_de, person = self.subject(verb.subject)
        rest_en: list[str] = []
        middle_de: list[str] = []
        kein = False
        if verb.frame == "dat+acc":
            recipients, things = verb.objects.split(";")
            recipient = self.noun_phrase(recipients, numbers=False)
            thing = self.noun_phrase(things, numbers=not negated)
            kein = negated and thing.negatable
            rest_en += [recipient.en(), thing.en()]
            middle_de += [recipient.de("dat"), thing.de("acc", negated=kein)]
        elif verb.frame in ("acc", "dat"):
            obj = self.noun_phrase(verb.objects, numbers=not negated and verb.frame == "acc")
            kein = negated and verb.frame == "acc" and obj.negatable
            rest_en.append(obj.en())
            middle_de.append(obj.de(verb.frame, negated=kein))
        if negated and not kein:
            middle_de.append("nicht")
        if verb.motion and self.chance(0.6):
            self.add(rest_en, middle_de, self.direction())
        elif self.chance(0.3):
            self.add(rest_en, middle_de, self.place())
        elif verb.subject == "person" and self.chance(0.2):
            self.add(rest_en, middle_de, self.company())
        return Clause(subject_en, subject_de, person, verb, tense, modal, negated, rest_en, middle_de)

    def copula(self, tense: str, modal: Modal | None, negated: bool) -> Clause:
        """"The dog is (not) tired / in the garden"; persons also "seven years old"."""
        kind = self.rng.random()
        if kind < 0.45:
            adjective = self.pick(ADJECTIVES)
            subject_en, subject_de, person = self.subject(adjective.kinds)
            rest_en, predicate = [adjective.en], [adjective.de]
        elif kind < 0.8:
            subject_en, subject_de, person = self.subject("animate")
            en, de = self.place()
            rest_en, predicate = [en], [de]
        else:
            subject_en, subject_de, person = self.subject("person")
            age = self.rng.randint(2, 99)
            rest_en, predicate = [f"{number_en(age)} years old"], [f"{number_de(age)} Jahre alt"]
        middle_de = (["nicht"] if negated else []) + predicate
        return Clause(subject_en, subject_de, person, BE, tense, modal, negated, rest_en, middle_de)

    def add(self, rest_en: list[str], middle_de: list[str], phrase: tuple[str, str]) -> None:
        rest_en.append(phrase[0])
        middle_de.append(phrase[1])

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

    def place(self) -> tuple[str, str]:
        """Where something is: two-way prepositions with the dative."""
        en_prep, de_prep, kinds = self.pick([("in", "in", "enclosed"), ("behind", "hinter", "place,vehicle"),
                                             ("in front of", "vor", "place,vehicle"),
                                             ("next to", "neben", "place,vehicle,furniture"),
                                             ("under", "unter", "furniture,vehicle"), ("on", "auf", "furniture")])
        phrase = self.definite_phrase(kinds)
        return f"{en_prep} {phrase.en()}", preposition(de_prep, phrase.de("dat"))

    def direction(self) -> tuple[str, str]:
        """Where something goes: "into" takes the accusative, "to" is zu with the dative."""
        en_prep, de_prep, case, kinds = self.pick([("into", "in", "acc", "enclosed"), ("to", "zu", "dat", "place"),
                                                   ("through", "durch", "acc", "through")])
        phrase = self.definite_phrase(kinds)
        return f"{en_prep} {phrase.en()}", preposition(de_prep, phrase.de(case))

    def company(self) -> tuple[str, str]:
        en_prep, de_prep, case = self.pick([("with", "mit", "dat"), ("for", "für", "acc"), ("without", "ohne", "acc")])
        phrase = self.definite_phrase("person,animal")
        return f"{en_prep} {phrase.en()}", preposition(de_prep, phrase.de(case))

    def time(self, tense: str) -> tuple[str, str]:
        """A time adverbial that fits the tense (no "yesterday" with the English perfect)."""
        if tense == "perfect":
            return "today", "heute"
        options = ["day", "clock", "date", "part"]
        options.append("yesterday" if tense.endswith("past") else "tomorrow")
        if tense == "present":
            options += ["today", "every day"]
        choice = self.pick(options)
        if choice == "yesterday":
            return "yesterday", "gestern"
        if choice == "tomorrow":
            return "tomorrow", "morgen"
        if choice == "today":
            return "today", "heute"
        if choice == "every day":
            return "every day", "jeden Tag"
        if choice == "part":
            return self.pick([("in the morning", "am Morgen"), ("in the evening", "am Abend"),
                              ("in the afternoon", "am Nachmittag")])
        if choice == "day":
            en, de = self.pick(DAYS)
            return f"on {en}", f"am {de}"
        if choice == "date":
            en, de, days = self.pick(MONTHS)
            day = self.rng.randint(1, days)
            return f"on the {ordinal_en(day)} of {en}", f"am {ordinal_de(day)} {de}"
        return self.clock()

    def clock(self) -> tuple[str, str]:
        """"at half past seven" = "um halb acht": German names the coming hour."""
        hour = self.rng.randint(1, 12)
        following = hour % 12 + 1
        style = self.rng.random()
        if style < 0.3:
            return f"at {number_en(hour)} o'clock", f"um {number_de(hour)} Uhr"
        if style < 0.5:
            return f"at half past {number_en(hour)}", f"um halb {_hour_de(following)}"
        if style < 0.65:
            return f"at a quarter past {number_en(hour)}", f"um Viertel nach {_hour_de(hour)}"
        if style < 0.8:
            return f"at a quarter to {number_en(following)}", f"um Viertel vor {_hour_de(following)}"
        minute = self.pick([m for m in range(10, 60) if m not in (15, 30, 45)])
        return f"at {number_en(hour)} {number_en(minute)}", f"um {number_de(hour)} Uhr {number_de(minute)}"


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


def _finish(text: str, mark: str) -> str:
    return text[0].upper() + text[1:] + mark
