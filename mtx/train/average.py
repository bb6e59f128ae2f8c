"""`mtx average`'s arithmetic: checkpoints averaged parameter-wise into one checkpoint that translates.

The paper (§6.1) translates with the average of the last checkpoints of a run: the last 5 of a base model, the
last 20 of a big one, written 10 minutes apart. The mean of weights from the flat end of training is a better
model than any one of them, at no cost at inference. A run that keeps a moving average of its weights
(train.ema_decay) has its averages averaged: each checkpoint's weights to translate with.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from mtx.checkpoint import inference_weights, load_checkpoint, model_config_of, shared_names, step_checkpoints
from mtx.errors import MtxError
from mtx.train.best import BestMetric

PAPER_AVERAGED = 5  # checkpoints averaged where a run keeps them all: the paper's number for base models


def _step_files(directory: Path) -> list[tuple[int, Path]]:
    """The step_<N>.pt files of a run's checkpoints/ folder, by step; none is an error."""
    found = step_checkpoints(directory)
    if not found:
        raise MtxError(f"No step_<N>.pt checkpoints in {directory}: train first with `mtx train RECIPE`.")
    return found


def _train_section(checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The train: section of a checkpoint's recipe, with the defaults of the keys a recipe stored before them
    lacks."""
    from mtx.config.train import TrainConfig

    return {**dataclasses.asdict(TrainConfig()), **checkpoint["recipe"].get("train", {})}


def named_checkpoints(files: list[Path] | None, directory: Path | None, last: int | None, best: int | None,
                      say: Callable[[str], None], metric: BestMetric | None = None) -> list[tuple[str, list[Path]]]:
    """What `mtx average` averages, as (description, checkpoints) candidates, from its arguments: the files given,
    the last or the best N of a run's folder (best by `metric`, or the run's train.best_metric), or, with the
    folder alone, `default_candidates`; asked for two ways at once is an error."""
    if bool(files) == (directory is not None):
        raise MtxError("Name the checkpoints to average one way: as files (mtx average a.pt b.pt -o avg.pt) "
                       "or as a run's folder (mtx average --dir RUN/checkpoints -o avg.pt).")
    if directory is None and (last is not None or best is not None):
        raise MtxError(f"{'--last' if last is not None else '--best'} only applies with --dir.")
    if last is not None and best is not None:
        raise MtxError("Pass --last N or --best N, not both.")
    if metric is not None and (directory is None or last is not None):
        raise MtxError("--best-metric ranks a run's checkpoints by validation, for --best N or --dir alone: the "
                       f"{'--last' if last is not None else 'files given'} are averaged as they are.")
    if directory is None:
        return [("the checkpoints given", list(files or []))]
    if last is not None:
        return [(f"the last {last}", last_checkpoints(directory, last))]
    if best is not None:
        return [(f"the best {best}", best_checkpoints(directory, best, say, metric))]
    return default_candidates(directory, say, metric)


def last_checkpoints(directory: Path, last: int) -> list[Path]:
    """The newest `last` step_<N>.pt files of a run's checkpoints/ folder, by step, oldest first."""
    found = _step_files(directory)
    if len(found) < last:
        raise MtxError(f"--last {last} asks for more checkpoints than the {len(found)} in {directory}.")
    return [path for _, path in found[-last:]]


def best_checkpoints(directory: Path, n: int, say: Callable[[str], None], metric: BestMetric | None = None
                     ) -> list[Path]:
    """The `n` step_<N>.pt files of a run's checkpoints/ folder with the best validation scores by `metric` or
    the run's train.best_metric (mtx.train.best), oldest first.

    Each checkpoint written at a validated step carries that validation's scores; one without (saved between
    validations, or by an mtx from before) is not ranked; fewer than `n` with scores is an error."""
    from mtx.train.best import best_steps, describe

    found = _step_files(directory)
    headers = {step: load_checkpoint(path, mmap=True, weights=False) for step, path in found}
    metric = metric or _train_section(headers[found[-1][0]])["best_metric"]
    scored = [(step, header["valid"]) for step, header in headers.items() if "valid" in header]
    if len(scored) < n:
        raise MtxError(f"--best {n}: only {len(scored)} of the {len(found)} checkpoints in {directory} carry a "
                       "validation score (a checkpoint written at a validated step does): validate at every save "
                       "(train.validate_every = save_every), or average the last N with --last N.")
    chosen = best_steps(scored, metric, n)
    values = ", ".join(f"{step:,} ({headers[step]['valid'][metric]:.3f})" for step in chosen)
    say(f"the best {n} of {len(scored)} by {describe(metric)}: steps {values}\n")
    paths = dict(found)
    return [paths[step] for step in chosen]


