"""Sampling's randomness and its filters: what a sampled translation may draw, and the draw itself.

A sampled translation must depend on the seed, the line's index in the input and the model only — not on the
batch the line landed in, the batch size, the threads or the device — so that a monolingual corpus translated
in shards, in any order, on any machine, gives the very sample the whole file would (back-translation at scale
does this; Edunov et al., 2018). A random generator consumed row by row cannot promise that: a row's draws
would depend on how many rows came before it. So each draw is a counter-based random number, a hash of
(seed, line, sample, step) — the same idea as Philox, which PyTorch uses on GPUs — computed for every row at
once with integer tensor arithmetic, and turned into a token by inverse transform sampling: the first token
whose cumulative probability exceeds the uniform number. The same integers on any device give the same
numbers; the probabilities they are compared with are the model's, which agree across batchings and devices to
float rounding, so a sample can differ only where a uniform number falls within that rounding of a boundary
between two tokens.

The filters are the usual ones, applied to the model's log-probabilities: top-k keeps the k most probable tokens
(the same k whether before or after the temperature, which keeps their order), a temperature T divides them (T < 1
sharpens the distribution, T > 1 flattens it), top-p (nucleus sampling, Holtzman et al., 2020) keeps the fewest most
probable tokens whose tempered probabilities sum to at least p.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

MASK32 = 0xFFFFFFFF
TEMPERATURES = (1e-30, 1e30)  # the temperatures that float32 tells apart: see `filtered`


def _mul32(x: Tensor, constant: int) -> Tensor:
    """x · constant mod 2^32, for x in [0, 2^32): in two 16-bit halves, so no product leaves int64's range."""
    low, high = x & 0xFFFF, x >> 16
    return ((((high * constant) & 0xFFFF) << 16) + low * constant) & MASK32


def _hash32(x: Tensor) -> Tensor:
    """A 32-bit integer hash with good avalanche ("lowbias32", C. Wellons' hash prospector), on int64 tensors."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def line_indices(lines: Sequence[int]) -> Tensor:
    """The input lines' indices as the draws read them, int64: modulo 2^32, as the 32-bit hash mixes them (so any
    index, however large, has its draws, and those of lines below 2^32 are unchanged)."""
    return torch.tensor([line & MASK32 for line in lines], dtype=torch.int64)


def uniforms(seed: int, lines: Tensor, samples: Tensor, step: int) -> Tensor:
    """A number in (0, 1) for each row, float64, from its (seed, line, sample) and the decoding step alone.

    lines, samples: (N,) int64 — the input line each row translates and which of its samples the row is.
    """
    x = _hash32(torch.full_like(lines, seed & MASK32))
    for value in (lines, samples, torch.full_like(lines, step)):
        x = _hash32(x ^ _hash32(value + 0x9E3779B9))
    low = _hash32(x ^ 0x85EBCA6B) >> 11  # 32 + 21 = 53 bits: all that a float64's mantissa holds
    return (x.double() * 2.0**21 + low.double() + 0.5) / 2.0**53


def filtered(log_probs: Tensor, temperature: float, topk: int, topp: float) -> Tensor:
    """The distribution to draw from, as log-probabilities (N, V) with -inf for what the filters leave out.

    Every temperature > 0 and every p in (0, 1] has a meaning, and gets it. The temperature is first brought into
    `TEMPERATURES`, which changes no draw: in float32, every temperature below 1e-30 already gives the most probable
    token all the probability (two distinct log-probabilities of one distribution differ by at least float32's
    spacing at log 1/2, about 6e-8, so divided they lie 1e22 apart), and every one above 1e30 a flat distribution
    over the tokens the search allows (a model's finite log-probabilities lie within about 1e4 of its best, so
    divided they lie within 1e-26 of it, which float32 cannot tell from 0 beside 1). Unbrought, a temperature of
    1e-300 would be 0 in float32 and one of 1e300 infinite, and the log-probabilities NaN. Top-k is applied
    before it, which keeps the tokens' order and so the same k. Top-p keeps at least the most probable token,
    however small p, so a p that float32 rounds to 0 still leaves one.
    """
    scores = log_probs.clone()
    if 0 < topk < scores.shape[1]:
        kth = scores.topk(topk, dim=1).values[:, -1:]
        scores.masked_fill_(scores < kth, -torch.inf)
    if temperature != 1.0:
        scores /= min(max(temperature, TEMPERATURES[0]), TEMPERATURES[1])
    scores = scores.log_softmax(dim=1)
    if topp < 1.0:
        ordered, order = scores.sort(dim=1, descending=True)
        before = ordered.exp().cumsum(dim=1) - ordered.exp()  # the probability of the tokens ranked above
        outside = before >= topp
        outside[:, 0] = False
        drop = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, order, outside)
        scores = scores.masked_fill(drop, -torch.inf).log_softmax(dim=1)
    return scores


def draw(scores: Tensor, u: Tensor) -> Tensor:
    """The token of each row (N,) whose cumulative probability first exceeds u (N,): inverse transform sampling
    over `scores` (N, V) log-probabilities, summed in float64 so that no token's share is lost to rounding."""
    cumulative = scores.double().exp().cumsum(dim=1)
    target = (u * cumulative[:, -1]).unsqueeze(1)  # the sums may miss 1 by rounding: scale u instead
    token = torch.searchsorted(cumulative, target, right=True).squeeze(1)
    return token.clamp_(max=scores.shape[1] - 1)
