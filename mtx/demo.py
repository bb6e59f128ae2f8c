"""The built-in demo corpus: English→German pairs generated from a small grammar, offline and deterministic.

It exists so that `mtx prepare recipes/demo.yaml && mtx train recipes/demo.yaml` shows real translation on a
laptop in minutes. The grammar is small (60 nouns, 20 adjectives, 50 verbs, in mtx.demo_lexicon) but German
makes a tiny model work for it, the way it makes a big one work on WMT:

- agreement: determiners and adjective endings follow gender, number and case ("ein großer Hund",
  "einen großen Hund", "mit einem großen Hund", "keine großen Hunde"); weak nouns ("den Studenten");
- case: accusative and dative objects, dative verbs ("hilft dem Mann"), two-way prepositions
  ("im Garten" vs "in den Garten"), contractions (im, ins, am, zum, zur);
- word order: V2 after a fronted adverbial ("Heute sieht der Mann …"), verb-final subordinate clauses
  ("…, dass der Mann den Hund gesehen hat"), a clause-first main clause ("Wenn …, liest …"), verb-first
  questions, separable verbs ("ruft den Arzt an"), the verb bracket of perfect and modal tenses;
- negation with "nicht" or "kein";
- numbers written as German compounds with the units before the tens ("dreihunderteinundzwanzig"),
  ordinal dates ("am einundzwanzigsten Juni") and clock times ("um halb acht" = "at half past seven").

Every English sentence has exactly one German translation, so a model can learn it to near-perfect BLEU.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from typing import Any

from mtx.config import DemoSource
from mtx.demo_lexicon import (
    ADJECTIVES,
    BE,
    DAYS,
    HAVE,
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
    Verb,
    number_de,
    number_en,
    ordinal_de,
    ordinal_en,
    preposition,
)
from mtx.errors import MtxError

# ----------------------------------------------------------------------------------------- the grammar


@dataclass
class Clause:
    """A clause's parts in both languages; the sentence decides the German word order."""

    subject_en: str
    subject_de: str
    person: str  # 1sg, 3sg, 1pl, 3pl
    verb: Verb
    tense: str  # present, past, perfect
    modal: Modal | None
    negated: bool
    rest_en: list[str]  # after the verb group: objects, predicate, prepositional phrases
    middle_de: list[str]  # German middle field after the subject: objects, nicht, predicate, phrases
    time_en: str = ""
    time_de: str = ""


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
                en = f"{clause.time_en} " + " ".join(self.english(clause, with_time=False))
                de = f"{clause.time_de} " + " ".join(self.german_main(clause, with_time=False, fronted=True))
            else:
                en, de = " ".join(self.english(clause)), " ".join(self.german_main(clause))
            return _finish(en, "."), _finish(de, ".")
        if kind < 0.52:
            clause = self.clause(time=True, question=True)
            return _finish(" ".join(self.english(clause, question=True)), "?"), \
                _finish(" ".join(self.german_question(clause)), "?")
        if kind < 0.68:
            return self.reported()
        if kind < 0.84:
            main, reason = self.clause(time=True), self.clause(time=False)
            en = " ".join(self.english(main)) + " because " + " ".join(self.english(reason))
            de = " ".join(self.german_main(main)) + ", weil " + " ".join(self.german_sub(reason))
            return _finish(en, "."), _finish(de, ".")
        tense = self.pick(["present", "past"])
        condition, main = self.clause(time=False, tense=tense), self.clause(time=False, tense=tense)
        en = "when " + " ".join(self.english(condition)) + ", " + " ".join(self.english(main))
        conj = "wenn" if tense == "present" else "als"
        de = f"{conj} " + " ".join(self.german_sub(condition)) + ", " + " ".join(
            self.german_main(main, fronted=True))
        return _finish(en, "."), _finish(de, ".")

    def reported(self) -> tuple[str, str]:
        """"She says that …" → "Sie sagt, dass …"; "I do not know whether …" → "Ich weiß nicht, ob …"."""
        subject_en, subject_de, person = self.subject("person", short=True)
        inner = self.clause(time=self.chance(0.3))
        if self.chance(0.2):
            verb = SAYING[1]
            tense = self.pick(["present", "past"])
            main = Clause(subject_en, subject_de, person, verb, tense, None, True, [], ["nicht"])
            en = " ".join(self.english(main)) + " whether " + " ".join(self.english(inner))
            de = " ".join(self.german_main(main)) + ", ob " + " ".join(self.german_sub(inner))
        else:
            verb = self.pick(SAYING)
            main = Clause(subject_en, subject_de, person, verb, self.pick(["present", "past"]), None, False, [], [])
            en = " ".join(self.english(main)) + " that " + " ".join(self.english(inner))
            de = " ".join(self.german_main(main)) + ", dass " + " ".join(self.german_sub(inner))
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

    # ------------------------------------------------------------------------------------ English

    def english(self, c: Clause, question: bool = False, with_time: bool = True) -> list[str]:
        aux, main = _english_verb_group(c, question)
        subject = [c.subject_en]
        words = [*aux, *subject, *main, *c.rest_en] if question else [*subject, *aux, *main, *c.rest_en]
        return words + ([c.time_en] if with_time and c.time_en else [])

    # ------------------------------------------------------------------------------------ German

    def german_main(self, c: Clause, with_time: bool = True, fronted: bool = False) -> list[str]:
        """Verb second: subject first, or right after a fronted adverbial or clause (`fronted`)."""
        finite, right, _ = _german_verbs(c)
        time = [c.time_de] if with_time and c.time_de else []
        if fronted:
            return [finite, c.subject_de, *time, *c.middle_de, *right]
        return [c.subject_de, finite, *time, *c.middle_de, *right]

    def german_question(self, c: Clause) -> list[str]:
        finite, right, _ = _german_verbs(c)
        return [finite, c.subject_de, *([c.time_de] if c.time_de else []), *c.middle_de, *right]

    def german_sub(self, c: Clause) -> list[str]:
        """Verb last: "…, dass der Mann den Hund gesehen hat"."""
        _, _, final = _german_verbs(c)
        return [c.subject_de, *([c.time_de] if c.time_de else []), *c.middle_de, *final]


