"""The batch plan as mtx made it before issue 23 (a Python step per pair), kept to time the change against.

`make_batches` here returns the same batches as mtx.data.batching.make_batches; tests/unit/test_batching.py holds
its own copy, the reference the property tests compare with.
"""

from __future__ import annotations

import numpy as np


def make_batches(src_lens: np.ndarray, tgt_lens: np.ndarray, max_tokens: int, seed: int) -> list[np.ndarray]:
    src_lens, tgt_lens = np.asarray(src_lens, dtype=np.int64), np.asarray(tgt_lens, dtype=np.int64)
    costs = np.maximum(src_lens, tgt_lens) + 1
    if len(costs) == 0:
        return []
    tie_break = np.random.default_rng(seed).permutation(len(costs))
    order = tie_break[np.lexsort((tgt_lens[tie_break], src_lens[tie_break]))]
    batches, start, widest = [], 0, 0
    for end, cost in enumerate(costs[order].tolist()):
        if end > start and (end - start + 1) * max(widest, cost) > max_tokens:
            batches.append(order[start:end])
            start, widest = end, 0
        widest = max(widest, cost)
    batches.append(order[start:])
    return batches
