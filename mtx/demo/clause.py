"""A clause's parts in both languages, and the words each language orders them into.

The grammar (mtx.demo.grammar) draws what a clause says; this module only decides where each word goes, with
no random draws, so every word-order rule can be checked on a hand-built clause (tests/test_demo.py). English
keeps subject–verb–object order and needs "do" for negation and questions; German puts the finite verb second
in main clauses, first in questions and last in subordinate clauses, with the rest of the verb group (a
participle, an infinitive, a separable prefix) at the end of the main clause: the verb bracket.
"""

from __future__ import annotations

from dataclasses import dataclass

from mtx.demo.lexicon import BE, HAVE, Modal, Verb


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


def english(c: Clause, question: bool = False, with_time: bool = True) -> list[str]:
    """Subject, verb group, the rest, then the time; a question puts the auxiliary before the subject."""
    aux, main = _english_verb_group(c, question)
    subject = [c.subject_en]
    words = [*aux, *subject, *main, *c.rest_en] if question else [*subject, *aux, *main, *c.rest_en]
    return words + ([c.time_en] if with_time and c.time_en else [])


def german_main(c: Clause, with_time: bool = True, fronted: bool = False) -> list[str]:
    """Verb second: subject first, or right after a fronted adverbial or clause (`fronted`)."""
    finite, right, _ = _german_verbs(c)
    time = [c.time_de] if with_time and c.time_de else []
    if fronted:
        return [finite, c.subject_de, *time, *c.middle_de, *right]
    return [c.subject_de, finite, *time, *c.middle_de, *right]


def german_question(c: Clause) -> list[str]:
    """Verb first: "Ruft der Mann den Arzt an?"."""
    finite, right, _ = _german_verbs(c)
    return [finite, c.subject_de, *([c.time_de] if c.time_de else []), *c.middle_de, *right]


def german_sub(c: Clause) -> list[str]:
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
