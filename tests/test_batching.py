"""Token-budget batching: budgets, length grouping, epoch order, rank sharding, resuming, collation."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from torch.overrides import TorchFunctionMode

from mtx.data.batching import BatchPlan, collate, decoding_batches, in_background, make_batches, pair_costs
from mtx.errors import MtxError
from mtx.tokenizer import BOS, EOS, PAD


class Pairs:
    """An in-memory split with the interface of mtx.data.prepared.TokenSplit."""

    def __init__(self, sources: list[list[int]], targets: list[list[int]]) -> None:
        self._src, self._tgt = sources, targets
        self.src_lens = np.array([len(s) for s in sources], dtype=np.int64)
        self.tgt_lens = np.array([len(t) for t in targets], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._src)

    def src(self, i: int) -> np.ndarray:
        return np.array(self._src[i], dtype=np.int64)

    def tgt(self, i: int) -> np.ndarray:
        return np.array(self._tgt[i], dtype=np.int64)


def random_lengths(n: int = 500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, n)
    return src, np.clip(src + rng.integers(-5, 6, n), 1, None)


def dummy_pairs(src: np.ndarray, tgt: np.ndarray) -> Pairs:
    """Pairs of the given lengths, every token 5."""
    return Pairs([[5] * int(n) for n in src], [[5] * int(n) for n in tgt])


def test_batches_cover_every_pair_once_within_the_budget() -> None:
    """The budget is the padded size of what collate builds: n pairs × (longest side + EOS), on both sides."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))
    costs = np.maximum(src, tgt) + 1
    assert np.array_equal(pair_costs(src, tgt), costs)
    pairs = dummy_pairs(src, tgt)
    for batch in batches:
        assert len(batch) * costs[batch].max() <= 400
        collated = collate(pairs, batch)
        assert collated.src.numel() <= 400 and collated.tgt_in.numel() <= 400
    # greedy: a batch is cut only when the next pair would not fit
    for batch, following in zip(batches, batches[1:], strict=False):
        grown = np.append(batch, following[0])
        assert len(grown) * costs[grown].max() > 400


def test_a_batch_may_fill_the_budget_exactly() -> None:
    """The budget is a maximum, reached, not a bound kept strictly below: 4 pairs of cost 10 fill 40."""
    lengths = np.full(10, 9)  # cost 10 each: 9 tokens and EOS
    assert [len(b) for b in make_batches(lengths, lengths, max_tokens=40, seed=1)] == [4, 4, 2]
    assert [len(b) for b in make_batches(lengths, lengths, max_tokens=39, seed=1)] == [3, 3, 3, 1]
    assert [len(b) for b in make_batches(lengths, lengths, max_tokens=10, seed=1)] == [1] * 10
    # a batch's cost is its widest pair × its pairs (45 = 15 × 3), not the sum of the pairs' costs (35)
    src = np.array([9, 14, 9])
    assert [sorted(b.tolist()) for b in make_batches(src, src, max_tokens=45, seed=1)] == [[0, 1, 2]]
    assert [sorted(b.tolist()) for b in make_batches(src, src, max_tokens=44, seed=1)] == [[0, 2], [1]]


def test_nothing_to_batch_and_a_single_pair() -> None:
    assert make_batches(np.array([], dtype=np.int64), np.array([], dtype=np.int64), max_tokens=10, seed=1) == []
    assert [b.tolist() for b in make_batches(np.array([4]), np.array([2]), max_tokens=5, seed=1)] == [[0]]


def test_batches_group_similar_lengths() -> None:
    """Pairs are sorted by source length, then target length, and cut in that order, so padding is rare."""
    src, tgt = random_lengths(2000)
    batches = make_batches(src, tgt, max_tokens=1000, seed=1)
    lengths = [(int(src[i]), int(tgt[i])) for i in np.concatenate(batches)]
    assert lengths == sorted(lengths)
    padded_source = sum(len(b) * (src[b].max() + 1) for b in batches)
    assert padded_source / (src + 1).sum() < 1.05  # sorted by source length: under 5% padding
    assert max(src[b].max() - src[b].min() for b in batches) <= 3


