"""Alignment error rate: how well word alignments match gold ones (Och & Ney, 2003, "A Systematic Comparison of
Various Statistical Alignment Models", §5).

A gold alignment has sure links S, where annotators agree, and possible links P, which include the sure ones
(P ⊇ S) and add the loose correspondences. Against it, an alignment A has

    precision = |A ∩ P| / |A|      recall = |A ∩ S| / |S|      AER = 1 − (|A ∩ S| + |A ∩ P|) / (|A| + |S|)

so a link is never wrong for being only possible, and a sure link is missed when absent. Over a corpus the
counts are summed over its sentences before dividing, as Och & Ney do: a long sentence weighs more than a short
one.

Gold lines are Pharaoh lines, "i-j" for a sure link and "ipj" for a possible one (source word i, target word j,
0-based), the convention of the alignment-scripts of Zenkel et al. (2019), which the demo's gold alignments
follow (mtx.data.demo.words).

The alignments measured are a model's, made as `mtx translate --alignment` makes them (mtx.decode.alignment), but of
the reference translation forced through the decoder: the gold links are over the reference's words, which a
model's own translation may not have. A monotone diagonal is the baseline they must beat.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from mtx.data.batching import padded
from mtx.decode.alignment import hard_alignments, word_attention, word_count
from mtx.decode.translation import Alignment
from mtx.errors import MtxError
from mtx.model.transformer import AttentionWeights, Transformer
from mtx.tokenizer import BOS, EOS, PAD, Tokenizer

Link = tuple[int, int]  # (source word, target word)


@dataclass(frozen=True)
class GoldAlignment:
    """A sentence's gold links: `sure` ones, and `possible` ones, which hold the sure ones too."""

    sure: frozenset[Link]
    possible: frozenset[Link]


def read_gold(line: str) -> GoldAlignment:
    """A gold Pharaoh line: "i-j" links are sure, "ipj" ones possible."""
    sure, possible = set(), set()
    for item in line.split():
        kind = "p" if "p" in item else "-"
        source, _, target = item.partition(kind)
        if not (source.isdigit() and target.isdigit()):
            raise MtxError(f"{item!r} is not a gold alignment link: expected i-j (sure) or ipj (possible), "
                           "with i and j 0-based word indices.")
        link = (int(source), int(target))
        possible.add(link)
        if kind == "-":
            sure.add(link)
    return GoldAlignment(frozenset(sure), frozenset(possible))


@dataclass(frozen=True)
class AlignmentCounts:
    """The counts that precision, recall and AER are made of, summed over sentences with `+`."""

    proposed: int = 0  # |A|
    sure: int = 0  # |S|
    proposed_sure: int = 0  # |A ∩ S|
    proposed_possible: int = 0  # |A ∩ P|

    def __add__(self, other: AlignmentCounts) -> AlignmentCounts:
        return AlignmentCounts(self.proposed + other.proposed, self.sure + other.sure,
                               self.proposed_sure + other.proposed_sure,
                               self.proposed_possible + other.proposed_possible)

    @property
    def precision(self) -> float:
        return self.proposed_possible / self.proposed if self.proposed else 0.0

    @property
    def recall(self) -> float:
        return self.proposed_sure / self.sure if self.sure else 0.0

    @property
    def aer(self) -> float:
        total = self.proposed + self.sure
        return 1.0 - (self.proposed_sure + self.proposed_possible) / total if total else 0.0


def sentence_counts(proposed: Iterable[Link], gold: GoldAlignment) -> AlignmentCounts:
    """One sentence's counts; a link proposed twice counts once."""
    links = set(proposed)
    return AlignmentCounts(len(links), len(gold.sure), len(links & gold.sure), len(links & gold.possible))


def corpus_counts(proposed: Iterable[Iterable[Link]], gold: Iterable[GoldAlignment]) -> AlignmentCounts:
    """The counts summed over sentences, the i-th proposed alignment against the i-th gold one."""
    total = AlignmentCounts()
    for links, reference in zip(proposed, gold, strict=True):
        total += sentence_counts(links, reference)
    return total


# ------------------------------------------------------------------------------- the alignments measured


@dataclass(frozen=True)
class PairAttention:
    """A sentence pair's cross-attention of every decoder layer and head, pooled to words as `mtx translate
    --alignment` pools it: (layers, heads, target words, source words)."""

    words: Tensor
    source_words: list[int | None]  # each source token's word, as mtx.decode.alignment takes them
    target_words: list[int | None]

    def links(self, attention: Tensor) -> Alignment:
        """The hard alignment of (target words, source words) `attention`: each target word's best source word."""
        return hard_alignments(attention[None], [self.target_words], [self.source_words])[0]


def reference_attention(model: Transformer, tokenizer: Tokenizer, pairs: Sequence[tuple[str, str]],
                        batch_size: int = 64) -> list[PairAttention]:
    """Each pair's pooled cross-attention, the reference target forced through the decoder (BOS, then its
    tokens, as the hypotheses of a search are). Pooling is linear, so averaging a layer's heads after pooling
    gives what `mtx translate` gets by pooling their average."""
    model.eval()
    results = []
    for start in range(0, len(pairs), batch_size):
        batch = pairs[start : start + batch_size]
        sources = [[*ids, EOS] for ids in tokenizer.encode_batch([tokenizer.normalize(s) for s, _ in batch])]
        targets = tokenizer.encode_batch([tokenizer.normalize(t) for _, t in batch], target=True)
        src = padded(sources)
        attention = AttentionWeights()
        with torch.inference_mode():
            model(src, src == PAD, padded([[BOS, *ids] for ids in targets]), attention=attention)
        cross = attention.stacked("cross")
        source_words = [tokenizer.word_of_each_token(ids) for ids in sources]
        target_words = [tokenizer.word_of_each_token(ids) for ids in targets]
        layers, heads = cross.shape[1:3]
        pooled = torch.stack([torch.stack([word_attention(cross[:, layer, head], target_words, source_words)
                                           for head in range(heads)]) for layer in range(layers)])
        for row, (src_words, tgt_words) in enumerate(zip(source_words, target_words, strict=True)):
            words = pooled[:, :, row, : word_count(tgt_words), : word_count(src_words)]
            results.append(PairAttention(words, src_words, tgt_words))
    return results



def diagonal(source_words: int, target_words: int) -> Alignment:
    """The monotone baseline: target word j linked to the source word at the same relative position,
    round(j · (m − 1) / (n − 1)) of m source and n target words."""
    if not source_words:
        return []
    scale = (source_words - 1) / (target_words - 1) if target_words > 1 else 0.0
    return [(math.floor(j * scale + 0.5), j) for j in range(target_words)]
