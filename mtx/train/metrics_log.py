"""What a training run reports: metrics.jsonl, its lines echoed on stderr, a progress bar, and (if the recipe
asks for it) TensorBoard event files (mtx.train.tensorboard_log), from rank 0.

The train line averages the loss over the updates since the last one (the loss window). Every rank sums its
updates' loss and nll on the device, since reading them back at each update would make the host wait for the
GPU; a train line all-reduces the sums into per-token averages. A checkpoint carries a window still open, so
a resumed run logs the very averages of a run that never stopped, and a resumed run first drops the events
logged after its checkpoint, since it logs them again.

Every train and valid line carries `seconds`, the training clock as train.max_time counts it (wall-clock
seconds summed over all sessions of the run), and `gpu_seconds`, that clock times the training processes:
the compute spent, which compares runs on different numbers of GPUs.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from torch import Tensor

from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.train import distributed
from mtx.train.tensorboard_log import TensorBoardLog


class MetricsLog:
    """metrics.jsonl, stderr and TensorBoard, and the loss window: the one place the window's sums live between
    two train lines and across a checkpoint (`carried_over`, `open_window`).

    With `tensorboard`, every rank checks here that TensorBoard is installed, so that a run refuses at once.
    `clock` gives the seconds that tokens_per_s divides by.
    """

    def __init__(self, path: Path, ctx: distributed.Context, tensorboard: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.path, self.ctx, self.clock = path, ctx, clock
        self.console = Console(stderr=True, highlight=False, soft_wrap=True)
        self.tensorboard = TensorBoardLog(path.parent / "tensorboard") if tensorboard else None
        self.open_window({})

    # ---- the loss window

    def open_window(self, carried: dict[str, float]) -> None:
        """Start the window from what a checkpoint carried over ({} for none): the sums on rank 0, which
        holds all ranks' sums at a checkpoint; the target tokens, counted over all ranks, on every rank."""
        sums = [carried.get("window_loss", 0.0), carried.get("window_nll", 0.0)] if self.ctx.is_main else [0.0, 0.0]
        self.sums = torch.tensor(sums, dtype=torch.float64, device=self.ctx.device)  # this rank's loss and nll
        self.tokens = carried.get("window_tokens", 0.0)
        self.window_start = self.clock()

    def add(self, sums: Tensor, n_tokens: float) -> None:
        """One update: its summed loss and nll (on the device, not read back) and its target tokens, all ranks'."""
        self.sums += sums
        self.tokens += n_tokens

    def carried_over(self) -> dict[str, float]:
        """The open window as a checkpoint's progress holds it, the sums of all ranks gathered onto rank 0 (the
        others count on from zero). Every rank calls this at the same update; only rank 0's answer is saved."""
        distributed.all_reduce_sum(self.sums)
        if not self.ctx.is_main:
            self.sums.zero_()
            return {}
        window_loss, window_nll = self.sums.tolist()
        return {"window_loss": window_loss, "window_nll": window_nll, "window_tokens": self.tokens}

    def log_train(self, step: int, epoch: int, lr: float, grad_norm: Tensor, skipped_steps: int,
                  seconds: float) -> None:
        """The train line of the window, which closes it, at `seconds` of training; a loss no longer finite stops
        the run with advice."""
        loss_sum, nll_sum = distributed.all_reduce_sum(self.sums).tolist()
        tokens = self.tokens
        loss, nll = loss_sum / tokens, nll_sum / tokens
        if not math.isfinite(loss):
            raise MtxError(f"Training diverged at step {step} (loss {loss}): lower train.lr, raise "
                           "train.warmup or set train.clip_norm, and pass --restart.")
        window_seconds = max(self.clock() - self.window_start, 1e-9)
        self.record({"event": "train", "step": step, "epoch": epoch, "loss": loss, "nll": nll,
                     "ppl": math.exp(min(nll, 100.0)), "lr": lr, "grad_norm": float(grad_norm),
                     "tokens_per_s": tokens / window_seconds, "skipped_steps": skipped_steps, **self.timing(seconds)})
        self.progress.update(self.task, info=f"loss {loss:.3f}  lr {lr:.2e}  {tokens / window_seconds:,.0f} tok/s")
        self.sums.zero_()
        self.tokens, self.window_start = 0.0, self.clock()

    # ---- lines

    def timing(self, seconds: float) -> dict[str, float]:
        """The timing fields of a line at `seconds` of training: those seconds, and the processes' seconds."""
        return {"seconds": seconds, "gpu_seconds": seconds * self.ctx.world}

    def record(self, event: dict[str, Any]) -> None:
        """One line of metrics.jsonl, one on stderr and its scalars in TensorBoard, from rank 0."""
        if not self.ctx.is_main:
            return
        if self.tensorboard is not None:
            self.tensorboard.write(event)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
        self.console.print(f"{event['event']}: {_shown(event)}")

    def say(self, message: str) -> None:
        """A message on stderr, from rank 0."""
        if self.ctx.is_main:
            self.console.print(message)

    @contextmanager
    def session(self, total: int, completed: int) -> Iterator[None]:
        """While the loop runs: a bar of the steps done (rank 0's), which `show_step` and the train lines update,
        gone when done; and rank 0's TensorBoard file of this session, after the `completed` steps resumed."""
        columns = (TextColumn("step {task.completed}/{task.total}"), BarColumn(), TextColumn("{task.fields[info]}"),
                   TimeElapsedColumn(), TimeRemainingColumn())
        with Progress(*columns, console=self.console, disable=not self.ctx.is_main, transient=True) as progress:
            self.progress = progress
            self.task = progress.add_task("train", total=total, completed=completed, info="")
            if self.tensorboard is not None and self.ctx.is_main:
                self.tensorboard.open(completed)
            try:
                yield
            finally:
                if self.tensorboard is not None:
                    self.tensorboard.close()

    def show_step(self, step: int) -> None:
        self.progress.update(self.task, completed=step)

    # ---- the file, on rank 0

    def delete(self) -> None:
        """--restart: the run starts over, and so do its log and its TensorBoard files."""
        if self.ctx.is_main:
            self.path.unlink(missing_ok=True)
            shutil.rmtree(self.path.parent / "tensorboard", ignore_errors=True)

    def truncate_after(self, step: int) -> None:
        """Drop events logged after the checkpoint of `step`, which the run resumes from: it logs them again."""
        if not self.ctx.is_main or not self.path.is_file():
            return
        lines = self.path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _event_step(line) <= step]
        if len(kept) != len(lines):
            atomic_write_text(self.path, "".join(kept))


def _event_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (json.JSONDecodeError, KeyError, TypeError):
        return math.inf  # a line torn by a kill: dropped


def _shown(event: dict[str, Any]) -> str:
    """A line's fields as its stderr line shows them: floats to 4 digits, a nested field (valid_pairs) as
    `name key value ...` for each of its entries."""
    def value(v: Any) -> str:
        if isinstance(v, dict):
            return "  ".join(f"{k} {value(inner)}" for k, inner in v.items())
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return "  ".join(f"{k} {value(v)}" for k, v in event.items() if k != "event")
