"""A lexical translation table learnt from the training pairs: for each source token, the target tokens it most
probably translates into, best first; and the target tokens by frequency. A decoding shortlist
(mtx.decode.shortlist) is made of it, as Marian's and Sockeye's are made of theirs.

The table is IBM Model 1's t(t | s) (Brown et al., 1993), over token ids: each target token of a pair is aligned
to one of the pair's source tokens or to NULL, the empty word, and EM re-estimates t from the alignments' expected
counts. Iteration 0 is where EM starts: every alignment of a pair equally likely, so t(t | s) is the count of s
and t in the same pair, each pair's weighted by 1 / (source tokens + 1) and normalised over t. It ranks a target
token that appears everywhere (a full stop, an article) high for every source token. Each further iteration
reweights each target token's alignment by the current table, so the source token that explains it best takes
its count, and the others let it go ("explaining away"). bench/README.md has how well each ranks the tokens a
translation needs.

Memory and time: the pairs are read a block of sentences at a time from the memory-mapped split; what is held is
the table of every (s, t) seen in one pair, 20 bytes each (its key s·V + t, probability and expected count), and,
while they fit in `CACHE_BYTES`, each (source token, target token) pair's index into it, 4 bytes, so that EM's
passes after its first read memory rather than the split. One pass is made for the table and one per iteration.
Both grow with the pairs read, so a split of more than `pairs` is learnt from a sample of that many, evenly spread
over it: what the table costs is bounded whatever the corpus size, and the sample costs only the rarest tokens'
translations (bench/README.md measures the coverage it keeps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mtx.data.prepared import TokenSplit
from mtx.files import atomic_write
from mtx.tokenizer import PAD

NULL = PAD  # IBM Model 1's empty word, which every target token may align to: PAD's id, which no sentence holds
BLOCK = 2048  # sentence pairs read and expanded into their (source, target) token pairs at once
CACHE_BYTES = 1 << 30  # the most memory the passes after EM's first may keep the blocks' pair indices in
MERGE_EVERY = 16  # blocks' distinct pairs merged into one sorted array at a time
RANK_STRETCH = 1 << 20  # entries of the table ranked at once, whole source tokens' runs
FILE = "lexicon.npz"  # in a prepared data folder
FORMAT = 1  # bump when the file's layout changes


@dataclass(frozen=True)
class Lexicon:
    """translations: (V, width) each source token's likeliest target tokens by t(t | s), best first, PAD after
    the last where it was seen with fewer; frequent: the target tokens seen in training, most frequent first;
    iterations: the EM iterations it was learnt with (0: co-occurrence); pairs: the sentence pairs it was learnt
    from (None: not recorded, as by a table of before samples, which was learnt from every training pair)."""

    translations: np.ndarray
    frequent: np.ndarray
    iterations: int
    pairs: int | None = None

    @property
    def width(self) -> int:
        return self.translations.shape[1]

    def to_checkpoint(self) -> dict[str, object]:
        """What a checkpoint carries (`lexicon`): tensors, as checkpoints load with weights_only, which takes
        no numpy arrays."""
        import torch  # here only: preparing data imports no torch

        return {"format": FORMAT, "iterations": self.iterations, "translations": torch.from_numpy(self.translations),
                "frequent": torch.from_numpy(self.frequent), **self._recorded()}

    @classmethod
    def of_checkpoint(cls, checkpoint: dict) -> Lexicon | None:
        """The table a checkpoint carries (its `lexicon`); None where it carries none."""
        stored = checkpoint.get("lexicon")
        if stored is None:
            return None
        return cls(stored["translations"].numpy(), stored["frequent"].numpy(), int(stored["iterations"]),
                   stored.get("pairs"))

    def _recorded(self) -> dict[str, int]:
        """`pairs` where it is known, as the files and checkpoints of before samples lack it."""
        return {} if self.pairs is None else {"pairs": self.pairs}

    def save(self, data_dir: Path) -> None:
        atomic_write(data_dir / FILE, lambda f: np.savez(f, format=FORMAT, iterations=self.iterations,
                                                          translations=self.translations, frequent=self.frequent,
                                                          **self._recorded()))

    @classmethod
    def load(cls, data_dir: Path) -> Lexicon | None:
        """The data folder's table; None where it has none, or one of another format."""
        path = data_dir / FILE
        if not path.is_file():
            return None
        with np.load(path) as stored:
            if int(stored["format"]) != FORMAT:
                return None
            return cls(stored["translations"], stored["frequent"], int(stored["iterations"]),
                       int(stored["pairs"]) if "pairs" in stored.files else None)


