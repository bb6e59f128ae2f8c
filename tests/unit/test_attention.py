"""Attention weights kept by the model's own sub-layers: the same outputs as without, and weights that are
distributions over what each query may see."""

from __future__ import annotations

import copy

import pytest
import torch

from mtx.config.recipe import ModelConfig, resolve_model
from mtx.decode.translator import prepare_model
from mtx.model.transformer import AttentionWeights, Transformer

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


def kept(model: Transformer, src: torch.Tensor, src_pad: torch.Tensor, tgt_in: torch.Tensor
         ) -> tuple[AttentionWeights, torch.Tensor]:
    """The weights of one teacher-forced pass, and its decoder states."""
    attention = AttentionWeights()
    with torch.inference_mode():
        states = model(src, src_pad, tgt_in, attention=attention)
    return attention, states


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_keeping_the_weights_gives_the_fast_paths_outputs(norm: str) -> None:
    """Sub-layers that keep their weights compute the attention written out, softmax(Q Kᵀ / √Dh) V with those
    very weights, and the pass ends where the fused kernels' pass ends."""
    model = small_model(norm)
    src, src_pad, tgt_in = padded_batch()
    attention, states = kept(model, src, src_pad, tgt_in)
    with torch.no_grad():
        expected = model(src, src_pad, tgt_in)
        memory = model.encode(src, src_pad)
    torch.testing.assert_close(states, expected, atol=1e-5, rtol=0)
    encoder_kept = AttentionWeights()
    with torch.inference_mode():
        torch.testing.assert_close(model.encode(src, src_pad, encoder_kept), memory, atol=1e-5, rtol=0)
    assert len(encoder_kept.encoder) == 2 and not encoder_kept.decoder and not encoder_kept.cross
    torch.testing.assert_close(encoder_kept.stacked("encoder"), attention.stacked("encoder"))


@pytest.mark.parametrize("norm", ["post", "pre"])
def test_every_row_is_a_distribution_over_what_its_query_may_see(norm: str) -> None:
    """Shapes as documented; each row sums to 1, with exactly 0 on source padding and on later target
    positions (the decoder's self-attention is causal)."""
    model = small_model(norm)
    src, src_pad, tgt_in = padded_batch()
    attention, _ = kept(model, src, src_pad, tgt_in)
    encoder, decoder, cross = (attention.stacked(kind) for kind in ("encoder", "decoder", "cross"))
    batch, source, target, heads = len(LENGTHS), src.shape[1], tgt_in.shape[1], model.cfg.heads
    assert encoder.shape == (batch, 2, heads, source, source)
    assert decoder.shape == (batch, 3, heads, target, target)
    assert cross.shape == (batch, 3, heads, target, source)
    for weights in (encoder, decoder, cross):
        assert weights.dtype == torch.float32
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]), atol=1e-6, rtol=0)
    padding = src_pad[:, None, None, None, :]
    for weights in (encoder, cross):
        assert bool((weights.masked_select(padding) == 0).all())
        assert bool((weights.masked_select(~padding) > 0).all())
    later = torch.ones(target, target, dtype=torch.bool).triu(diagonal=1)
    assert bool((decoder[..., later] == 0).all())
    assert bool((decoder[..., ~later] > 0).all())


def test_one_layers_cross_attention_is_that_of_the_whole_pass() -> None:
    """Given the encoder output of the fast path, as a search has it, one layer's weights are those of the
    whole pass."""
    model = small_model("post")
    src, src_pad, tgt_in = padded_batch()
    attention, _ = kept(model, src, src_pad, tgt_in)
    with torch.inference_mode():
        memory = model.encode(src, src_pad)
        for layer in range(3):
            torch.testing.assert_close(model.cross_attention_weights(memory, src_pad, tgt_in, layer),
                                       attention.cross[layer], atol=1e-6, rtol=0)


def test_half_precision_and_int8_models_give_float32_distributions() -> None:
    """The path runs in the model's own format (bf16 weights, int8 linear layers) and still gives float32
    weights close to the float32 model's."""
    model = small_model("pre")
    src, src_pad, tgt_in = padded_batch()
    exact = kept(model, src, src_pad, tgt_in)[0].stacked("cross")
    for dtype in ("bf16", "int8"):
        cross = kept(prepare_model(copy.deepcopy(model), torch.device("cpu"), dtype), src, src_pad,
                     tgt_in)[0].stacked("cross")
        assert cross.dtype == torch.float32
        torch.testing.assert_close(cross.sum(-1), torch.ones(cross.shape[:-1]), atol=1e-5, rtol=0)
        assert (cross - exact).abs().max() < 0.05, dtype


def test_a_model_in_training_mode_is_refused() -> None:
    """Dropout would change the weights: they are those of the model that translates, in eval mode."""
    model = small_model("post").train()
    src, src_pad, tgt_in = padded_batch()
    with pytest.raises(ValueError, match="eval mode"):
        model(src, src_pad, tgt_in, attention=AttentionWeights())
    with pytest.raises(ValueError, match="eval mode"):
        model.cross_attention_weights(model.encode(src, src_pad), src_pad, tgt_in, 0)
