"""int8 linear layers (mtx.model.int8): close to the float layer, each row's output a function of that row alone,
a shortlist's rows bit for bit the whole layer's, and every nn.Linear of a model replaced."""

import pytest
import torch
from support import tiny_model
from torch import nn

from mtx.model.int8 import Int8Linear, quantize_linear_layers


def layer(bias: bool = True, seed: int = 0) -> nn.Linear:
    torch.manual_seed(seed)
    return nn.Linear(64, 48, bias=bias)


@pytest.mark.parametrize("bias", [True, False])
def test_an_int8_layer_computes_the_float_layers_function_to_within_its_rounding(bias: bool) -> None:
    """Rounding x and W to 127 levels each moves an output by at most about k · max|x| · max|W| / 127 in the
    worst case; in practice by a small share of the output's range, which is what this checks."""
    float_layer = layer(bias)
    x = torch.randn(3, 5, 64)  # any leading shape, as nn.Linear takes
    with torch.no_grad():
        exact, approximate = float_layer(x), Int8Linear.of(float_layer.weight, float_layer.bias)(x)
    assert approximate.shape == exact.shape and approximate.dtype == torch.float32
    assert (approximate - exact).abs().max() < 0.02 * exact.abs().max()


def test_a_rows_output_depends_on_that_row_alone() -> None:
    """The batch-invariance the per-row scale is for: a row decoded beside a row 1,000 times larger (which sets a
    per-batch scale) gives the bits it gives alone. One scale per batch would round the small row to a grid 1,000
    times coarser."""
    float_layer = layer()
    int8 = Int8Linear.of(float_layer.weight, float_layer.bias)
    row = torch.randn(1, 64)
    beside = torch.cat([torch.randn(6, 64) * 1000, row, torch.randn(2, 64)])
    with torch.no_grad():
        assert torch.equal(int8(beside)[6:7], int8(row))


def test_a_row_of_zeros_gives_the_bias() -> None:
    float_layer = layer()
    with torch.no_grad():
        out = Int8Linear.of(float_layer.weight, float_layer.bias)(torch.zeros(2, 64))
    assert torch.equal(out, float_layer.bias.detach().expand(2, -1))


def test_a_layer_over_some_outputs_gives_those_outputs_bit_for_bit() -> None:
    """What a shortlist's output layer relies on (mtx.decode.shortlist.union_projection)."""
    float_layer = layer()
    int8 = Int8Linear.of(float_layer.weight, float_layer.bias)
    tokens = torch.tensor([0, 3, 4, 20, 47])
    x = torch.randn(7, 64)
    with torch.no_grad():
        assert torch.equal(int8.rows(tokens)(x), int8(x)[:, tokens])


def test_every_linear_layer_of_a_model_becomes_int8_and_the_embeddings_stay_float() -> None:
    model = tiny_model()
    model.make_output_projection_a_module()
    embedding = model.tgt_embed.weight.detach().clone()
    quantize_linear_layers(model)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    assert isinstance(model.output_proj, Int8Linear)
    assert model.tgt_embed.weight.dtype == torch.float32 and torch.equal(model.tgt_embed.weight, embedding)
