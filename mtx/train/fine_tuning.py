"""Fine-tuning (`train.init_from`): a new run that starts from another run's checkpoint, its parent.

The parent gives the weights — the ones it translates with, its moving average's where it keeps one — and, with
`train.init_from_state`, its optimizer, grad scaler, step and data position as well; everything else is the new
run's own: its data, its schedule settings, its budgets, its best score. Only a run without checkpoints of its
own starts from the parent (mtx.train.resume). Once it has saved one it resumes from that, like any run, so the
parent may be moved or deleted once the fine-tuning has started.

A fine-tuned model must read the parent's token ids and hold its weights: the data is encoded with the parent's
tokenizer (`data.bpe.from`), and the model has the parent's shape. The shape is checked when the recipe is read
(mtx.config.run_recipe), the data here, when training starts.
"""

from __future__ import annotations

from typing import Any

from mtx.config.recipe import Recipe
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer

# The parts of a parent's progress that belong to the parent's run, not to the one that continues its training:
# the best score and patience (of another valid set, maybe), the milestones, the clock that train.max_time counts.
PARENT_ONLY = ("best_bleu", "best_score", "bad_validations", "milestones", "train_seconds")


def check_vocabulary(recipe: Recipe, checkpoint: dict[str, Any], tokenizer: Tokenizer) -> None:
    """Refuse data encoded with another tokenizer than the parent's: its token ids would mean other subwords."""
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