def test_batches_are_a_function_of_the_seed_which_only_breaks_ties() -> None:
    """A resumed run must rebuild the very batches it was using; another seed only swaps pairs of equal lengths."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    again = make_batches(src, tgt, max_tokens=400, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    other = make_batches(src, tgt, max_tokens=400, seed=2)
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other, strict=True))
    for a, b in zip(batches, other, strict=True):
        assert np.array_equal(src[a], src[b]) and np.array_equal(tgt[a], tgt[b])


def test_a_pair_over_the_budget_is_a_clear_error() -> None:
    """Caught before batching, naming the pair and the smallest budget that fits it; a pair that fits exactly
    is not an error."""
    src, tgt = np.array([3, 30]), np.array([4, 2])  # pair 1 costs 31
    with pytest.raises(MtxError, match=r"train.max_tokens = 30 cannot fit even one sentence pair: pair 1 needs "
                                       r"31 tokens .* Raise train.max_tokens to at least 31, or prepare the data "
                                       r"with a smaller data.filter.max_len.$"):
        make_batches(src, tgt, max_tokens=30, seed=1)
    assert [b.tolist() for b in make_batches(src, tgt, max_tokens=31, seed=1)] == [[0], [1]]


def test_epoch_order_is_a_function_of_seed_and_epoch() -> None:
    """Every rank computes the same order without communicating, and a resumed run finds it again."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    plan = BatchPlan(batches, seed=1)
    again = BatchPlan(make_batches(src, tgt, max_tokens=400, seed=1), seed=1)
    assert np.array_equal(plan.epoch_order(3), again.epoch_order(3))
    other_rank = BatchPlan(batches, seed=1, update_freq=2, world=2, rank=1)
    assert np.array_equal(plan.epoch_order(3), other_rank.epoch_order(3))
    assert not np.array_equal(plan.epoch_order(1), plan.epoch_order(2))
    assert not np.array_equal(plan.epoch_order(1), BatchPlan(batches, seed=2).epoch_order(1))
    assert sorted(plan.epoch_order(1).tolist()) == list(range(len(batches)))


