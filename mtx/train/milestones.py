"""Time to BLEU: when the valid BLEU first reached each level of `train.bleu_milestones`.

What a recipe costs is best told as the compute it takes to reach a quality: how many GPU-hours to 25 BLEU.
The first validation whose BLEU reaches a level becomes a "milestone" line of metrics.jsonl, with the step,
the training seconds (summed over resumes, as train.max_time counts them), the GPU-hours (seconds × training
processes) and the target tokens trained on so far, all as the valid line of that validation has them. The
trainer keeps the milestones in its checkpoint, so that a resumed run neither forgets a level nor records it
twice, and prints them when it stops. A level added to the recipe on a resume counts from then on: the
validations before the resume are not looked at again.
"""

from __future__ import annotations

from typing import Any

SECONDS_PER_HOUR = 3600.0


def milestones_reached(levels: list[float], recorded: list[dict[str, Any]],
                       valid: dict[str, Any]) -> list[dict[str, Any]]:
    """The milestone lines of the levels that the valid line `valid` reaches and `recorded` lacks."""
    done = {milestone["bleu_level"] for milestone in recorded}
    return [{"event": "milestone", "step": valid["step"], "bleu_level": level, "valid_bleu": valid["valid_bleu"],
             "seconds": valid["seconds"], "gpu_seconds": valid["gpu_seconds"],
             "gpu_hours": valid["gpu_seconds"] / SECONDS_PER_HOUR, "tokens": valid["tokens"]}
            for level in levels if level not in done and valid["valid_bleu"] >= level]


def describe_milestones(levels: list[float], recorded: list[dict[str, Any]], best_bleu: float | None) -> list[str]:
    """One line per level, for the end of a run: when it was reached, or that it was not (yet)."""
    by_level = {milestone["bleu_level"]: milestone for milestone in recorded}
    lines = []
    for level in sorted(set(levels) | set(by_level)):
        milestone = by_level.get(level)
        if milestone is None:
            best = "no validation yet" if best_bleu is None else f"best valid BLEU so far {best_bleu:.2f}"
            lines.append(f"BLEU {level:g} not reached ({best})")
        else:
            lines.append(f"BLEU {level:g} reached at step {milestone['step']:,}, after "
                         f"{format_duration(milestone['seconds'])} ({format_gpu_hours(milestone['gpu_seconds'])} "
                         f"GPU-hours, {milestone['tokens']:,} target tokens)")
    return lines


def format_duration(seconds: float) -> str:
    """3 h 05 min, 12 min 30 s, 41 s: as precise as a reader of a run's summary, or one comparing runs, needs."""
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    if hours:
        return f"{hours:,} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if minutes else f"{secs} s"


def format_gpu_hours(gpu_seconds: float) -> str:
    """GPU-seconds as GPU-hours, to two decimals, one from 10 on; a tiny run's few seconds read as under 0.01."""
    hours = gpu_seconds / SECONDS_PER_HOUR
    if hours < 0.01:
        return "< 0.01"
    return f"{hours:,.1f}" if hours >= 10 else f"{hours:.2f}"
