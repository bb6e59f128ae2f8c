"""Checkpoints: self-contained files that translate on their own, written atomically.

A checkpoint is a plain dict saved with `torch.save` and loaded with `weights_only=True` (tensors and Python
primitives only, so loading a file cannot run code):

    format, mtx_version   what wrote it
    model_config          the resolved ModelConfig as a dict
    vocab_size            rows of the shared embedding
    tokenizer             the tokenizer's JSON, so no data folder is needed to translate
    recipe                the recipe of the run (decoding defaults included)
    step                  optimizer updates done
    model                 the state dict: the weights as trained, or, in a checkpoint that carries `ema_decay`
                          but no `ema` (best.pt, averaged), the moving average's
    ema, ema_decay        a run with train.ema_decay: the moving average of the weights (mtx.train.ema) as a
                          state dict beside `model` in step checkpoints, which resuming needs both of, and its
                          decay. Wherever a checkpoint has an average, it translates with it
                          (`inference_weights`)
    train_state           what resuming needs besides the model: the optimizer's and the grad scaler's state
                          and the trainer's progress (step, data position, best score, clock, open loss
                          window). Only the newest two step_<N>.pt of a run carry it (last.pt, the newest again):
                          the trainer rewrites older ones without it (mtx.train.checkpoints), since Adam's
                          two moments make it twice the weights' size and only a resume reads it. Absent
                          from best.pt and from averaged checkpoints
    averaged_from         the files an averaged checkpoint is the mean of (mtx.train.average)
    data_stats            what the training pairs say of length ratios and copying, which `mtx translate` flags
                          doubtful translations by (mtx.decode.doubts); absent from checkpoints written before
    lexicon               the training pairs' lexical table (mtx.data.lexicon: `Lexicon.to_checkpoint`), which
                          decoding shortlists are made of (mtx.decode.shortlist); absent from checkpoints of data
                          prepared before mtx learnt one
    imported_from         a checkpoint made by `mtx import` (mtx.importing): the MarianMT folder or hub id@commit it
                          was read from, the transformers version that read it, and notes on what it left out
    valid                 a step checkpoint written at a validated step: that validation's scores (step, loss, nll,
                          BLEU, length ratio), which the trainer keeps the best step checkpoints by and `mtx
                          average --best` picks them by (mtx.train.best); absent from other checkpoints
    lenpen_choice         a checkpoint whose α was chosen on its run's valid split: averaged with `mtx average
                          --tune-lenpen`, or the step checkpoint training ended on (train.tune_lenpen): the valid
                          BLEU and length ratio of each length penalty α tried, and the one chosen, which its
                          recipe's decode.lenpen then holds (mtx.decode.lenpen_choice)

No RNG state is saved, and no learning-rate scheduler's: the trainer reseeds dropout at every update from
(seed, step, rank), draws the batch order from (seed, epoch) and computes the learning rate from the step.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import torch

from mtx import __version__
from mtx.config.model import resolve_model
from mtx.config.recipe import ModelConfig
from mtx.errors import MtxError, first_line
from mtx.files import atomic_write

FORMAT = "mtx-checkpoint-v1"
STEP_FILE = re.compile(r"^step_(\d+)\.pt$")


def save_checkpoint(checkpoint: dict[str, Any], path: Path) -> None:
    atomic_write(path, lambda f: torch.save(checkpoint, f))


def make_checkpoint(model: torch.nn.Module, tokenizer_json: str, recipe: dict[str, Any], step: int,
                    train_state: dict[str, Any] | None = None, copy: bool = False,
                    ema: dict[str, torch.Tensor] | None = None, ema_decay: float | None = None,
                    ema_only: bool = False) -> dict[str, Any]:
    """The checkpoint dict of `model` (an mtx Transformer, unwrapped from DDP/compile by the caller).

    `copy`: the weights are copies, never the model's own CPU tensors, for a writer that runs while the next
    updates change the model (train_state is the caller's to copy). `ema`: the moving average of the weights,
    of decay `ema_decay`, stored beside them, or, with `ema_only`, instead of them (a checkpoint to translate)."""
    checkpoint = {
        "format": FORMAT,
        "mtx_version": __version__,
        "model_config": dataclasses.asdict(model.cfg),
        "vocab_size": model.vocab_size,
        "tokenizer": tokenizer_json,
        "recipe": recipe,
        "step": step,
        "model": _on_cpu(ema if ema is not None and ema_only else model.state_dict(), copy),
    }
    if ema is not None:
        checkpoint["ema_decay"] = ema_decay
        if not ema_only:
            checkpoint["ema"] = _on_cpu(ema, copy)
    if train_state is not None:
        checkpoint["train_state"] = train_state
    return checkpoint


def _on_cpu(state: dict[str, torch.Tensor], copy: bool) -> dict[str, torch.Tensor]:
    """`state` on the CPU (copied if `copy`), where names that share one tensor (the tied embedding and output
    matrix: three names, one matrix) still share one, so `torch.save` stores it once."""
    aliases = shared_names(state)
    moved = {name: tensor.detach().to("cpu", copy=copy) for name, tensor in state.items() if name not in aliases}
    return {name: moved[aliases.get(name, name)] for name in state}


def require_checkpoint_file(path: Path) -> None:
    """Refuse a checkpoint path that names no file: what a command checks before any slow work."""
    if not path.is_file():
        raise MtxError(f"Checkpoint {path} does not exist: pass a file written by `mtx train` or `mtx average`.")


def load_checkpoint(path: str | Path, mmap: bool = False, weights: bool = True) -> dict[str, Any]:
    """Load and sanity-check a checkpoint on the CPU; a missing or corrupt file is a user error. `mmap` maps
    the tensors from the file rather than reading them: a caller pages in only what it touches (nothing, for
    one that looks only at the metadata), from the page cache that all processes of a machine share.

    `weights`: the caller translates, averages or trains with the weights, so they are checked to be finite
    numbers (`require_finite_weights`), which reads them. A caller that reads the metadata alone passes False,
    and pages in nothing of a mapped file; the command that uses the weights then checks them.
    """
    path = Path(path)
    require_checkpoint_file(path)
    try:
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except Exception as e:
        raise MtxError(
            f"Checkpoint {path} cannot be read ({type(e).__name__}: {first_line(e, 200)}): "
            "the file is corrupt, truncated or not an mtx checkpoint. Use another one, e.g. an earlier step_<N>.pt."
        ) from None
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != FORMAT:
        raise MtxError(f"{path} is not an mtx checkpoint (no '{FORMAT}' format marker).")
    if weights:
        require_finite_weights(checkpoint, path)
    return checkpoint


def require_finite_weights(checkpoint: dict[str, Any], path: Path) -> None:
    """Refuse a checkpoint whose weights (`model`, and `ema` where it has one) hold a NaN or an infinity, naming
    the file and the first such tensor.

    `torch.load` checks no checksum of the tensors' bytes, so bytes overwritten on disk read back as whatever
    they now spell; one NaN weight then makes every translation's scores NaN, and an average of the file NaN
    everywhere, without an error. Each tensor is read once by `torch.aminmax`, whose minimum or maximum is NaN or
    infinite exactly when one of its values is (NaN propagates through both): a pass over the weights as fast as
    reading them, with no tensor of their size made (bench/README.md, "Checkpoints checked for non-finite
    weights"). A tensor that several names share (the tied embedding) is read once.
    """
    for part in ("model", "ema"):
        state = checkpoint.get(part)
        if not isinstance(state, dict):
            continue
        aliases = shared_names(state)
        for name, tensor in state.items():
            if name in aliases or not tensor.is_floating_point() or tensor.numel() == 0:
                continue
            if not all(bool(extreme.isfinite()) for extreme in torch.aminmax(tensor)):
                bad = int((~tensor.isfinite()).sum())
                raise MtxError(
                    f"Checkpoint {path} holds weights that are not finite numbers: {bad:,} of the {tensor.numel():,} "
                    f"values of {part}.{name} are NaN or infinite. The file was damaged on disk (torch checks no "
                    "checksum), or written by a run that had diverged. Use another checkpoint, e.g. an earlier "
                    "step_<N>.pt, and leave this one out of `mtx average`."
                )


def model_config_of(checkpoint: dict[str, Any]) -> ModelConfig:
    """The checkpoint's model config, a key it predates (written before the option existed) the preset's."""
    return resolve_model(ModelConfig(**checkpoint["model_config"]))


def inference_weights(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The weights a checkpoint translates with: the moving average where the run kept one."""
    return checkpoint.get("ema", checkpoint["model"])


def describe_weights(checkpoint: dict[str, Any]) -> str:
    """Which weights `inference_weights` gives, for the line where a command says what it loaded."""
    decay = checkpoint.get("ema_decay")
    return "weights" if decay is None else f"EMA weights (decay {decay:g})"


def describe_checkpoint(checkpoint: dict[str, Any]) -> str:
    """What a checkpoint holds, for the line where a command says what it loaded: "step 500", "the average of
    5 checkpoints", with ", EMA weights (decay 0.999)" where those are what it translates with."""
    averaged = checkpoint.get("averaged_from")
    origin = f"the average of {len(averaged)} checkpoints" if averaged else f"step {checkpoint['step']}"
    return origin if "ema_decay" not in checkpoint else f"{origin}, {describe_weights(checkpoint)}"


def load_model(path: str | Path, device: str | torch.device = "cpu"):
    """(model in eval mode on `device`, tokenizer, checkpoint dict) from a checkpoint file; the model holds
    the weights it translates with (`inference_weights`)."""
    checkpoint = load_checkpoint(path)
    model, tokenizer = model_of(checkpoint, path)
    return model.to(device).eval(), tokenizer, checkpoint


def model_of(checkpoint: dict[str, Any], name: str | Path):
    """(model on the CPU in eval mode, tokenizer) of a checkpoint dict, one read from file or made in memory (an
    average); `name` says which in an error. The model holds the weights it translates with (`inference_weights`)."""
    from mtx.model.transformer import Transformer
    from mtx.tokenizer import Tokenizer

    model = Transformer(model_config_of(checkpoint), checkpoint["vocab_size"])
    try:
        model.load_state_dict(inference_weights(checkpoint))
    except RuntimeError as e:
        raise MtxError(f"Checkpoint {name} does not match its own model config: {str(e)[:300]}") from None
    return model.eval(), Tokenizer.from_str(checkpoint["tokenizer"])


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


def latest_checkpoint(directory: Path) -> Path | None:
    """The checkpoint a run in `directory` resumes from: the newest step_<N>.pt (last.pt is the same file, but a
    kill may fall between writing one and the other); last.pt alone if there is no step file."""
    if not directory.is_dir():
        return None
    steps = step_checkpoints(directory)
    if steps:
        return steps[-1][1]
    last = directory / "last.pt"
    return last if last.is_file() else None


def shared_names(state: dict[str, torch.Tensor]) -> dict[str, str]:
    """{name: the first name of the same tensor} for each name that repeats an earlier one's tensor."""
    first: dict[tuple, str] = {}
    aliases = {}
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape), tensor.stride())
        if key in first:
            aliases[name] = first[key]
        else:
            first[key] = name
    return aliases
