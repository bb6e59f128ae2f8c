"""The model options that published models need (ModelConfig.activation, output_bias, scale_embeddings, positions):
each computes what the model it comes from computes, and the paper's defaults leave mtx's model as it was."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from mtx.checkpoint import make_checkpoint, model_config_of, save_checkpoint
from mtx.config.model import ModelConfig, resolve_model
from mtx.config.run_recipe import shape_differences
from mtx.data.batching import Batch
from mtx.decode.translator import prepare_model
from mtx.model.int8 import Int8Linear
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD
from mtx.train.average import average_checkpoints
from mtx.train.loss import batch_loss, label_smoothed_loss

VOCAB = 37
NEW_OPTIONS = dict(activation="swish", output_bias=True, scale_embeddings=False, positions="halves")


def config(**options) -> ModelConfig:
    return resolve_model(ModelConfig(preset="tiny", d_model=16, heads=4, d_ff=32, max_positions=40, **options))


def model(seed: int = 0, **options) -> Transformer:
    """A tiny model in eval mode; with an output bias, a random one (zeros would hide a bias left out)."""
    torch.manual_seed(seed)
    m = Transformer(config(**options), VOCAB).eval()
    if m.output_bias is not None:
        with torch.no_grad():
            m.output_bias.normal_(std=2.0)
    return m


def old_positions(max_positions: int, d_model: int) -> torch.Tensor:
    """mtx's positional table as it was computed before the options existed, written out again here."""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def sources() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, VOCAB, (3, 9), generator=g)
    src[1, 6:] = PAD
    tgt_in = torch.cat([torch.full((3, 1), BOS), torch.randint(4, VOCAB, (3, 7), generator=g)], dim=1)
    return src, src == PAD, tgt_in


# ------------------------------------------------------------------------------ the paper's defaults kept


def test_the_presets_default_to_the_papers_model() -> None:
    cfg = config()
    assert (cfg.activation, cfg.output_bias, cfg.scale_embeddings, cfg.positions) == ("relu", False, True,
                                                                                      "interleaved")


def test_a_default_model_computes_as_before() -> None:
    """The default model's table, embedding scale, feed-forward and output layer are the old expressions bit for
    bit, and it has no new parameter (tests/unit/test_transformer.py holds the presets' parameter counts)."""
    m = model()
    assert torch.equal(m.positions, old_positions(40, 16))
    src, _, _ = sources()
    expected = m.src_embed.weight[src] * math.sqrt(16) + old_positions(40, 16)[: src.shape[1]]
    assert torch.equal(m.embed(m.src_embed, src), expected)
    x = torch.randn(5, 16)
    ffn = m.encoder_layers[0].ffn
    assert torch.equal(ffn(x), ffn.fc2(F.relu(ffn.fc1(x))))
    assert torch.equal(m.output_logits(x), F.linear(x, m.tgt_embed.weight))
    assert m.output_bias is None and "output_bias" not in m.state_dict()
    assert set(model(**NEW_OPTIONS).state_dict()) - set(m.state_dict()) == {"output_bias"}


def test_a_checkpoint_written_before_the_options_loads_with_the_papers() -> None:
    """Its stored model config (resolved, as checkpoints store it) lacks the new keys."""
    stored = dataclasses.asdict(config())
    for name in NEW_OPTIONS:
        del stored[name]
    assert model_config_of({"model_config": stored}) == config()


def test_checkpoints_of_one_run_written_before_and_after_the_options_average(tmp_path: Path) -> None:
    """A run resumed across the upgrade: its older checkpoints lack the keys its newer ones hold."""
    m = model()
    paths = [tmp_path / "old.pt", tmp_path / "new.pt"]
    old = make_checkpoint(m, "tokenizer", {}, 1)
    old["model_config"] = {k: v for k, v in old["model_config"].items() if k not in NEW_OPTIONS}
    save_checkpoint(old, paths[0])
    save_checkpoint(make_checkpoint(m, "tokenizer", {}, 2), paths[1])
    averaged = average_checkpoints(paths)
    assert all(torch.equal(averaged["model"][k], v) for k, v in m.state_dict().items())


@pytest.mark.parametrize("name", list(NEW_OPTIONS))
def test_fine_tuning_refuses_a_parent_computed_otherwise(name: str) -> None:
    """An option changes what the same weights compute: train.init_from's parent must share it."""
    differs = shape_differences(config(), config(**{name: NEW_OPTIONS[name]}))
    assert len(differs) == 1 and differs[0].startswith(f"model.{name} is ")


# ---------------------------------------------------------------------------------------- each option


@pytest.mark.parametrize(("name", "reference"), [("relu", "relu"), ("swish", "swish"), ("gelu", "gelu")])
def test_the_activations_are_transformers_own(name: str, reference: str) -> None:
    """transformers' ACT2FN, which MarianMT models name in their config's activation_function."""
    activations = pytest.importorskip("transformers.activations")
    ffn = model(activation=name).encoder_layers[0].ffn
    x = torch.randn(6, 16) * 3
    hidden = ffn.fc1(x)
    assert torch.equal(ffn(x), ffn.fc2(activations.ACT2FN[reference](hidden)))


