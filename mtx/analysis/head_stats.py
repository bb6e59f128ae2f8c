"""Per-head statistics: a few numbers that say what kind of view each attention head takes.

Voita et al. (2019, "Analyzing Multi-Head Self-Attention") and Clark et al. (2019, "What Does BERT Look At?")
found that many heads fall into a few kinds, which simple numbers tell apart: a positional head attends the
previous token or its own position; a "no-op" head parks its attention on a sentence-boundary token or on
punctuation; a broad head spreads it over the whole sentence (high entropy), a sharp one puts it on one key
(entropy near 0). For each head, with `weights` (Q, K) whose rows are distributions over the allowed keys:

- entropy: -Σ p log₂ p over the allowed keys, in bits, averaged over the query rows. A row of one-hot
  attention has 0 bits; a uniform row over n keys has log₂ n bits.
- previous: the share of attention on the key one position before the query's own, averaged over the query
  rows that have such a key (all but the first).
- same: the share on the key at the query's own position, averaged over the query rows that have one.
- boundary: the share on the sentence-boundary key: the source's final </s>, or the target's initial <s>.
- punctuation: the share on keys that are punctuation only.

Positions pair query i with key i on every kind of attention: in self-attention they are the same token; in
the decoder, query i is the step that reads target input i (<s> first) and key i that input, so "same" is the
token the step has just read; in cross-attention, key i is source token i, so "same" is the diagonal.
"""

from __future__ import annotations

import math
import unicodedata
from dataclasses import asdict, dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class HeadStats:
    """One head's statistics (see the module docstring); `head` None stands for the layer's heads averaged."""

    kind: str  # encoder, decoder or cross
    layer: int
    head: int | None
    entropy_bits: float
    previous: float
    same: float
    boundary: float
    punctuation: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def is_punctuation(text: str) -> bool:
    """Whether `text` has visible characters and all of them are Unicode punctuation (categories P*)."""
    visible = "".join(text.split())
    return bool(visible) and all(unicodedata.category(character).startswith("P") for character in visible)


def mean_entropy_bits(weights: Tensor) -> Tensor:
    """(..., Q, K) distributions → (...) the mean over the rows of each row's entropy in bits. Keys a row may
    not attend hold exactly 0 and add nothing (0 · log 0 = 0)."""
    return torch.special.entr(weights).sum(dim=-1).mean(dim=-1) / math.log(2)


def diagonal_share(weights: Tensor, offset: int) -> Tensor:
    """(..., Q, K) → (...) the mean over the query rows i that have a key i + `offset` of the attention on it."""
    diagonal = weights.diagonal(offset=offset, dim1=-2, dim2=-1)
    if diagonal.shape[-1] == 0:
        return weights.new_zeros(weights.shape[:-2])
    return diagonal.mean(dim=-1)


def share_on(weights: Tensor, keys: Tensor) -> Tensor:
    """(..., Q, K) → (...) the mean over the query rows of the attention on the keys that `keys` (K,) marks."""
    return (weights * keys.to(weights.dtype)).sum(dim=-1).mean(dim=-1)


def head_statistics(kind: str, weights: Tensor, boundary: Tensor, punctuation: Tensor) -> list[HeadStats]:
    """The statistics of every head of `weights` (L, H, Q, K) and of each layer's heads averaged (head None,
    after the layer's heads), in layer order. `boundary` and `punctuation` (K,) mark the keys of each kind."""
    with_means = torch.cat([weights.float(), weights.float().mean(dim=1, keepdim=True)], dim=1)
    columns = [mean_entropy_bits(with_means), diagonal_share(with_means, -1), diagonal_share(with_means, 0),
               share_on(with_means, boundary), share_on(with_means, punctuation)]
    rows = torch.stack(columns, dim=-1).tolist()  # (L, H + 1, statistics)
    heads = weights.shape[1]
    return [HeadStats(kind, layer, head if head < heads else None, *values)
            for layer, per_head in enumerate(rows) for head, values in enumerate(per_head)]