def width_of(lexicon: Lexicon | None) -> int:
    """The translations per source token `lexicon` holds, 0 for no table: the most decode.shortlist may ask."""
    return 0 if lexicon is None else lexicon.width


def learn_lexicon(split: TokenSplit, vocab_size: int, width: int, iterations: int, pairs: int | None = None,
                  advance: Callable[[int], None] = lambda pairs: None, cache_bytes: int = CACHE_BYTES) -> Lexicon:
    """The table of `split`'s pairs, or of `pairs` of them evenly spread (`evenly_spread`) where it has more:
    `width` target tokens per source token, after `iterations` of EM. `advance(pairs)` is told of every block
    of sentence pairs read: (iterations + 2) passes over the pairs learnt from in all, of which those after the
    second are made from memory where the blocks fit in `cache_bytes`."""
    if pairs is not None and pairs < len(split):
        split = Sample(split, evenly_spread(len(split), pairs))
    keys, target_counts = _cooccurring(split, vocab_size, advance)
    probability = _expectation_maximisation(_Blocks(split, keys, vocab_size, advance, cache_bytes), keys,
                                            vocab_size, iterations)
    return Lexicon(_best_targets(keys, probability, vocab_size, width),
                   np.argsort(-target_counts, kind="stable")[: int((target_counts > 0).sum())].astype(np.int32),
                   iterations, len(split))


def _expectation_maximisation(blocks: _Blocks, keys: np.ndarray, vocab_size: int, iterations: int) -> np.ndarray:
    """t(t | s) of every key after `iterations` of EM, float32; the blocks kept in memory are let go on return,
    before the table is ranked."""
    probability: np.ndarray | None = None  # None: every alignment equally likely, where EM starts
    for _ in range(iterations + 1):
        counts = np.zeros(len(keys), dtype=np.float64)
        for index, pairs_each in blocks:
            position = np.repeat(np.arange(len(pairs_each)), pairs_each)  # which target token each pair holds
            weight = np.ones(len(index)) if probability is None else probability[index]
            # each target token's alignments, normalised: the posterior of each source token (NULL included)
            posterior = weight / np.bincount(position, weights=weight)[position]
            counts += np.bincount(index, weights=posterior, minlength=len(keys))
        sources = keys // vocab_size
        probability = (counts / np.bincount(sources, weights=counts, minlength=vocab_size)[sources]).astype(np.float32)
    assert probability is not None
    return probability


def sample_size(split_pairs: int, pairs: int | None) -> int:
    """The sentence pairs `learn_lexicon` learns from, of a split of `split_pairs`, bounded by `pairs`."""
    return split_pairs if pairs is None else min(pairs, split_pairs)


def evenly_spread(total: int, count: int) -> np.ndarray:
    """`count` distinct indices of 0..total - 1, one every total / count, from 0: a sample that takes alike from
    every stretch of the split (each corpus of several in proportion to its size, a corpus ordered by source or by
    date from each part), and the same sample on every run, as prepare is."""
    assert 0 < count <= total, (count, total)
    return np.arange(count, dtype=np.int64) * total // count


