"""int8 inference on a CPU: every linear layer's product in 8-bit integers, each row quantised on its own.

`mtx translate --dtype int8` stores each weight matrix W as int8 with one scale for the matrix (s_W = max|W| /
127), and quantises its input x as it comes, **one scale per row** (s_x = max|x_row| / 127, as CTranslate2
does), so that

    x · Wᵀ + b  ≈  (q_x · q_Wᵀ) ⊙ (s_x · s_W) + b,

the integer product exact in int32 (`torch._int_mm`: k products of at most 127² stay below 2³¹ for k up to
133,000 inputs, wider than any layer `ModelConfig` allows).

Why per row, rather than the one scale per batch of PyTorch's dynamic quantisation (`torch.ao`, which mtx used
before): with one scale per batch, a sentence's every activation is rounded to a grid that its batch's largest
value sets, so its translation depends on what it was batched with, and `mtx translate` batches whatever lines
a window holds, `mtx serve` whatever requests arrived together. Here a layer's output row depends on its input
row alone, bit for bit, so a sentence's int8 translation is the same in any batch, at any thread count (tested),
as its float32 one is: up to float32's own last-bit rounding in attention over padded sources, which int8's
rounding can now and then turn into another token.
The weights keep one scale per matrix, as `torch.ao`'s did: a scale per output row costs another pass over
every product's output. What this costs in speed and BLEU is in bench/README.md ("int8 rounded row by row").
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

LEVELS = 127  # symmetric int8: the integers within ±127, so that −x quantises to −q
TINY = 1e-30  # a row of zeros gets this scale instead of 0, and quantises to zeros


class Int8Linear(nn.Module):
    """An nn.Linear's function with its weight in int8 (one scale) and its input quantised row by row."""

    def __init__(self, weight_t: Tensor, weight_scale: float, bias: Tensor | None) -> None:
        super().__init__()
        self.in_features, self.out_features = weight_t.shape
        self.register_buffer("weight_t", weight_t)  # (in, out) int8, contiguous: the layout `_int_mm` reads
        self.weight_scale = weight_scale  # s_W: int8 weight q stands for q · s_W
        self.register_buffer("bias", bias)

    @classmethod
    def of(cls, weight: Tensor, bias: Tensor | None) -> Int8Linear:
        """The int8 form of a float (out, in) `weight` and its `bias`."""
        weight = weight.detach().float()
        scale = max(weight.abs().max().item(), TINY) / LEVELS
        quantised = torch.round(weight / scale).to(torch.int8)
        return cls(quantised.t().contiguous(), scale, None if bias is None else bias.detach().float().clone())

    def rows(self, tokens: Tensor) -> Int8Linear:
        """This layer over the outputs `tokens` alone (a shortlist's rows of the output matrix): their int8
        weights at the same scale, so each output is the one this layer computes for it, bit for bit."""
        bias = None if self.bias is None else self.bias.index_select(0, tokens)
        return Int8Linear(self.weight_t.index_select(1, tokens).contiguous(), self.weight_scale, bias)

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)  # float32
        scale = rows.abs().amax(dim=1, keepdim=True).clamp_min_(TINY).div_(LEVELS)  # s_x = max|x_row| / 127
        quantised = torch.div(rows, scale).round_().to(torch.int8)
        products = torch._int_mm(quantised, self.weight_t)  # (rows, out) int32, exact
        # Converted, then scaled in place: faster than one multiplication of int32 by float32 into a new tensor.
        out = products.float().mul_(scale.mul_(self.weight_scale))  # · s_x · s_W
        if self.bias is not None:
            out.add_(self.bias)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def quantize_linear_layers(model: nn.Module) -> nn.Module:
    """`model` with every nn.Linear replaced by its `Int8Linear`, in place (a weight shared by two layers, or by a
    layer and an embedding, gets a copy per layer; the embedding keeps its float one)."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, name, Int8Linear.of(child.weight, child.bias))
    return model
