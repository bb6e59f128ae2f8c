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

DEMO_RECIPE = {
    "name": "aer", "seed": 1,
    "data": {"source": {"demo": {"pairs": 4000, "valid": 10, "test": 200, "seed": 2}}, "bpe": {"vocab_size": 600},
             "filter": {"max_ratio": 0}},
    "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 2, "dropout": 0.0},
    "train": {"max_tokens": 2000, "lr_schedule": "inverse_sqrt", "lr": 2.5e-3, "warmup": 100, "max_steps": 250,
              "label_smoothing": 0.1, "save_every": 250, "validate_every": 1000, "log_every": 1000, "device": "cpu",
              "precision": "fp32"},
}


@pytest.mark.slow
def test_the_default_layer_aligns_clearly_better_than_the_diagonal(tmp_path) -> None:
    """A small demo model trained for a few hundred steps: the default layer's attention, heads averaged,
    has an AER on the demo's gold alignments well below the monotone diagonal's, which German's verb
    movements defeat."""
    import io

    import yaml
    from rich.console import Console

    from mtx.analysis.aer import diagonal, reference_attention
    from mtx.checkpoint import load_model, step_checkpoints
    from mtx.config.loading import load_recipe
    from mtx.data.prepare import prepare
    from mtx.decode.alignment import default_alignment_layer
    from mtx.train.trainer import train

    path = tmp_path / "aer.yaml"
    path.write_text(yaml.safe_dump({**DEMO_RECIPE, "run_dir": str(tmp_path / "run")}), encoding="utf-8")
    recipe = load_recipe(path)
    prepare(recipe, workers=1, console=Console(file=io.StringIO()))
    train(recipe)
    model, tokenizer, _ = load_model(step_checkpoints(tmp_path / "run" / "checkpoints")[-1][1])
    data = tmp_path / "run" / "data"
    sources, targets, lines = ((data / f"test.{suffix}").read_text(encoding="utf-8").splitlines()
                               for suffix in ("en", "de", "align"))
    gold = [read_gold(line) for line in lines]
    pairs = reference_attention(model, tokenizer, list(zip(sources, targets, strict=True)))
    layer = default_alignment_layer(len(model.decoder_layers))
    model_aer = corpus_counts([p.links(p.words[layer].mean(0)) for p in pairs], gold).aer
    diagonal_aer = corpus_counts([diagonal(p.words.shape[3], p.words.shape[2]) for p in pairs], gold).aer
    assert model_aer < diagonal_aer - 0.1, (model_aer, diagonal_aer)
