"""Fine-tuning (train.init_from): a new run from another run's checkpoint, and every way of getting it wrong."""

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from rich.console import Console
from support import base_recipe, write_pairs, write_recipe

from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.config.command import read_run_recipe
from mtx.config.fields import ConfigError
from mtx.config.loading import load_recipe
from mtx.data.prepare import prepare
from mtx.errors import MtxError
from mtx.train.trainer import train


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="module")
def parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A parent run of 12 updates with a moving average: its checkpoints/ folder."""
    tmp_path = tmp_path_factory.mktemp("parent")
    raw = base_recipe(tmp_path, 300, 20)
    raw["train"].update(max_steps=12, save_every=4, ema_decay=0.8, validate_every=6)
    path = write_recipe(tmp_path, raw)
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    train(load_recipe(path))
    return Path(raw["run_dir"]) / "checkpoints"


def child_recipe(tmp_path: Path, parent: Path, checkpoint: str = "last.pt", model: bool = False,
                 **train_settings: object) -> Path:
    """A fine-tuning recipe on other (in-domain) data, encoded with the parent's vocabulary; without a model
    section unless `model`."""
    raw = base_recipe(tmp_path, 10, 5)
    text = tmp_path / "text"
    other = write_pairs(text, "domain", 80, seed=7, max_words=4)
    raw["data"]["source"]["files"]["train"] = [str(p) for p in other]
    raw["data"]["bpe"] = {"from": str(parent / checkpoint)}
    raw.update(name="child", run_dir=str(tmp_path / "child"))
    if not model:
        del raw["model"]
    raw["train"].update({"init_from": str(parent / checkpoint), "max_steps": 5, "save_every": 5, **train_settings})
    return write_recipe(tmp_path, raw, "child.yaml")


def prepare_child(path: Path) -> None:
    prepare(read_run_recipe(path), workers=1, console=Console(file=io.StringIO()))


def test_a_fine_tuned_run_starts_from_the_parents_average_with_fresh_state(parent: Path, tmp_path: Path,
                                                                            capfd) -> None:
    path = child_recipe(tmp_path, parent)
    child = read_run_recipe(path)
    parent_checkpoint = load_checkpoint(parent / "last.pt")
    assert json.dumps(child.to_dict()["model"], sort_keys=True) == json.dumps(
        {k: v for k, v in parent_checkpoint["model_config"].items() if v is not None}, sort_keys=True)
    prepare_child(path)
    assert train(child).step == 5
    said = " ".join(capfd.readouterr().err.split())
    assert f"Fine-tuning from {parent / 'last.pt'} (step 12, EMA weights (decay 0.8))" in said
    first = load_checkpoint(tmp_path / "child" / "checkpoints" / "step_5.pt")
    assert first["train_state"]["progress"]["step"] == 5  # the schedule and the step started over


def test_the_first_update_starts_from_exactly_the_parents_weights(parent: Path, tmp_path: Path) -> None:
    """lr 0 for one update: Adam moves nothing, so the child's weights are the parent's EMA weights."""
    path = child_recipe(tmp_path, parent, max_steps=1, save_every=1)
    prepare_child(path)
    train(read_run_recipe(path, ["train.lr_schedule=inverse_sqrt", "train.warmup=1000000"]))
    child = load_checkpoint(tmp_path / "child" / "checkpoints" / "step_1.pt")["model"]
    for name, tensor in load_checkpoint(parent / "last.pt")["ema"].items():
        torch.testing.assert_close(child[name], tensor, atol=1e-6, rtol=0, msg=name)


def test_init_from_state_continues_the_parents_step_and_optimizer(parent: Path, tmp_path: Path, capfd) -> None:
    path = child_recipe(tmp_path, parent, init_from_state=True, max_steps=16, save_every=2)
    prepare_child(path)
    assert train(read_run_recipe(path)).step == 16
    assert "continued from step 12" in " ".join(capfd.readouterr().err.split())
    assert [step for step, _ in step_checkpoints(tmp_path / "child" / "checkpoints")][0] == 14


def test_a_fine_tuned_run_resumes_from_its_own_checkpoints_once_the_parent_is_gone(parent: Path,
                                                                                 tmp_path: Path, capfd) -> None:
    copy = tmp_path / "parent-copy"
    shutil.copytree(parent, copy)
    path = child_recipe(tmp_path, copy)
    prepare_child(path)
    train(read_run_recipe(path))
    shutil.rmtree(copy)
    capfd.readouterr()
    state = train(read_run_recipe(path, ["train.max_steps=8"]))
    said = " ".join(capfd.readouterr().err.split())
    assert state.step == 8 and "Resuming from" in said and "Fine-tuning" not in said


def test_bad_parents_are_refused_before_any_work(parent: Path, tmp_path: Path) -> None:
    not_a_checkpoint = tmp_path / "notes.pt"
    not_a_checkpoint.write_text("hello")
    path = child_recipe(tmp_path, parent)
    for init_from in (str(not_a_checkpoint), str(tmp_path / "missing.pt")):
        with pytest.raises(MtxError, match="^train.init_from: "):
            read_run_recipe(path, [f"train.init_from={init_from}"])
    wider = child_recipe(tmp_path, parent, model=True)
    with pytest.raises(MtxError, match=r"train.init_from = .*model.d_model is 32 there, 64 here"):
        read_run_recipe(wider, ["model.d_model=64"])
    with pytest.raises(MtxError, match="train.init_from_state is true, but .*best.pt holds no training state"):
        read_run_recipe(child_recipe(tmp_path, parent, "best.pt", init_from_state=True))
    with pytest.raises(ConfigError, match="train.init_from_state = True applies only with train.init_from"):
        read_run_recipe(path, ["train.init_from=null", "train.init_from_state=true"])


def test_data_encoded_with_another_vocabulary_is_refused_naming_bpe_from(parent: Path, tmp_path: Path) -> None:
    path = child_recipe(tmp_path, parent)
    own_vocabulary = read_run_recipe(path, ["data.bpe.from=null"])
    prepare(own_vocabulary, workers=1, console=Console(file=io.StringIO()))
    with pytest.raises(MtxError, match=r"another vocabulary.*Set data.bpe.from: .*last.pt"):
        train(own_vocabulary)
