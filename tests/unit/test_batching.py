"""Token-budget batching: budgets, length grouping, epoch order, rank sharding, resuming, collation."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
from support import Pairs
from torch.overrides import TorchFunctionMode

from mtx.data.batching import (
    BatchPlan,
    collate,
    cut_into_batches,
    decoding_batches,
    in_background,
    make_batches,
    pair_costs,
    pairs_within,
    update_shape,
)
from mtx.errors import MtxError
from mtx.tokenizer import BOS, EOS, PAD


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
    assert [done for done, _ in updates] == list(range(3, len(batches) + 1, 3))
    assert plan.updates_per_epoch == len(updates)
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
            assert rank[u][0] == (u + 1) * 2 * world
            assert [b.tolist() for b in rank[u][1]] == [b.tolist() for i, b in enumerate(expected) if i % world == r]


def test_resuming_mid_epoch_continues_with_the_same_batches() -> None:
    src, tgt = random_lengths()
    plan = BatchPlan(make_batches(src, tgt, max_tokens=300, seed=1), seed=1, update_freq=2)
    whole = list(plan.updates(epoch=4))
    tail = list(plan.updates(epoch=4, start=10))  # 5 updates of 2 batches done
    assert [done for done, _ in tail] == list(range(12, 2 * plan.updates_per_epoch + 1, 2))
    for (u1, b1), (u2, b2) in zip(whole[5:], tail, strict=True):
        assert u1 == u2 and all(np.array_equal(x, y) for x, y in zip(b1, b2, strict=True))
    last = 2 * (plan.updates_per_epoch - 1)  # stopped before the epoch's last update, or after it
    assert [done for done, _ in plan.updates(epoch=4, start=last)] == [last + 2]
    assert list(plan.updates(epoch=4, start=last + 2)) == []
    assert not plan.epoch_finished(last) and plan.epoch_finished(last + 2)


@pytest.mark.parametrize(("before", "after"), [((2, 1), (1, 1)), ((1, 4), (2, 1)), ((3, 1), (1, 2)), ((1, 1), (2, 3))])
def test_a_resume_on_another_shape_continues_at_the_batch_where_the_run_stopped(before: tuple[int, int],
                                                                                after: tuple[int, int]) -> None:
    """Processes × update_freq changed between two sessions (a smaller allocation, another update_freq): the
    second session trains on each batch of the epoch's order that the first did not, once, in order, and only
    its own ragged tail is left out."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=300, seed=1)

    def trained(world: int, update_freq: int, start: int, updates: int | None = None) -> list[list[int]]:
        plans = [BatchPlan(batches, seed=3, update_freq=update_freq, world=world, rank=r) for r in range(world)]
        per_rank = [list(plan.updates(epoch=2, start=start))[:updates] for plan in plans]
        return [b.tolist() for u in range(len(per_rank[0])) for i in range(update_freq) for r in range(world)
                for b in [per_rank[r][u][1][i]]]

    first = trained(*before, start=0, updates=5)
    done = 5 * before[0] * before[1]
    second = trained(*after, start=done)
    order = BatchPlan(batches, seed=3).epoch_order(2)
    expected = [batches[i].tolist() for i in order]
    group = after[0] * after[1]
    assert first + second == expected[: done + (len(batches) - done) // group * group]

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


# ----------------------------------------------------------------- the batch plan against the former algorithm


def reference_cut(order: list | np.ndarray, costs: list[int], budget: int) -> list:
    """cut_into_batches as it was before issue 23: one Python step per item."""
    batches, start, widest = [], 0, 0
    for end, cost in enumerate(costs):
        if end > start and (end - start + 1) * max(widest, cost) > budget:
            batches.append(order[start:end])
            start, widest = end, 0
        widest = max(widest, cost)
    if len(order):
        batches.append(order[start:])
    return batches


def reference_make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int,
                           keep: np.ndarray | None = None) -> list[np.ndarray]:
    """make_batches as it was before issue 23, and training's batches of the pairs `keep` marks as they were
    (made of the kept pairs' lengths, then mapped back to the split): what a run started then must find again
    when it resumes."""
    pairs = np.arange(len(src_lens)) if keep is None else np.flatnonzero(keep)
    src_lens, tgt_lens = np.asarray(src_lens, dtype=np.int64)[pairs], np.asarray(tgt_lens, dtype=np.int64)[pairs]
    costs = np.maximum(src_lens, tgt_lens) + 1
    tie_break = np.random.default_rng(seed).permutation(len(costs))
    order = tie_break[np.lexsort((tgt_lens[tie_break], src_lens[tie_break]))]
    return [pairs[b] for b in reference_cut(order, costs[order].tolist(), max_tokens)]


