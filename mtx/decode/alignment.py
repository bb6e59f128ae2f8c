"""Word alignments from cross-attention: for each target word, the source word it was translated from.

The search carries them: asked for a layer (`AligningDecoder`), the decoder hands out that layer's cross-attention
weights at every step, computed beside its attention's fast path, and the search keeps each hypothesis' rows,
reordering them with its beams (as fairseq does), so no second pass of the translations through the decoder is
needed. The search's choices are the same with or without them.

From the cross-attention of one decoder layer, averaged over its heads, each target token's row is the
attention of the step that predicted it (the EOS step's row is left out). Tokens are subwords; words are the
whitespace-separated words of the normalised source line and of the output line, and each token belongs to the
word where its first visible character falls (`Tokenizer.word_of_each_token`). Pooling to words:

- over a source word's subwords the attention is summed: it is the share of the target token's attention that
  the word receives, whatever the number of pieces it was cut into (a maximum would favour a word whose
  attention is concentrated in one piece over one whose attention is spread over several);
- over a target word's subwords it is averaged: each row is a distribution over the source, and their mean is
  the word's distribution, with the argmax of their sum.

The source's EOS column is left out, and each target word is aligned to the source word of highest pooled
attention: one link per target word, printed in target order as Pharaoh "source-target" pairs (0-based word
indices), e.g. "0-0 2-1 1-2".
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.decode.search import Hypothesis
from mtx.decode.translation import Alignment
from mtx.model.decoder_state import DecoderState
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer


class AligningDecoder:
    """The model as search drives it (an `mtx.decode.search.IncrementalDecoder`), its decoder state asked to hand
    out the cross-attention of decoder layer `layer` at every step (`DecoderState.attention`)."""

    def __init__(self, model: Transformer, layer: int) -> None:
        self.model, self.layer = model, layer

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return self.model.encode(src, src_pad)

    def init_state(self, memory: Tensor, src_pad: Tensor, max_len: int) -> DecoderState:
        return self.model.init_state(memory, src_pad, max_len, attention_layer=self.layer)

    def decode_step(self, prev: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        return self.model.decode_step(prev, state)


def word_count(words: list[int | None]) -> int:
    return 1 + max((word for word in words if word is not None), default=-1)


def word_indices(words_per_row: list[list[int | None]], length: int, count: int) -> Tensor:
    """(rows, length) long: each token's word, and `count` (a word beyond the real ones, which pooling then
    drops) for a token of no word and for the positions beyond a row's tokens."""
    return torch.tensor([[count if word is None else word for word in words] + [count] * (length - len(words))
                         for words in words_per_row])


def word_attention(attention: Tensor, target_words: list[list[int | None]],
                   source_words: list[list[int | None]]) -> Tensor:
    """The (rows, target tokens, source tokens) float32 attention of a batch of hypotheses pooled to (rows,
    target words, source words): averaged over each target word's tokens, summed over each source word's.
    A token of no word (EOS among them) counts in none, and neither do the tokens beyond a row's lists. The
    words are as many as the most of any row; a row with fewer has zeros beyond its own."""
    rows, length, width = attention.shape
    target_count = max(map(word_count, target_words), default=0)
    source_count = max(map(word_count, source_words), default=0)
    target = word_indices(target_words, length, target_count).to(attention.device)
    source = word_indices(source_words, width, source_count).to(attention.device)
    by_source = attention.new_zeros(rows, length, source_count + 1)
    by_source.scatter_add_(2, source[:, None, :].expand(rows, length, width), attention)
    summed = attention.new_zeros(rows, target_count + 1, source_count + 1)
    summed.scatter_add_(1, target[:, :, None].expand(rows, length, source_count + 1), by_source)
    tokens = attention.new_zeros(rows, target_count + 1).scatter_add_(1, target, torch.ones_like(attention[:, :, 0]))
    return (summed / tokens.clamp(min=1.0).unsqueeze(2))[:, :target_count, :source_count]


def hard_alignments(pooled: Tensor, target_words: list[list[int | None]],
                    source_words: list[list[int | None]]) -> list[Alignment]:
    """Each target word of each row of `word_attention`'s `pooled` linked to its source word of highest
    attention (the first, of equals): (source, target) pairs in target order; none when either side has no
    words."""
    source_counts = torch.tensor([word_count(words) for words in source_words])
    beyond = torch.arange(pooled.shape[2]) >= source_counts[:, None]  # (rows, source words) not in the row
    best = pooled.masked_fill(beyond[:, None, :], -1.0).argmax(dim=2).tolist()
    return [[(best[row][target], target) for target in range(word_count(words))] if source_counts[row] else []
            for row, words in enumerate(target_words)]


def pharaoh(alignment: Alignment) -> str:
    """The Pharaoh format of Moses and Marian: "source-target" pairs separated by spaces."""
    return " ".join(f"{source}-{target}" for source, target in alignment)


def align_searched(tokenizer: Tokenizer, sources: list[list[int]], nbests: list[list[Hypothesis]]
                   ) -> list[list[Alignment]]:
    """The word alignment of every hypothesis of `nbests`, each carrying its attention rows from the search
    (`Hypothesis.attention`); `sources` holds each sentence's token ids, EOS included, as searched."""
    rows = [(sources[i], h.tokens, h.attention) for i, nbest in enumerate(nbests) for h in nbest]
    links = iter(align_rows(tokenizer, rows))
    return [[next(links) for _ in nbest] for nbest in nbests]


def align_rows(tokenizer: Tokenizer, rows: list[tuple[list[int], list[int], Tensor]]) -> list[Alignment]:
    """The word alignment of each (source ids, target tokens, attention (≥ tokens, S) heads averaged) row."""
    if not rows:
        return []
    width = max(attention.shape[1] for _, _, attention in rows)
    length = max(len(tokens) for _, tokens, _ in rows)
    attention = torch.zeros(len(rows), length, width)
    for row, (_, tokens, weights) in enumerate(rows):
        attention[row, : len(tokens), : weights.shape[1]] = weights[: len(tokens)].float().cpu()
    target_words = [tokenizer.word_of_each_token(tokens) for _, tokens, _ in rows]
    source_words = [tokenizer.word_of_each_token(source) for source, _, _ in rows]
    return hard_alignments(word_attention(attention, target_words, source_words), target_words, source_words)
