"""Which checkpoints are best: the validation metric a run is judged by (`train.best_metric`) and its direction.

A step checkpoint written at a validated step carries that validation's scores (`valid`: loss, nll, BLEU, length
ratio; mtx.checkpoint). Everything that picks checkpoints by validation reads them through this module, so that
"best" means one thing: best.pt and early stopping (mtx.train.trainer), the best N step checkpoints the trainer
keeps beside the newest (`train.keep_best`, mtx.train.checkpoints), and `mtx average --best N`.

The metrics are those peers offer: fairseq's `--best-checkpoint-metric` (loss by default, or BLEU), Marian's
and Sockeye's `--keep-best` by their first validation metric. BLEU is the decoded valid set's (greedy unless
train.valid_beam says otherwise, on train.valid_max_sentences spread sentences); nll is the per-token negative
log-likelihood of the references, without label smoothing, over the whole valid split. Ties go to the newer
checkpoint, the one trained longer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mtx.config.train import BestMetric

HIGHER_IS_BETTER: dict[str, bool] = {"bleu": True, "nll": False}


def metric_value(valid: dict[str, Any], metric: BestMetric) -> float:
    """The value of `metric` in a checkpoint's `valid` scores."""
    return float(valid[metric])


def improves(value: float, best: float | None, metric: BestMetric) -> bool:
    """Whether a validation's `metric` beats the best so far (strictly): it then becomes best.pt, and patience
    starts over."""
    if best is None:
        return True
    return value > best if HIGHER_IS_BETTER[metric] else value < best


def ranked(scored: Iterable[tuple[int, dict[str, Any]]], metric: BestMetric) -> list[int]:
    """The steps of `scored` ((step, valid scores) pairs), best first by `metric`, the newer first among equals."""
    sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
    return [step for step, _ in sorted(scored, key=lambda item: (sign * metric_value(item[1], metric), item[0]),
                                       reverse=True)]


def best_steps(scored: Iterable[tuple[int, dict[str, Any]]], metric: BestMetric, n: int) -> list[int]:
    """The `n` best steps of `scored` by `metric`, in the order of training (oldest first)."""
    return sorted(ranked(scored, metric)[:n])


def describe(metric: BestMetric) -> str:
    """The metric in words, for messages."""
    return "valid BLEU" if metric == "bleu" else "valid nll"