def reference_decoding_batches(source_lens: list[int], output_limits: list[int], batch_tokens: int
                               ) -> list[list[int]]:
    order = sorted(range(len(source_lens)), key=lambda i: -source_lens[i])
    return reference_cut(order, [max(source_lens[i], output_limits[i] + 1) for i in order], batch_tokens)


def lengths_like(rng: np.random.Generator, n: int, shape: str) -> tuple[np.ndarray, np.ndarray]:
    """n pairs' lengths: few distinct values (long runs of ties), a wide uniform spread, corpus-like skew (a
    long tail), targets that follow sources, or lengths so long that the combinations are too many for a table."""
    if shape == "ties":
        return rng.integers(0, 4, n), rng.integers(0, 4, n)
    if shape == "uniform":
        return rng.integers(1, 300, n), rng.integers(1, 300, n)
    if shape == "skewed":
        src = np.clip(np.rint(rng.lognormal(np.log(20), 0.8, n)), 1, 250).astype(np.int64)
        return src, np.clip(np.rint(src * rng.lognormal(0.1, 0.2, n)), 1, 250).astype(np.int64)
    if shape == "constant":
        return np.full(n, 9), np.full(n, 9)
    if shape == "correlated":
        src = rng.integers(1, 60, n)
        return src, np.clip(src + rng.integers(-5, 6, n), 1, None)
    return rng.integers(1, 5000, n), rng.integers(1, 3000, n)  # "long"


SHAPES = ["ties", "uniform", "skewed", "constant", "correlated", "long"]


