"""The end of `mtx train` chooses the length penalty α on the valid split (train.tune_lenpen, issue 59): in the
checkpoint training ends on, which still resumes; not after a stop signal, not where the recipe pins
decode.lenpen, and not where the search is greedy, each saying so."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import torch
from support import prepared, recipe, run_files

from mtx.checkpoint import load_checkpoint
from mtx.config.decode import DecodeConfig
from mtx.train.components import Hooks
from mtx.train.trainer import train

BEAM = "decode.beam=2"  # base_recipe searches greedily, where α changes nothing


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def sigterm_after_update(step: int) -> Hooks:
    """A pre-emption right after update `step`."""
    def update_then_signal(state, batches, update):
        stepped = update()
        if state.step == step:
            os.kill(os.getpid(), signal.SIGTERM)
        return stepped

    return Hooks(around_update=update_then_signal)


def test_a_budget_spent_chooses_alpha_for_the_last_checkpoint_and_a_signal_does_not(tmp_path: Path, capfd) -> None:
    """A SIGTERM stop leaves α as it was: a pre-emption has seconds. The same command then trains to max_steps and
    chooses α on the valid split: last.pt, still step_6.pt, holds it as its decode.lenpen with the table of
    what each α scored, and keeps its training state and validation scores, so raising max_steps resumes from
    it, and that run's end chooses again."""
    path = prepared(tmp_path)
    checkpoints = run_files(path)[0]
    settings = dict(validate_every=3, save_every=3)
    assert train(recipe(path, BEAM, max_steps=6, **settings), hooks=sigterm_after_update(2)).step == 2
    assert "lenpen_choice" not in load_checkpoint(checkpoints / "last.pt")
    assert "chosen on the valid split" not in capfd.readouterr().err

    assert train(recipe(path, BEAM, max_steps=6, **settings)).step == 6
    err = capfd.readouterr().err
    last = load_checkpoint(checkpoints / "last.pt")
    assert (checkpoints / "last.pt").samefile(checkpoints / "step_6.pt")
    choice = last["lenpen_choice"]
    assert last["recipe"]["decode"]["lenpen"] == choice["chosen"]
    assert choice["chosen"] in [score["alpha"] for score in choice["scores"]]
    assert f"train.tune_lenpen: decode.lenpen {choice['chosen']:g} chosen on the valid split, stored in " in err
    assert last["train_state"]["progress"]["step"] == 6 and last["valid"]["step"] == 6

    assert train(recipe(path, BEAM, max_steps=9, **settings)).step == 9
    assert "Resuming from" in capfd.readouterr().err
    assert "lenpen_choice" in load_checkpoint(checkpoints / "last.pt")
    assert load_checkpoint(checkpoints / "step_6.pt")["lenpen_choice"] == choice


def test_a_pinned_lenpen_is_kept_and_a_greedy_search_has_none_to_choose(tmp_path: Path, capfd) -> None:
    """A recipe that gives decode.lenpen (as the WMT14 recipes give the paper's 0.6) keeps it and says so; a
    greedy recipe says why there is nothing to choose. Neither checkpoint holds a choice."""
    path = prepared(tmp_path)
    train(recipe(path, BEAM, "decode.lenpen=0.6", max_steps=2))
    last = load_checkpoint(run_files(path)[0] / "last.pt")
    assert "lenpen_choice" not in last and last["recipe"]["decode"]["lenpen"] == 0.6
    assert ("train.tune_lenpen is off (the recipe pins decode.lenpen or turns it off): decode.lenpen 0.6 kept."
            in capfd.readouterr().err)

    train(recipe(path, max_steps=2), restart=True)
    assert "lenpen_choice" not in load_checkpoint(run_files(path)[0] / "last.pt")
    err = " ".join(capfd.readouterr().err.split())
    assert "train.tune_lenpen: the recipe searches greedily (decode.beam = 1)" in err
    assert f"decode.lenpen {DecodeConfig().lenpen:g} kept." in err
