"""`mtx train` and `mtx average`: a recipe trained on its prepared data, and a run's checkpoints averaged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx.config.command import RecipeArg, SetOpt, read_run_recipe
from mtx.errors import MtxError


def train(
    recipe: RecipeArg,
    set_: SetOpt = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Delete the run's checkpoints and metrics and train from scratch.")
    ] = False,
) -> None:
    """Train on the run's prepared data/, writing checkpoints/ and metrics.jsonl; resumes if it has checkpoints.

    On a budget (max_steps, max_epochs, max_time), early stopping or SIGTERM/SIGINT it saves a checkpoint and
    exits 0; the same command resumes. Several GPUs or nodes: torchrun --nproc-per-node 8 -m mtx train RECIPE.yaml

    Example: mtx train recipes/demo.yaml --set train.max_steps=2000
    """
    from mtx.train.trainer import train as run_training

    run_training(read_run_recipe(recipe, set_), restart=restart)


def average(
    output: Annotated[Path, typer.Option("-o", "--output", help="The averaged checkpoint to write.")],
    checkpoints: Annotated[
        list[Path] | None, typer.Argument(help="Checkpoints to average.", metavar="CKPT...", show_default=False)
    ] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="A run's checkpoints/ folder; use with --last.")
    ] = None,
    last: Annotated[int | None, typer.Option("--last", min=1, help="Average the last N step_<N>.pt by step.")] = None,
) -> None:
    """Average checkpoints parameter-wise into one self-contained checkpoint for translation.

    The paper averages the last 5 checkpoints of base models and the last 20 of big ones.

    Example: mtx average --dir runs/demo/checkpoints --last 5 -o runs/demo/average.pt
    """
    from mtx.checkpoint import describe_weights
    from mtx.train.average import average_files, last_checkpoints

    if bool(checkpoints) == (directory is not None):
        raise MtxError("Name the checkpoints to average one way: as files (mtx average a.pt b.pt -o avg.pt) "
                       "or as --dir RUN/checkpoints --last N.")
    if directory is not None:
        if last is None:
            raise MtxError("--dir needs --last N: how many of the latest step checkpoints to average.")
        checkpoints = last_checkpoints(directory, last)
    elif last is not None:
        raise MtxError("--last only applies with --dir.")
    averaged = average_files(checkpoints, output)
    weights = f" (their {describe_weights(averaged)})" if "ema_decay" in averaged else ""
    sys.stderr.write(f"averaged {len(checkpoints)} checkpoints{weights} → {output}\n")
