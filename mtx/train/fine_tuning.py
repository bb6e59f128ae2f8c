"""Fine-tuning (`train.init_from`): a new run that starts from another run's checkpoint, its parent.

The parent gives the weights — the ones it translates with, its moving average's where it keeps one — and, with
`train.init_from_state`, its optimizer, grad scaler, step and data position as well; everything else is the new
run's own: its data, its schedule settings, its budgets, its best score. Only a run without checkpoints of its
own starts from the parent. Once it has saved one it resumes from that, like any run, so the parent may be moved
or deleted once the fine-tuning has started.

A fine-tuned model must read the parent's token ids and hold its weights: the data is encoded with the parent's
tokenizer (`data.bpe.from`), and the model has the parent's shape — the recipe's model section must match it,
and a recipe without one takes the parent's (or, once the run has checkpoints, its own newest's). Both are
checked before any work: when the recipe is read (the file, the shape) and when training starts (the data).

torch and the checkpoint code are imported only where a recipe fine-tunes, so that `mtx config` and
`mtx prepare` read every other recipe as fast as before.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtx.config.loading import read_recipe, recipe_from_raw
from mtx.config.recipe import Recipe
from mtx.errors import MtxError

if TYPE_CHECKING:
    from mtx.tokenizer import Tokenizer

# The parts of a parent's progress that belong to the parent's run, not to the one that continues its training:
# the best score and patience (of another valid set, maybe), the milestones, the clock that train.max_time counts.
PARENT_ONLY = ("best_bleu", "bad_validations", "milestones", "train_seconds")


def load_run_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """The recipe at `path`, as `mtx prepare` and `mtx train` run it: a fine-tuning recipe without a model
    section takes its parent's, and its parent is checked (an mtx checkpoint, of the recipe's shape) unless
    the run has checkpoints of its own to resume from."""
    raw = read_recipe(path, overrides)
    recipe = recipe_from_raw(raw, path)
    if recipe.train.init_from is None:
        return recipe
    from mtx.train.checkpoints import latest_checkpoint

    own = latest_checkpoint(recipe.run_path / "checkpoints")
    if "model" not in raw:
        source, key = (own, "the run's own newest checkpoint") if own is not None else (
            Path(recipe.train.init_from), "train.init_from")
        raw["model"] = _load(source, key)["model_config"]
        recipe = recipe_from_raw(raw, path)
    if own is None:
        parent_checkpoint(recipe)
    return recipe


def parent_checkpoint(recipe: Recipe) -> dict[str, Any]:
    """The checkpoint `train.init_from` names, once it is known to load into the recipe's model (and to hold
    training state, if `train.init_from_state` asks for it); its tensors mapped, not read."""
    from mtx.train.checkpoints import shape_differences

    path, cfg = Path(recipe.train.init_from), recipe.train
    checkpoint = _load(path, "train.init_from")
    differs = shape_differences(recipe, checkpoint)
    if differs:
        raise MtxError(f"train.init_from = {path}: its model does not have the recipe's shape ({'; '.join(differs)}). "
                       "Leave the model section out of the recipe to take the checkpoint's, or make it match.")
    if cfg.init_from_state and "train_state" not in checkpoint:
        raise MtxError(f"train.init_from_state is true, but train.init_from = {path} holds no training state "
                       "(best.pt and averaged checkpoints hold none, nor step checkpoints older than the newest "
                       "two): name the run's last.pt, or set train.init_from_state to false.")
    return checkpoint


def check_vocabulary(recipe: Recipe, checkpoint: dict[str, Any], tokenizer: Tokenizer) -> None:
    """Refuse data encoded with another tokenizer than the parent's: its token ids would mean other subwords."""
    from mtx.tokenizer import Tokenizer

    if Tokenizer.from_str(checkpoint["tokenizer"]).sha256 != tokenizer.sha256:
        raise MtxError(
            f"train.init_from = {recipe.train.init_from} was trained on another vocabulary than the one "
            f"{recipe.run_path / 'data'} is encoded with. Set data.bpe.from: {recipe.train.init_from} in the "
            "recipe and run `mtx prepare RECIPE` again, so that the data is encoded with the checkpoint's "
            "tokenizer."
        )


def inherited_progress(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """What a run that continues the parent's training (`train.init_from_state`) takes of its progress: the step,
    the epoch and the position in it, the tokens; not the parent's best score, milestones, clock or loss window."""
    progress = checkpoint["train_state"]["progress"]
    return {k: v for k, v in progress.items() if k not in PARENT_ONLY and not k.startswith("window_")}


def _load(path: Path, key: str) -> dict[str, Any]:
    from mtx.checkpoint import load_checkpoint

    try:
        return load_checkpoint(path, mmap=True)
    except MtxError as e:
        raise MtxError(f"{key}: {e}") from None