def default_candidates(directory: Path, say: Callable[[str], None], metric: BestMetric | None = None
                       ) -> list[tuple[str, list[Path]]]:
    """What `mtx average --dir` chooses among on the valid split, each set of checkpoints once: the average of the
    run's train.keep_best best by validation (by `metric` or the run's; where enough carry scores:
    `best_checkpoints`), the average of its train.keep_last last (the paper's 5 where it keeps all), and the newest
    checkpoint alone: as many as the run keeps to average. Early in training the model still improves from one
    checkpoint to the next, and an average lags behind the newest (docs: Which defaults, measured); later the
    average is the better model. Which is the better, only held-out text can tell."""
    found = _step_files(directory)
    kept = _train_section(load_checkpoint(found[-1][1], mmap=True, weights=False))
    last, best = min(kept["keep_last"] or PAPER_AVERAGED, len(found)), kept["keep_best"]
    candidates: dict[tuple[Path, ...], list[str]] = {}
    if best:
        try:
            candidates[tuple(best_checkpoints(directory, best, say, metric))] = [f"the average of the best {best} by "
                                                                          "validation"]
        except MtxError:  # too few carry scores
            say(f"Fewer than {best} checkpoints in {directory} carry a validation score (validate at every save, "
                f"train.validate_every = save_every, for the best to be chosen): choosing between the last {last} "
                "and the newest alone.\n")
    candidates.setdefault(tuple(path for _, path in found[-last:]), []).append(f"the average of the last {last}")
    candidates.setdefault((found[-1][1],), []).append(f"the newest checkpoint, step {found[-1][0]:,}")
    return [(", also ".join(descriptions), list(paths)) for paths, descriptions in candidates.items()]


def _identity(checkpoint: dict[str, Any]) -> tuple:
    """What two checkpoints must share to be averaged: the model's shape, the tokenizer, and whether their
    weights are moving averages."""
    shapes = tuple((k, tuple(v.shape)) for k, v in inference_weights(checkpoint).items())
    averaged = "ema_decay" in checkpoint
    config = model_config_of(checkpoint)  # resolved: a checkpoint written before a model option has the preset's
    return config, checkpoint["vocab_size"], checkpoint["tokenizer"], shapes, averaged


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The parameter-wise mean of `paths`' weights to translate with (`inference_weights`: the moving
    average's, in a run that keeps one), as an inference checkpoint (no training state).

    Streaming: a float64 running sum plus the checkpoint being read, so memory stays at about two models
    however many are averaged. Parameters are written back in the checkpoints' own dtype, and a tensor that
    several names share (the tied embedding) is averaged once and stays shared.
    """
    if not paths:
        raise MtxError("No checkpoints to average: pass files, or --dir RUN/checkpoints --last N.")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for i, path in enumerate(paths):
        checkpoint = load_checkpoint(path, mmap=True)  # the training state some carry is never read
        weights = inference_weights(checkpoint)
        if i == 0:
            first_path, identity = path, _identity(checkpoint)
            metadata = {k: v for k, v in checkpoint.items() if k not in ("model", "ema", "train_state")}
            aliases = shared_names(weights)
            dtypes = {k: v.dtype for k, v in weights.items()}
            total = {k: v.to(torch.float64) for k, v in weights.items() if k not in aliases}
        else:
            if _identity(checkpoint) != identity:
                raise MtxError(f"Cannot average {path} with {first_path}: their {_difference(checkpoint, metadata)} "
                               "differs. Average only checkpoints of the same run.")
            for k, v in weights.items():
                if k not in aliases:
                    total[k] += v.to(torch.float64)
        del checkpoint
    averaged = {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}
    for name, first in aliases.items():  # names of one shared tensor stay one tensor
        averaged[name] = averaged[first]
    return {**metadata, "model": averaged, "averaged_from": [str(p) for p in paths]}


def _difference(checkpoint: dict[str, Any], first: dict[str, Any]) -> str:
    if checkpoint["tokenizer"] != first["tokenizer"]:
        return "tokenizer"
    if ("ema_decay" in checkpoint) != ("ema_decay" in first):
        return "kind of weights (moving averages in one, raw weights in the other)"
    return "model shape or config"
