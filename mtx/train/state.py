"""`TrainState`: a run's progress, which every checkpoint carries, and where a resumed session continues in it.

The batch order is a pure function of (seed, epoch), so the progress needs no RNG state: the epoch and the
position in it, counted in batches of the epoch's order, say which batch comes next. A session on another
number of processes or update_freq continues at that very batch; one with another max_tokens has other
batches, and continues at the same fraction of the epoch (`reposition_for_this_session`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class TrainState:
    """The trainer's progress, as Python primitives (checkpoints load with weights_only=True)."""

    step: int = 0  # optimizer updates done
    epoch: int = 1  # the epoch in progress, from 1
    batch_in_epoch: int = 0  # batches of `epoch`'s order trained on: where a resumed run continues
    world: int = 1  # the processes and train.update_freq of the session that saved this state: the batches
    update_freq: int = 1  # of an update, which a resume on another shape reports
    max_tokens: int | None = None  # and the budget and number of the epoch's batches it counted positions in
    epoch_batches: int | None = None  # (None: saved by an mtx that did not record them)
    train_seconds: float = 0.0  # summed over all sessions of the run; what train.max_time budgets
    best_bleu: float | None = None  # the best valid BLEU so far, which milestones and the model card report
    best_score: float | None = None  # the best train.best_metric so far, which best.pt holds (mtx.train.best)
    bad_validations: int = 0  # validations since best_score last improved (train.patience)
    skipped_steps: int = 0  # fp16 updates dropped by the grad scaler for inf/NaN gradients (not in `step`)
    tokens: int = 0  # target tokens of all updates so far, all ranks' (skipped ones too: the data moved on)
    milestones: list[dict[str, Any]] = field(default_factory=list)  # the milestone lines of levels reached

    @classmethod
    def from_progress(cls, progress: dict[str, Any], world: int, update_freq: int, best_metric: str) -> TrainState:
        """The state in a checkpoint's progress, which also holds the log's loss window (its window_* keys); a
        new run's state on `world` processes × `update_freq` if there is none.

        A checkpoint of an mtx from before positions were counted in batches holds `update_in_epoch` instead, with
        no shape: it is taken to have the shape of this session, as that mtx would have taken it. One from before
        train.best_metric judged best.pt by BLEU alone: its best BLEU is the best score of a run judged by
        `best_metric` bleu, and a run judged by nll starts its best score afresh."""
        state = cls(**{f.name: progress[f.name] for f in dataclasses.fields(cls) if f.name in progress})
        if "batch_in_epoch" not in progress:
            state.world, state.update_freq = world, update_freq
            state.batch_in_epoch = progress.get("update_in_epoch", 0) * world * update_freq
        if "best_score" not in progress and best_metric == "bleu":
            state.best_score = state.best_bleu
        return state


def reposition_for_this_session(state: TrainState, batches: int, max_tokens: int, world: int, update_freq: int,
                                say: Callable[[str], None]) -> None:
    """Move `state` to where this session, on `world` processes × `update_freq` with epochs of `batches` batches
    of up to `max_tokens`, continues, and record that shape in it; say so where the shape changed.

    On another number of processes or update_freq the run continues at the very batch where it stopped, and
    says whether an update's batches (the effective batch) changed. With another max_tokens (lowered after
    running out of memory, or set anew by train.update_tokens on another number of processes) the batches are
    others: it continues at the same fraction of the epoch."""
    before, now = state.world * state.update_freq, world * update_freq
    if state.max_tokens not in (None, max_tokens) and state.epoch_batches:
        position = state.batch_in_epoch
        state.batch_in_epoch = min(batches, round(position * batches / state.epoch_batches))
        say(f"The batches were cut with max_tokens {state.max_tokens:,} when the run stopped and are "
            f"cut with {max_tokens:,} now: it continues at the same fraction of epoch "
            f"{state.epoch}, batch {state.batch_in_epoch:,} of {batches:,} (it stopped at "
            f"{position:,} of {state.epoch_batches:,}).")
    elif (state.world, state.update_freq) != (world, update_freq):
        effect = (f"An update has the same {now} batches as before." if before == now else
                  f"The effective batch changes from {before} to {now} batches of up to train.max_tokens tokens "
                  "per update; the learning rate schedule stays as it was.")
        say(f"Resuming on {world} process{'es' if world > 1 else ''} × update_freq {update_freq} "
            f"where the run stopped on {state.world} × {state.update_freq}: it continues at batch "
            f"{state.batch_in_epoch:,} of epoch {state.epoch}. {effect}")
    state.world, state.update_freq = world, update_freq
    state.max_tokens, state.epoch_batches = max_tokens, batches
