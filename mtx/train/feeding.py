"""The updates of an epoch as the trainer takes them: collated by a background thread, ahead of the device.

The batch plan (mtx.data.batching) says which pairs each of this rank's updates holds; here they become
`Batch`es, in page-locked memory on a GPU, which it copies from without stopping the host. With BPE-dropout
the sentences are segmented anew (mtx.data.bpe_dropout), by that thread or by worker processes
(train.bpe_dropout_workers), which work up to that many updates ahead.
"""

from __future__ import annotations

import collections
from collections.abc import Iterator

import numpy as np

from mtx.data.batching import Batch, collate, in_background
from mtx.data.bpe_dropout import DroppedOutSplit
from mtx.train.components import RunParts


def collated_updates(parts: RunParts, epoch: int, batch_in_epoch: int) -> Iterator[tuple[int, list[Batch]]]:
    """This rank's updates of `epoch` from batch `batch_in_epoch` on: (the batches of the epoch done after it,
    its collated batches)."""
    pin = parts.ctx.device.type == "cuda"
    workers = parts.recipe.train.bpe_dropout_workers

    def ready(collated: Batch) -> Batch:
        return collated.pin_memory() if pin else collated

    def segmented(updates: Iterator[tuple[int, list[np.ndarray]]]) -> Iterator[tuple[int, list[Batch]]]:
        pending: collections.deque = collections.deque()
        for done, indices in updates:
            pending.append((done, [parts.segmenting.submit(epoch, i) for i in indices]))
            if len(pending) > workers:
                done, futures = pending.popleft()
                yield done, [ready(future.result()) for future in futures]
        for done, futures in pending:
            yield done, [ready(future.result()) for future in futures]

    updates = parts.plan.updates(epoch, batch_in_epoch)
    if parts.segmenting is not None:
        return in_background(segmented(updates), ahead=2)
    split = parts.train_split
    if parts.bpe_dropout is not None:
        split = DroppedOutSplit(split, parts.bpe_dropout, epoch, parts.recipe.model.max_positions)
    return in_background(((done, [ready(collate(split, i)) for i in indices]) for done, indices in updates),
                         ahead=2)
