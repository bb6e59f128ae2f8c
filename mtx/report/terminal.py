"""`mtx report RUN…` without -o: the runs in the terminal, with rich alone (no plotting library needed).

A table with a row per run (the summary the page opens with), then for each run its valid BLEU and train loss
as sparklines — a line of block characters, lowest ▁ to highest █, scaled to the run's own range — with the
first and last values, and when it reached each BLEU level.
"""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Sequence

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from mtx.report.run_folder import Run
from mtx.report.summary import RunSummary, milestone_text, time_to_bleu

BLOCKS = "▁▂▃▄▅▆▇█"
SPARKLINE_WIDTH = 40  # characters at most; a longer series is averaged into this many


def sparkline(values: Sequence[float], width: int = SPARKLINE_WIDTH) -> str:
    """`values` as block characters, at most `width`, each the mean of a run of consecutive values."""
    if not values:
        return ""
    columns = min(width, len(values))
    means = [statistics.fmean(values[i * len(values) // columns:(i + 1) * len(values) // columns])
             for i in range(columns)]
    low, high = min(means), max(means)
    top = len(BLOCKS) - 1
    return "".join(BLOCKS[round((mean - low) / (high - low) * top) if high > low else 0] for mean in means)


def summary_table(runs: Sequence[Run]) -> Table:
    """The summary with a column per run, so that a few runs fit a narrow terminal side by side."""
    cells = [RunSummary.of(run).cells() for run in runs]
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("")
    for run in runs:
        table.add_column(run.label, justify="right", overflow="fold")
    for heading in cells[0]:
        table.add_row(heading, *(row[heading] for row in cells))
    return table


def curve_line(name: str, steps: list[int], values: list[float], decimals: int) -> Text:
    """  valid BLEU  ▁▄▇█  33.61 → 87.25  (steps 250–1,000)"""
    if not values:
        return Text(f"  {name:<11} no lines yet", style="dim")
    return Text.assemble(f"  {name:<11} ", (sparkline(values), "cyan"),
                         f"  {values[0]:.{decimals}f} → {values[-1]:.{decimals}f}",
                         (f"  (steps {steps[0]:,}–{steps[-1]:,})", "dim"))


def print_report(console: Console, runs: Sequence[Run], levels: Sequence[float]) -> None:
    console.print(summary_table(runs))
    for run in runs:
        console.print()
        console.print(Text(run.label, style="bold"))
        scored = [line for line in run.valid if line.get("valid_bleu") is not None]
        console.print(curve_line("valid BLEU", [line["step"] for line in scored],
                                 [line["valid_bleu"] for line in scored], 2))
        console.print(curve_line("train loss", [line["step"] for line in run.train],
                                 [line["loss"] for line in run.train], 3))
        for level in levels:
            console.print(f"  BLEU {level:g}: {milestone_text(time_to_bleu(run, level))}")
        if run.tensorboard is not None:
            console.print(Text(f"  TensorBoard: tensorboard --logdir {run.tensorboard}", style="dim"))
    console.print()
    console.print(Text("The curves against steps and training time, the data, the recipe and the score cards, "
                       "in one page:", style="dim"))
    console.print(Text(f"  mtx report {shlex.join(run.label for run in runs)} -o report.html", style="dim"))
