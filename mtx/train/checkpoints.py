"""The checkpoints of one training run: which one to resume from, when to write one, which to keep.

mtx.checkpoint is the file format, which `mtx translate` and `mtx average` read as well; this module is the
trainer's policy for its run's checkpoints/ folder, and changes with training, not with the format:

    step_<N>.pt   the run at update N. Kept: the newest train.keep_last (all, with 0), and beside them the
                  train.keep_best best by train.best_metric (mtx.train.best) of those written at a validated
                  step, which carry its scores (`valid`). The newest two carry the training state (optimizer,
                  grad scaler, progress; after a stop, the newest three until the next save); older ones hold
                  the model alone, as best.pt does. With train.ema_decay each holds the moving average of the
                  weights beside them (mtx.train.ema). The one training ends on may hold the α chosen for it
                  on the valid split (train.tune_lenpen: `rewrite_newest`)
    last.pt       the newest step_<N>.pt again: a hard link, or a copy where the filesystem has none
    best.pt       the model of the best train.best_metric so far (valid BLEU or nll), without training state:
                  the moving average's weights where the run keeps one, as validation scores them

Adam's two moments make the training state twice the weights' size, and only a resume reads it, from the newest
step_<N>.pt: so a step checkpoint is written whole, and the training state of those older than the newest two
is dropped once the new one is in place (the file rewritten without it), which keeps the files that averaging
reads to about a third of their size. Rewriting costs a write of the weights per save, in the background; a
state file beside each step checkpoint would not, but files that must travel in pairs, and a last.pt without
the training state that `mtx report` and users read from it, are what this avoids. The second newest keeps its
state so that a newest file damaged after it was written still leaves one to resume from.

Every file is written under a temporary name and renamed into place (mtx.files), so a kill leaves at worst a
temporary file, which the next run removes; and nothing loses its training state before a newer checkpoint
holding one is in place, so a kill at any moment of a save leaves a newest step_<N>.pt to resume from. A
resumed run takes the newest step_<N>.pt rather than last.pt, since a kill may fall between writing the one
and linking the other.

Only rank 0 writes, and on a GPU a step checkpoint's write need not hold up training: `save` copies the model, the
optimizer's and the scaler's state to host memory, which is all that must happen before the next update changes
them, and writes the file on a thread of its own while the GPU trains on. On a CPU the thread would take the cores
that training computes on (bench/README.md, "Checkpoint writes"), so there it writes at once. The next save,
`flush`, or a save with `wait=True` (a stop, which has seconds) waits for it. A resume maps the file rather than
reading it (mmap): each rank pages in what it copies into its model and optimizer, and the ranks of one machine
share the pages.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mtx.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    make_checkpoint,
    model_config_of,
    save_checkpoint,
    step_checkpoints,
)
from mtx.config.recipe import Recipe
from mtx.config.run_recipe import shape_differences
from mtx.data.lexicon import Lexicon
from mtx.errors import MtxError
from mtx.files import atomic_write
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer
from mtx.train import distributed
from mtx.train.best import best_steps
from mtx.train.ema import WeightAverage

RESUMABLE = 2  # the newest step checkpoints that keep their training state


class CheckpointKeeper:
    """Saves the model, the optimizer and the grad scaler with the trainer's progress, and restores them.

    The progress is the trainer's own dict of Python primitives (its TrainState and the open loss window);
    the keeper stores it as it is and reads nothing in it but the step and epoch it names.
    """

    def __init__(self, recipe: Recipe, ctx: distributed.Context, model: Transformer, tokenizer: Tokenizer,
                 optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, say: Callable[[str], None],
                 ema: WeightAverage | None = None, data_stats: dict[str, Any] | None = None,
                 lexicon: Lexicon | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        """`data_stats`: what the training data says of its pairs (mtx.decode.doubts), and `lexicon`: its
        lexical table (mtx.data.lexicon), which decoding shortlists are made of, both stored in every
        checkpoint; `clock`: the seconds that train.save_every_minutes counts."""
        self.recipe, self.ctx, self.say, self.clock = recipe, ctx, say, clock
        self.model, self.tokenizer, self.optimizer, self.scaler = model, tokenizer, optimizer, scaler
        self.ema, self.data_stats, self.lexicon = ema, data_stats, lexicon
        self.directory = recipe.run_path / "checkpoints"
        self.saved_step = 0  # the step of the newest checkpoint, written or being written: a stop need not save it
        self.last_save_time = self.clock()  # train.save_every_minutes counts from the last save or resume
        self.background = ctx.device.type == "cuda"  # periodic saves written by a thread while training goes on
        self._writing: _Write | None = None  # rank 0's step checkpoint write in flight, if any
        self._scores: dict[int, dict[str, float] | None] = {}  # each step file's `valid`, read once (rank 0)

    # ---- before training: rank 0 tidies up, every rank resumes

    def delete_all(self) -> None:
        """--restart: the run starts over from step 0."""
        if self.ctx.is_main:
            shutil.rmtree(self.directory, ignore_errors=True)

    def remove_torn_writes(self) -> None:
        """The temporary files that a kill in the middle of a write left behind."""
        if self.ctx.is_main:
            for torn in self.directory.glob(".*.tmp"):
                torn.unlink()


    def resume(self) -> dict[str, Any]:
        """Load the latest checkpoint, if any, into model, optimizer and scaler; its progress ({} if none).

        Rank 0 chooses the checkpoint and every rank loads that one: on a network filesystem another rank's
        listing of checkpoints/ can be older, and replicas resumed from different steps would drift apart
        silently. Then all ranks check they hold the same step before the first update.
        """
        chosen = latest_checkpoint(self.directory) if self.ctx.is_main else None
        chosen = distributed.broadcast_object(None if chosen is None else str(chosen))
        progress: dict[str, Any] = {}
        problem = None
        if chosen is not None:
            try:
                progress = self._load(Path(chosen))
            except MtxError as e:
                problem = str(e)
        outcomes = distributed.all_gather_objects((progress.get("step", 0), problem))
        for rank, (_, error) in enumerate(outcomes):
            if error is not None:
                raise MtxError(error if self.ctx.world == 1 else f"Rank {rank} cannot resume: {error}")
        steps = [step for step, _ in outcomes]
        if len(set(steps)) > 1:
            raise MtxError(f"The ranks resumed from different steps ({steps}, by rank) out of {chosen}: the run "
                           "directory must be one shared filesystem that every node sees alike.")
        if chosen is not None:
            self.say(f"Resuming from {chosen} (step {progress['step']}, epoch {progress['epoch']}).")
        self.saved_step, self.last_save_time = progress.get("step", 0), self.clock()
        return progress

    def _load(self, path: Path) -> dict[str, Any]:
        """Restore what `path` holds into the model, optimizer and scaler, and return its progress; refuse,
        saying why, a checkpoint of another model shape or tokenizer, or one without training state."""
        checkpoint = load_checkpoint(path, mmap=True)
        differs = shape_differences(self.recipe.model, model_config_of(checkpoint))
        if checkpoint["vocab_size"] != self.tokenizer.vocab_size:
            differs.append(f"the vocabulary has {checkpoint['vocab_size']} tokens there, "
                           f"{self.tokenizer.vocab_size} here")
        elif checkpoint["tokenizer"] != self.tokenizer.to_str():
            differs.append("the data was prepared again since (another tokenizer)")
        if "train_state" not in checkpoint:
            differs.append("it holds no training state (an averaged checkpoint?)")
        if differs:
            raise MtxError(
                f"Cannot resume from {path}: {'; '.join(differs)}. Pass --restart to delete {self.directory} "
                "and start over, or give the recipe another name or run_dir."
            )
        return self.restore(checkpoint, path)

    def restore(self, checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
        """Put a checkpoint's weights, moving average, optimizer and scaler state in place; its progress."""
        self.model.load_state_dict(checkpoint["model"])
        if self.ema is not None and "ema" in checkpoint:
            self.ema.load_state_dict(checkpoint["ema"])
        elif self.ema is not None:
            self.ema.restart_from_weights()
            self.say(f"train.ema_decay is set but {path} holds no moving average: it starts from the weights of "
                     f"step {checkpoint['step']}.")
        elif "ema" in checkpoint:
            self.say(f"{path} holds a moving average of the weights, which this run, without train.ema_decay, "
                     "no longer keeps.")
        saved = checkpoint["train_state"]
        self.optimizer.load_state_dict(saved["optimizer"])
        _off_the_file(self.optimizer)
        if saved["scaler"]:
            self.scaler.load_state_dict(saved["scaler"])
        return saved["progress"]

    # ---- while training

    def save_due(self) -> bool:
        """Whether train.save_every_minutes of wall-clock time have passed since the last save (on this rank)."""
        minutes = self.recipe.train.save_every_minutes
        return minutes is not None and self.clock() - self.last_save_time >= 60 * minutes

    def save(self, step: int, progress: dict[str, Any], wait: bool = False,
             valid: dict[str, float] | None = None) -> None:
        """step_<N>.pt, holding `valid`, the scores of this step's validation if it had one, then last.pt as a
        hard link to it (no second write); the step checkpoints neither among the train.keep_last newest nor the
        train.keep_best best pruned, the training state of those older than the newest two dropped. Called on all
        ranks at the same update; only rank 0 writes.

        With `background` (on a GPU) the write runs on a thread of rank 0 while training goes on, once the state
        is copied to host memory; a save waits first for the previous save's write, and raises what that write
        raised. `wait=True` (the stop path) returns with the file in place and leaves the older files' training
        state for the next save to drop, as a stop may have only seconds.
        """
        self.flush()
        self.saved_step, self.last_save_time = step, self.clock()
        if not self.ctx.is_main:
            return
        train_state = {"progress": progress, "optimizer": self.optimizer.state_dict(),
                       "scaler": self.scaler.state_dict()}
        if wait or not self.background:
            self._write_step(step, self._checkpoint(step, train_state, valid=valid), drop_older_state=not wait)
            return
        checkpoint = self._checkpoint(step, _to_cpu(train_state), copy=True, valid=valid)
        self._writing = _Write(lambda: self._write_step(step, checkpoint, drop_older_state=True))

    def flush(self) -> None:
        """Wait until the step checkpoint being written, if any, is in place; raise what its write raised. The
        trainer calls it before it returns or exits, so that a run never ends with a write in flight."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.wait()

    def _write_step(self, step: int, checkpoint: dict[str, Any], drop_older_state: bool) -> None:
        path = self.directory / f"step_{step}.pt"
        save_checkpoint(checkpoint, path)
        _link_atomically(path, self.directory / "last.pt")
        self._scores[step] = checkpoint.get("valid")
        steps = step_checkpoints(self.directory)
        kept = self._kept([step for step, _ in steps])
        for old_step, old in steps:
            if old_step not in kept:
                old.unlink()
                self._scores.pop(old_step, None)
        if drop_older_state:
            for old in [old for old_step, old in steps if old_step in kept][:-RESUMABLE]:
                _drop_train_state(old)

    def _kept(self, steps: list[int]) -> set[int]:
        """Which of the step checkpoints `steps` (oldest first) stay: the train.keep_last newest (all, with 0) and
        the train.keep_best best by train.best_metric of those that carry validation scores."""
        cfg = self.recipe.train
        newest = steps[-cfg.keep_last:] if cfg.keep_last else steps
        scored = [(step, valid) for step in steps if (valid := self._valid_of(step)) is not None]
        return {*newest, *best_steps(scored, cfg.best_metric, cfg.keep_best)}

    def _valid_of(self, step: int) -> dict[str, float] | None:
        """The validation scores step_<step>.pt carries (None: none, or a file that cannot be read), read from
        its metadata once: the file's tensors are mapped, not read."""
        if step not in self._scores:
            try:
                checkpoint = load_checkpoint(self.directory / f"step_{step}.pt", mmap=True, weights=False)
                self._scores[step] = checkpoint.get("valid")
            except MtxError:
                self._scores[step] = None
        return self._scores[step]

    def rewrite_newest(self, update: Callable[[dict[str, Any], Path], dict[str, Any]]) -> dict[str, Any]:
        """Rewrite the newest step checkpoint as `update` returns it (handed the checkpoint and its path), then
        link last.pt to it again; the checkpoint written. From rank 0, at the end of training (train.tune_lenpen).
        What `update` leaves alone stays, the training state included, so the run still resumes from it; the
        file is replaced atomically, and until last.pt is linked again it is the file as it was."""
        self.flush()
        path = self.directory / f"step_{self.saved_step}.pt"
        checkpoint = update(load_checkpoint(path, mmap=True), path)
        save_checkpoint(checkpoint, path)
        _link_atomically(path, self.directory / "last.pt")
        return checkpoint

    def save_best(self, step: int) -> None:
        """best.pt: the weights validation scored (the moving average's, if the run keeps one) alone, for
        translating, from rank 0."""
        if self.ctx.is_main:
            save_checkpoint(self._checkpoint(step, train_state=None, ema_only=True), self.directory / "best.pt")

    def _checkpoint(self, step: int, train_state: dict[str, Any] | None, copy: bool = False,
                    ema_only: bool = False, valid: dict[str, float] | None = None) -> dict[str, Any]:
        ema = None if self.ema is None else self.ema.state_dict()
        checkpoint = make_checkpoint(self.model, self.tokenizer.to_str(), self.recipe.to_dict(), step, train_state,
                                     copy, ema=ema, ema_decay=self.recipe.train.ema_decay, ema_only=ema_only)
        if self.data_stats is not None:
            checkpoint["data_stats"] = self.data_stats
        if self.lexicon is not None:
            checkpoint["lexicon"] = self.lexicon.to_checkpoint()
        if valid is not None:
            checkpoint["valid"] = dict(valid)
        return checkpoint


