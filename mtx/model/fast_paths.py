"""CPU fast paths: the same computations as mtx.model.transformer's, arranged to run faster on a CPU.

Each function here computes what the model's plain expression computes (the tests check it), and on a GPU
every one of them is that plain PyTorch call. They exist because a CPU pays for a few operations out of
proportion to their share of the arithmetic: a Bernoulli draw per dropped element, SDPA's setup for a decoding
step's handful of queries, a beam reorder's rows gathered before they are copied, and a large vocabulary's output
matrix falling out of the cache. What each path was measured to gain is in bench/README.md, in the table "The CPU
fast paths".

Shapes follow mtx.model.transformer: B sentences, H heads, Dh the head size, D = d_model, V the vocabulary.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# ------------------------------------------------------------------------------------------- dropout §5.4


class Dropout(nn.Module):
    """Inverted dropout: each element kept with probability 1 − p and scaled by 1 / (1 − p).

    On a GPU this is `F.dropout`. On a CPU, `F.dropout` draws one Bernoulli sample per element from a serial
    generator, a visible share of a training update; here each element gets 16 random bits instead, 64 bits
    per draw of the same seeded generator, and is dropped when they fall below p · 2^16. So p is rounded to a
    multiple of 2^-16 (0.1 becomes 0.1000061) and the scale uses the rounded value, keeping the expectation
    exact.
    """

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if x.device.type != "cpu":
            return F.dropout(x, self.p, training=True)
        dropped = round(self.p * 65536)  # of the 2^16 values 16 random bits can take
        if dropped >= 65536:
            return x * 0.0
        bits = torch.empty(x.numel() // 4 + 1, dtype=torch.int64).random_(-(2**63), None)
        bits = bits.view(torch.int16)[: x.numel()].view(x.shape)
        # bool → uint8 → float converts faster than bool → float, and a float mask multiplies faster than a
        # bool one; the mask is what autograd keeps for the backward, as F.dropout's is.
        keep = (bits >= dropped - 32768).view(torch.uint8).to(x.dtype).mul_(65536 / (65536 - dropped))
        return x * keep

    def extra_repr(self) -> str:
        return f"p={self.p}"


# ----------------------------------------------------------------------------------------- attention §3.2

FEW_QUERIES = 16  # queries per row up to which attention on a CPU is computed explicitly (faster than SDPA there)


def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout: float, causal: bool) -> Tensor:
    """softmax(Q Kᵀ / √Dh) V: q (B, H, Q, Dh), k and v (B, H, S, Dh), `mask` broadcastable to (B, H, Q, S) and
    True where a key may be attended, `dropout` the attention dropout rate, `causal` hiding later keys →
    (B, H, Q, Dh).

    Decoding asks for a handful of queries per row: one in a step's self-attention, one per beam in its
    cross-attention (`mtx.model.transformer.DecoderLayer.step`). There SDPA's CPU kernel, built for blocks of queries,
    costs more than the explicit two matmuls and softmax, so on a CPU up to `FEW_QUERIES` of them per row are
    computed by `explicit_attention` (short sources in the encoder too). Everywhere else (training with its
    dropout and causal masks, longer sequences, any GPU, whose SDPA kernels are the fast path) SDPA it is.
    """
    if q.shape[2] <= FEW_QUERIES and q.device.type == "cpu" and dropout == 0.0 and not causal:
        return explicit_attention(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)


def explicit_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """Scaled dot-product attention written out, shapes and mask as in `attention`: what SDPA computes,
    without dropout, for the few queries Q per row of a decoding step."""
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(q.shape[-1] ** -0.5)
    if mask is not None:
        scores.masked_fill_(~mask, -torch.inf)
    return torch.matmul(scores.softmax(dim=-1), v)


# ---------------------------------------------------------------------------------------- beam reorders


def copy_within(tensor: Tensor, dim: int, sources: Tensor, places: Tensor) -> None:
    """Copy the slices `sources` of `tensor` along `dim` into its slices `places`, in place; no place may be a
    source (what is copied is never overwritten before it is read).

    = tensor.index_copy_(dim, places, tensor.index_select(dim, sources))

    A beam reorder copies a few rows of the decoder's cache within it (`DecoderState.reorder`). Through a gathered
    temporary that is two passes over each row, by PyTorch's general index kernels; on a CPU one `copy_` a row,
    straight from its source to its place, is one pass of contiguous runs. On a GPU, one launch per row would
    cost more than the two kernels.
    """
    if tensor.device.type == "cpu":
        for source, place in zip(sources.tolist(), places.tolist(), strict=True):
            tensor.select(dim, place).copy_(tensor.select(dim, source))
    else:
        tensor.index_copy_(dim, places, tensor.index_select(dim, sources))


# ------------------------------------------------------------------------------ output projection §3.4

SLICE_BYTES = 2**20  # the size of the slices of the output matrix that decoding on a CPU projects onto


def tied_projection(h: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """h · weightᵀ + bias: (..., D) states onto the (V, D) embedding matrix, plus the (V,) output bias where the
    model has one → (..., V) logits.

    Decoding on a CPU projects onto `SLICE_BYTES` slices of the matrix, one after the other: multiplying the
    rows of a beam step by the whole matrix of a large vocabulary at once is slower, as MKL's blocks of the
    matrix no longer stay in cache. Under autograd and on a GPU it is one product.
    """
    if h.device.type != "cpu" or torch.is_grad_enabled():
        return F.linear(h, weight, bias)
    rows = max(1, SLICE_BYTES // (weight.shape[1] * weight.element_size()))
    return torch.cat([F.linear(h, weight[i : i + rows], None if bias is None else bias[i : i + rows])
                      for i in range(0, weight.shape[0], rows)], dim=-1)


# ------------------------------------------------------------------------- the weights' layout for inference


def transposed_layout(weight: Tensor) -> Tensor:
    """`weight`'s values, stored transposed: a (out, in) view of a contiguous (in, out) tensor."""
    return weight.detach().t().contiguous().t()


def store_weights_transposed(model: nn.Module) -> None:
    """Store every nn.Linear's weight transposed, in place: the same values, read by the same `F.linear`.

    `F.linear(x, W)` computes x · Wᵀ. With W as training leaves it, row-major (out, in), MKL's single-precision
    GEMM first copies Wᵀ into blocks of its own at every call, and a decoding step makes dozens of such calls
    on a few rows each; with Wᵀ itself contiguous, MKL multiplies the weights where they are. A decoding model
    on a CPU is stored this way once (`mtx.decode.translator.prepare_model`); training keeps the layout its
    optimizer state follows. A weight shared with an embedding (the output projection's, once a module of its
    own) gets a transposed copy, as looking up rows of a transposed matrix would read a whole column each.
    """
    for module in model.modules():
        if isinstance(module, nn.Linear) and not module.weight.t().is_contiguous():
            module.weight = nn.Parameter(transposed_layout(module.weight), requires_grad=False)
