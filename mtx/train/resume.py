"""Where a run starts: from its own newest checkpoint, from its parent's (train.init_from), or from nothing.

Rank 0 first clears what --restart asks to delete and what a kill in the middle of a write left; then every rank
loads the checkpoint rank 0 chose (mtx.train.checkpoints), and the log drops the events logged after it, since
the run logs them again. A new run with train.init_from takes its parent's weights, or with
train.init_from_state all it holds to train on (mtx.train.fine_tuning).
"""

from __future__ import annotations

from typing import Any

import mtx.checkpoint
from mtx.checkpoint import describe_checkpoint, inference_weights
from mtx.config.run_recipe import parent_checkpoint
from mtx.train import distributed, fine_tuning
from mtx.train.components import RunParts


def resume_run(parts: RunParts, restart: bool) -> dict[str, Any]:
    """The progress of the checkpoint every rank resumed from ({} for a new run), its weights and state loaded
    into `parts`."""
    if restart:
        parts.keeper.delete_all()
        parts.log.delete()
    parts.keeper.remove_torn_writes()
    distributed.barrier()
    progress = parts.keeper.resume()
    if not progress and parts.recipe.train.init_from is not None:
        progress = _start_from_parent(parts)
    parts.log.truncate_after(progress.get("step", 0))
    return progress


def _start_from_parent(parts: RunParts) -> dict[str, Any]:
    """Load train.init_from's weights (its moving average's, where it keeps one) — or, with
    train.init_from_state, all it holds to train on — and say which; the progress the run starts with."""
    recipe = parts.recipe
    checkpoint = parent_checkpoint(recipe, mtx.checkpoint)
    fine_tuning.check_vocabulary(recipe, checkpoint, parts.tokenizer)
    path = recipe.train.init_from
    if recipe.train.init_from_state:
        parts.keeper.restore(checkpoint, path)
        progress = fine_tuning.inherited_progress(checkpoint)
        parts.log.say(f"Fine-tuning from {path}: its weights, optimizer and schedule, continued from step "
                      f"{progress['step']} (train.init_from_state).")
        return progress
    parts.model.load_state_dict(inference_weights(checkpoint))
    if parts.ema is not None:
        parts.ema.restart_from_weights()
    parts.log.say(f"Fine-tuning from {path} ({describe_checkpoint(checkpoint)}); the optimizer, the schedule "
                  "and the data start fresh.")
    return {}