def test_one_process_takes_the_epoch_order_and_drops_the_ragged_tail() -> None:
    """Update u is batches u·k … u·k + k - 1 of the epoch's order (k = update_freq); the last len % k are left
    out, so every update has k batches."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    assert len(batches) % 3 != 0, "the test needs a ragged tail"
    plan = BatchPlan(batches, seed=7, update_freq=3)
    order = plan.epoch_order(2)
    updates = list(plan.updates(epoch=2))
    assert [u for u, _ in updates] == list(range(len(batches) // 3)) and plan.updates_per_epoch == len(updates)
    taken = [b.tolist() for _, micro in updates for b in micro]
    assert all(len(micro) == 3 for _, micro in updates)
    assert taken == [batches[i].tolist() for i in order[: len(batches) // 3 * 3]]


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_together_take_what_one_process_accumulates(world: int) -> None:
    """Update u of `world` ranks × update_freq 2 uses the batches of one rank × update_freq 2·world: batch i of
    the update's group of 2·world goes to rank i % world."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=300, seed=1)
    single = list(BatchPlan(batches, seed=5, update_freq=2 * world).updates(epoch=2))
    ranks = [list(BatchPlan(batches, seed=5, update_freq=2, world=world, rank=r).updates(epoch=2))
             for r in range(world)]
    assert all(len(r) == len(single) == len(batches) // (2 * world) for r in ranks)
    for u, (_, expected) in enumerate(single):
        for r, rank in enumerate(ranks):
            assert rank[u][0] == u
            assert [b.tolist() for b in rank[u][1]] == [b.tolist() for i, b in enumerate(expected) if i % world == r]


def test_resuming_mid_epoch_continues_with_the_same_batches() -> None:
    src, tgt = random_lengths()
    plan = BatchPlan(make_batches(src, tgt, max_tokens=300, seed=1), seed=1, update_freq=2)
    whole = list(plan.updates(epoch=4))
    tail = list(plan.updates(epoch=4, start=5))
    assert [u for u, _ in tail] == list(range(5, plan.updates_per_epoch))
    for (u1, b1), (u2, b2) in zip(whole[5:], tail, strict=True):
        assert u1 == u2 and all(np.array_equal(x, y) for x, y in zip(b1, b2, strict=True))
    last = plan.updates_per_epoch - 1  # stopped before the epoch's last update, or after it
    assert [u for u, _ in plan.updates(epoch=4, start=last)] == [last]
    assert list(plan.updates(epoch=4, start=last + 1)) == []


def test_too_few_batches_for_one_update_is_a_clear_error() -> None:
    """One update needs world × update_freq batches: exactly that many make one update, one fewer is an error."""
    batches = [np.array([i]) for i in range(8)]
    assert BatchPlan(batches, seed=1, update_freq=4, world=2).updates_per_epoch == 1
    assert BatchPlan(batches + batches[:7], seed=1, update_freq=4, world=2).updates_per_epoch == 1
    with pytest.raises(MtxError, match=r"only 7 batches, fewer than one update needs \(2 processes × "
                                       r"train.update_freq 4\). Lower train.max_tokens or train.update_freq, use "
                                       r"fewer processes, or add training data.$"):
        BatchPlan(batches[:7], seed=1, update_freq=4, world=2)


def test_collate_follows_the_sequence_convention() -> None:
    pairs = Pairs([[10, 11, 12], [20]], [[30, 31], [40, 41, 42, 43]])
    batch = collate(pairs, [0, 1])
    assert batch.src.tolist() == [[10, 11, 12, EOS], [20, EOS, PAD, PAD]]
    assert batch.src_pad.tolist() == [[False] * 4, [False, False, True, True]]
    assert batch.tgt_in.tolist() == [[BOS, 30, 31, PAD, PAD], [BOS, 40, 41, 42, 43]]
    assert batch.tgt_out.tolist() == [[30, 31, EOS, PAD, PAD], [40, 41, 42, 43, EOS]]
    assert batch.n_tgt_tokens == 3 + 5 == int((batch.tgt_out != PAD).sum())
    assert batch.src.dtype == torch.long
    # the loss reads only the target positions, flat in the (B·T) target of width 5
    assert batch.tgt_positions.tolist() == [0, 1, 2, 5, 6, 7, 8, 9]
    assert batch.tgt_tokens.tolist() == [30, 31, EOS, 40, 41, 42, 43, EOS]
    assert collate(pairs, np.array([1, 0])).src.tolist() == [[20, EOS, PAD, PAD], [10, 11, 12, EOS]]


class _TorchCalls(TorchFunctionMode):
    """Records the torch functions and tensor methods called inside it, with their keyword arguments."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls.append((getattr(func, "__name__", str(func)), dict(kwargs or {})))
        return func(*args, **(kwargs or {}))


def test_a_batch_moves_to_a_device_whole_asynchronously_and_without_searching_again() -> None:
    """Every tensor goes to the device, with non_blocking copies (asynchronous from pinned memory), and the
    target positions found on the CPU travel along: searching them again on a GPU would make the host wait."""
    batch = collate(Pairs([[10, 11, 12], [20]], [[30, 31], [40, 41, 42, 43]]), [0, 1])
    fields = ("src", "src_pad", "tgt_in", "tgt_out", "tgt_positions", "tgt_tokens")
    meta = torch.device("meta")  # a device every build of torch has, CPU-only ones included
    with _TorchCalls() as torch_calls:
        moved = batch.to(meta)
    for field in fields:
        assert getattr(moved, field).device.type == "meta", field
        assert getattr(moved, field).shape == getattr(batch, field).shape, field
        assert getattr(moved, field).dtype == getattr(batch, field).dtype, field
    assert moved.n_tgt_tokens == batch.n_tgt_tokens
    assert [name for name, _ in torch_calls.calls] == ["to"] * len(fields)
    assert all(kwargs.get("non_blocking") is True for _, kwargs in torch_calls.calls)


def test_in_background_yields_every_item_in_order_then_the_producers_error() -> None:
    """The trainer's next batches come from a thread: none may be lost or reordered, and an error collating
    one is raised where it is consumed, after the items before it."""
    assert list(in_background(iter(range(50)), ahead=2)) == list(range(50))

    def failing() -> Iterator[int]:
        yield from range(3)
        raise ValueError("collate failed")

    got = []
    with pytest.raises(ValueError, match="collate failed"):
        for item in in_background(failing(), ahead=2):
            got.append(item)
    assert got == [0, 1, 2]


def test_in_background_reads_at_most_ahead_items_before_they_are_asked_for() -> None:
    """Memory stays bounded: `ahead` items wait in the queue and one more in the producer's hands."""
    pulled = 0

    def counted() -> Iterator[int]:
        nonlocal pulled
        for i in range(100):
            pulled = i + 1
            yield i

    items = in_background(counted(), ahead=2)
    assert next(items) == 0
    deadline = time.monotonic() + 10
    while pulled < 1 + 2 + 1 and time.monotonic() < deadline:  # let the producer run as far as it may
        time.sleep(0.01)
    time.sleep(0.2)
    assert pulled == 1 + 2 + 1
    items.close()


def test_in_background_stops_its_thread_when_the_consumer_stops_early() -> None:
    """A stop (a signal, max_steps) closes the iterator mid-epoch: the producer must end, not block forever on
    a full queue, and no thread may be left running torch code."""
    def endless() -> Iterator[int]:
        i = 0
        while True:
            yield i
            i += 1

    before = set(threading.enumerate())
    items = in_background(endless(), ahead=2)
    assert [next(items) for _ in range(5)] == [0, 1, 2, 3, 4]
    [producer] = set(threading.enumerate()) - before
    assert producer.name == "mtx-collate" and producer.daemon  # named in stack dumps; never keeps Python alive
    closer = threading.Thread(target=items.close, daemon=True)  # close joins the producer: bound the wait
    closer.start()
    closer.join(timeout=10)
    assert not closer.is_alive() and not producer.is_alive()


def test_decoding_batches_go_longest_first_within_the_budget() -> None:
    """A sentence costs its source or its output limit plus EOS, whichever is longer; one over budget on its
    own is decoded alone rather than refused."""
    lengths = [5, 30, 2, 9, 9, 17, 1, 40, 3]
    limits = [n + 5 for n in lengths]
    costs = [n + 6 for n in lengths]
    batches = decoding_batches(lengths, limits, batch_tokens=40)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    for batch in batches:
        assert len(batch) == 1 or len(batch) * max(costs[i] for i in batch) <= 40
        assert [lengths[i] for i in batch] == sorted((lengths[i] for i in batch), reverse=True)
    assert batches[:2] == [[7], [1]]  # longest first, alone: each is over budget on its own
    assert decoding_batches([], [], batch_tokens=40) == []
