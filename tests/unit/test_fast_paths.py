"""The CPU fast paths compute what the plain PyTorch expressions they stand in for compute."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mtx.model.fast_paths import (
    FEW_QUERIES,
    SLICE_BYTES,
    Dropout,
    attention,
    copy_within,
    explicit_attention,
    store_weights_transposed,
    tied_projection,
)

# ------------------------------------------------------------------------------------------------- dropout


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_drops_at_rate_p_and_keeps_the_expectation(p: float) -> None:
    dropout = Dropout(p).train()
    x = torch.full((400, 500), 2.0, requires_grad=True)
    torch.manual_seed(0)
    y = dropout(x)
    dropped = (y == 0).float().mean().item()
    assert abs(dropped - p) < 4 * (p * (1 - p) / x.numel()) ** 0.5  # within 4 standard deviations
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 2.0 / (1 - round(p * 65536) / 65536)))
    torch.testing.assert_close(y.mean(), torch.tensor(2.0), rtol=0.01, atol=0)
    y.sum().backward()  # the gradient passes exactly where the value did, with the same scale
    torch.testing.assert_close(x.grad, y.detach() / 2.0)


def test_dropout_follows_the_seed_and_is_off_in_eval() -> None:
    """The trainer's exact resume rests on dropout being a function of torch's seed."""
    dropout = Dropout(0.1).train()
    x = torch.randn(3, 7, 16)
    torch.manual_seed(5)
    first = dropout(x)
    torch.manual_seed(5)
    assert torch.equal(dropout(x), first)
    assert not torch.equal(dropout(x), first)
    assert dropout.eval()(x) is x
    assert Dropout(0.0).train()(x) is x


# ----------------------------------------------------------------------------------------------- attention


def qkv_and_mask(queries: int, keys: int = 6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(3, 4, queries, 8) queries against 6 keys and values, and a mask hiding the second row's last two keys."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(3, 4, length, 8, generator=g) for length in (queries, keys, keys))
    may_attend = torch.ones(3, 1, 1, keys, dtype=torch.bool)
    may_attend[1, ..., keys - 2 :] = False
    return q, k, v, may_attend


@pytest.mark.parametrize("queries", [1, 4])
def test_explicit_attention_equals_sdpa(queries: int) -> None:
    """The explicit attention of decoding steps on the CPU computes what SDPA computes, for one query per row
    (self-attention) or a few (a sentence's beams in cross-attention)."""
    q, k, v, may_attend = qkv_and_mask(queries)
    for mask in (None, may_attend):
        torch.testing.assert_close(explicit_attention(q, k, v, mask),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=mask))


@pytest.mark.parametrize("queries", [1, FEW_QUERIES, FEW_QUERIES + 1])
def test_attention_equals_sdpa_on_either_side_of_few_queries(queries: int) -> None:
    """Whichever path `attention` takes, explicit up to FEW_QUERIES queries per row or SDPA beyond, padded or
    causal, it computes SDPA's result."""
    q, k, v, may_attend = qkv_and_mask(queries)
    for mask in (None, may_attend):
        torch.testing.assert_close(attention(q, k, v, mask, dropout=0.0, causal=False),
                                   F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
    q, k, v, _ = qkv_and_mask(queries, keys=queries)
    torch.testing.assert_close(attention(q, k, v, None, dropout=0.0, causal=True),
                               F.scaled_dot_product_attention(q, k, v, is_causal=True))


# ---------------------------------------------------------------------------------------- beam reorders


@pytest.mark.parametrize("dim", [0, 2])
def test_copy_within_equals_index_copy_of_the_gathered_slices(dim: int) -> None:
    """Slices copied row by row within a tensor (a beam reorder's second continuations, and sentences moved into
    the places of dropped ones) land exactly where index_copy_ of the gathered slices puts them, in a strided
    view as the decoder's cache is (its filled positions only), and nothing else changes."""
    def filled(cache: torch.Tensor) -> torch.Tensor:  # a strided view whose `dim` holds 9 slices
        return cache[:, :, :, :, :5] if dim == 2 else cache[:, 0, :, :, :5].movedim(1, 0)

    g = torch.Generator().manual_seed(3)
    cache = torch.randn(2, 2, 9, 3, 7, 4, generator=g)
    sources, places = torch.tensor([4, 0, 4, 8]), torch.tensor([1, 6, 2, 3])  # a source copied twice
    expected = cache.clone()
    filled(expected).index_copy_(dim, places, filled(expected).index_select(dim, sources))
    copy_within(filled(cache), dim, sources, places)
    assert torch.equal(cache, expected)


def test_copy_within_off_a_cpu_reads_no_index_on_the_host() -> None:
    """Off a CPU the copy stays the two indexing kernels, which never bring the indices to the host (a meta
    tensor has no values to bring: reading them would raise)."""
    cache = torch.empty(2, 9, 3, device="meta")
    copy_within(cache, 1, torch.tensor([4, 8], device="meta"), torch.tensor([1, 2], device="meta"))


# --------------------------------------------------------------------------------------- output projection

# An embedding matrix whose float32 form spans two and a half of tied_projection's slices (one and a quarter in
# bfloat16), so the last slice is partial.
SLICED_D, SLICED_VOCAB = 256, 2560


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sliced_output_projection_equals_one_matmul(dtype: torch.dtype) -> None:
    """Decoding on a CPU projects onto the embedding matrix a slice at a time; the slices, the partial last
    one included, must put together exactly the logits of one F.linear over the whole matrix, for a decoding
    step's (B, 1, D) states and for flat (N, D) ones, with and without an output bias."""
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(SLICED_VOCAB, SLICED_D, generator=g).to(dtype)
    assert weight.numel() * weight.element_size() > SLICE_BYTES  # more than one slice
    assert (weight.numel() * weight.element_size()) % SLICE_BYTES  # the last slice is partial
    bias = torch.randn(SLICED_VOCAB, generator=g).to(dtype)
    for shape in ((6, 1, SLICED_D), (11, SLICED_D)):
        h = torch.randn(shape, generator=g).to(dtype)
        with torch.no_grad():
            torch.testing.assert_close(tied_projection(h, weight), F.linear(h, weight))
            # a model's output bias (model.output_bias) is sliced with the matrix's rows
            torch.testing.assert_close(tied_projection(h, weight, bias), F.linear(h, weight, bias))


# ------------------------------------------------------------------------- the weights' layout for inference


def test_weights_stored_transposed_keep_their_values_and_products() -> None:
    """Every nn.Linear's weight is stored transposed (its transpose contiguous) with the same values, so each
    layer's output is unchanged; a weight the module shares with an embedding is copied, and the embedding keeps
    reading its own row-major matrix."""
    g = torch.Generator().manual_seed(2)
    embedding = nn.Embedding(50, 16)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16), nn.Linear(16, 50, bias=False))
    model[3].weight = embedding.weight  # tied, as the output projection is
    x = torch.randn(7, 16, generator=g)
    with torch.no_grad():
        before, weights = model(x), [m.weight.clone() for m in model if isinstance(m, nn.Linear)]
        store_weights_transposed(model)
        after = model(x)
    for module, weight in zip([m for m in model if isinstance(m, nn.Linear)], weights, strict=True):
        assert module.weight.t().is_contiguous() and not module.weight.is_contiguous()
        assert torch.equal(module.weight, weight)
    assert model[3].weight.data_ptr() != embedding.weight.data_ptr() and embedding.weight.is_contiguous()
    torch.testing.assert_close(after, before, rtol=1e-5, atol=1e-6)
