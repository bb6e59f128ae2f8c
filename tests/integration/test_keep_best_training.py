"""Checkpoints judged by validation while training (issue 59): a step checkpoint carries the scores of its
step's validation, best.pt and patience follow train.best_metric, and the step checkpoints kept are the newest
and the best by that metric, a resumed run's among them. The valid nll and BLEU are scripted through the run's
hooks; everything else trains for real."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import events, prepared, recipe, run_files
from torch import Tensor

from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.train.components import Hooks
from mtx.train.loss import batch_loss
from mtx.train.trainer import train


class ScriptedValidation:
    """Validations whose nll and BLEU follow `nlls` and `bleus`, one of each per validation: the loss hook gives
    the valid batches that per-token nll (and a loss 0.5 above it), while training's loss stays real; the length
    ratio is 1."""

    def __init__(self, nlls: list[float], bleus: list[float]) -> None:
        self.nlls, self.bleus, self.done = nlls, bleus, 0

    def loss(self, model, batch, smoothing: float, run=None) -> tuple[Tensor, Tensor, Tensor]:
        loss_sum, nll_sum, n_tokens = batch_loss(model, batch, smoothing, run=run)
        if model.training:
            return loss_sum, nll_sum, n_tokens
        nll = self.nlls[self.done]
        return n_tokens * (nll + 0.5), n_tokens * nll, n_tokens

    def bleu(self) -> tuple[float, float]:
        bleu = self.bleus[self.done]
        self.done += 1
        return bleu, 1.0

    @property
    def hooks(self) -> Hooks:
        return Hooks(loss=self.loss, valid_bleu=self.bleu)


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def kept(path: Path) -> list[int]:
    return [step for step, _ in step_checkpoints(run_files(path)[0])]


def test_a_step_checkpoint_carries_the_scores_of_its_steps_validation_only(tmp_path: Path) -> None:
    """Saves every 2 updates, validations every 4: steps 4 and 8 carry what their validation logged, steps 2 and
    6 nothing."""
    path = prepared(tmp_path)
    train(recipe(path, max_steps=8, save_every=2, validate_every=4, keep_last=0))
    logged = {event["step"]: event for event in events(run_files(path)[1], "valid")}
    for step, file in step_checkpoints(run_files(path)[0]):
        valid = load_checkpoint(file).get("valid")
        if step % 4:
            assert valid is None, step
        else:
            event = logged[step]
            assert valid == {"step": step, "loss": event["valid_loss"], "nll": event["valid_nll"],
                             "bleu": event["valid_bleu"], "length_ratio": event["valid_length_ratio"]}


def test_best_pt_patience_and_the_kept_checkpoints_follow_the_nll(tmp_path: Path, capfd) -> None:
    """best_metric nll, validations every 2 updates with nll 3, 2, 2.5, 2, 2.25 while BLEU climbs: patience 3
    stops after the fifth (an equal nll is no improvement), best.pt is step 4's, and beside the newest (keep_last
    1) the two best by nll are kept, steps 8 and 4 (the newer first among equals), not the best by BLEU. The best
    BLEU is still tracked, for the milestones and the model card."""
    path = prepared(tmp_path)
    scripted = ScriptedValidation([3.0, 2.0, 2.5, 2.0, 2.25, 1.0], [10.0, 20.0, 30.0, 40.0, 50.0, 60.0])
    state = train(recipe(path, max_steps=1000, validate_every=2, save_every=2, patience=3, keep_last=1, keep_best=2,
                         best_metric="nll"), hooks=scripted.hooks)
    assert (state.step, state.best_score, state.bad_validations, state.best_bleu) == (10, 2.0, 3, 50.0)
    assert "Training stopped at step 10: early stopping: valid nll has not improved in 3 validations" in (
        capfd.readouterr().err)
    assert load_checkpoint(run_files(path)[0] / "best.pt")["step"] == 4
    assert kept(path) == [4, 8, 10]


def test_a_resumed_run_keeps_the_best_of_the_files_written_before_it(tmp_path: Path) -> None:
    """keep_last 1, keep_best 1 by BLEU: the first session's step 4 (BLEU 30) outranks what the second session
    scores (20 and 5), so it stays beside the newest; and the best score resumes, so best.pt stays step 4's."""
    path = prepared(tmp_path)
    settings = dict(validate_every=4, save_every=4, keep_last=1, keep_best=1, best_metric="bleu")
    train(recipe(path, max_steps=8, **settings), hooks=ScriptedValidation([2.0, 2.0], [30.0, 10.0]).hooks)
    assert kept(path) == [4, 8]
    state = train(recipe(path, max_steps=16, **settings), hooks=ScriptedValidation([2.0, 2.0], [20.0, 5.0]).hooks)
    assert kept(path) == [4, 16] and (state.best_score, state.bad_validations) == (30.0, 3)
    assert load_checkpoint(run_files(path)[0] / "best.pt")["step"] == 4
