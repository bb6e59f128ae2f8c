"""Vocabulary shortlists: each sentence searched over the few target tokens it is likely to need.

The output layer of a decoding step multiplies every hypothesis' state by the whole (V, D) output matrix, and
the log-softmax and the search then read all V scores, while a sentence's translation draws on a few hundred
tokens. A shortlist (Marian's `--shortlist`, Sockeye's `--restrict-lexicon`, CTranslate2's `use_vmap`) keeps, per
sentence: the `frequent` most frequent target tokens, the `translations` likeliest target tokens of each of its
source tokens by the checkpoint's lexical table (mtx.data.lexicon), EOS, and the tokens it is forced to produce
(its target prefix, or the translation `--score-reference` scores), which are added rather than refused. Its
tokens' probabilities are renormalised over that set: search, sampling and forced scores all see the same
distribution.

Each sentence has its own set, never its batch's: when a batch's union is the shortlist (as in
mozilla/translations#977), a sentence's output depends on what it was batched with. Here a batch's output layer
is computed once over the union of its sentences' sets (one matrix product, a few hundred rows of the output
matrix rather than V), and each row's log-softmax over its own sentence's set alone, the rest -inf. So a
sentence's translation is the same whatever it is batched with (tested). The log-probabilities handed to the
search are those U columns, not V: the state says which token each is (`columns`), and the search, its
constraints and forced scoring map between tokens and columns (mtx.decode.search.token_columns).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from mtx.data.lexicon import Lexicon
from mtx.decode.search import DecoderCache, IncrementalDecoder
from mtx.model import fast_paths
from mtx.model.int8 import Int8Linear
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD


@dataclass(frozen=True)
class Shortlist:
    """Which target tokens each sentence's search may produce: `frequent` most frequent ones and `translations`
    per source token, from `lexicon`."""

    lexicon: Lexicon
    translations: int
    frequent: int

    def candidates(self, sources: Sequence[Sequence[int]], forced: Sequence[Sequence[int]] | None = None
                   ) -> list[np.ndarray]:
        """Each sentence's sorted token ids: from its source tokens (`sources`), plus its `forced` tokens and
        PAD, BOS and EOS. PAD and BOS are never produced (the search forbids them), but the whole vocabulary's
        log-softmax counts them, and so does a shortlist's: a shortlist of every token is the whole vocabulary."""
        common = np.concatenate([[PAD, BOS, EOS], self.lexicon.frequent[: self.frequent]]).astype(np.int64)
        table = self.lexicon.translations[:, : self.translations]
        return [np.unique(np.concatenate([common, table[np.asarray(source, dtype=np.int64)].ravel(),
                                          np.asarray([] if forced is None else forced[i], dtype=np.int64)]))
                for i, source in enumerate(sources)]


@dataclass
class ShortlistState:
    """The wrapped decoder's state, and the batch's shortlist as the open sentences need it: `columns` (U,) the
    union of the batch's sets, sorted, and `outside` (B, U) True where sentence b's set lacks token columns[u].
    Reordered with the state: sentences that leave take their rows of `outside` with them; the union stays."""

    inner: DecoderCache
    columns: Tensor
    outside: Tensor

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> ShortlistState:
        outside = self.outside if sentences is None else self.outside.index_select(0, sentences)
        return ShortlistState(self.inner.reorder(rows, sentences), self.columns, outside)

    @property
    def attention(self) -> Tensor | None:
        return getattr(self.inner, "attention", None)


class ShortlistDecoder:
    """A model searched over its batch's shortlists (an `mtx.decode.search.IncrementalDecoder`): `decoder` as
    search would drive it (the model, or mtx.decode.alignment.AligningDecoder around it) for the encoder and the
    state, `model` for the output layer, `candidates` each sentence's token ids (`Shortlist.candidates`).

    One per batch: it holds the batch's shortlists, and threads decoding other batches make their own."""

    def __init__(self, decoder: IncrementalDecoder, model: Transformer, candidates: Sequence[np.ndarray]) -> None:
        self.decoder, self.model = decoder, model
        device, union = model.output_weight.device, np.unique(np.concatenate(candidates))
        self.union = torch.from_numpy(union).to(device)
        self.project = union_projection(model, self.union)
        lacking = np.stack([~np.isin(union, own, assume_unique=True) for own in candidates])
        self.outside = torch.from_numpy(lacking).to(device)  # (B, U)

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return self.decoder.encode(src, src_pad)

    def init_state(self, memory: Tensor, src_pad: Tensor, max_len: int) -> ShortlistState:
        """The wrapped state; `memory` may hold each sentence several times in a row (sampling's samples are
        sentences of their own), whose shortlist each copy takes."""
        copies = memory.shape[0] // self.outside.shape[0]
        return ShortlistState(self.decoder.init_state(memory, src_pad, max_len), self.union,
                              self.outside.repeat_interleave(copies, dim=0))

    def decode_step(self, prev: Tensor, state: ShortlistState) -> tuple[Tensor, ShortlistState]:
        """(N, U) float32 log-probabilities over the union's tokens (`columns`), each row normalised over its
        sentence's shortlist, -inf at the union's other tokens."""
        hidden, inner = self.model.decode_hidden(prev, state.inner)
        logits = self.project(hidden).float()  # (N, U): a sentence's rows consecutive
        sentences, union = state.outside.shape
        logits.view(sentences, -1, union).masked_fill_(state.outside.unsqueeze(1), -torch.inf)
        return torch.log_softmax(logits, dim=-1, out=logits), ShortlistState(inner, state.columns, state.outside)


def union_projection(model: Transformer, union: Tensor) -> Callable[[Tensor], Tensor]:
    """The output layer over the tokens `union` alone (their rows of the output matrix, and their entries of the
    output bias where the model has one), in the model's own format. An int8 model (`--dtype int8`) projects
    with its int8 rows of those tokens, at the same scale (`Int8Linear.rows`), so each logit is the one its
    whole-vocabulary projection gives, at the int8 speed the shortlist is asked for on top of (bench/README.md).
    A float model's rows are stored transposed, as a CPU multiplies them fastest
    (`fast_paths.store_weights_transposed`)."""
    if isinstance(model.output_proj, Int8Linear):
        return model.output_proj.rows(union)
    weight = fast_paths.transposed_layout(model.output_weight.index_select(0, union))  # (U, D)
    bias = None if model.output_bias is None else model.output_bias.detach().index_select(0, union)  # (U,)
    return lambda hidden: F.linear(hidden, weight, bias)
