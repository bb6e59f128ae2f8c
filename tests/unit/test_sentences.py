"""Paragraphs cut into sentences (mtx.documents.sentences): spans without their whitespace, cut at block edges,
the languages' abbreviations kept whole, and the extra named when it is missing."""

from __future__ import annotations

import sys

import pytest

from mtx.documents.sentences import segmenter_missing, sentence_spans
from mtx.errors import MtxError

pytest.importorskip("sentencex", reason="sentences are cut by the extra mtx[documents]")

# Paragraphs of the three languages mtx's recipes name, each with where it must be cut (and must not).
GOLD = {
    "en": ("Use --force to overwrite. See e.g. the manual, i.e. man tar. Version 1.2 is out!  Really?",
           ["Use --force to overwrite.", "See e.g. the manual, i.e. man tar.", "Version 1.2 is out!", "Really?"]),
    "de": ("Die Datei wurde gespeichert. Dr. Müller prüft sie z. B. morgen. Fertig?",
           ["Die Datei wurde gespeichert.", "Dr. Müller prüft sie z. B. morgen.", "Fertig?"]),
    "fr": ("Le fichier est enregistré. Voir p. ex. le manuel. C'est fini !",
           ["Le fichier est enregistré.", "Voir p. ex. le manuel.", "C'est fini !"]),
}


@pytest.mark.parametrize("language", sorted(GOLD))
def test_a_paragraph_is_cut_at_its_sentence_ends_only(language: str) -> None:
    text, sentences = GOLD[language]
    assert [text[start:end] for start, end in sentence_spans(text, language)] == sentences


def test_spans_leave_out_the_whitespace_between_and_around() -> None:
    text = "  One here.\n\nTwo there.   "
    spans = sentence_spans(text, "en")
    assert [text[a:b] for a, b in spans] == ["One here.", "Two there."]
    assert spans[0][0] == 2 and text[spans[-1][1]:] == "   "


def test_block_edges_cut_even_without_whitespace_and_without_splitting() -> None:
    text = "One.Two. Three."
    assert [text[a:b] for a, b in sentence_spans(text, "en", [4], split=False)] == ["One.", "Two. Three."]
    assert [text[a:b] for a, b in sentence_spans(text, "en", [4])] == ["One.", "Two.", "Three."]


def test_a_language_without_rules_of_its_own_is_still_cut() -> None:
    text = "Alpha beta. Gamma delta."
    assert len(sentence_spans(text, "xx")) == 2


def test_nothing_visible_gives_no_sentence() -> None:
    assert sentence_spans("", "en") == [] and sentence_spans(" \t ", "en") == []


def test_the_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sentencex", None)  # what an environment without it imports
    assert "mtx[documents]" in segmenter_missing()
    with pytest.raises(MtxError, match=r"pip install 'mtx\[documents\]'"):
        sentence_spans("One. Two.", "en")
