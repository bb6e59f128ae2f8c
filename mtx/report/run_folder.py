"""A training run's folder as `mtx report` reads it: its metrics.jsonl, data manifest, checkpoint and score cards.

    metrics.jsonl          the events the trainer logged: "train", "valid" and "milestone" lines (mtx.train.metrics_log)
    data/manifest.json     what `mtx prepare` read, dropped and kept (mtx.data.prepare)
    checkpoints/last.pt    the recipe and the model's shape, hence its size; the training clock
    score*.json            `mtx score --json` cards saved beside the run

Only metrics.jsonl is required: a run stopped before its first checkpoint, or whose data folder was moved
away, still has curves to show. Lines of metrics.jsonl written before mtx logged the training clock lack
`seconds`, `gpu_seconds` and `tokens`, and have no milestone events; the report copes with both kinds.

The checkpoint is memory-mapped, so that reading the recipe of a `big` run does not read its weights and
optimizer state.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtx.errors import MtxError

METRICS = "metrics.jsonl"
EVENTS = ("train", "valid", "milestone")  # what the report reads; other events are left alone


@dataclass(frozen=True)
class CheckpointFacts:
    """What the report takes from a run's latest checkpoint."""

    path: Path
    recipe: dict[str, Any]  # the resolved recipe the run trained with
    parameters: int  # trainable parameters, each shared matrix counted once
    train_seconds: float | None  # the training clock at that checkpoint (None: an inference checkpoint)


@dataclass(frozen=True)
class Run:
    """One run folder: its events by kind, in the order logged, and whatever else it holds."""

    folder: Path
    train: list[dict[str, Any]]
    valid: list[dict[str, Any]]
    milestones: list[dict[str, Any]]
    manifest: dict[str, Any] | None
    checkpoint: CheckpointFacts | None
    scores: dict[str, dict[str, Any]]  # file name → the score card it holds

    @property
    def label(self) -> str:
        """The run's name in tables and legends: its folder as the user named it."""
        return str(self.folder)

    @property
    def pairs(self) -> list[str]:
        """The language pairs its validations scored one by one (a model of several: `valid_pairs`), in order."""
        return list(dict.fromkeys(pair for line in self.valid for pair in line.get("valid_pairs", {})))

    @property
    def logs_clock(self) -> bool:
        """Whether its train and valid lines carry the training clock (`seconds`), as those of mtx since it did."""
        return any("seconds" in line for line in self.train + self.valid)

    @property
    def tensorboard(self) -> Path | None:
        """The folder of TensorBoard event files, if the run wrote one (train.tensorboard)."""
        folder = self.folder / "tensorboard"
        return folder if folder.is_dir() else None


def read_run(folder: Path) -> Run:
    """The run in `folder`; a folder that is not a run (no metrics.jsonl) is a user error."""
    if not folder.is_dir():
        raise MtxError(f"{folder} is not a folder: pass the run folder of a training run, e.g. runs/demo.")
    if not (folder / METRICS).is_file():
        raise MtxError(f"{folder} is not a training run: it has no {METRICS}. Pass the folder `mtx train` wrote "
                       "(runs/<name> of the recipe, or its run_dir), after at least one logged step.")
    events = read_events(folder / METRICS)
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in EVENTS}
    for event in events:
        if event["event"] in by_kind:
            by_kind[event["event"]].append(event)
    return Run(folder=folder, train=by_kind["train"], valid=by_kind["valid"], milestones=by_kind["milestone"],
               manifest=read_manifest(folder), checkpoint=read_checkpoint_facts(folder / "checkpoints"),
               scores=read_scores(folder))


def read_events(path: Path) -> list[dict[str, Any]]:
    """The events of a metrics.jsonl, each a JSON object with an "event" and a "step".

    A last line without its newline that does not parse is one being written, or torn by a kill (a resumed run
    drops it too), and is left out; any other line that is not an event is an error naming its number.
    """
    lines = path.read_text(encoding="utf-8", errors="replace").split("\n")
    torn_tail = lines.pop()  # "" when the file ends with its newline
    events = [_event(path, number, line) for number, line in enumerate(lines, start=1)]
    if torn_tail.strip():
        with contextlib.suppress(MtxError):
            events.append(_event(path, len(lines) + 1, torn_tail))
    if not events:
        raise MtxError(f"{path} holds no events yet: the trainer logs its first line after train.log_every steps.")
    return events


def _event(path: Path, number: int, line: str) -> dict[str, Any]:
    if not line.strip():
        raise MtxError(f"{path}, line {number}, is empty: every line of a metrics log is one JSON event. Remove the "
                       "line, or pass the run's own metrics.jsonl.")
    try:
        event = json.loads(line)
    except json.JSONDecodeError as e:
        raise MtxError(f"{path}, line {number}, is not JSON ({e.msg}): {line[:80]!r}. Remove or repair the "
                       "line; the rest of the log is kept.") from None
    if not (isinstance(event, dict) and isinstance(event.get("event"), str) and isinstance(event.get("step"), int)):
        raise MtxError(f"{path}, line {number}, is not a metrics event (a JSON object with \"event\" and "
                       f"\"step\"): {line[:80]!r}.")
    return event


def read_manifest(folder: Path) -> dict[str, Any] | None:
    """The data manifest, or None where the run has no data folder here (prepared elsewhere, or moved)."""
    path = folder / "data" / "manifest.json"
    if not path.is_file():
        return None
    return _json_object(path, "run `mtx prepare RECIPE` again to rewrite it")


def read_scores(folder: Path) -> dict[str, dict[str, Any]]:
    """The `score*.json` cards of the run folder (`mtx score --json > RUN/score.json`), by file name."""
    return {path.name: _json_object(path, "write it again with `mtx score --json`")
            for path in sorted(folder.glob("score*.json")) if path.is_file()}


def _json_object(path: Path, remedy: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MtxError(f"{path} is not valid JSON ({e}): {remedy}.") from None
    if not isinstance(data, dict):
        raise MtxError(f"{path} does not hold a JSON object: {remedy}.")
    return data


def read_checkpoint_facts(checkpoints: Path) -> CheckpointFacts | None:
    """The recipe, model size and clock of the run's latest checkpoint: last.pt, else the highest step_<N>.pt,
    else best.pt; None if the run has saved none yet."""
    from mtx.checkpoint import load_checkpoint, model_config_of, step_checkpoints
    from mtx.model.transformer import count_parameters_for

    if not checkpoints.is_dir():
        return None
    candidates = [checkpoints / "last.pt", *(path for _, path in reversed(step_checkpoints(checkpoints))),
                  checkpoints / "best.pt"]
    path = next((path for path in candidates if path.is_file()), None)
    if path is None:
        return None
    checkpoint = load_checkpoint(path, mmap=True, weights=False)
    progress = checkpoint.get("train_state", {}).get("progress", {})
    return CheckpointFacts(path=path, recipe=checkpoint["recipe"],
                           parameters=count_parameters_for(model_config_of(checkpoint), checkpoint["vocab_size"]),
                           train_seconds=progress.get("train_seconds"))
