"""A run's recipe as `mtx config`, `mtx prepare` and `mtx train` read it: the file with its --set overrides, and,
for a fine-tuning recipe (train.init_from), the parent it starts from.

A fine-tuned model must hold its parent's weights, so it has the parent's shape: a recipe without a model
section takes the parent's (or, once the run has checkpoints of its own, its own newest's), and one with a
model section must match it. The parent is checked when the recipe is read, before any work: an mtx
checkpoint, of the recipe's shape, holding training state if train.init_from_state asks for it.

Checkpoints are torch files, which mtx.checkpoint reads, a stage above this one: the caller hands in that
reader (`CheckpointReader`; the module mtx.checkpoint is one), and a recipe that does not fine-tune never asks
for it, so that it is read without importing torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from mtx.config.loading import read_recipe, recipe_from_raw
from mtx.config.model import ModelConfig
from mtx.config.recipe import Recipe
from mtx.errors import MtxError

# The model keys that decide whether a checkpoint's weights load into a model (the shape), and compute there what
# they computed in it.
SHAPE_KEYS = ("layers_enc", "layers_dec", "d_model", "heads", "d_ff", "norm", "share_embeddings", "max_positions",
              "activation", "output_bias", "scale_embeddings", "positions")


class CheckpointReader(Protocol):
    """What reading a run's recipe asks of checkpoints, as mtx.checkpoint answers it."""

    def latest_checkpoint(self, directory: Path) -> Path | None:
        """The checkpoint a run in `directory` resumes from; None if it has none."""

    def load_checkpoint(self, path: str | Path, mmap: bool = False) -> dict[str, Any]:
        """The checkpoint at `path`; MtxError, saying why, if it is not one."""

    def model_config_of(self, checkpoint: dict[str, Any]) -> ModelConfig:
        """The model section of the checkpoint's run."""


def load_run_recipe(path: str | Path, overrides: list[str] | None,
                    checkpoints: Callable[[], CheckpointReader]) -> Recipe:
    """The recipe at `path`: a fine-tuning recipe without a model section takes its parent's, and its parent is
    checked unless the run has checkpoints of its own to resume from. `checkpoints` gives the reader, and is
    called only for a recipe that fine-tunes."""
    raw = read_recipe(path, overrides)
    recipe = recipe_from_raw(raw, path)
    if recipe.train.init_from is None:
        return recipe
    reader = checkpoints()
    own = reader.latest_checkpoint(recipe.run_path / "checkpoints")
    if "model" not in raw:
        source, key = (own, "the run's own newest checkpoint") if own is not None else (
            Path(recipe.train.init_from), "train.init_from")
        raw["model"] = _load(reader, source, key)["model_config"]
        recipe = recipe_from_raw(raw, path)
    if own is None:
        parent_checkpoint(recipe, reader)
    return recipe


def parent_checkpoint(recipe: Recipe, reader: CheckpointReader) -> dict[str, Any]:
    """The checkpoint `train.init_from` names, once it is known to load into the recipe's model (and to hold
    training state, if `train.init_from_state` asks for it); its tensors mapped, not read."""
    path, cfg = Path(recipe.train.init_from), recipe.train
    checkpoint = _load(reader, path, "train.init_from")
    differs = shape_differences(recipe.model, reader.model_config_of(checkpoint))
    if differs:
        raise MtxError(f"train.init_from = {path}: its model does not have the recipe's shape ({'; '.join(differs)}). "
                       "Leave the model section out of the recipe to take the checkpoint's, or make it match.")
    if cfg.init_from_state and "train_state" not in checkpoint:
        raise MtxError(f"train.init_from_state is true, but train.init_from = {path} holds no training state "
                       "(best.pt and averaged checkpoints hold none, nor step checkpoints older than the newest "
                       "two): name the run's last.pt, or set train.init_from_state to false.")
    return checkpoint


def shape_differences(ours: ModelConfig, theirs: ModelConfig) -> list[str]:
    """How the recipe's model shape (`ours`) differs from a checkpoint's, one phrase per key; none: it loads."""
    here, there = dataclasses.asdict(ours), dataclasses.asdict(theirs)
    return [f"model.{k} is {there[k]} there, {here[k]} here" for k in SHAPE_KEYS if here[k] != there[k]]


def _load(reader: CheckpointReader, path: Path, key: str) -> dict[str, Any]:
    try:
        return reader.load_checkpoint(path, mmap=True)
    except MtxError as e:
        raise MtxError(f"{key}: {e}") from None
