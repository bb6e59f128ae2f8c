"""BPE-dropout (Provilkov et al. 2020): training sentences segmented anew each epoch, with merges dropped at random.

A BPE vocabulary segments a word the same way every time, so the model never sees "unhappiness" as anything but
its one segmentation and learns little about the pieces inside frequent words. Dropping each applicable merge
with probability p while segmenting shows it other segmentations of the same text, built from the same
vocabulary: a regulariser that gains most where data is small. Valid, test and translation never drop.

The segmentation is BPE's own, step by step: of the merges that apply to adjacent symbols, the one learnt first
is tried first, then the next; each is dropped with probability p, the first kept is applied, and when all are
dropped the word is done (as Hugging Face tokenizers' dropout does it; with p = 0 this is exactly `encode`).
Words are what the tokenizer's own normalizer and pre-tokenizer make of the sentence, so merges never cross what
they never cross; a metaspace character the vocabulary lacks is its byte tokens, as in `encode`. The stored
data holds token ids, not text: the words are found from the stored tokens between two word-start marks, and
remembered, with the steps of BPE's own segmentation from each state a word passes through.

Reproducible: the draws for a sentence come from a generator seeded by (seed, epoch, pair, side), so every rank,
and a run resumed mid-epoch, segments the sentence of that pair in that epoch the same way. A leading tag stays
its one token.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import random
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path

import numpy as np

from mtx.data.batching import Batch, PairSource, collate
from mtx.data.prepared import load_split
from mtx.errors import MtxError
from mtx.spm_tokenizer import SpmPairTokenizer
from mtx.tokenizer import BYTE_TOKENS, Tokenizer

_SIDES = {"src": 0, "tgt": 1}
_REMEMBERED = 1 << 20  # states of words whose merge order is kept; past it, forgotten all at once
GROWTH_SAMPLE = 1000  # pairs that `growth` measures on


class BpeDropout:
    """Segments sentences of a BPE tokenizer's text with merges dropped at `rate`, per (seed, epoch, pair, side)."""

    def __init__(self, tokenizer: Tokenizer | SpmPairTokenizer, rate: float, seed: int) -> None:
        if isinstance(tokenizer, SpmPairTokenizer):
            # SentencePiece's own sampling draws from one generator per process, not per (seed, epoch, pair, side),
            # so a resumed run would not see the segmentations it would have seen.
            raise MtxError(f"train.bpe_dropout = {rate} drops merges of mtx's own BPE vocabulary, and this data is "
                           "encoded with an imported MarianMT model's SentencePiece models (data.bpe.from), whose "
                           "segmentations mtx cannot draw again exactly: set train.bpe_dropout to 0.")
        if tokenizer.model != "bpe":
            raise MtxError(f"train.bpe_dropout = {rate} needs a BPE vocabulary, and this data is encoded with a "
                           f"{tokenizer.model} one: set train.bpe_dropout to 0, or prepare the data with "
                           "data.bpe.model: bpe.")
        self.tokenizer, self.rate, self.seed = tokenizer, rate, seed
        spec = json.loads(tokenizer.to_str())["model"]
        self._ids: dict[str, int] = spec["vocab"]
        self._ranks = {tuple(merge): rank for rank, merge in enumerate(spec["merges"])}
        self._bytes = [self._ids[token] for token in BYTE_TOKENS] if spec.get("byte_fallback") else None
        self._starts_word = [token.startswith(tokenizer.word_mark)
                             for token, _ in sorted(self._ids.items(), key=lambda t: t[1])]
        self._tags = {i for i, token in tokenizer.special_tokens.items() if token in tokenizer.tags}
        self._keep, self._log_keep, self._log_rate = 1.0 - rate, _log(1.0 - rate), _log(rate)
        self._words: dict[tuple[int, ...], list[tuple[str, ...]]] = {}
        self._merges: dict[tuple[str, ...], tuple[tuple[str, ...], ...]] = {}
        self._paths: dict[tuple[str, ...], tuple[tuple[tuple[str, ...], ...], list[int]]] = {}

    def sentence(self, ids: Sequence[int], epoch: int, pair: int, side: str) -> np.ndarray:
        """The sentence of `ids` (one side of a stored pair, as `encode` made it) segmented anew with dropout."""
        ids = [int(i) for i in ids]
        out = list(itertools.takewhile(self._tags.__contains__, ids))  # its leading tags, kept whole
        draws = random.Random(((self.seed * 1_000_003 + int(epoch)) * 4_294_967_311 + int(pair)) * 2 + _SIDES[side])
        start = len(out)
        for end in range(start + 1, len(ids) + 1):
            if end == len(ids) or self._starts_word[ids[end]]:
                for word in self._words_of(tuple(ids[start:end])):
                    out += self._word(word, draws)
                start = end
        return np.asarray(out, dtype=np.int64)

    def _words_of(self, tokens: tuple[int, ...]) -> list[tuple[str, ...]]:
        """The words, as BPE's initial symbols, of the stored tokens from one word-start mark ("▁", "Ġ") to the
        next: BPE never merges across one, and the tokenizer's own normalizer and pre-tokenizer split the text
        between two (byte-level splits punctuation and digits from letters). Remembered by the tokens."""
        words = self._words.get(tokens)
        if words is None:
            words = [tuple(word) for word in self.tokenizer.words(self.tokenizer.decode(tokens))]
            _room(self._words)[tokens] = words
        return words

    def _word(self, state: tuple[str, ...], draws: random.Random) -> list[int]:
        """Dropout's segmentation of one word, in a draw or two per drop rather than one per merge: each merge
        step drops its first merge with probability p whatever else applies, so the steps before the first drop
        follow BPE's own segmentation and their number is geometric, P(≥ t) = (1 − p)^t. At that step, how many
        more merges are dropped is geometric too, P(≥ k) = p^k; then BPE goes on from the merge kept."""
        while True:
            path, ids = self._own_segmentation(state)
            draw = 1.0 - draws.random()  # in (0, 1]
            if draw <= self._keep ** len(path):  # no merge step of the rest of BPE's own drops one
                return ids
            state = path[int(math.log(draw) / self._log_keep)]
            merged = self._merged(state)
            dropped = 1 + int(math.log(1.0 - draws.random()) / self._log_rate)
            if dropped >= len(merged):  # every merge that applies is dropped: the word is done
                return self._ids_of(state)
            state = merged[dropped]

    def _own_segmentation(self, state: tuple[str, ...]) -> tuple[tuple[tuple[str, ...], ...], list[int]]:
        """BPE's own steps from the symbols `state` (the state before each merge) and the ids it ends with.
        Remembered: a word's states recur at every occurrence of the word."""
        known = self._paths.get(state)
        if known is None:
            path, current = [], state
            while merged := self._merged(current):
                path.append(current)
                current = merged[0]
            known = (tuple(path), self._ids_of(current))
            _room(self._paths)[state] = known
        return known

    def _merged(self, state: tuple[str, ...]) -> tuple[tuple[str, ...], ...]:
        """The symbols after each merge that applies to the symbols `state`, the merge learnt first first."""
        merged = self._merges.get(state)
        if merged is None:
            ranks = self._ranks
            order = sorted((ranks[pair], i) for i, pair in enumerate(itertools.pairwise(state)) if pair in ranks)
            merged = tuple((*state[:i], state[i] + state[i + 1], *state[i + 2 :]) for _, i in order)
            _room(self._merges)[state] = merged
        return merged

    def _ids_of(self, symbols: tuple[str, ...]) -> list[int]:
        ids = []
        for symbol in symbols:
            i = self._ids.get(symbol)
            if i is not None:
                ids.append(i)
            else:  # a character the metaspace vocabulary lacks (byte-level vocabularies hold every symbol)
                ids += [self._bytes[byte] for byte in symbol.encode("utf-8")]
        return ids


