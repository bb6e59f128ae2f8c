"""Tiny models trained to a bar: what they learnt is checked, not only that training ran.

The other system tests of this tier train whole pipelines (test_pipeline: the demo's five commands) or run the
benchmarks at their check sizes (test_quality_bench, test_gpu_check).
"""

from __future__ import annotations

import pytest

from mtx.analysis.aer import corpus_counts, read_gold

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
    from mtx.decode.request import default_alignment_layer
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
