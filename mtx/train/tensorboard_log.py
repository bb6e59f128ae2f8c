"""TensorBoard event files of a run's learning curves, under runs/<name>/tensorboard/, from rank 0.

The scalars are the train and valid lines of metrics.jsonl, against the step: the training loss, nll,
perplexity, learning rate, gradient norm, throughput and skipped updates, and the valid loss, nll, perplexity,
BLEU and length ratio, and for a model of several language pairs each pair's BLEU and length ratio
(valid/bleu/en-de). TensorBoard is an optional extra (`pip install 'mtx[tensorboard]'`); a recipe that asks for it
without the package is refused as the run starts, not at its first log line hours later.

A resumed run logs again the steps after its checkpoint. metrics.jsonl drops its lines of those steps; the
event files cannot be edited, so the resumed run's file opens with a marker (SummaryWriter's purge_step) that
tells TensorBoard to drop the points of those steps that the files before it hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mtx.errors import MtxError

SCALARS = {  # the fields of each metrics.jsonl event written as scalars, tagged <event>/<field>
    "train": ("loss", "nll", "ppl", "lr", "grad_norm", "tokens_per_s", "skipped_steps"),
    "valid": ("valid_loss", "valid_nll", "valid_ppl", "valid_bleu", "valid_length_ratio"),
}


class TensorBoardLog:
    """The event files of one run. Constructing it checks that TensorBoard is installed; `open` starts the
    file that the events of this session go to."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.writer_class = _summary_writer_class()
        self.writer: Any = None

    def open(self, resumed_step: int) -> None:
        """A new event file, which hides from TensorBoard any point of an earlier file after `resumed_step`."""
        self.writer = self.writer_class(str(self.directory), purge_step=resumed_step + 1)

    def write(self, event: dict[str, Any]) -> None:
        """The scalars of one metrics.jsonl event at its step (train/loss, valid/bleu, ...); others have none."""
        for field in SCALARS.get(event["event"], ()):
            self.writer.add_scalar(f"{event['event']}/{field.removeprefix('valid_')}", event[field], event["step"])
        for pair, scores in event.get("valid_pairs", {}).items():  # a model of several pairs: valid/bleu/en-de
            for name, value in scores.items():
                self.writer.add_scalar(f"valid/{name}/{pair}", value, event["step"])

    def close(self) -> None:
        """Flush what is buffered to the file and close it."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _summary_writer_class() -> type:
    """torch's SummaryWriter, which needs the tensorboard package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as e:
        raise MtxError(f"train.tensorboard is true, but TensorBoard cannot be imported ({e}). Install it with "
                       "pip install 'mtx[tensorboard]', or set train.tensorboard: false.") from None
    return SummaryWriter