class DroppedOutSplit:
    """A training split (mtx.data.batching.PairSource) whose sentences are segmented with BPE-dropout for one
    epoch. The lengths are the stored segmentation's: the epoch's batches are cut by them, once for the whole
    run, so a batch holds about `growth` times the tokens it was cut for. A sentence that dropout would make
    longer than the model's positions (EOS included) keeps its stored segmentation."""

    def __init__(self, split: PairSource, dropout: BpeDropout, epoch: int, max_positions: int) -> None:
        self.split, self.dropout, self.epoch, self.max_positions = split, dropout, epoch, max_positions
        self.src_lens, self.tgt_lens = split.src_lens, split.tgt_lens

    def __len__(self) -> int:
        return len(self.split)

    def src(self, i: int) -> np.ndarray:
        return self._sentence(self.split.src(i), i, "src")

    def tgt(self, i: int) -> np.ndarray:
        return self._sentence(self.split.tgt(i), i, "tgt")

    def _sentence(self, stored: np.ndarray, i: int, side: str) -> np.ndarray:
        ids = self.dropout.sentence(stored, self.epoch, i, side)
        return ids if len(ids) < self.max_positions else stored


def growth(split: PairSource, dropout: BpeDropout, sample: int = GROWTH_SAMPLE) -> float:
    """Tokens after dropout per stored token, on `sample` pairs evenly spaced through the split (epoch 1)."""
    picked = np.unique(np.linspace(0, len(split) - 1, num=min(sample, len(split))).astype(np.int64))
    stored = sum(len(split.src(i)) + len(split.tgt(i)) for i in picked)
    dropped = sum(len(dropout.sentence(split.src(i), 1, i, "src")) + len(dropout.sentence(split.tgt(i), 1, i, "tgt"))
                  for i in picked)
    return dropped / max(stored, 1)


def _log(probability: float) -> float:
    return math.log(probability) if probability > 0 else -math.inf


def _room(remembered: dict) -> dict:
    """`remembered`, emptied once it holds `_REMEMBERED` entries: a bound on the memory of a long run."""
    if len(remembered) >= _REMEMBERED:
        remembered.clear()
    return remembered


class SegmentingWorkers:
    """Worker processes that segment and collate training batches with BPE-dropout, for a host whose one
    collation thread cannot keep up with its device. Each maps the training split and builds its segmenter once;
    a batch is one task, and the batches come back in the order they were asked for."""

    def __init__(self, workers: int, data_dir: Path, dropout: BpeDropout, max_positions: int) -> None:
        # spawn, not fork: the trainer has threads and may hold a GPU, which a forked child must not inherit
        self._pool = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
            initargs=(str(data_dir), dropout.tokenizer.to_str(), dropout.rate, dropout.seed, max_positions))

    def submit(self, epoch: int, indices: np.ndarray) -> Future:
        """A future of the batch of the pairs `indices`, segmented for `epoch`."""
        return self._pool.submit(_segmented_batch, epoch, indices)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


_worker: tuple[PairSource, BpeDropout, int] | None = None  # a worker process's split, segmenter and positions


def _start_worker(data_dir: str, tokenizer_json: str, rate: float, seed: int, max_positions: int) -> None:
    global _worker
    _worker = (load_split(Path(data_dir), "train"), BpeDropout(Tokenizer.from_str(tokenizer_json), rate, seed),
               max_positions)


def _segmented_batch(epoch: int, indices: np.ndarray) -> Batch:
    split, dropout, max_positions = _worker
    return collate(DroppedOutSplit(split, dropout, epoch, max_positions), indices)
