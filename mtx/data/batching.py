"""Token-budget batches of similar-length sentence pairs, shuffled per epoch, sharded across ranks, resumable.

How tokens are counted (fairseq's `max_tokens`): a pair costs `max(len(src) + 1, len(tgt) + 1)` tokens, the
+1 being the EOS that ends the source and the target (`tgt_in` has BOS instead, the same length). A batch of n
pairs costs n × the largest cost among them, i.e. its padded size, and stays within `train.max_tokens`.
Pairs are sorted by source length, then target length, ties broken by a seeded shuffle, and cut greedily into
batches, so each batch holds sentences of nearly the same length and padding is rare.

The batches are made once; what changes per epoch is their order, a pure function of (seed, epoch), so every
rank computes the same order without communicating and a resumed run finds the very same batches. One update
consumes `world × update_freq` consecutive batches of that order; rank r takes those at positions r,
r + world, ... of the group (batch i goes to rank i % world). So one process with update_freq k sees, in one
update, exactly the batches that k processes with update_freq 1 see together. The epoch's ragged tail (fewer
than `world × update_freq` batches) is dropped, so every rank runs the same number of steps; the order changes
every epoch, so a different tail is dropped each time and no pair is left out for good. Where an epoch stands is
counted in batches of its order, not in updates, so that a run resumed with another number of processes or
another update_freq continues at the very batch where it stopped.

Decoding (mtx.decode.translator) cuts its batches by the same rule (`cut_into_batches`) but orders and costs them its
own way (`decoding_batches`): longest source first, and a sentence's target side costs its output length limit,
since the translation's length is not known before it is decoded.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, Protocol, TypeVar

import numpy as np
import torch
from torch import Tensor

from mtx.errors import MtxError
from mtx.tokenizer import BOS, EOS, PAD


class PairSource(Protocol):
    """What batching needs from a split (mtx.data.prepared's TokenSplit): lengths without specials, and token ids."""

    src_lens: np.ndarray
    tgt_lens: np.ndarray

    def __len__(self) -> int: ...
    def src(self, i: int) -> np.ndarray: ...
    def tgt(self, i: int) -> np.ndarray: ...


def pair_costs(src_lens: np.ndarray, tgt_lens: np.ndarray) -> np.ndarray:
    """Each pair's cost in the token budget: its longer side, EOS included."""
    return np.maximum(src_lens, tgt_lens) + 1


_CHUNK = 1 << 18  # pairs per NumPy call in the passes over a split: temporaries of a few MB, whatever its size
_SORT_CHUNK = 1 << 16  # pairs per step of the counting sort: a position in the chunk takes 16 bits
_LOOKUP_KEYS = 1 << 20  # up to this many (source, target) length combinations, a table maps them to sort keys


def pairs_within(src_lens: np.ndarray, tgt_lens: np.ndarray, limit: int) -> np.ndarray:
    """Which pairs cost at most `limit`, as a boolean mask: chunk by chunk, so that a split of tens of millions of
    pairs needs no array of costs."""
    within = np.empty(len(src_lens), dtype=bool)
    for start, src, tgt, _ in _chunks(src_lens, tgt_lens, None):
        within[start : start + len(src)] = pair_costs(src, tgt) <= limit
    return within


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int,
                 key: str = "train.max_tokens", keep: np.ndarray | None = None) -> list[np.ndarray]:
    """Indices of pairs, cut into batches of padded size ≤ max_tokens, in length order: of every pair, or of
    those that the boolean mask `keep` marks, so that the batches index the split directly.

    Every training rank makes these at start-up, from tens of millions of pairs, and a resumed run must find the
    very batches of the run it continues: they are exactly those of sorting the pairs by source length, then
    target length, ties in the order of `np.random.default_rng(seed).permutation` of them, and cutting that
    order greedily (`cut_into_batches`). So that start-up takes seconds and twelve bytes a pair, no step is
    taken in Python per pair: the pairs' indices are shuffled together with their sort keys, one uint64 each; a
    stable counting sort over the distinct length combinations puts them in order, a chunk at a time, into one
    int32 array of which the batches are slices; and the cut goes run by run of pairs of equal cost.
    """
    src_lens, tgt_lens = np.asarray(src_lens), np.asarray(tgt_lens)
    keep = None if keep is None or np.all(keep) else np.asarray(keep, dtype=bool)
    survey = _survey(src_lens, tgt_lens, keep)
    if survey.pairs == 0:
        return []
    if survey.longest > max_tokens:
        raise MtxError(
            f"{key} = {max_tokens} cannot fit even one sentence pair: pair {survey.longest_at} needs "
            f"{survey.longest} tokens (its longer side plus EOS). Raise {key} to at least {survey.longest}, or "
            "prepare the data with a smaller data.filter.max_len."
        )
    combinations, counts, keyed = _keyed_pairs(src_lens, tgt_lens, keep, survey)
    # The very permutation rng.permutation(pairs) draws: a shuffle's swaps depend on the generator and the length
    # alone, and an array of 8-byte items is shuffled as fast as rng.permutation's int64 one.
    np.random.default_rng(seed).shuffle(keyed)
    order = _counting_sort(keyed, counts, np.int32 if len(src_lens) < 2**31 else np.int64)
    del keyed  # 8 bytes a pair, freed before the batches are cut
    costs = pair_costs(combinations // survey.width, combinations % survey.width)
    return _slices(order, _greedy_cuts(zip(costs.tolist(), counts.tolist(), strict=True), max_tokens))


class _Survey(NamedTuple):
    """What one pass over the pairs to batch finds, before they are sorted."""

    pairs: int
    longest_src: int
    width: int  # one more than the longest target: a (source, target) combination is numbered source × width + target
    longest: int  # the largest cost
    longest_at: int  # the first pair of that cost, as an index into the split


def _survey(src_lens: np.ndarray, tgt_lens: np.ndarray, keep: np.ndarray | None) -> _Survey:
    """Reductions `where` the pairs are kept, rather than over copies of the kept pairs: one pass, no copies."""
    pairs, longest_src, longest_tgt, longest, longest_at = 0, 0, 0, 0, 0
    for start, src, tgt, kept in _chunks(src_lens, tgt_lens, keep):
        costs = pair_costs(src, tgt)
        if (chunk_longest := int(costs.max(where=kept, initial=0))) > longest:
            longest, longest_at = chunk_longest, start + int(np.where(kept, costs, 0).argmax())
        pairs += len(src) if keep is None else int(np.count_nonzero(kept))
        longest_src = max(longest_src, int(src.max(where=kept, initial=0)))
        longest_tgt = max(longest_tgt, int(tgt.max(where=kept, initial=0)))
    return _Survey(pairs, longest_src, longest_tgt + 1, longest, longest_at)


def _chunks(src_lens: np.ndarray, tgt_lens: np.ndarray, keep: np.ndarray | None
            ) -> Iterator[tuple[int, np.ndarray, np.ndarray, np.ndarray | bool]]:
    """The pairs a chunk at a time: where it starts, the lengths as int64 (so that no cost overflows a narrower
    dtype), and which of them to batch (True: all)."""
    for start in range(0, len(src_lens), _CHUNK):
        chunk = slice(start, start + _CHUNK)
        src, tgt = (np.asarray(lens[chunk], dtype=np.int64) for lens in (src_lens, tgt_lens))
        yield start, src, tgt, True if keep is None else keep[chunk]


def _kept(values: np.ndarray, kept: np.ndarray | bool) -> np.ndarray:
    """The `values` of a chunk's kept pairs (`kept` True: all of them)."""
    return values if kept is True else values[kept]


def _keyed_pairs(src_lens: np.ndarray, tgt_lens: np.ndarray, keep: np.ndarray | None, survey: _Survey
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The (source, target) length combinations of the pairs to batch, numbered as in `_Survey`, in ascending
    order; how many pairs have each; and the pairs, each as its sort key (the rank of its combination) above its
    index in the split in one uint64 (so up to 2³² pairs).

    A table maps combinations to ranks where there are few enough possible ones; beyond that a binary search
    does.
    """
    width = survey.width
    possible = (survey.longest_src + 1) * width
    numbered = (_kept(src * width + tgt, kept) for _, src, tgt, kept in _chunks(src_lens, tgt_lens, keep))
    if possible <= _LOOKUP_KEYS:
        counts = np.zeros(possible, dtype=np.int64)
        for numbers in numbered:
            counts += np.bincount(numbers, minlength=possible)
        combinations = np.flatnonzero(counts)
        counts = counts[combinations]
        keys = np.zeros(possible, dtype=np.uint64)
        keys[combinations] = np.arange(len(combinations), dtype=np.uint64) << 32
        key_of = keys.take
    else:
        found = [np.unique(numbers, return_counts=True) for numbers in numbered]
        combinations, found_at = np.unique(np.concatenate([c for c, _ in found]), return_inverse=True)
        counts = np.zeros(len(combinations), dtype=np.int64)
        np.add.at(counts, found_at, np.concatenate([n for _, n in found]))

        def key_of(numbers: np.ndarray) -> np.ndarray:
            return combinations.searchsorted(numbers).astype(np.uint64) << 32

    keyed = np.empty(survey.pairs, dtype=np.uint64)
    done = 0
    for start, src, tgt, kept in _chunks(src_lens, tgt_lens, keep):
        indices = _kept(np.arange(start, start + len(src), dtype=np.uint64), kept)
        np.bitwise_or(key_of(_kept(src * width + tgt, kept)), indices, out=keyed[done : done + len(indices)])
        done += len(indices)
    return combinations, counts, keyed


def _counting_sort(keyed: np.ndarray, counts: np.ndarray, dtype: type[np.integer]) -> np.ndarray:
    """The pairs of `keyed` (each its key above its index) stably sorted by key, as indices of `dtype`: each
    goes to the next free place of its key's run.

    A chunk at a time, small enough for its sort to run in cache: sorting the chunk's (key, position in the
    chunk), packed into one integer so that no two are equal and NumPy's fastest sort applies (32 bits wide
    where the keys take 16), lines the chunk's pairs up by key, each after those of its key before it; `free`
    skips those of earlier chunks.
    """
    order = np.empty(len(keyed), dtype=dtype)
    free = np.cumsum(counts) - counts
    packed_dtype = np.uint32 if len(counts) <= 1 << 16 else np.uint64
    positions = np.arange(_SORT_CHUNK, dtype=packed_dtype)
    for start in range(0, len(keyed), _SORT_CHUNK):
        chunk = keyed[start : start + _SORT_CHUNK]
        packed = (chunk >> 32).astype(packed_dtype) << 16 | positions[: len(chunk)]
        packed.sort()
        pairs, sorted_keys = (chunk & 0xFFFFFFFF)[packed & 0xFFFF], packed >> 16
        firsts = np.flatnonzero(np.concatenate(([True], sorted_keys[1:] != sorted_keys[:-1])))
        run_lengths = np.diff(np.append(firsts, len(pairs)))
        run_keys = sorted_keys[firsts]
        order[np.repeat(free[run_keys] - firsts, run_lengths) + np.arange(len(pairs))] = pairs
        free[run_keys] += run_lengths
    return order


def decoding_batches(source_lens: Sequence[int], output_limits: Sequence[int], batch_tokens: int
                     ) -> list[list[int]]:
    """Indices of sentences to decode, longest source first, cut into batches of padded size ≤ batch_tokens.

    A sentence costs its source or its output, EOS included on both sides (`source_lens` counts it, an output
    limit does not), whichever is longer, as a training pair does. The output side counts its length limit,
    not the translation's length, which is unknown until decoded: the decoder cache holds that many positions
    for every beam whatever the translation's length. Longest first, so a batch too big for the device fails
    at once rather than after hours; unlike training, a sentence over budget is no error: it is decoded in a
    batch of its own.
    """
    order = sorted(range(len(source_lens)), key=lambda i: -source_lens[i])
    return cut_into_batches(order, [max(source_lens[i], output_limits[i] + 1) for i in order], batch_tokens)


Indices = TypeVar("Indices", np.ndarray, list)


def cut_into_batches(order: Indices, costs: Sequence[int], budget: int) -> list[Indices]:
    """`order` cut into consecutive batches whose padded size, count × largest cost, stays within `budget`.

    `costs[k]`, a positive number, is the cost of `order[k]`. The cut is greedy: each item joins the open batch
    if it still fits. An item over budget on its own opens a batch that nothing joins.
    """
    runs = ((cost, sum(1 for _ in run)) for cost, run in itertools.groupby(costs))
    return _slices(order, _greedy_cuts(runs, budget))


def _greedy_cuts(runs: Iterable[tuple[int, int]], budget: int) -> list[int]:
    """Where the greedy cut of `cut_into_batches` starts a batch, but for items given as runs (cost, count) of
    items of equal cost: the one rule that training and decoding batches are cut by.

    Within a run the open batch's largest cost stays the same once the run's first item has joined it, so how
    many of the run's items it still takes, and how many make each batch after it, is one division: a corpus
    sorted by length has few runs (one per length combination), and the steps here are per run and per batch.
    """
    cuts: list[int] = []
    done, size, widest = 0, 0, 0  # items placed so far; those of them in the open batch, and their largest cost
    for cost, count in runs:
        if size:
            widest = max(widest, cost)
            joining = min(count, max(budget // widest - size, 0))
            size, done, count = size + joining, done + joining, count - joining
            if count == 0:
                continue
            cuts.append(done)
        per_batch = max(budget // cost, 1)
        cuts.extend(range(done + per_batch, done + count, per_batch))
        size, widest, done = (count - 1) % per_batch + 1, cost, done + count
    return cuts


def _slices(order: Indices, cuts: list[int]) -> list[Indices]:
    """`order` cut at `cuts`, as views where `order` is an array."""
    if len(order) == 0:
        return []
    return [order[start:end] for start, end in zip([0, *cuts], [*cuts, len(order)], strict=True)]


def update_shape(update_tokens: int, max_tokens: int, world: int) -> tuple[int, int]:
    """(max_tokens, update_freq) of every rank's micro-batches for updates of about `update_tokens` padded token
    slots over `world` ranks (train.update_tokens): the fewest micro-batches within `max_tokens` each, all of
    one size. A GPU runs one large batch faster than several small ones of the same tokens, so accumulating is
    the last resort: 28,672 slots are 1 × 28,672 on one GPU, 1 × 3,584 on eight and, with max_tokens 8,192,
    4 × 7,168 on one."""
    update_freq = math.ceil(update_tokens / (world * max_tokens))
    return math.ceil(update_tokens / (world * update_freq)), update_freq


@dataclass(frozen=True)
class BatchPlan:
    """Which batches this rank trains on, update by update, epoch by epoch.

    Epochs count from 1. `updates(epoch, start)` yields, update by update, (the batches of the epoch's order
    done after it, this rank's micro-batches for it), from batch `start` of the order on: how a resumed run
    continues mid-epoch, whatever shape (processes × update_freq) the run had when it stopped.
    """

    batches: Sequence[np.ndarray]
    seed: int
    update_freq: int = 1
    world: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        if self.updates_per_epoch == 0:
            raise MtxError(
                f"The training data makes only {len(self.batches)} batches, fewer than one update needs "
                f"({self.world} processes × train.update_freq {self.update_freq}). Lower train.max_tokens or "
                "train.update_freq, use fewer processes, or add training data."
            )

    @property
    def group(self) -> int:
        """Batches per update, all ranks together: world × update_freq."""
        return self.world * self.update_freq

    @property
    def updates_per_epoch(self) -> int:
        return len(self.batches) // self.group

    def epoch_finished(self, done: int) -> bool:
        """Whether an epoch with `done` of its batches trained on has no whole update left."""
        return len(self.batches) - done < self.group

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The batch order of `epoch`: the same on every rank, in every run with this seed."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.batches), generator=generator).numpy()

    def updates(self, epoch: int, start: int = 0) -> Iterator[tuple[int, list[np.ndarray]]]:
        order, group = self.epoch_order(epoch), self.group
        for first in range(start, len(order) - group + 1, group):
            mine = order[first + self.rank : first + group : self.world]
            yield first + group, [self.batches[i] for i in mine]


@dataclass
class Batch:
    """A padded batch in the shared sequence convention.

    src = ids + [EOS]; tgt_in = [BOS] + ids; tgt_out = ids + [EOS]; PAD on the right; src_pad = src == PAD.
    The target tokens' positions in the flattened (B·T) target, and those tokens, are found once, where the
    batch is made (on the CPU): on a GPU, finding them there would make the host wait for the device. So is
    whether any source is padded at all: most batches of length-sorted pairs have sources of one length.
    """

    src: Tensor  # (B, S)
    src_pad: Tensor  # (B, S) True = padding
    tgt_in: Tensor  # (B, T)
    tgt_out: Tensor  # (B, T)
    n_tgt_tokens: int  # non-pad target tokens: what the loss is normalised by
    tgt_positions: Tensor | None = None  # (N,) flat indices of the non-pad targets; found from tgt_out if None
    tgt_tokens: Tensor | None = None  # (N,) those targets, tgt_out.flatten()[tgt_positions]
    src_padded: bool | None = None  # whether src_pad marks any position; found from src_pad if None

    def __post_init__(self) -> None:
        if self.tgt_positions is None:
            self.tgt_positions = (self.tgt_out != PAD).flatten().nonzero().squeeze(1)
            self.tgt_tokens = self.tgt_out.flatten().index_select(0, self.tgt_positions)
        if self.src_padded is None:
            self.src_padded = bool(self.src_pad.any())

    @property
    def src_pad_if_any(self) -> Tensor | None:
        """src_pad, or None where no source is padded: attention then takes no mask, which lets SDPA on a GPU
        run its flash kernel (it takes no arbitrary mask) for the encoder's and the cross-attention."""
        return self.src_pad if self.src_padded else None

    def _map(self, fn) -> Batch:
        return Batch(fn(self.src), fn(self.src_pad), fn(self.tgt_in), fn(self.tgt_out), self.n_tgt_tokens,
                     fn(self.tgt_positions), fn(self.tgt_tokens), self.src_padded)

    def to(self, device: torch.device) -> Batch:
        """On `device`; from pinned memory the copies are asynchronous (`non_blocking`)."""
        return self._map(lambda t: t.to(device, non_blocking=True))

    def pin_memory(self) -> Batch:
        """In page-locked memory, from which a GPU copies while the host goes on."""
        return self._map(Tensor.pin_memory)


def padded(rows: Sequence[Sequence[int]]) -> Tensor:
    """Rows of token ids as one (rows, longest) batch, right-padded with PAD: how the decoding paths, which
    build their inputs from lists, lay them out as training's `collate` does."""
    return torch.nn.utils.rnn.pad_sequence([torch.tensor(row, dtype=torch.long) for row in rows], batch_first=True,
                                           padding_value=PAD)


def collate(split: PairSource, indices: Sequence[int]) -> Batch:
    sources = [split.src(int(i)) for i in indices]
    targets = [split.tgt(int(i)) for i in indices]
    src = torch.full((len(indices), max(len(s) for s in sources) + 1), PAD, dtype=torch.long)
    tgt_in = torch.full((len(indices), max(len(t) for t in targets) + 1), PAD, dtype=torch.long)
    tgt_out = tgt_in.clone()
    for row, (s, t) in enumerate(zip(sources, targets, strict=True)):
        src[row, : len(s)] = torch.from_numpy(np.asarray(s, dtype=np.int64))
        src[row, len(s)] = EOS
        tgt_in[row, 0] = BOS
        tgt_in[row, 1 : len(t) + 1] = torch.from_numpy(np.asarray(t, dtype=np.int64))
        tgt_out[row, : len(t)] = tgt_in[row, 1 : len(t) + 1]
        tgt_out[row, len(t)] = EOS
    n_tgt_tokens = sum(len(t) + 1 for t in targets)
    return Batch(src, src == PAD, tgt_in, tgt_out, n_tgt_tokens)


T = TypeVar("T")
_DONE = object()


def in_background(items: Iterable[T], ahead: int) -> Iterator[T]:
    """`items`, produced by a background thread up to `ahead` items before they are asked for.

    The trainer collates the next update's batches this way while the current one runs. An exception in the
    thread is raised here, in order; closing the iterator early (a stop) ends the thread at its next item.
    """
    ready: queue.Queue = queue.Queue(maxsize=ahead)
    closed = threading.Event()

    def offer(item: object) -> bool:
        """Queue `item` once there is room; False if the consumer has gone."""
        while not closed.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def produce() -> None:
        try:
            for item in items:
                if not offer(item):
                    return
            offer(_DONE)
        except BaseException as e:  # handed to the consumer, which raises it in its own thread
            offer(e)

    thread = threading.Thread(target=produce, name="mtx-collate", daemon=True)
    thread.start()
    try:
        while (item := ready.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        closed.set()
        thread.join()  # at most one item away: no thread left running torch code at interpreter exit
