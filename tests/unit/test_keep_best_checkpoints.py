"""The step checkpoints a run keeps (issue 59): the train.keep_last newest and, beside them, the train.keep_best
best by train.best_metric of those that carry a validation's scores; and the rewrite of the newest in place
(train.tune_lenpen's). The trainer's CheckpointKeeper is driven directly, on a model of a few thousand
parameters, with the scores handed in as the trainer hands them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import mtx.train.checkpoints
from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.config.loading import recipe_from_dict
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer
from mtx.train.checkpoints import CheckpointKeeper
from mtx.train.distributed import Context

TOKENIZER = Tokenizer.train([f"w{i} v{i}" for i in range(40)], vocab_size=100, style="bytelevel")

# Validated at the even steps: the best two by BLEU are steps 4 and 6, by nll (lower is better) steps 6 and 2.
SCORES = {2: {"bleu": 10.0, "nll": 2.0}, 4: {"bleu": 30.0, "nll": 3.0}, 6: {"bleu": 20.0, "nll": 1.5},
          8: {"bleu": 15.0, "nll": 2.5}}


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def make_keeper(run: Path, keep_last: int, keep_best: int, best_metric: str = "bleu") -> CheckpointKeeper:
    recipe = recipe_from_dict({
        "name": "keep", "run_dir": str(run), "seed": 1, "data": {"source": {"demo": {}}},
        "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": 16, "heads": 2, "d_ff": 32,
                  "max_positions": 32},
        "train": {"keep_last": keep_last, "keep_best": keep_best, "best_metric": best_metric, "device": "cpu"}})
    model = Transformer(recipe.model, TOKENIZER.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return CheckpointKeeper(recipe, Context(0, 1, torch.device("cpu")), model, TOKENIZER, optimizer,
                            torch.amp.GradScaler("cpu", enabled=False), say=lambda line: None)


def valid_of(step: int, scores: dict[int, dict[str, float]]) -> dict[str, float] | None:
    """The `valid` the trainer hands a save at `step`: the validation's scores there, None at a step it skipped."""
    if step not in scores:
        return None
    return {"step": step, "loss": scores[step]["nll"] + 0.5, "length_ratio": 1.0, **scores[step]}


def save_steps(keeper: CheckpointKeeper, steps: range, scores: dict[int, dict[str, float]]) -> None:
    for step in steps:
        keeper.save(step, {"step": step, "epoch": 1}, valid=valid_of(step, scores))


def kept(keeper: CheckpointKeeper) -> list[int]:
    return [step for step, _ in step_checkpoints(keeper.directory)]


@pytest.mark.parametrize(("metric", "expected"), [("bleu", [4, 6, 7, 8]), ("nll", [2, 6, 7, 8])])
def test_the_newest_and_the_best_by_the_metric_are_kept(tmp_path: Path, metric: str, expected: list[int]) -> None:
    """keep_last 2, keep_best 2 over 8 saves validated at the even steps: the newest two (7, 8) and the best two
    validated ones by the metric. Each file carries the scores of its step's validation, or none; the newest two
    keep the training state, the best older ones the weights alone."""
    keeper = make_keeper(tmp_path / "run", keep_last=2, keep_best=2, best_metric=metric)
    save_steps(keeper, range(1, 9), SCORES)
    assert kept(keeper) == expected
    for step, path in step_checkpoints(keeper.directory):
        checkpoint = load_checkpoint(path)
        assert checkpoint.get("valid") == valid_of(step, SCORES)
        assert ("train_state" in checkpoint) == (step in (7, 8))


def test_keep_best_0_keeps_the_newest_alone_and_keep_last_0_keeps_all(tmp_path: Path) -> None:
    newest = make_keeper(tmp_path / "newest", keep_last=2, keep_best=0)
    save_steps(newest, range(1, 9), SCORES)
    assert kept(newest) == [7, 8]
    every = make_keeper(tmp_path / "every", keep_last=0, keep_best=2)
    save_steps(every, range(1, 9), SCORES)
    assert kept(every) == list(range(1, 9))


def test_a_resumed_run_ranks_the_files_an_earlier_session_wrote_reading_each_once(tmp_path: Path,
                                                                                   monkeypatch) -> None:
    """keep_last 1, keep_best 1: the first session keeps step 2 (BLEU 30) beside the newest. A second session,
    whose keeper has seen none of the scores, still keeps step 2 over step 6 (BLEU 20): it reads the scores of
    the files it did not write from their metadata, once each, not at every save."""
    scores = {2: {"bleu": 30.0, "nll": 1.0}, 4: {"bleu": 10.0, "nll": 2.0}, 6: {"bleu": 20.0, "nll": 1.5}}
    save_steps(make_keeper(tmp_path / "run", keep_last=1, keep_best=1), range(1, 5), scores)
    assert [step for step, _ in step_checkpoints(tmp_path / "run" / "checkpoints")] == [2, 4]

    read, load = [], mtx.train.checkpoints.load_checkpoint

    def counted(path: Path, mmap: bool = False, weights: bool = True) -> dict:
        if not weights:
            read.append(Path(path).name)
        return load(path, mmap=mmap, weights=weights)

    monkeypatch.setattr(mtx.train.checkpoints, "load_checkpoint", counted)
    resumed = make_keeper(tmp_path / "run", keep_last=1, keep_best=1)
    save_steps(resumed, range(5, 10), scores)
    assert kept(resumed) == [2, 9]
    assert sorted(read) == ["step_2.pt", "step_4.pt"]


def test_the_newest_is_rewritten_in_place_and_still_resumes(tmp_path: Path) -> None:
    """rewrite_newest: what the update changes is in step_<N>.pt and in last.pt, linked to it again; the
    training state and the validation's scores stay, and the run resumes from it."""
    keeper = make_keeper(tmp_path / "run", keep_last=2, keep_best=1)
    save_steps(keeper, range(1, 5), SCORES)
    handed = []

    def update(checkpoint: dict, path: Path) -> dict:
        handed.append((checkpoint["step"], path))
        recipe = checkpoint["recipe"]
        return {**checkpoint, "recipe": {**recipe, "decode": {**recipe["decode"], "lenpen": 1.3}},
                "lenpen_choice": {"chosen": 1.3}}

    written = keeper.rewrite_newest(update)
    directory = keeper.directory
    assert handed == [(4, directory / "step_4.pt")] and written["lenpen_choice"] == {"chosen": 1.3}
    assert (directory / "last.pt").samefile(directory / "step_4.pt")
    last = load_checkpoint(directory / "last.pt")
    assert last["recipe"]["decode"]["lenpen"] == 1.3 and last["lenpen_choice"] == {"chosen": 1.3}
    assert last["valid"] == valid_of(4, SCORES) and last["train_state"]["progress"] == {"step": 4, "epoch": 1}
    assert make_keeper(tmp_path / "run", keep_last=2, keep_best=1).resume() == {"step": 4, "epoch": 1}
