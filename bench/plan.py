"""How long every training rank takes to make its batch plan, and how much memory that needs (issue 23).

Synthetic lengths shaped like WMT14 En-Fr after BPE: sources log-normal around 28 tokens, clipped to [1, 250];
each target its source's length times a log-normal ratio around 1.1 (French runs longer), clipped alike. They
are int32 arrays, as mtx.data.prepared.TokenSplit hands them to the trainer. `mtx.data.batching.make_batches`
is timed on --pairs and on --reference-pairs pairs at each train.max_tokens (the first run apart, then the
median of the repeats), and the peak of its own allocations measured in a run of its own under tracemalloc
(NumPy reports its arrays to it). `training_batches` is what mtx.train.run_data.training_batches does when
some pairs are too long for the model (`pairs_within`, then the batches of the others). The algorithm mtx used
before (bench/plan_reference.py) is timed on --reference-pairs, and its batches checked equal to mtx's.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/plan.py
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/plan.py --pairs 4000000 --reference-pairs 0
"""

from __future__ import annotations

import argparse
import gc
import time
import tracemalloc
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
from common import emit, emit_info
from plan_reference import make_batches as reference_make_batches

from mtx.data.batching import make_batches, pairs_within

MB = 1 << 20
MAX_POSITIONS = 200  # for training_batches: leaves out the few longest pairs, the tail of the distribution


def wmt_like_lengths(pairs: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    src = np.clip(np.rint(rng.lognormal(np.log(28), 0.6, pairs)), 1, 250).astype(np.int32)
    tgt = np.clip(np.rint(src * rng.lognormal(np.log(1.1), 0.2, pairs)), 1, 250).astype(np.int32)
    return src, tgt


def training_batches(src: np.ndarray, tgt: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """What mtx.train.run_data.training_batches does when some pairs are too long for the model."""
    return make_batches(src, tgt, max_tokens, seed=1, keep=pairs_within(src, tgt, min(MAX_POSITIONS, max_tokens)))


def measure(name: str, make: Callable[[], list[np.ndarray]], config: dict, repeats: int) -> list[np.ndarray]:
    """Time `make` (the first run apart) and measure its peak memory, over what was allocated before it (its
    result included); print both; its batches."""
    batches: list[np.ndarray] = []
    seconds = []
    for _ in range(1 + repeats):
        batches = []  # the previous run's batches are freed before this one makes its own
        started = time.perf_counter()
        batches = make()
        seconds.append(time.perf_counter() - started)
    config = {**config, "batches": len(batches)}
    emit(f"plan.{name}.seconds", config, seconds[1:], "s", first_run_s=round(seconds[0], 2))
    batches = []
    gc.collect()
    tracemalloc.start()
    try:
        batches = make()
        peak = tracemalloc.get_traced_memory()[1] / MB
    finally:
        tracemalloc.stop()
    emit(f"plan.{name}.peak_memory", config, [peak], "MB")
    return batches


def same_batches(ours: Sequence[np.ndarray], theirs: Sequence[np.ndarray]) -> bool:
    return len(ours) == len(theirs) and all(np.array_equal(a, b) for a, b in zip(ours, theirs, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=36_000_000)
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--reference-pairs", type=int, default=4_000_000,
                        help="pairs to time the former algorithm on, and mtx's again (0: neither)")
    args = parser.parse_args()
    src, tgt = wmt_like_lengths(max(args.pairs, args.reference_pairs))
    for pairs in sorted({args.pairs, args.reference_pairs} - {0}, reverse=True):
        s, t = src[:pairs], tgt[:pairs]
        for max_tokens in args.max_tokens:
            config = {"pairs": pairs, "max_tokens": max_tokens}
            ours = measure("make_batches", partial(make_batches, s, t, max_tokens, seed=1), config, args.repeats)
            if pairs == args.reference_pairs:
                theirs = measure("reference", partial(reference_make_batches, s, t, max_tokens, seed=1), config,
                                 args.repeats)
                emit_info("plan.same_batches_as_reference", **config, ok=same_batches(ours, theirs))
            del ours
        config = {"pairs": pairs, "max_tokens": args.max_tokens[0], "max_positions": MAX_POSITIONS,
                  "left_out": int(np.count_nonzero(~pairs_within(s, t, MAX_POSITIONS)))}
        measure("training_batches", partial(training_batches, s, t, args.max_tokens[0]), config, args.repeats)


if __name__ == "__main__":
    main()
