"""A clause's parts in both languages, and the words each language orders them into.

The grammar (mtx.data.demo.grammar) draws what a clause says; this module only decides where each word goes, with
no random draws, so every word-order rule can be checked on a hand-built clause (tests/unit/test_demo.py). English
keeps subject–verb–object order and needs "do" for negation and questions; German puts the finite verb second
in main clauses, first in questions and last in subordinate clauses, with the rest of the verb group (a
participle, an infinitive, a separable prefix) at the end of the main clause: the verb bracket.

The words are mtx.data.demo.words.Word objects, each German one linked to the English words it translates, so the
gold alignment comes from these same rules: the verbs are made here, in both languages at once (`VerbGroup`),
and every word keeps its links wherever it is moved.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtx.data.demo.lexicon import BE, HAVE, Modal, Verb
from mtx.data.demo.words import Word, english_words


@dataclass
class Clause:
    """A clause's parts in both languages; the sentence decides the German word order.

    The grammar gives each part as words (mtx.data.demo.words), the German ones linked to the English ones they
    translate, so the order functions below move the links with the words. A hand-built clause may give the
    subject and the time as one string each, and the other parts' phrases as plain strings: its sentences
    read the same, and only the verbs have links.
    """

    subject_en: list[Word]
    subject_de: list[Word]
    person: str  # 1sg, 3sg, 1pl, 3pl
    verb: Verb
    tense: str  # present, past, perfect
    modal: Modal | None
    negated: bool
    rest_en: list[Word]  # after the verb group: objects, predicate, prepositional phrases
    middle_de: list[Word]  # German middle field after the subject: objects, nicht, predicate, phrases
    time_en: list[Word] = field(default_factory=list)
    time_de: list[Word] = field(default_factory=list)
    not_en: Word = field(default_factory=lambda: Word("not"), init=False)  # "nicht" and "kein" translate it
    _verb_groups: dict[bool, VerbGroup] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("subject_en", "subject_de", "time_en", "time_de"):
            if isinstance(value := getattr(self, name), str):
                setattr(self, name, [Word(value)] if value else [])

    def verb_group(self, question: bool) -> VerbGroup:
        """The verb group of a statement or of a question, built once per clause, so that the English
        verbs that `english` orders are the very words that the German verbs of the other order functions
        link to."""
        if question not in self._verb_groups:
            self._verb_groups[question] = _verb_group(self, question)
        return self._verb_groups[question]


@dataclass(frozen=True)
class VerbGroup:
    """A clause's verbs in both languages, the German ones linked to the English ones they translate."""

    aux_en: list[Word]  # the English auxiliary, which a question puts before the subject
    main_en: list[Word]  # the rest of the English verb group: "not", the main verb, an infinitive
    finite_de: Word  # the German finite verb, second in main clauses and first in questions
    right_de: list[Word]  # the verb bracket's right side: a participle, an infinitive, a separable prefix
    final_de: list[Word]  # the verb-final cluster of a subordinate clause


def english(c: Clause, question: bool = False, with_time: bool = True) -> list[Word]:
    """Subject, verb group, the rest, then the time; a question puts the auxiliary before the subject."""
    verbs = c.verb_group(question)
    if question:
        words = [*verbs.aux_en, *c.subject_en, *verbs.main_en, *c.rest_en]
    else:
        words = [*c.subject_en, *verbs.aux_en, *verbs.main_en, *c.rest_en]
    return words + (c.time_en if with_time else [])


def german_main(c: Clause, with_time: bool = True, fronted: bool = False) -> list[Word]:
    """Verb second: subject first, or right after a fronted adverbial or clause (`fronted`)."""
    verbs = c.verb_group(question=False)
    time = c.time_de if with_time else []
    if fronted:
        return [verbs.finite_de, *c.subject_de, *time, *c.middle_de, *verbs.right_de]
    return [*c.subject_de, verbs.finite_de, *time, *c.middle_de, *verbs.right_de]


def german_question(c: Clause) -> list[Word]:
    """Verb first: "Ruft der Mann den Arzt an?"."""
    verbs = c.verb_group(question=True)
    return [verbs.finite_de, *c.subject_de, *c.time_de, *c.middle_de, *verbs.right_de]


