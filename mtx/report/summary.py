"""What `mtx report` says about runs, in figures and in words: the summary of each run, time to BLEU, and the
recipe keys that set runs apart. The page and the terminal both show these, so they say the same.

Time to BLEU is when validation BLEU first reached a level: the trainer's milestone line for that level where
it wrote one (train.bleu_milestones, mtx.train.milestones), else the first valid line that reached it, with its
training clock where the line has one (runs logged before mtx recorded the clock have steps only).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mtx.report.run_folder import Run
from mtx.train.milestones import format_duration, format_gpu_hours

NOT_RECORDED = "not recorded"


@dataclass(frozen=True)
class Milestone:
    """When a run's validation BLEU first reached `level`."""

    level: float
    step: int
    valid_bleu: float
    seconds: float | None  # training clock; None where the log has none
    gpu_seconds: float | None
    tokens: int | None  # target tokens trained on by then
    recorded: bool  # the trainer's own milestone line; False: found among the valid lines


def bleu_levels(runs: Sequence[Run], asked: Sequence[float] | None) -> list[float]:
    """The levels to report: those asked for, else every level any run's recipe names or its log reached."""
    if asked:
        return sorted(set(asked))
    levels: set[float] = set()
    for run in runs:
        levels |= {milestone["bleu_level"] for milestone in run.milestones}
        if run.checkpoint is not None:
            levels |= set(run.checkpoint.recipe.get("train", {}).get("bleu_milestones", []))
    return sorted(levels)


def time_to_bleu(run: Run, level: float) -> Milestone | None:
    """When `run` first reached `level`; None if no validation has."""
    for line in run.milestones:
        if line["bleu_level"] == level:
            return Milestone(level, line["step"], line["valid_bleu"], line["seconds"], line["gpu_seconds"],
                             line["tokens"], recorded=True)
    for line in run.valid:
        if line.get("valid_bleu") is not None and line["valid_bleu"] >= level:
            return Milestone(level, line["step"], line["valid_bleu"], line.get("seconds"), line.get("gpu_seconds"),
                             line.get("tokens"), recorded=False)
    return None


@dataclass(frozen=True)
class RunSummary:
    """A run in one row: how far it got, how long it took, how good it is."""

    steps: int
    seconds: float | None  # training clock at the last line that has one, else at the last checkpoint
    gpu_seconds: float | None
    parameters: int | None
    best: dict[str, Any] | None  # the first valid line of the best BLEU
    train_loss: float | None  # of the last train line
    valid_loss: float | None  # of the last valid line
    tokens_per_s: float | None  # the median of the train lines'

    @classmethod
    def of(cls, run: Run) -> RunSummary:
        lines = run.train + run.valid
        timed = [line for line in lines if "seconds" in line]
        last_timed = max(timed, key=lambda line: line["seconds"]) if timed else {}
        seconds = last_timed.get("seconds", run.checkpoint.train_seconds if run.checkpoint else None)
        scored = [line for line in run.valid if line.get("valid_bleu") is not None]
        speeds = [line["tokens_per_s"] for line in run.train if "tokens_per_s" in line]
        return cls(steps=max(line["step"] for line in lines) if lines else 0, seconds=seconds,
                   gpu_seconds=last_timed.get("gpu_seconds"),
                   parameters=run.checkpoint.parameters if run.checkpoint else None,
                   best=max(scored, key=lambda line: line["valid_bleu"]) if scored else None,
                   train_loss=run.train[-1]["loss"] if run.train else None,
                   valid_loss=run.valid[-1].get("valid_loss") if run.valid else None,
                   tokens_per_s=statistics.median(speeds) if speeds else None)

    def cells(self) -> dict[str, str]:
        """The summary as text, by heading ("–": not logged, e.g. no clock in an older run's log)."""
        best = self.best
        return {"steps": f"{self.steps:,}", "training time": "–" if self.seconds is None else duration(self.seconds),
                "GPU-hours": "–" if self.gpu_seconds is None else gpu_hours(self.gpu_seconds),
                "parameters": count(self.parameters),
                "best valid BLEU": "–" if best is None else f"{best['valid_bleu']:.2f}",
                "at step": "–" if best is None else f"{best['step']:,}",
                "train loss": number(self.train_loss, 3), "valid loss": number(self.valid_loss, 3),
                "tokens/s": count(None if self.tokens_per_s is None else round(self.tokens_per_s))}


def recipe_rows(runs: Sequence[Run]) -> list[tuple[str, list[str]]]:
    """The recipe keys to show, dotted, each with its value in every run: all of a single run's keys; the keys
    whose values differ between several runs. A run without a checkpoint has no recipe to compare ("?")."""
    flat = [flat_recipe(run.checkpoint.recipe) if run.checkpoint else None for run in runs]
    keys = sorted({key for recipe in flat if recipe is not None for key in recipe})
    rows = [(key, ["?" if recipe is None else recipe.get(key, "–") for recipe in flat]) for key in keys]
    if len(runs) == 1:
        return rows
    return [(key, values) for key, values in rows
            if len({value for value, recipe in zip(values, flat, strict=True) if recipe is not None}) > 1]


def flat_recipe(recipe: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """{dotted key: value as the recipe would write it} of a nested recipe, as `--set` names its keys."""
    flat = {}
    for key, value in recipe.items():
        if isinstance(value, dict) and value:
            flat.update(flat_recipe(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value if isinstance(value, str) else json.dumps(value)
    return flat


# ------------------------------------------------------------------------------------------- numbers in words


def duration(seconds: float | None) -> str:
    return NOT_RECORDED if seconds is None else format_duration(seconds)


def gpu_hours(gpu_seconds: float | None) -> str:
    return NOT_RECORDED if gpu_seconds is None else format_gpu_hours(gpu_seconds)


def count(n: int | None) -> str:
    return "–" if n is None else f"{n:,}"


def number(value: float | None, decimals: int) -> str:
    return "–" if value is None else f"{value:.{decimals}f}"


def milestone_text(milestone: Milestone | None) -> str:
    """A milestone in a few words: where and when, or that it was not reached."""
    if milestone is None:
        return "not reached"
    when = "" if milestone.seconds is None else f", {duration(milestone.seconds)}"
    spent = "" if milestone.gpu_seconds is None else f", {gpu_hours(milestone.gpu_seconds)} GPU-h"
    return f"step {milestone.step:,}{when}{spent}"
