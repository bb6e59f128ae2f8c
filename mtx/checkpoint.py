"""Checkpoints: self-contained files that translate on their own, written atomically, averaged streaming.

A checkpoint is a plain dict saved with `torch.save` and loaded with `weights_only=True` (tensors and Python
primitives only, so loading a file cannot run code):

    format, mtx_version   what wrote it
    model_config          the resolved ModelConfig as a dict
    vocab_size            rows of the shared embedding
    tokenizer             the tokenizer's JSON, so no data folder is needed to translate
    recipe                the recipe of the run (decoding defaults included)
    step                  optimizer updates done
    model                 the state dict
    train_state           optimizer, schedule, scaler, RNG and data position; absent from averaged checkpoints
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from mtx import __version__
from mtx.config import ModelConfig
from mtx.errors import MtxError

FORMAT = "mtx-checkpoint-v1"
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def atomic_write(path: Path, write) -> None:
    """Call `write(file)` on a temporary file beside `path`, then rename it over `path`.

    A crash or SIGKILL at any moment leaves either the old file or the new one, never a torn one: rename
    within one filesystem is atomic, and fsync makes the bytes durable before the name points at them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600 files; give the result the mode any new file would get, so colleagues on a
        # shared cluster can read the run's checkpoints as the user's umask allows.
        os.chmod(tmp, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda f: torch.save(checkpoint, f))


def make_checkpoint(model: torch.nn.Module, tokenizer_json: str, recipe: dict[str, Any], step: int,
                    train_state: dict[str, Any] | None = None) -> dict[str, Any]:
    """The checkpoint dict of `model` (an mtx Transformer, unwrapped from DDP/compile by the caller)."""
    checkpoint = {
        "format": FORMAT,
        "mtx_version": __version__,
        "model_config": dataclasses.asdict(model.cfg),
        "vocab_size": model.vocab_size,
        "tokenizer": tokenizer_json,
        "recipe": recipe,
        "step": step,
        "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
    }
    if train_state is not None:
        checkpoint["train_state"] = train_state
    return checkpoint


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Load and sanity-check a checkpoint on the CPU; a missing or corrupt file is a user error."""
    path = Path(path)
    if not path.is_file():
        raise MtxError(f"Checkpoint {path} does not exist: pass a file written by `mtx train` or `mtx average`.")
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        raise MtxError(
            f"Checkpoint {path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0][:200]}): "
            "the file is corrupt, truncated or not an mtx checkpoint. Use another one, e.g. an earlier step_<N>.pt."
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise MtxError(f"{path} is not an mtx checkpoint (no '{FORMAT}' format marker).")
    return checkpoint


def model_config_of(checkpoint: dict[str, Any]) -> ModelConfig:
    return ModelConfig(**checkpoint["model_config"])


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode on `device`, tokenizer, checkpoint dict) from a checkpoint file."""
    from mtx.model import Transformer
    from mtx.tokenizer import Tokenizer

    checkpoint = load_checkpoint(path)
    model = Transformer(model_config_of(checkpoint), checkpoint["vocab_size"])
    try:
        model.load_state_dict(checkpoint["model"])
    except RuntimeError as e:
        raise MtxError(f"Checkpoint {path} does not match its own model config: {str(e)[:300]}") from None
    tokenizer = Tokenizer.from_str(checkpoint["tokenizer"])
    return model.to(device).eval(), tokenizer, checkpoint


def step_checkpoints(directory: str | Path) -> list[tuple[int, Path]]:
    """The `step_<N>.pt` files of a run, by step (not by file time, which copies and rsync change)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise MtxError(f"Checkpoint directory {directory} does not exist.")
    found = []
    for path in directory.iterdir():
        match = STEP_FILE.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _identity(checkpoint: dict[str, Any]) -> tuple:
    """What two checkpoints must share to be averaged: the model's shape and the tokenizer."""
    shapes = tuple((k, tuple(v.shape)) for k, v in checkpoint["model"].items())
    return checkpoint["model_config"], checkpoint["vocab_size"], checkpoint["tokenizer"], shapes


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The parameter-wise mean of `paths`, as an inference checkpoint (no training state).

    Streaming: a float64 running sum plus the checkpoint being read, so memory stays at about two models
    however many are averaged. Parameters are written back in the checkpoints' own dtype.
    """
    if not paths:
        raise MtxError("No checkpoints to average: pass files, or --dir RUN/checkpoints --last N.")
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    for i, path in enumerate(paths):
        checkpoint = load_checkpoint(path)
        if i == 0:
            first_path, identity = path, _identity(checkpoint)
            metadata = {k: v for k, v in checkpoint.items() if k not in ("model", "train_state")}
            dtypes = {k: v.dtype for k, v in checkpoint["model"].items()}
            total = {k: v.to(torch.float64) for k, v in checkpoint["model"].items()}
        else:
            if _identity(checkpoint) != identity:
                what = "tokenizer" if checkpoint["tokenizer"] != metadata["tokenizer"] else "model shape or config"
                raise MtxError(f"Cannot average {path} with {first_path}: their {what} differs. "
                               "Average only checkpoints of the same run.")
            for k, v in checkpoint["model"].items():
                total[k] += v.to(torch.float64)
        del checkpoint
    averaged = {k: (v / len(paths)).to(dtypes[k]) for k, v in total.items()}
    return {**metadata, "model": averaged, "averaged_from": [str(p) for p in paths]}
