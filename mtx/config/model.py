"""The recipe's `model:` section: the Transformer's shape, and the presets that fill what a recipe leaves unset.

The largest model a recipe may describe is bounded here, so that a slip of a few digits is a message naming the
key, not an overflow deep inside PyTorch. This module imports no torch: `mtx config` and recipe errors must be
instant.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from mtx.config.fields import RATE, Bounds, check, check_bounds, setting

# The largest model a recipe may describe: far beyond any Transformer trained (the deepest, DeepNet's, has 1,000
# layers; GPT-3's widest sub-layer 49,152 units), and small enough that every size, count and index stays within
# int64 and float64, so that a slip of a few digits is a message, not an overflow deep inside PyTorch.
LAYERS = Bounds(1, 1000)
WIDTH = Bounds(1, 2**17)
POSITIONS = Bounds(1, 2**20)

FROM_PRESET = "(the preset's)"  # how `mtx config --keys` shows the default of a field the preset fills


@dataclass
class ModelConfig:
    """The Transformer's shape. `preset` fills every field left unset (None) in the recipe."""

    preset: Literal["tiny", "small", "base", "big", "student", "student-tiny"] = setting(
        "base", "Table 3 of the paper (base, big), a size for CPUs (tiny, small), or a student's shape for "
        "distillation, a deep encoder and a shallow decoder (student, student-tiny); any field below overrides it.")
    layers_enc: int | None = setting(None, "Encoder layers.", bounds=LAYERS)
    layers_dec: int | None = setting(None, "Decoder layers.", bounds=LAYERS)
    d_model: int | None = setting(None, "Width of the residual stream and the embeddings.", bounds=WIDTH)
    heads: int | None = setting(None, "Attention heads per layer; must divide d_model.", bounds=WIDTH)
    d_ff: int | None = setting(None, "Inner width of the feed-forward blocks.", bounds=WIDTH)
    dropout: float | None = setting(
        None, "Dropout on the embeddings and every residual branch (the paper's P_drop).", bounds=RATE)
    attn_dropout: float | None = setting(
        None, "Dropout on the attention weights (the paper: none; T2T: 0.1).", bounds=RATE)
    relu_dropout: float | None = setting(
        None, "Dropout inside the feed-forward blocks, after the activation.", bounds=RATE)
    norm: Literal["post", "pre"] | None = setting(
        None, "post: LayerNorm after each residual sum (the paper); pre: before each sub-layer, plus one at the "
        "end of each stack, which trains deep or large models with less warmup.")
    share_embeddings: bool | None = setting(
        None, "One matrix for the source and target embeddings and the output projection (§3.4); false gives the "
        "source its own.")
    max_positions: int | None = setting(
        None, "The longest source or target sequence in tokens, EOS included: the size of the positional table.",
        bounds=POSITIONS)
    activation: Literal["relu", "swish", "gelu"] | None = setting(
        None, "The feed-forward blocks' non-linearity: relu, max(0, x) (the paper); swish, x·σ(x) (SiLU); gelu, "
        "x·Φ(x) with the exact Gaussian CDF. Most OPUS-MT models use swish.")
    output_bias: bool | None = setting(
        None, "Add a learnt bias to the output layer's logits, h·Eᵀ + b (Marian's final_logits_bias); the paper's "
        "output layer has none.")
    scale_embeddings: bool | None = setting(
        None, "Multiply the embeddings by √d_model before adding the positions (§3.4); false adds them as they are.")
    positions: Literal["interleaved", "halves"] | None = setting(
        None, "The layout of the sinusoidal positional table (§3.5): interleaved, sines in the even channels and "
        "cosines in the odd ones (the paper's formula); halves, all the sines then all the cosines (Marian's).")

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.d_model % self.heads == 0, f"{key}.heads", self.heads, f"must divide d_model ({self.d_model})")


# Table 3 of the paper for base and big; tiny and small are for CPUs, tests and the demo. The students are what
# sequence-level distillation trains (docs/guides/distillation.md): the decoder runs once per output token and the
# encoder once per sentence, so a deep encoder and a shallow decoder translate fast at little cost in quality
# (Kasai et al., 2021; browsermt/students' 6 + 2 layers at width 256 for a `base`/`big` teacher). student-tiny is
# the shape for a `small` teacher, or a `tiny` one as on the demo.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(layers_enc=2, layers_dec=2, d_model=128, heads=4, d_ff=512, dropout=0.1),
    "small": dict(layers_enc=3, layers_dec=3, d_model=256, heads=4, d_ff=1024, dropout=0.1),
    "base": dict(layers_enc=6, layers_dec=6, d_model=512, heads=8, d_ff=2048, dropout=0.1),
    "big": dict(layers_enc=6, layers_dec=6, d_model=1024, heads=16, d_ff=4096, dropout=0.3),
    "student": dict(layers_enc=6, layers_dec=2, d_model=256, heads=4, d_ff=1024, dropout=0.1),
    "student-tiny": dict(layers_enc=3, layers_dec=1, d_model=128, heads=4, d_ff=512, dropout=0.1),
}
PRESET_COMMON: dict[str, Any] = dict(
    attn_dropout=0.0, relu_dropout=0.0, norm="post", share_embeddings=True, max_positions=1024,
    activation="relu", output_bias=False, scale_embeddings=True, positions="interleaved",
)


def resolve_model(model: ModelConfig) -> ModelConfig:
    """The preset's values for every field the recipe left unset."""
    defaults = {**PRESET_COMMON, **PRESETS[model.preset]}
    values = {k: (v if v is not None else defaults[k]) for k, v in dataclasses.asdict(model).items()}
    return ModelConfig(**values)

