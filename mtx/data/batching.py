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
every epoch, so a different tail is dropped each time and no pair is left out for good.

Decoding (mtx.decode.translator) cuts its batches by the same rule (`cut_into_batches`) but orders and costs them its
own way (`decoding_batches`): longest source first, and a sentence's target side costs its output length limit,
since the translation's length is not known before it is decoded.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

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


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int,
                 key: str = "train.max_tokens") -> list[np.ndarray]:
    """Indices of pairs, cut into batches of padded size ≤ max_tokens, in length order."""
    src_lens, tgt_lens = np.asarray(src_lens, dtype=np.int64), np.asarray(tgt_lens, dtype=np.int64)
    costs = pair_costs(src_lens, tgt_lens)
    if len(costs) == 0:
        return []
    longest = int(costs.max())
    if longest > max_tokens:
        raise MtxError(
            f"{key} = {max_tokens} cannot fit even one sentence pair: pair {int(costs.argmax())} needs {longest} "
            f"tokens (its longer side plus EOS). Raise {key} to at least {longest}, or prepare the data with a "
            "smaller data.filter.max_len."
        )
    tie_break = np.random.default_rng(seed).permutation(len(costs))
    order = tie_break[np.lexsort((tgt_lens[tie_break], src_lens[tie_break]))]
    return cut_into_batches(order, costs[order].tolist(), max_tokens)


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

    `costs[k]` is the cost of `order[k]`. The cut is greedy: each item joins the open batch if it still fits.
    An item over budget on its own opens a batch that nothing joins.
    """
    batches, start, widest = [], 0, 0
    for end, cost in enumerate(costs):
        if end > start and (end - start + 1) * max(widest, cost) > budget:
            batches.append(order[start:end])
            start, widest = end, 0
        widest = max(widest, cost)
    if len(order):
        batches.append(order[start:])
    return batches


@dataclass(frozen=True)
class BatchPlan:
    """Which batches this rank trains on, update by update, epoch by epoch.

    Epochs count from 1. `updates(epoch, start)` yields (update index within the epoch, this rank's
    micro-batches for it), starting at update `start`, which is how a resumed run continues mid-epoch.
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
    def updates_per_epoch(self) -> int:
        return len(self.batches) // (self.world * self.update_freq)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The batch order of `epoch`: the same on every rank, in every run with this seed."""
        generator = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
        return torch.randperm(len(self.batches), generator=generator).numpy()

    def updates(self, epoch: int, start: int = 0) -> Iterator[tuple[int, list[np.ndarray]]]:
        order = self.epoch_order(epoch)
        group = self.world * self.update_freq
        for update in range(start, self.updates_per_epoch):
            mine = order[update * group + self.rank : (update + 1) * group : self.world]
            yield update, [self.batches[i] for i in mine]


@dataclass
class Batch:
    """A padded batch in the shared sequence convention.

    src = ids + [EOS]; tgt_in = [BOS] + ids; tgt_out = ids + [EOS]; PAD on the right; src_pad = src == PAD.
    The target tokens' positions in the flattened (B·T) target, and those tokens, are found once, where the
    batch is made (on the CPU): on a GPU, finding them there would make the host wait for the device.
    """

    src: Tensor  # (B, S)
    src_pad: Tensor  # (B, S) True = padding
    tgt_in: Tensor  # (B, T)
    tgt_out: Tensor  # (B, T)
    n_tgt_tokens: int  # non-pad target tokens: what the loss is normalised by
    tgt_positions: Tensor | None = None  # (N,) flat indices of the non-pad targets; found from tgt_out if None
    tgt_tokens: Tensor | None = None  # (N,) those targets, tgt_out.flatten()[tgt_positions]

    def __post_init__(self) -> None:
        if self.tgt_positions is None:
            self.tgt_positions = (self.tgt_out != PAD).flatten().nonzero().squeeze(1)
            self.tgt_tokens = self.tgt_out.flatten().index_select(0, self.tgt_positions)

    def _map(self, fn) -> Batch:
        return Batch(fn(self.src), fn(self.src_pad), fn(self.tgt_in), fn(self.tgt_out), self.n_tgt_tokens,
                     fn(self.tgt_positions), fn(self.tgt_tokens))

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