class _Write:
    """A checkpoint write on a thread of its own. The thread is not a daemon: a process that ends normally
    finishes the write before it exits, and one that is killed leaves at worst a temporary file."""

    def __init__(self, write: Callable[[], None]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(write,), name="mtx-checkpoint-write")
        self.thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as e:  # raised again by `wait`, in the thread that trains
            self.error = e

    def wait(self) -> None:
        self.thread.join()
        if self.error is not None:
            raise self.error


def _to_cpu(value: Any) -> Any:
    """`value` with every tensor in it copied to host memory and every dict, list and tuple rebuilt, for a
    write that runs while the next updates change the originals in place."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: _to_cpu(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_cpu(item) for item in value)
    return value


def _drop_train_state(path: Path) -> None:
    """Rewrite `path` without its training state, atomically (its tensors mapped, not read, until written).
    A file that cannot be read is left as it is: it is not the one a resume takes, and averaging names it."""
    try:
        checkpoint = load_checkpoint(path, mmap=True)
    except MtxError:
        return
    if checkpoint.pop("train_state", None) is not None:
        save_checkpoint(checkpoint, path)


def _off_the_file(optimizer: torch.optim.Optimizer) -> None:
    """Give the optimizer's state tensors that loading left on the CPU (all of a CPU run's, a GPU run's step
    counts) memory of their own: they are views of the checkpoint's mapped file, which they would keep alive,
    disk space included, for the whole run after it is pruned."""
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.device.type == "cpu":
                state[key] = value.clone()


def _link_atomically(source: Path, target: Path) -> None:
    """Make `target` the same file as `source`: a hard link renamed into place; where a filesystem has no
    hard links, a copy streamed in blocks (never the whole checkpoint in memory), renamed into place."""
    temporary = target.with_name(f".{target.name}.link.tmp")
    temporary.unlink(missing_ok=True)
    try:
        os.link(source, temporary)
        os.replace(temporary, target)
    except OSError:
        with open(source, "rb") as original:
            atomic_write(target, lambda f: shutil.copyfileobj(original, f, 1 << 24))