@pytest.mark.parametrize(("positions", "d_model"), [(1024, 512), (512, 1024), (300, 7)])
def test_positions_in_halves_are_marians_table_bit_for_bit(positions: int, d_model: int) -> None:
    """transformers' MarianSinusoidalPositionalEmbedding (float64 sinusoids, then float32), odd widths too."""
    marian = pytest.importorskip("transformers.models.marian.modeling_marian")
    from mtx.model.transformer import sinusoidal_positions_in_halves

    theirs = marian.MarianSinusoidalPositionalEmbedding(positions, d_model).create_weight()
    assert torch.equal(sinusoidal_positions_in_halves(positions, d_model), theirs)
    assert torch.equal(Transformer(resolve_model(ModelConfig(
        preset="tiny", d_model=512, heads=8, max_positions=1024, positions="halves")), VOCAB).positions,
        marian.MarianSinusoidalPositionalEmbedding(1024, 512).create_weight())


def test_unscaled_embeddings_are_added_as_they_are() -> None:
    m = model(scale_embeddings=False)
    assert m.embed_scale == 1.0
    src, _, _ = sources()
    assert torch.equal(m.embed(m.src_embed, src), m.src_embed.weight[src] + m.positions[: src.shape[1]])


def test_the_output_bias_is_a_parameter_of_zeros_added_to_every_logit() -> None:
    torch.manual_seed(0)
    fresh = Transformer(config(output_bias=True), VOCAB)
    assert isinstance(fresh.output_bias, torch.nn.Parameter) and fresh.output_bias.shape == (VOCAB,)
    assert torch.equal(fresh.output_bias, torch.zeros(VOCAB)) and "output_bias" in fresh.state_dict()
    m = model(output_bias=True)
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        torch.testing.assert_close(m.output_logits(x), F.linear(x, m.tgt_embed.weight, m.output_bias))


@pytest.mark.parametrize("options", [dict(activation="gelu"), NEW_OPTIONS], ids=["gelu", "all"])
def test_stepping_the_decoder_gives_the_teacher_forced_log_probabilities(options: dict) -> None:
    """The model's invariant (DESIGN.md), with the options: `decode_step` over a sequence is `forward`."""
    m = model(**options)
    src, src_pad, tgt_in = sources()
    with torch.no_grad():
        expected = torch.log_softmax(m.output_logits(m(src, src_pad, tgt_in)), dim=-1)
        state = m.init_state(m.encode(src, src_pad), src_pad, tgt_in.shape[1])
        for t in range(tgt_in.shape[1]):
            log_probs, state = m.decode_step(tgt_in[:, t], state)
            torch.testing.assert_close(log_probs, expected[:, t], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "int8", "bf16"])
def test_every_inference_format_keeps_the_output_bias(dtype: str) -> None:
    """The output projection made a module (`make_output_projection_a_module`) has the bias itself: the CPU's
    transposed layout keeps it, int8 a float copy; bf16 casts it. Each within its rounding of the float32 logits."""
    reference = model(**NEW_OPTIONS)
    x = torch.randn(4, 16)
    with torch.no_grad():
        exact = reference.output_logits(x)
        m = prepare_model(model(**NEW_OPTIONS), torch.device("cpu"), dtype)
        if dtype == "int8":
            assert isinstance(m.output_proj, Int8Linear) and torch.equal(m.output_proj.bias, reference.output_bias)
        elif dtype == "fp32":
            assert m.output_proj.bias is m.output_bias
        got = m.output_logits(x.to(m.tgt_embed.weight.dtype)).float()
    tolerance = {"fp32": 1e-5, "int8": 0.1, "bf16": 0.1}[dtype]
    torch.testing.assert_close(got, exact, atol=tolerance, rtol=tolerance)


def test_training_learns_the_output_bias() -> None:
    """The fused projection and loss (mtx.train.loss) add the bias and give it its gradient: those of the
    unfused logits."""
    m = model(**NEW_OPTIONS)
    src, src_pad, tgt_in = sources()
    target = torch.cat([tgt_in[:, 1:], torch.full((3, 1), EOS)], dim=1)
    target[2, 4:] = PAD
    batch = Batch(src, src_pad, tgt_in.masked_fill(target == PAD, PAD), target, int((target != PAD).sum()))
    results = []
    for loss in (lambda: batch_loss(m, batch, 0.1),
                 lambda: label_smoothed_loss(m.output_logits(m(src, src_pad, batch.tgt_in)), target, 0.1)):
        m.zero_grad()
        sums = loss()
        sums[0].backward()
        results.append((sums[0], m.output_bias.grad.clone(), m.tgt_embed.weight.grad.clone()))
    for fused, unfused in zip(*results, strict=True):
        torch.testing.assert_close(fused, unfused)
    assert results[0][1].abs().sum() > 0
