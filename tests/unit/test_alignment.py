"""Word alignments: subword attention pooled to words, the hard alignment and its Pharaoh format. Which word
each token belongs to is tested with the tokenizer (test_tokenizer.py); the end-to-end tests on a trained model
are in test_translate.py."""

from __future__ import annotations

import pytest
import torch

from mtx.decode.alignment import hard_alignments, pharaoh, word_attention
from mtx.decode.output import format_nbest
from mtx.decode.request import aligning_layer, default_alignment_layer
from mtx.decode.translator import Translation
from mtx.errors import MtxError


def test_pooling_sums_over_source_subwords_and_averages_over_target_subwords() -> None:
    """Target tokens: word 0 in two pieces, then word 1. Source tokens: word 0, word 1 in two pieces, EOS.
    Source word 1 receives more of target word 0's attention in total (0.4 on average over its pieces) than
    source word 0 (0.3), though less than word 0 in any one piece; EOS, which draws most attention, is left
    out."""
    attention = torch.tensor([[
        [0.4, 0.3, 0.3, 0.0],
        [0.2, 0.1, 0.1, 0.6],
        [0.05, 0.0, 0.05, 0.9],
        [0.0, 0.0, 0.0, 1.0],  # the EOS step's row, beyond the target's tokens
    ]])
    target, source = [[0, 0, 1]], [[0, 1, 1, None]]
    pooled = word_attention(attention, target, source)
    torch.testing.assert_close(pooled, torch.tensor([[[0.3, 0.4], [0.05, 0.05]]]))
    assert hard_alignments(pooled, target, source) == [[(1, 0), (0, 1)]]  # a tie goes to the first source word


def test_tokens_of_no_word_count_in_none() -> None:
    """A lone space token (None) neither adds to a target word's average nor takes a source word's share."""
    attention = torch.tensor([[[0.9, 0.1, 0.0], [0.1, 0.0, 0.9], [0.2, 0.8, 0.0]]])
    pooled = word_attention(attention, [[None, 0, 0]], [[None, 0, 1]])
    torch.testing.assert_close(pooled, torch.tensor([[[0.4, 0.45]]]))
    assert hard_alignments(pooled, [[None, 0, 0]], [[None, 0, 1]]) == [[(1, 0)]]


def test_rows_of_a_batch_are_pooled_on_their_own() -> None:
    """Rows of different lengths and word counts: each row's words only, however many the others have, and
    no links for a row without target words (an empty translation)."""
    attention = torch.tensor([
        [[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.0, 0.0, 1.0]],
        [[0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]],  # source: one word, then EOS and padding
        [[0.5, 0.5, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]],
    ])
    target, source = [[0, 1], [0], []], [[0, 1, None], [0, None], [0, 1, None]]
    pooled = word_attention(attention, target, source)
    assert pooled.shape == (3, 2, 2)
    torch.testing.assert_close(pooled[1], torch.tensor([[0.9, 0.0], [0.0, 0.0]]))
    assert hard_alignments(pooled, target, source) == [[(1, 0), (0, 1)], [(0, 0)], []]


def test_pharaoh_and_output_lines() -> None:
    assert pharaoh([(0, 0), (2, 1), (1, 2)]) == "0-0 2-1 1-2"
    assert pharaoh([]) == ""
    best = [Translation("Das Haus", -0.25, alignment=[(0, 0), (1, 1)]),
            Translation("Haus das", -1.5, alignment=[(1, 0), (0, 1)])]
    assert format_nbest(best, with_scores=False, with_alignment=True) == "Das Haus ||| 0-0 1-1"
    assert format_nbest(best, with_scores=False) == "Das Haus"
    assert format_nbest(best, with_scores=True, with_alignment=True) == (
        "-0.2500\tDas Haus ||| 0-0 1-1\t-1.5000\tHaus das ||| 1-0 0-1")
    assert format_nbest([], with_scores=False, with_alignment=True) == " ||| "
    assert format_nbest([], with_scores=True, with_alignment=True) == ""
    assert format_nbest([Translation("", -3.0, alignment=[])], with_scores=False, with_alignment=True) == " ||| "


def test_default_layer_is_the_last_of_a_shallow_decoder_and_the_penultimate_of_a_deep_one() -> None:
    assert default_alignment_layer(6) == 4
    assert default_alignment_layer(3) == 1
    assert default_alignment_layer(2) == 1
    assert default_alignment_layer(1) == 0


def test_the_aligning_layer_is_asked_for_with_alignments_only_and_must_be_the_models() -> None:
    """One rule for `mtx translate`'s flags, the translator and a request's fields, in each one's spelling."""
    assert aligning_layer(False, None, 6) is None
    assert aligning_layer(True, None, 6) == default_alignment_layer(6) == 4
    assert aligning_layer(True, 0, 6) == 0 and aligning_layer(True, 5, 6) == 5
    with pytest.raises(MtxError, match=r"^--alignment-layer only applies with --alignment\.$"):
        aligning_layer(False, 0, 6)
    for layer in (6, -1):
        with pytest.raises(MtxError, match=rf"^--alignment-layer {layer} is not a layer of this model, whose decoder "
                           r"layers are numbered 0 to 5\.$"):
            aligning_layer(True, layer, 6)
    field = (lambda name: name, " = ")
    with pytest.raises(MtxError, match=r"^alignment_layer only applies with alignment\.$"):
        aligning_layer(False, 1, 2, *field)
    with pytest.raises(MtxError, match=r"^alignment_layer = 2 is not a layer of this model, whose decoder layers are "
                       r"numbered 0 to 1\.$"):
        aligning_layer(True, 2, 2, *field)
