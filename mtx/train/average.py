"""`mtx average`'s arithmetic: checkpoints averaged parameter-wise into one checkpoint that translates.

The paper (§6.1) translates with the average of the last checkpoints of a run: the last 5 of a base model, the
last 20 of a big one, written 10 minutes apart. The mean of weights from the flat end of training is a better
model than any one of them, at no cost at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mtx.checkpoint import load_checkpoint, save_checkpoint, shared_names, step_checkpoints
from mtx.errors import MtxError


def last_checkpoints(directory: Path, last: int) -> list[Path]:
    """The newest `last` step_<N>.pt files of a run's checkpoints/ folder, by step, oldest first."""
    found = step_checkpoints(directory)
    if not found:
        raise MtxError(f"No step_<N>.pt checkpoints in {directory}: train first with `mtx train RECIPE`.")
    if len(found) < last:
        raise MtxError(f"--last {last} asks for more checkpoints than the {len(found)} in {directory}.")
    return [path for _, path in found[-last:]]


def average_files(paths: Sequence[Path], output: Path) -> None:
    """Write the average of the checkpoints `paths` to `output`, atomically."""
    save_checkpoint(average_checkpoints(paths), output)


def _identity(checkpoint: dict[str, Any]) -> tuple:
    """What two checkpoints must share to be averaged: the model's shape and the tokenizer."""
    shapes = tuple((k, tuple(v.shape)) for k, v in checkpoint["model"].items())
    return checkpoint["model_config"], checkpoint["vocab_size"], checkpoint["tokenizer"], shapes


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The parameter-wise mean of `paths`, as an inference checkpoint (no training state).

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
        if i == 0:
            first_path, identity = path, _identity(checkpoint)
            metadata = {k: v for k, v in checkpoint.items() if k not in ("model", "train_state")}
            aliases = shared_names(checkpoint["model"])
            dtypes = {k: v.dtype for k, v in checkpoint["model"].items()}
            total = {k: v.to(torch.float64) for k, v in checkpoint["model"].items() if k not in aliases}
        else:
            if _identity(checkpoint) != identity:
                what = "tokenizer" if checkpoint["tokenizer"] != metadata["tokenizer"] else "model shape or config"
                raise MtxError(f"Cannot average {path} with {first_path}: their {what} differs. "
                               "Average only checkpoints of the same run.")
            for k, v in checkpoint["model"].items():
                if k not in aliases:
                    total[k] += v.to(torch.float64)
        del checkpoint
    averaged = {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}
    for name, first in aliases.items():  # names of one shared tensor stay one tensor
        averaged[name] = averaged[first]
    return {**metadata, "model": averaged, "averaged_from": [str(p) for p in paths]}
