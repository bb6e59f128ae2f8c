"""Token-budget batching: budgets, length grouping, epoch order, rank sharding, resuming, collation."""

import numpy as np
import pytest
import torch

from mtx.batching import BatchPlan, collate, make_batches, pair_costs
from mtx.errors import MtxError
from mtx.tokenizer import BOS, EOS, PAD


class Pairs:
    """An in-memory split with the interface of mtx.data.TokenSplit."""

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


def test_batches_cover_every_pair_once_within_the_budget() -> None:
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    assert sorted(np.concatenate(batches).tolist()) == list(range(len(src)))
    costs = pair_costs(src, tgt)
    for batch in batches:
        assert len(batch) * costs[batch].max() <= 400
    # greedy: a batch is cut only when the next pair would not fit
    for batch, following in zip(batches, batches[1:], strict=False):
        grown = np.append(batch, following[0])
        assert len(grown) * costs[grown].max() > 400


def test_batches_group_similar_lengths() -> None:
    src, tgt = random_lengths(2000)
    batches = make_batches(src, tgt, max_tokens=1000, seed=1)
    padded_source = sum(len(b) * (src[b].max() + 1) for b in batches)
    assert padded_source / (src + 1).sum() < 1.05  # sorted by source length: under 5% padding
    assert max(src[b].max() - src[b].min() for b in batches) <= 3


def test_a_pair_over_the_budget_is_a_clear_error() -> None:
    with pytest.raises(MtxError, match=r"train.max_tokens = 20 .* needs 31 tokens.*at least 31"):
        make_batches(np.array([3, 30]), np.array([4, 2]), max_tokens=20, seed=1)


def test_epoch_order_is_a_function_of_seed_and_epoch() -> None:
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=400, seed=1)
    plan = BatchPlan(batches, seed=1)
    again = BatchPlan(make_batches(src, tgt, max_tokens=400, seed=1), seed=1)
    assert np.array_equal(plan.epoch_order(3), again.epoch_order(3))
    assert not np.array_equal(plan.epoch_order(1), plan.epoch_order(2))
    assert not np.array_equal(plan.epoch_order(1), BatchPlan(batches, seed=2).epoch_order(1))
    assert sorted(plan.epoch_order(1).tolist()) == list(range(len(batches)))


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_together_take_what_one_process_accumulates(world: int) -> None:
    """Update u of `world` ranks × update_freq 2 uses the batches of one rank × update_freq 2·world."""
    src, tgt = random_lengths()
    batches = make_batches(src, tgt, max_tokens=300, seed=1)
    single = list(BatchPlan(batches, seed=5, update_freq=2 * world).updates(epoch=2))
    ranks = [list(BatchPlan(batches, seed=5, update_freq=2, world=world, rank=r).updates(epoch=2))
             for r in range(world)]
    assert all(len(r) == len(single) == len(batches) // (2 * world) for r in ranks)
    for u, (_, expected) in enumerate(single):
        together = [b.tolist() for rank in ranks for b in rank[u][1]]
        assert sorted(together) == sorted(b.tolist() for b in expected)
        for rank in ranks:  # no batch is used by two ranks
            assert len(rank[u][1]) == 2


def test_resuming_mid_epoch_continues_with_the_same_batches() -> None:
    src, tgt = random_lengths()
    plan = BatchPlan(make_batches(src, tgt, max_tokens=300, seed=1), seed=1, update_freq=2)
    whole = list(plan.updates(epoch=4))
    tail = list(plan.updates(epoch=4, start=5))
    assert [u for u, _ in tail] == list(range(5, plan.updates_per_epoch))
    for (u1, b1), (u2, b2) in zip(whole[5:], tail, strict=True):
        assert u1 == u2 and all(np.array_equal(x, y) for x, y in zip(b1, b2, strict=True))


def test_too_few_batches_for_one_update_is_a_clear_error() -> None:
    batches = make_batches(np.array([3, 4, 5]), np.array([3, 4, 5]), max_tokens=10, seed=1)
    with pytest.raises(MtxError, match="fewer than one update"):
        BatchPlan(batches, seed=1, update_freq=4, world=2)


def test_collate_follows_the_sequence_convention() -> None:
    pairs = Pairs([[10, 11, 12], [20]], [[30, 31], [40, 41, 42, 43]])
    batch = collate(pairs, [0, 1])
    assert batch.src.tolist() == [[10, 11, 12, EOS], [20, EOS, PAD, PAD]]
    assert batch.src_pad.tolist() == [[False] * 4, [False, False, True, True]]
    assert batch.tgt_in.tolist() == [[BOS, 30, 31, PAD, PAD], [BOS, 40, 41, 42, 43]]
    assert batch.tgt_out.tolist() == [[30, 31, EOS, PAD, PAD], [40, 41, 42, 43, EOS]]
    assert batch.n_tgt_tokens == 3 + 5 == int((batch.tgt_out != PAD).sum())
    assert batch.src.dtype == torch.long
