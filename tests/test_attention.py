"""The explicit attention path: the fast path's outputs, and weights that are distributions over what may be seen."""

from __future__ import annotations

import copy

import pytest
import torch

from mtx.attention import attention_maps, cross_attention
from mtx.config.recipe import ModelConfig, resolve_model
from mtx.decode.translator import prepare_model
from mtx.model.transformer import Transformer

VOCAB = 50
LENGTHS = (7, 4, 9)  # source lengths: the shorter two are padded


def small_model(norm: str) -> Transformer:
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=32, heads=4, d_ff=64, layers_enc=2, layers_dec=3,
                                    norm=norm, max_positions=64))
    return Transformer(cfg, VOCAB).eval()


def padded_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sources of `LENGTHS` right-padded with 0, and target inputs of 20 positions (more than the CPU's
    explicit-attention threshold, so the fast path runs SDPA on them)."""
    g = torch.Generator().manual_seed(1)
    src = torch.zeros(len(LENGTHS), max(LENGTHS), dtype=torch.long)
    for i, n in enumerate(LENGTHS):
        src[i, :n] = torch.randint(4, VOCAB, (n,), generator=g)
    tgt_in = torch.randint(4, VOCAB, (len(LENGTHS), 20), generator=g)
    return src, src == 0, tgt_in


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_explicit_path_gives_the_fast_paths_outputs(norm: str) -> None:
    model = small_model(norm)
    src, src_pad, tgt_in = padded_batch()
    maps = attention_maps(model, src, src_pad, tgt_in)
    with torch.no_grad():
        expected = model(src, src_pad, tgt_in)
        states = model(src, src_pad, tgt_in, project=False)
    torch.testing.assert_close(torch.log_softmax(maps.outputs, -1), torch.log_softmax(expected, -1), atol=1e-5,
                               rtol=0)
    torch.testing.assert_close(attention_maps(model, src, src_pad, tgt_in, project=False).outputs, states,
                               atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_every_row_is_a_distribution_over_what_its_query_may_see(norm: str) -> None:
    """Shapes as documented; each row sums to 1, with exactly 0 on source padding and on later target
    positions (the decoder's self-attention is causal)."""
    model = small_model(norm)
    src, src_pad, tgt_in = padded_batch()
    maps = attention_maps(model, src, src_pad, tgt_in)
    batch, source, target, heads = len(LENGTHS), src.shape[1], tgt_in.shape[1], model.cfg.heads
    assert maps.encoder.shape == (batch, 2, heads, source, source)
    assert maps.decoder.shape == (batch, 3, heads, target, target)
    assert maps.cross.shape == (batch, 3, heads, target, source)
    for weights in (maps.encoder, maps.decoder, maps.cross):
        assert weights.dtype == torch.float32
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-6, rtol=0)
    padding = src_pad[:, None, None, None, :]
    for weights in (maps.encoder, maps.cross):
        assert bool((weights.masked_select(padding) == 0).all())
        assert bool((weights.masked_select(~padding) > 0).all())
    later = torch.ones(target, target, dtype=torch.bool).triu(diagonal=1)
    assert bool((maps.decoder[..., later] == 0).all())
    assert bool((maps.decoder[..., ~later] > 0).all())


def test_one_layers_cross_attention_is_that_of_the_whole_pass() -> None:
    """Given the encoder output of the fast path, as a search has it, one layer's weights are those of
    `attention_maps`."""
    model = small_model("post")
    src, src_pad, tgt_in = padded_batch()
    maps = attention_maps(model, src, src_pad, tgt_in)
    with torch.no_grad():
        memory = model.encode(src, src_pad)
    for layer in range(3):
        torch.testing.assert_close(cross_attention(model, memory, src_pad, tgt_in, layer), maps.cross[:, layer],
                                   atol=1e-6, rtol=0)


def test_half_precision_and_int8_models_give_float32_distributions() -> None:
    """The path runs in the model's own format (bf16 weights, int8 linear layers) and still gives float32
    weights close to the float32 model's."""
    model = small_model("pre")
    src, src_pad, tgt_in = padded_batch()
    exact = attention_maps(model, src, src_pad, tgt_in).cross
    for dtype in ("bf16", "int8"):
        maps = attention_maps(prepare_model(copy.deepcopy(model), torch.device("cpu"), dtype), src, src_pad, tgt_in)
        assert maps.cross.dtype == torch.float32
        torch.testing.assert_close(maps.cross.sum(-1), torch.ones(maps.cross.shape[:-1]), atol=1e-5, rtol=0)
        assert (maps.cross - exact).abs().max() < 0.05, dtype


def test_a_model_in_training_mode_is_refused() -> None:
    model = small_model("post").train()
    src, src_pad, tgt_in = padded_batch()
    with pytest.raises(ValueError, match="eval mode"):
        attention_maps(model, src, src_pad, tgt_in)