def german_sub(c: Clause) -> list[Word]:
    """Verb last: "…, dass der Mann den Hund gesehen hat"."""
    return [*c.subject_de, *c.time_de, *c.middle_de, *c.verb_group(question=False).final_de]


def _verb_group(c: Clause, question: bool) -> VerbGroup:
    aux, main, do = _english_verb_group(c, question)
    not_ = [c.not_en] if c.negated else []
    finite, right, final = _german_verbs(c, aux, main, do)
    return VerbGroup(aux, [*not_, *main], finite, right, final)


def _english_verb_group(c: Clause, question: bool) -> tuple[list[Word], list[Word], bool]:
    """(auxiliary, the verbs after "not", whether the auxiliary is "do"). Negation and questions need an
    auxiliary, so a verb without one gets "do" ("sees" → "does not see", "does … see?"); a question puts the
    auxiliary first."""
    base, third, past, participle = c.verb.en
    third_person = c.person == "3sg"
    do = english_words("did" if c.tense == "past" else "does" if third_person else "do")
    if c.verb is BE:
        if c.modal:
            return english_words(_modal_en(c.modal, c.tense)), english_words("be"), False
        if c.tense == "perfect":
            return english_words("has" if third_person else "have"), english_words("been"), False
        form = {"present": {"1sg": "am", "3sg": "is"}, "past": {"1sg": "was", "3sg": "was"}}[c.tense]
        return english_words(form.get(c.person, "are" if c.tense == "present" else "were")), [], False
    if c.modal:
        if c.modal.en[0] == "want to":
            if c.negated or question:
                return do, english_words(f"want to {base}"), True
            wants = "wanted" if c.tense == "past" else "wants" if third_person else "want"
            return [], english_words(f"{wants} to {base}"), False
        return english_words(_modal_en(c.modal, c.tense)), english_words(base), False
    if c.tense == "perfect":
        return english_words("has" if third_person else "have"), english_words(participle), False
    if c.negated or question:
        return do, english_words(base), True
    return [], english_words(past if c.tense == "past" else third if third_person else base), False


def _modal_en(modal: Modal, tense: str) -> str:
    return modal.en[1] if tense == "past" else modal.en[0]


def _german_verbs(c: Clause, aux: list[Word], main: list[Word], do: bool) -> tuple[Word, list[Word], list[Word]]:
    """(finite verb for verb-second order, the verb bracket's right side, the verb-final cluster), linked to
    the English auxiliary `aux` and verbs `main` ("do" in `aux` when `do`)."""
    verb, person = c.verb, c.person
    if c.modal:
        singular = person.endswith("sg")
        modal = c.modal.de[2] + ("" if singular else "n") if c.tense == "past" else c.modal.de[0 if singular else 1]
        if c.modal.en[0] == "want to":  # "(does not) want to see": wollen ← want, the infinitive ← see (and to)
            finite = Word(modal, main[:1], aux if do else ())
            infinitive = Word(verb.de[0], main[2:], main[1:2])
        else:
            finite, infinitive = Word(modal, aux), Word("sein" if verb is BE else verb.de[0], main)
        return finite, [infinitive], [infinitive, finite]
    if c.tense == "perfect":
        finite = Word(_present(BE if verb.aux == "sein" else HAVE, person), aux)
        participle = Word(verb.de[3], main)
        return finite, [participle], [participle, finite]
    if verb is BE:
        finite = Word(_present(verb, person) if c.tense == "present" else verb.de_past(person), aux)
        return finite, [], [finite]
    text = _present(verb, person) if c.tense == "present" else verb.de_past(person)
    possible = aux if do else []
    if not verb.prefix:
        finite = Word(text, main, possible)
        return finite, [], [finite]
    # "ruft … an" ← "calls"; "holt … ab" ← "picks up", each part its own word
    stem_en, prefix_en = (main[:1], main[1:]) if len(main) == 2 else (main, main)
    finite, prefix = Word(text, stem_en, possible), Word(verb.prefix, prefix_en)
    return finite, [prefix], [Word(verb.prefix + text, main, possible)]


def _present(verb: Verb, person: str) -> str:
    if verb is BE:
        return {"1sg": "bin", "3sg": "ist"}.get(person, "sind")
    return verb.de_present(person)
