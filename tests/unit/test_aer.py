"""Alignment error rate (mtx.analysis.aer): gold lines with sure and possible links, and Och & Ney's figures worked by
hand."""

from __future__ import annotations

import pytest

from mtx.analysis.aer import AlignmentCounts, GoldAlignment, corpus_counts, read_gold, sentence_counts
from mtx.errors import MtxError


def test_gold_lines_have_sure_and_possible_links() -> None:
    gold = read_gold("0-0 1p1 2-1 1-2")
    assert gold.sure == {(0, 0), (2, 1), (1, 2)}
    assert gold.possible == {(0, 0), (1, 1), (2, 1), (1, 2)}  # P holds S
    assert read_gold("") == GoldAlignment(frozenset(), frozenset())
    with pytest.raises(MtxError, match="ipj"):
        read_gold("0-0 1:1")


def test_precision_recall_and_aer_of_one_sentence() -> None:
    """S = {0-0, 2-1, 1-2}, P = S + {1-1}; A = {0-0, 1-1, 0-2}: |A∩S| = 1 (0-0), |A∩P| = 2 (0-0, 1-1), so
    precision 2/3, recall 1/3 and AER 1 − (1 + 2) / (3 + 3) = 1/2."""
    counts = sentence_counts([(0, 0), (1, 1), (0, 2)], read_gold("0-0 1p1 2-1 1-2"))
    assert counts == AlignmentCounts(proposed=3, sure=3, proposed_sure=1, proposed_possible=2)
    assert counts.precision == pytest.approx(2 / 3)
    assert counts.recall == pytest.approx(1 / 3)
    assert counts.aer == pytest.approx(0.5)


def test_possible_links_are_never_wrong_and_never_missed() -> None:
    gold = read_gold("0-0 1-1 0p1")
    assert sentence_counts([(0, 0), (1, 1)], gold).aer == 0.0  # the sure links alone: perfect
    with_possible = sentence_counts([(0, 0), (1, 1), (0, 1)], gold)
    assert (with_possible.precision, with_possible.recall, with_possible.aer) == (1.0, 1.0, 0.0)
    only_possible = sentence_counts([(0, 1)], gold)  # precise, but recalls no sure link
    assert (only_possible.precision, only_possible.recall) == (1.0, 0.0)
    assert only_possible.aer == pytest.approx(1 - 1 / 3)
    assert sentence_counts([(0, 0), (0, 0)], gold).proposed == 1  # a link proposed twice counts once


def test_the_corpus_figure_sums_counts_before_dividing() -> None:
    """The sentence above (AER 1/2, 6 links in A and S) and a perfect one-link sentence: summed counts give
    1 − (2 + 3) / (4 + 4) = 3/8, not the mean of the sentences' AERs, 1/4."""
    counts = corpus_counts([[(0, 0), (1, 1), (0, 2)], [(0, 0)]], [read_gold("0-0 1p1 2-1 1-2"), read_gold("0-0")])
    assert counts == AlignmentCounts(proposed=4, sure=4, proposed_sure=2, proposed_possible=3)
    assert counts.aer == pytest.approx(3 / 8)
    assert counts.precision == pytest.approx(3 / 4)
    assert counts.recall == pytest.approx(2 / 4)
    with pytest.raises(ValueError):
        corpus_counts([[(0, 0)]], [])


# ------------------------------------------------------------------------- a trained model against gold
