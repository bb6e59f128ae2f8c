"""Doubts about a translation: why it deserves a human look (`mtx translate --format jsonl` lists them as "flags").

Four ways a neural translation goes wrong without saying so, each checked on the translation's tokens:

    loop          the decoder fell into a loop: an n-gram of 1 to 4 tokens repeated `loop` times in a row
    length_ratio  the translation is far shorter or longer than its source, beyond what the training data has
    copied        the source was left untranslated: nearly all of the translation's tokens occur in the source
    low_log_prob  the model was unsure: the mean log-probability of the translation's tokens (EOS included) is
                  below `min_mean_log_prob`

and one fact of its input, which the translator knows rather than checks:

    truncated     the source was longer than the model's positions, and only its first max_positions - 1 tokens
                  were translated: the translation misses the rest (`TRUNCATED`)

The length-ratio bounds and the copy share come from the training data: the trainer measures them on its
training pairs (`training_statistics`: the 0.5th and 99.5th percentiles of target / source length in tokens over
up to a million of them, and the 99.5th percentile of the share of a target's tokens that occur in its source over
20,000), evenly spaced through the corpus, and rank 0 stores them in every checkpoint (`data_stats`). A
checkpoint without them (written before) gets the defaults of `DoubtThresholds`. The loop length and the
log-probability bar are documented defaults: what a correct sentence never does, and a mean per-token
probability below e^-1 ≈ 0.37.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

STATISTICS_SAMPLE = 20_000  # training pairs, evenly spaced, that the copy share is measured on (token by token)
RATIO_SAMPLE = 1_000_000  # those the length ratios are: all of a smaller corpus, 8 MB of ratios for WMT14 En-Fr
MAX_LOOP_NGRAM = 4
TRUNCATED = "truncated"  # the flag of a translation of a source cut to the model's positions (mtx.decode.translator)


@dataclass(frozen=True)
class DoubtThresholds:
    """Where each doubt starts; the defaults are for checkpoints that carry no statistics of their data."""

    length_ratio: tuple[float, float] = (0.5, 2.0)
    copied: float = 0.9
    min_mean_log_prob: float = -1.0
    loop: int = 3

    @classmethod
    def of_checkpoint(cls, checkpoint: dict[str, Any]) -> DoubtThresholds:
        stats = checkpoint.get("data_stats") or {}
        defaults = cls()
        low, high = stats.get("length_ratio", defaults.length_ratio)
        return cls((float(low), float(high)), float(stats.get("copied", defaults.copied)))


def training_statistics(src_lens: np.ndarray, tgt_lens: np.ndarray, pair: Any) -> dict[str, Any]:
    """The length-ratio bounds and the copy share of the training pairs (their lengths in tokens; `pair(i)`
    gives pair i's source and target token ids), for a checkpoint's `data_stats`. Measured on evenly spaced
    samples, so that a run's start-up stays short on a corpus of tens of millions of pairs."""
    spread = _evenly_spaced(len(src_lens), RATIO_SAMPLE)
    ratios = (tgt_lens[spread] + 1) / (src_lens[spread] + 1)  # EOS counted on both sides: no division by 0
    low, high = np.percentile(ratios, [0.5, 99.5])
    sample = _evenly_spaced(len(src_lens), STATISTICS_SAMPLE)
    shares = [copied_share(*pair(int(i))) for i in sample]
    return {"length_ratio": [round(float(low), 4), round(float(high), 4)],
            "copied": round(float(np.percentile(shares, 99.5)), 4), "pairs_measured": len(sample)}


def _evenly_spaced(total: int, count: int) -> np.ndarray:
    return np.linspace(0, total - 1, min(count, total)).astype(np.int64)


def copied_share(source: Sequence[int], target: Sequence[int]) -> float:
    """The share of the target's tokens that occur in the source (0 for an empty target)."""
    if len(target) == 0:
        return 0.0
    present = set(int(t) for t in source)
    return sum(int(t) in present for t in target) / len(target)


def longest_loop(tokens: Sequence[int]) -> int:
    """The most times in a row that one n-gram (n ≤ 4) of `tokens` repeats: 1 where nothing repeats."""
    best, count = 1, len(tokens)
    for n in range(1, MAX_LOOP_NGRAM + 1):
        for start in range(count - 2 * n + 1):
            times = 1
            while start + (times + 1) * n <= count and tokens[start + times * n : start + (times + 1) * n] == \
                    tokens[start : start + n]:
                times += 1
            best = max(best, times)
    return best


def doubts(source: Sequence[int], tokens: Sequence[int], token_log_probs: Sequence[float],
           thresholds: DoubtThresholds) -> list[str]:
    """The doubts about one translation, by name (`loop`, `length_ratio`, `copied`, `low_log_prob`): `source`
    its source's token ids (EOS excluded), `tokens` its own, `token_log_probs` one per token and EOS."""
    raised = []
    if longest_loop(list(tokens)) >= thresholds.loop:
        raised.append("loop")
    low, high = thresholds.length_ratio
    if not low <= (len(tokens) + 1) / (len(source) + 1) <= high:
        raised.append("length_ratio")
    if len(tokens) > 0 and copied_share(source, tokens) > thresholds.copied:
        raised.append("copied")
    if token_log_probs and sum(token_log_probs) / len(token_log_probs) < thresholds.min_mean_log_prob:
        raised.append("low_log_prob")
    return raised
