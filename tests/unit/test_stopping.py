"""The stopping rules on their own: each budget at its edge, patience, and the stop signals' flag."""

from __future__ import annotations

import os
import signal

import pytest

from mtx.config.recipe import TrainConfig
from mtx.train.best import improves
from mtx.train.stopping import Budgets, StopReason, StopSignals


def spent(cfg: TrainConfig, step: int = 5, epoch: int = 1, epoch_finished: bool = False,
          bad_validations: int = 0) -> StopReason | None:
    return Budgets(cfg).spent(step, epoch, epoch_finished, bad_validations)


def test_max_steps_stops_at_that_step_and_not_before() -> None:
    cfg = TrainConfig(max_steps=20)
    assert spent(cfg, step=19) is None
    assert spent(cfg, step=20) is StopReason.MAX_STEPS
    assert spent(cfg, step=21) is StopReason.MAX_STEPS


def test_max_epochs_counts_an_epoch_once_its_last_update_is_done() -> None:
    cfg = TrainConfig(max_epochs=2)
    assert spent(cfg, epoch=2, epoch_finished=False) is None
    assert spent(cfg, epoch=2, epoch_finished=True) is StopReason.MAX_EPOCHS
    assert spent(cfg, epoch=3, epoch_finished=False) is StopReason.MAX_EPOCHS  # a resume between epochs
    assert spent(cfg, epoch=1, epoch_finished=True) is None
    assert spent(TrainConfig(), epoch=50, epoch_finished=True) is None  # no max_epochs


def test_patience_stops_after_that_many_validations_without_a_better_bleu() -> None:
    cfg = TrainConfig(patience=3)
    assert spent(cfg, bad_validations=2) is None
    assert spent(cfg, bad_validations=3) is StopReason.PATIENCE
    assert spent(TrainConfig(), bad_validations=100) is None  # no patience


def test_steps_are_looked_at_before_epochs_and_patience() -> None:
    """The reason given is the first that applies, in the order the user reads them."""
    cfg = TrainConfig(max_steps=20, max_epochs=1, patience=1)
    assert spent(cfg, step=20, epoch=2, bad_validations=1) is StopReason.MAX_STEPS
    assert spent(cfg, step=10, epoch=2, bad_validations=1) is StopReason.MAX_EPOCHS


def test_max_time_is_reached_at_its_duration() -> None:
    budgets = Budgets(TrainConfig(max_time="90m"))
    assert budgets.time_spent(90 * 60 - 0.5) is None
    assert budgets.time_spent(90 * 60) is StopReason.MAX_TIME
    assert Budgets(TrainConfig()).time_spent(1e12) is None  # no max_time


def test_a_better_score_is_strictly_better_in_the_metrics_direction() -> None:
    """What patience counts and best.pt follows: a higher BLEU, a lower nll; an equal score is no improvement."""
    assert improves(10.0, None, "bleu") and improves(3.0, None, "nll")
    assert improves(10.5, 10.0, "bleu") and not improves(9.0, 10.0, "bleu")
    assert improves(2.5, 3.0, "nll") and not improves(3.5, 3.0, "nll")
    assert not improves(10.0, 10.0, "bleu") and not improves(3.0, 3.0, "nll")


def test_reasons_are_worded_with_the_recipes_values() -> None:
    cfg = TrainConfig(max_steps=300, patience=4, max_time="2h")
    assert StopReason.MAX_STEPS.describe(cfg) == "train.max_steps = 300 reached"
    assert StopReason.PATIENCE.describe(cfg) == ("early stopping: valid nll has not improved in 4 validations "
                                                 "(train.patience)")
    assert StopReason.PATIENCE.describe(TrainConfig(patience=2, best_metric="bleu")).startswith(
        "early stopping: valid BLEU has not improved in 2 validations")
    assert StopReason.SIGNAL.describe(cfg, "SIGTERM") == "stopped by SIGTERM"
    assert StopReason.SIGNAL.describe(cfg) == "stopped by a signal to another rank"


@pytest.mark.parametrize("name", ["SIGTERM", "SIGUSR1", "SIGHUP", "SIGINT"])
def test_a_stop_signal_is_recorded_and_the_handlers_are_restored(name: str) -> None:
    signum = getattr(signal, name)
    before = signal.getsignal(signum)
    with StopSignals() as signals:
        assert not signals.requested()
        os.kill(os.getpid(), signum)
        assert signals.requested() and signals.received == name
    assert signal.getsignal(signum) is before


def test_a_second_sigint_aborts_at_once() -> None:
    with StopSignals(), pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