def _english_verb_group(c: Clause, question: bool) -> tuple[list[str], list[str]]:
    """(auxiliary, the rest of the verb group). Negation and questions need an auxiliary, so a verb without
    one gets "do" ("sees" → "does not see", "does … see?"); a question puts the auxiliary first."""
    base, third, past, participle = c.verb.en
    third_person = c.person == "3sg"
    not_ = ["not"] if c.negated else []
    do = ["did" if c.tense == "past" else "does" if third_person else "do"]
    if c.verb is BE:
        if c.modal:
            return [_modal_en(c.modal, c.tense)], [*not_, "be"]
        if c.tense == "perfect":
            return ["has" if third_person else "have"], [*not_, "been"]
        form = {"present": {"1sg": "am", "3sg": "is"}, "past": {"1sg": "was", "3sg": "was"}}[c.tense]
        return [form.get(c.person, "are" if c.tense == "present" else "were")], not_
    if c.modal:
        if c.modal.en[0] == "want to":
            if c.negated or question:
                return do, [*not_, "want", "to", base]
            return [], [("wanted" if c.tense == "past" else "wants" if third_person else "want"), "to", base]
        return [_modal_en(c.modal, c.tense)], [*not_, base]
    if c.tense == "perfect":
        return ["has" if third_person else "have"], [*not_, participle]
    if c.negated or question:
        return do, [*not_, base]
    return [], [past if c.tense == "past" else third if third_person else base]


def _modal_en(modal: Modal, tense: str) -> str:
    return modal.en[1] if tense == "past" else modal.en[0]


def _german_verbs(c: Clause) -> tuple[str, list[str], list[str]]:
    """(finite verb for verb-second order, the verb bracket's right side, the verb-final cluster)."""
    verb, person = c.verb, c.person
    if c.modal:
        singular = person.endswith("sg")
        finite = c.modal.de[2] + ("" if singular else "n") if c.tense == "past" else c.modal.de[0 if singular else 1]
        infinitive = "sein" if verb is BE else verb.de[0]
        return finite, [infinitive], [infinitive, finite]
    if c.tense == "perfect":
        aux = _present(BE if verb.aux == "sein" else HAVE, person)
        return aux, [verb.de[3]], [verb.de[3], aux]
    finite = _present(verb, person) if c.tense == "present" else verb.de_past(person)
    if verb.prefix:
        return finite, [verb.prefix], [verb.prefix + finite]
    return finite, [], [finite]


def _present(verb: Verb, person: str) -> str:
    if verb is BE:
        return {"1sg": "bin", "3sg": "ist"}.get(person, "sind")
    return verb.de_present(person)


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


# ------------------------------------------------------------------------------------------------ corpus

MAX_WORDS = 20  # longer sentences are drawn again: the demo must train in minutes


def sample_pairs(count: int, seed: int, exclude: set[str] = frozenset()) -> list[tuple[str, str]]:
    """`count` distinct pairs whose English is not in `exclude`; each English sentence maps to one German."""
    grammar = Grammar(seed)
    seen: set[str] = set(exclude)
    pairs = []
    attempts = 0
    while len(pairs) < count:
        attempts += 1
        if attempts > 20 * count + 1000:
            raise MtxError(f"data.source.demo: the demo grammar could not draw {count:,} distinct sentences; "
                           "ask for fewer pairs.")
        en, de = grammar.sentence()
        if en in seen or len(en.split()) > MAX_WORDS or len(de.split()) > MAX_WORDS:
            continue
        seen.add(en)
        pairs.append((en, de))
    return pairs


def demo_splits(config: DemoSource) -> dict[str, list[tuple[str, str]]]:
    """Train, valid and test, with no English sentence in more than one of them."""
    held_out = sample_pairs(config.valid + config.test, config.seed + 1_000_003)
    valid, test = held_out[: config.valid], held_out[config.valid :]
    train = sample_pairs(config.pairs, config.seed, exclude={en for en, _ in held_out})
    return {"train": train, "valid": valid, "test": test}
