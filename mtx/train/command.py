"""`mtx train` and `mtx average`: a recipe trained on its prepared data, and a run's checkpoints averaged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, cast

import typer

from mtx.config.command import RecipeArg, SetOpt, read_run_recipe
from mtx.config.decode import TUNE_SENTENCES
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
    directory: Annotated[Path | None, typer.Option(
        "--dir", help="A run's checkpoints/ folder. Alone: the better on the valid split of the average of the "
        "run's train.keep_best best checkpoints by validation, of its train.keep_last last, and the newest alone; "
        "with --last or --best, the average of the ones those name.")] = None,
    last: Annotated[int | None, typer.Option("--last", min=1, help="With --dir: the last N step_<N>.pt by step.")
                    ] = None,
    best: Annotated[int | None, typer.Option(
        "--best", min=1, help="With --dir: the N step checkpoints with the best validation score, by the run's "
        "train.best_metric (the scores each checkpoint carries from the validation of its step).")] = None,
    best_metric: Annotated[str | None, typer.Option(
        "--best-metric", metavar="bleu|nll", help="The validation score that ranks the checkpoints for --best and "
        "--dir alone. Default: the run's train.best_metric.", show_default=False)] = None,
    tune_lenpen: Annotated[bool | None, typer.Option(
        "--tune-lenpen/--no-tune-lenpen", help="Choose the length penalty α (0 to 2 by tenths, and on while the "
        "best is the largest; in the recipe's decode.lenpen_style) that translates the run's valid split (at "
        f"most {TUNE_SENTENCES:,} sentences, spread over it) best by BLEU, with the recipe's beam, and store it "
        "as the checkpoint's decode.lenpen, which mtx translate and mtx serve then use: one beam search, every α "
        "rescored. Default: the run's train.tune_lenpen, on unless its recipe gives decode.lenpen; on by "
        "default, a run without a valid split keeps its α.", show_default=False)] = None,
    device: Annotated[str, typer.Option(
        metavar="auto|cpu|cuda", help="Where to translate the valid split for α; auto: cuda if there is one."
    )] = "auto",
) -> None:
    """Average checkpoints parameter-wise into one self-contained checkpoint for translation, its length penalty
    chosen on the valid split.

    The paper averages the last 5 checkpoints of base models and the last 20 of big ones; fairseq, Marian and
    Sockeye can keep and average the best by validation, which a short run needs (docs: Which defaults).

    Example: mtx average --dir runs/demo/checkpoints -o runs/demo/average.pt
    """
    from mtx.checkpoint import describe_weights, load_checkpoint, save_checkpoint
    from mtx.config.loading import tunes_lenpen
    from mtx.decode.command import check_choice
    from mtx.devices import DeviceName
    from mtx.train.average import average_checkpoints, named_checkpoints
    from mtx.train.best import BestMetric
    from mtx.train.tune_lenpen import ValidToTune, chosen_on_valid

    check_choice("--device", device, DeviceName)
    if best_metric is not None:
        check_choice("--best-metric", best_metric, BestMetric)
    say = sys.stderr.write
    candidates = named_checkpoints(checkpoints, directory, last, best, say, cast(BestMetric | None, best_metric))
    first_path = candidates[0][1][0]
    first = load_checkpoint(first_path, mmap=True, weights=False)
    tune = tune_lenpen if tune_lenpen is not None else tunes_lenpen(first["recipe"])
    if tune_lenpen is None and not tune:
        say(f"decode.lenpen {first['recipe'].get('decode', {}).get('lenpen')} kept: the run's recipe pins it "
            "(train.tune_lenpen: false); --tune-lenpen chooses it on the valid split.\n")
    valid = None
    if tune or len(candidates) > 1:
        try:
            valid = ValidToTune.of_run(first, first_path)
        except MtxError as e:
            if tune_lenpen:  # asked for by name: a reason not to is an error
                raise
            say(f"Nothing chosen on the valid split: {e}\n")
    if valid is not None and len(candidates) > 1:
        averaged = chosen_on_valid(candidates, valid, tune, device, say)
    else:
        averaged = average_checkpoints(candidates[0][1])
        if valid is not None and tune:
            averaged = valid.with_chosen_lenpen(averaged, device, say)
    weights = f" (their {describe_weights(averaged)})" if "ema_decay" in averaged else ""
    say(f"averaged {len(averaged['averaged_from'])} checkpoints{weights}\n")
    save_checkpoint(averaged, output)
    say(f"→ {output}\n")
