"""`mtx report`: how training runs went, from the files they leave behind, in the terminal or as one HTML page.

A report only reads, so it can be run on a run still training (a line being written is left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from mtx.errors import MtxError, require_extra

if TYPE_CHECKING:
    from rich.console import Console


def report(
    runs: Annotated[list[Path], typer.Argument(help="Run folders (runs/<name>), one or more to compare.",
                                               metavar="RUN_DIR", show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="REPORT.html", help="Write one self-contained HTML page (needs mtx[report]) "
        "instead of printing the summary.")] = None,
    bleu_milestones: Annotated[str | None, typer.Option(
        "--bleu-milestones", metavar="LIST", help="Comma-separated BLEU levels to give the time to, e.g. 20,25,27. "
        "[default: the levels of the runs' train.bleu_milestones]")] = None,
) -> None:
    """Show how training runs went: learning curves, time to BLEU, data counts, model size, recipes, score cards.

    In the terminal: a summary per run (steps, training time, best valid BLEU, final losses, tokens/s,
    parameters), sparklines of valid BLEU and train loss, and when BLEU reached each level. With -o: one
    HTML page that needs no network, with the train and valid loss, valid BLEU and learning rate against
    steps and training time (several runs overlaid), the data manifest's counts and each filter's drops, the
    recipe keys that differ between the runs, and the score cards of any score*.json in the run folders.

    Example: mtx report runs/demo -o runs/demo/report.html

    Example: mtx report runs/base runs/big --bleu-milestones 25,27
    """
    from rich.console import Console

    levels = None if bleu_milestones is None else parse_levels(bleu_milestones)
    report_runs(runs, output, levels, Console(highlight=False))


def report_runs(folders: Sequence[Path], output: Path | None, asked_levels: Sequence[float] | None,
                console: Console) -> None:
    """Report the runs in `folders`: the page written to `output` if given, else the summary printed to
    `console`. Time to BLEU is given for `asked_levels`, else the levels the runs' recipes name."""
    from rich.text import Text

    from mtx.report.charts import draw_charts
    from mtx.report.page import write_page
    from mtx.report.run_folder import read_run
    from mtx.report.summary import bleu_levels
    from mtx.report.terminal import print_report

    if len(set(map(Path.resolve, folders))) < len(folders):
        raise MtxError("A run folder is given twice: name each run once.")
    if output is not None:
        require_extra("report", ["matplotlib"], "mtx report -o (its charts)",
                      otherwise="Without -o, mtx report prints its summary in the terminal.")
    runs = [read_run(folder) for folder in folders]
    levels = bleu_levels(runs, asked_levels)
    if output is None:
        print_report(console, runs, levels)
        return
    write_page(output, runs, draw_charts(runs, levels), levels)
    console.print(Text(f"wrote {output}: the learning curves, time to BLEU, score cards, recipe and data of "
                       f"{len(runs)} run{'s' if len(runs) > 1 else ''}", style="dim"))


def parse_levels(text: str) -> list[float]:
    """BLEU levels from "20,25,27"; anything but numbers in (0, 100] is a user error."""
    try:
        levels = [float(part) for part in text.split(",")]
    except ValueError:
        levels = []
    if not levels or not all(0 < level <= 100 for level in levels):
        raise MtxError(f"--bleu-milestones {text}: give BLEU levels in (0, 100], separated by commas, e.g. 20,25,27.")
    return levels
