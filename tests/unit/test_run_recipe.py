"""A run's recipe as the commands read it: the checkpoint reader it is handed, asked only where a recipe
fine-tunes; a parent's model section taken, its shape and training state checked."""

import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
from support import base_recipe, write_recipe

from mtx.config.loading import load_recipe
from mtx.config.model import ModelConfig, resolve_model
from mtx.config.run_recipe import load_run_recipe, shape_differences
from mtx.errors import MtxError


class FakeCheckpoints:
    """A reader of one checkpoint, of `model`'s shape, with or without training state; the run has none of its own."""

    def __init__(self, model: dict, train_state: bool = True) -> None:
        self.checkpoint = {"model_config": model, **({"train_state": {}} if train_state else {})}
        self.loaded: list[Path] = []

    def latest_checkpoint(self, directory: Path) -> Path | None:
        return None

    def load_checkpoint(self, path, mmap: bool = False) -> dict:
        self.loaded.append(Path(path))
        return self.checkpoint

    def model_config_of(self, checkpoint: dict) -> ModelConfig:
        return ModelConfig(**checkpoint["model_config"])


def resolved_model(tmp_path: Path, raw: dict) -> dict:
    """The model section of `raw`, presets resolved, as a checkpoint stores it."""
    return dataclasses.asdict(load_recipe(write_recipe(tmp_path, raw, "model.yaml")).model)


def test_a_recipe_that_does_not_fine_tune_never_asks_for_checkpoints(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, base_recipe(tmp_path, 5, 2))
    recipe = load_run_recipe(path, ["train.max_steps=3"], lambda: pytest.fail("asked for the checkpoint reader"))
    assert recipe.train.max_steps == 3


def test_a_fine_tuning_recipe_without_a_model_section_takes_its_parents(tmp_path: Path) -> None:
    raw = base_recipe(tmp_path, 5, 2)
    parent_model = {**resolved_model(tmp_path, raw), "d_model": 48}
    del raw["model"]
    raw["train"]["init_from"] = str(tmp_path / "parent.pt")
    reader = FakeCheckpoints(parent_model)
    recipe = load_run_recipe(write_recipe(tmp_path, raw), None, lambda: reader)
    assert recipe.model.d_model == 48 and reader.loaded == [tmp_path / "parent.pt"] * 2  # its section, its check


def test_a_parent_of_another_shape_or_without_state_is_refused_with_the_way_out(tmp_path: Path) -> None:
    raw = base_recipe(tmp_path, 5, 2)
    raw["train"]["init_from"] = str(tmp_path / "parent.pt")
    path = write_recipe(tmp_path, raw)
    model = resolved_model(tmp_path, raw)
    wider = FakeCheckpoints({**model, "d_model": 2 * model["d_model"]})
    with pytest.raises(MtxError, match=r"its model does not have the recipe's shape \(model.d_model is 64 there, "
                                       r"32 here\). Leave the model section out"):
        load_run_recipe(path, None, lambda: wider)
    stateless = FakeCheckpoints(model, train_state=False)
    with pytest.raises(MtxError, match=r"train.init_from_state is true, but .* holds no training state"):
        load_run_recipe(path, ["train.init_from_state=true"], lambda: stateless)


def test_shape_differences_name_each_key_that_stops_weights_loading() -> None:
    ours = resolve_model(ModelConfig())
    assert shape_differences(ours, ours) == []
    theirs = dataclasses.replace(ours, heads=ours.heads * 2, dropout=0.0)  # dropout is no part of the shape
    assert shape_differences(ours, theirs) == [f"model.heads is {ours.heads * 2} there, {ours.heads} here"]


def test_the_commands_read_a_plain_recipe_without_torch(tmp_path: Path) -> None:
    path = write_recipe(tmp_path, base_recipe(tmp_path, 5, 2))
    code = (f"import sys; from mtx.config.command import read_run_recipe; read_run_recipe({str(path)!r}); "
            "print('torch' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == "False"