def assert_same_batches(ours: list, theirs: list) -> None:
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs, strict=True):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("chunk", [None, 64, 7])
@pytest.mark.parametrize("shape", SHAPES)
def test_batches_are_the_very_batches_of_the_former_algorithm(shape: str, chunk: int | None,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A run started before the batch plan was rewritten resumes on the same batches: the same pairs, in the
    same order within each batch, the batches in the same order. Random sizes (nothing, one pair, a few,
    thousands), seeds, budgets from the longest batched pair's cost up, pairs left out by masks of every density
    (among them pairs over the budget); passes over the split and sorts a small chunk at a time too, so that
    every chunk boundary is crossed."""
    if chunk:
        monkeypatch.setattr("mtx.data.batching._CHUNK", chunk)
        monkeypatch.setattr("mtx.data.batching._SORT_CHUNK", chunk)
    rng = np.random.default_rng([SHAPES.index(shape), chunk or 0])
    for case in range(25):
        n = [0, 1, 2, 3, 50, 1000, 3000][case % 7]
        src, tgt = lengths_like(rng, n, shape)
        seed = int(rng.integers(0, 1000))
        keep = [None, rng.random(n) < rng.choice([0.0, 0.05, 0.5, 0.95, 1.0])][case % 2]
        kept_costs = (np.maximum(src, tgt) + 1)[keep if keep is not None else slice(None)]
        longest = int(kept_costs.max(initial=1))
        max_tokens = int(rng.choice([longest, longest + 1, 2 * longest, 4096, 16384, 100 * longest]))
        max_tokens = max(max_tokens, longest)
        assert_same_batches(make_batches(src, tgt, max_tokens, seed, keep=keep),
                            reference_make_batches(src, tgt, max_tokens, seed, keep))


def test_batches_with_many_length_combinations_are_the_former_algorithms() -> None:
    """More than 65,536 (source, target) combinations: the sort keys need 32 bits, whether a table or a search
    numbers the combinations."""
    rng = np.random.default_rng(5)
    for high in (1000, 3000):  # 10⁶ possible combinations, within the table's reach; 9·10⁶, beyond it
        src, tgt = rng.integers(0, high, 150_000), rng.integers(0, high, 150_000)
        assert len(np.unique(src * high + tgt)) > 1 << 16
        assert_same_batches(make_batches(src, tgt, 20_000, seed=3), reference_make_batches(src, tgt, 20_000, 3))


def test_a_pair_over_the_budget_is_named_by_its_index_in_the_split() -> None:
    """The first pair of the largest cost, among those batched, as the former algorithm named it."""
    rng = np.random.default_rng(2)
    for n in (1, 5, 300):
        src, tgt = rng.integers(1, 40, n), rng.integers(1, 40, n)
        costs = np.maximum(src, tgt) + 1
        with pytest.raises(MtxError, match=rf"pair {int(costs.argmax())} needs {costs.max()} tokens"):
            make_batches(src, tgt, int(costs.max()) - 1, seed=1)
    src, tgt, keep = np.array([50, 3, 20, 20]), np.array([2, 3, 4, 4]), np.array([False, True, True, True])
    with pytest.raises(MtxError, match=r"key.x = 20 cannot fit even one sentence pair: pair 2 needs 21 tokens"):
        make_batches(src, tgt, 20, seed=1, key="key.x", keep=keep)


def test_make_batches_needs_twelve_bytes_a_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank of a 36M-pair run makes the plan. At the peak: each pair with its sort key, shuffled, in a uint64,
    and the int32 order it is sorted into; besides them, only the tables of length combinations and a chunk's
    temporaries, nothing else the size of the split."""
    import tracemalloc

    monkeypatch.setattr("mtx.data.batching._CHUNK", 1 << 14)
    monkeypatch.setattr("mtx.data.batching._SORT_CHUNK", 1 << 14)
    src, tgt = lengths_like(np.random.default_rng(0), 1 << 22, "skewed")
    for keep in (None, np.arange(len(src)) % 100 != 0):
        tracemalloc.start()
        try:
            make_batches(src, tgt, 4096, seed=1, keep=keep)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 12.5 * len(src)


def test_cutting_is_the_former_greedy_rule() -> None:
    """Random costs, runs of equal ones, items over budget on their own, a budget of zero; arrays and lists."""
    rng = np.random.default_rng(4)
    for case in range(300):
        n = int(rng.integers(0, 200))
        costs = rng.integers(1, [3, 30, 300][case % 3], n)
        if case % 4 == 0:
            costs = np.repeat(costs, rng.integers(1, 20, n))[:n]
        budget = int(rng.choice([0, 1, 5, 40, 100, 1000]))
        for order in (np.arange(len(costs)) * 3, list(range(len(costs)))):
            ours, theirs = cut_into_batches(order, costs.tolist(), budget), reference_cut(order, costs.tolist(), budget)
            assert type(ours) is type(theirs) and all(type(a) is type(order) for a in ours)
            assert_same_batches(ours, theirs)


def test_decoding_batches_are_the_former_ones() -> None:
    """Sentences over budget (decoded alone), output limits longer or shorter than their sources."""
    rng = np.random.default_rng(6)
    for case in range(200):
        n = int(rng.integers(0, 100))
        lengths = rng.integers(1, [5, 50, 300][case % 3], n).tolist()
        limits = [int(x * 1.5 + 10) for x in lengths] if case % 2 else rng.integers(1, 100, n).tolist()
        budget = int(rng.choice([1, 40, 256, 4096]))
        assert decoding_batches(lengths, limits, budget) == reference_decoding_batches(lengths, limits, budget)


def test_pairs_within_a_limit() -> None:
    """Costs counted in int64, whatever the dtype of the lengths."""
    src, tgt = np.array([1, 9, 3, 0], dtype=np.uint16), np.array([4, 2, 9, 65535], dtype=np.uint16)
    assert pairs_within(src, tgt, 9).tolist() == [True, False, False, False]  # 65535 + 1 does not wrap round
    assert pairs_within(src[:0], tgt[:0], 9).tolist() == []


@pytest.mark.parametrize(("update_tokens", "max_tokens", "world", "expected"), [
    (28672, 28672, 1, (28672, 1)), (28672, 28672, 8, (3584, 1)), (28672, 8192, 1, (7168, 4)),
    (28672, 3584, 2, (3584, 4)), (28672, 4096, 3, (3186, 3)), (100, 4096, 3, (34, 1)), (5, 1, 2, (1, 3)),
])
def test_update_shape_takes_the_fewest_equal_micro_batches_within_max_tokens(update_tokens, max_tokens, world,
                                                                             expected) -> None:
    micro, update_freq = update_shape(update_tokens, max_tokens, world)
    assert (micro, update_freq) == expected
    assert micro <= max_tokens
    assert update_tokens <= micro * world * update_freq < update_tokens + world * update_freq
    if update_freq > 1:  # one micro-batch fewer would not hold the update within max_tokens
        assert max_tokens * world * (update_freq - 1) < update_tokens