class Sample:
    """The pairs of `split` at `indices` (increasing), read as a split is read (`len`, `block`), each block
    gathered from the split's memory map by `rows`, which reads only the sentences chosen."""

    def __init__(self, split: TokenSplit, indices: np.ndarray) -> None:
        self.split, self.indices = split, indices

    def __len__(self) -> int:
        return len(self.indices)

    def block(self, side: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        return self.split.rows(side, self.indices[start:end])


class _Blocks:
    """The split's token pairs as EM reads them, a block at a time: (each pair's index among `keys`, how many
    pairs each target token has). Read from the split on the first pass, and kept for the next ones while
    they fit in `cache_bytes` (a pass from memory skips the split and the sorting, most of a pass's time)."""

    def __init__(self, split: TokenSplit, keys: np.ndarray, vocab_size: int, advance: Callable[[int], None],
                 cache_bytes: int) -> None:
        self.split, self.keys, self.vocab_size, self.advance = split, keys, vocab_size, advance
        self.cache_bytes = cache_bytes
        self.kept: list[tuple[np.ndarray, np.ndarray, int]] | None = None

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        if self.kept is not None:
            for index, pairs_each, sentences in self.kept:
                yield index, pairs_each
                self.advance(sentences)
            return
        kept: list[tuple[np.ndarray, np.ndarray, int]] | None = []
        held = 0
        for source, target, pairs_each, sentences in _token_pairs(self.split):
            distinct, each = _distinct(source * self.vocab_size + target)
            # sorted needles: a cache-friendly walk through the keys; int32 indices, half the memory to keep
            index = np.searchsorted(self.keys, distinct).astype(np.int32)[each]
            yield index, pairs_each
            self.advance(sentences)
            held += index.nbytes + pairs_each.nbytes
            if kept is not None and held <= self.cache_bytes:
                kept.append((index, pairs_each, sentences))
            else:
                kept = None
        self.kept = kept


def _cooccurring(split: TokenSplit, vocab_size: int, advance: Callable[[int], None]
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The sorted keys s·V + t of every (source, target) token pair seen in one sentence pair, NULL as a source
    token of each; and every target token's count."""
    found: list[np.ndarray] = []
    target_counts = np.zeros(vocab_size, dtype=np.int64)
    for source, target, pairs_each, sentences in _token_pairs(split):
        found.append(_sorted_distinct(source * vocab_size + target))
        target_counts += np.bincount(target[np.cumsum(pairs_each) - pairs_each], minlength=vocab_size)  # once each
        if len(found) == MERGE_EVERY:  # so that what is held stays near the distinct pairs
            found = [_sorted_distinct(np.concatenate(found))]
        advance(sentences)
    return _sorted_distinct(np.concatenate(found)) if found else np.zeros(0, dtype=np.int64), target_counts


def _sorted_distinct(keys: np.ndarray) -> np.ndarray:
    """The sorted distinct values of `keys` (which it sorts in place): `_distinct` without the index of each key,
    and without its sort order's 8 bytes a key, the most memory the table's first pass holds at once."""
    keys.sort()
    return keys[np.diff(keys, prepend=keys[:1] - 1) != 0]


def _distinct(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sorted distinct values of `keys`, and each key's index among them: `np.unique(keys,
    return_inverse=True)` by a sort, which is several times faster on these arrays than its hashing."""
    order = np.argsort(keys)
    ordered = keys[order]
    starts = np.diff(ordered, prepend=ordered[:1] - 1) != 0
    each = np.empty(len(keys), dtype=np.int64)
    each[order] = np.cumsum(starts) - 1
    return ordered[starts], each


def _token_pairs(split: TokenSplit) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """Every (source token, target token) pair of every sentence pair, NULL among each one's source tokens, a
    block of sentences at a time: (source, target, pairs_each, sentences), one entry of source and target per
    pair, the pairs of each target token consecutive (its sentence's NULL first), pairs_each the number each
    target token has, sentences the block's sentence pairs."""
    for start in range(0, len(split), BLOCK):
        end = min(start + BLOCK, len(split))
        src, src_offsets = split.block("src", start, end)
        tgt, tgt_offsets = split.block("tgt", start, end)
        sentences = end - start
        with_null = np.insert(src, src_offsets[:-1], NULL)  # each sentence's source tokens after a NULL
        null_offsets = src_offsets + np.arange(sentences + 1)
        sentence = np.repeat(np.arange(sentences), np.diff(tgt_offsets))  # each target token's sentence
        pairs_each = np.diff(null_offsets)[sentence]  # each target token pairs with its sentence's source tokens
        within = np.arange(int(pairs_each.sum())) - np.repeat(np.cumsum(pairs_each) - pairs_each, pairs_each)
        source = with_null[np.repeat(null_offsets[sentence], pairs_each) + within]
        yield source, np.repeat(tgt, pairs_each), pairs_each.astype(np.int32), sentences


def _best_targets(keys: np.ndarray, probability: np.ndarray, vocab_size: int, width: int) -> np.ndarray:
    """(V, width): each source token's `width` target tokens of highest probability, best first (ties: the lower
    id), PAD after its last; NULL's row is left empty, as NULL is no token of a sentence. The keys are sorted, so
    each source token's entries are one run of them, ranked a stretch of whole runs at a time: the sort's
    temporaries are a stretch's, not the table's."""
    table = np.full((vocab_size, width), PAD, dtype=np.int32)
    run_starts = np.searchsorted(keys, keys[::RANK_STRETCH] // vocab_size * vocab_size)  # a stretch starts a run
    for start, end in zip(run_starts, [*run_starts[1:], len(keys)], strict=True):
        if start == end:  # a source token with more than a stretch of entries: ranked with the stretch before
            continue
        sources = keys[start:end] // vocab_size
        # by source, then probability down; a stable sort keeps equal probabilities in key order, the lower id first
        order = np.lexsort((-probability[start:end], sources))
        rank = np.arange(end - start) - np.searchsorted(sources, sources)  # each entry's place in its source's run
        kept = (rank < width) & (sources != NULL)
        table[sources[kept], rank[kept]] = keys[start:end][order][kept] % vocab_size
    return table
