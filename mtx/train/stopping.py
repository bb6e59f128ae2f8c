"""When training stops: its budgets (max_steps, max_epochs, max_time), early stopping (patience, counted on
train.best_metric: mtx.train.best) and stop signals.

Kept apart from the loop, as fairseq's `should_stop_early` and OpenNMT-py's earlystopping.py are: the rules
say whether and why to stop (a `StopReason`, worded for the user); the trainer asks them between updates, and
the ranks agree on what each rank sees on its own — the clock, a signal — before all of them stop together.
On any stop the trainer writes the checkpoint of that step first, and the same command resumes.
"""

from __future__ import annotations

import enum
import math
import signal
from typing import Any

from mtx.config.fields import parse_duration
from mtx.config.recipe import TrainConfig
from mtx.train.best import describe

STOP_SIGNALS = ("SIGTERM", "SIGINT", "SIGUSR1", "SIGHUP")  # SIGUSR1: SLURM's --signal=USR1@T warning, via torchrun


class StopReason(enum.Enum):
    """Why training stops, worded for the user with the recipe's values. A budget spent (every reason but
    SIGNAL) asks for that budget to be raised to train on; after a signal, the same command resumes."""

    MAX_STEPS = "train.max_steps = {cfg.max_steps} reached"
    MAX_EPOCHS = "train.max_epochs = {cfg.max_epochs} reached"
    MAX_TIME = "train.max_time = {cfg.max_time} of training reached"
    PATIENCE = "early stopping: {metric} has not improved in {cfg.patience} validations (train.patience)"
    SIGNAL = "stopped by {signal}"

    def describe(self, cfg: TrainConfig, signal: str | None = None) -> str:
        """The reason in words; `signal` names the stop signal of SIGNAL (None: one sent to another rank)."""
        return self.value.format(cfg=cfg, metric=describe(cfg.best_metric),
                                 signal=signal or "a signal to another rank")


class StopSignals:
    """SIGTERM, SIGINT, SIGUSR1 or SIGHUP (a pre-emption, SLURM's advance warning, Ctrl-C, a closed terminal)
    asks the loop to stop after the current update, or in the middle of a validation, and save.

    Under torchrun the signal reaches the launcher, which forwards it to every worker and kills them after
    its --shutdown-timeout: the stop must fit in that window. SIGUSR1 and SIGHUP would otherwise kill the
    process outright. A second SIGINT aborts at once. Handlers can only be set in the main thread; elsewhere
    this does nothing.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def requested(self) -> bool:
        """Whether a stop signal has arrived: what the validator asks between batches."""
        return self.received is not None

    def __enter__(self) -> StopSignals:
        try:
            for name in STOP_SIGNALS:
                signum = getattr(signal, name)
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


class Budgets:
    """The budgets of a recipe's `train:` section: max_steps, max_epochs and patience, which every rank sees
    alike, and max_time, the training time summed over resumes, which each rank measures on its own clock."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        # parsed once here, not at every look at the clock
        self.max_seconds = math.inf if cfg.max_time is None else parse_duration(cfg.max_time, "train.max_time")

    def spent(self, step: int, epoch: int, epoch_finished: bool, bad_validations: int) -> StopReason | None:
        """Why training at update `step`, in epoch `epoch` (`epoch_finished`: with no whole update of it left),
        `bad_validations` validations since the best, must stop; None if it goes on."""
        cfg = self.cfg
        if step >= cfg.max_steps:
            return StopReason.MAX_STEPS
        epochs_done = epoch - 1 + epoch_finished
        if cfg.max_epochs is not None and epochs_done >= cfg.max_epochs:
            return StopReason.MAX_EPOCHS
        if cfg.patience is not None and bad_validations >= cfg.patience:
            return StopReason.PATIENCE
        return None

    def time_spent(self, seconds: float) -> StopReason | None:
        """MAX_TIME once `seconds` of training time reach train.max_time."""
        return StopReason.MAX_TIME if seconds >= self.max_seconds else None

