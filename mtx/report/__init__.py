"""`mtx report`: how training runs went, from the files they leave behind, in the terminal or as one HTML page.

    run_folder   a run's folder read: metrics.jsonl, data manifest, latest checkpoint, score cards
    summary      what the report says about runs: summary row, time to BLEU, recipe differences
    terminal     the summary table and sparklines, with rich (mtx's own dependencies)
    charts       the learning curves as SVG, with matplotlib (the optional extra mtx[report])
    page         the self-contained HTML page that holds it all

A report only reads, so it can be run on a run still training (a line being written is left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mtx.errors import MtxError
from mtx.report.charts import draw_charts, require_matplotlib
from mtx.report.page import write_page
from mtx.report.run_folder import read_run
from mtx.report.summary import bleu_levels
from mtx.report.terminal import print_report


def report_runs(folders: Sequence[Path], output: Path | None, asked_levels: Sequence[float] | None,
                console: Console) -> None:
    """Report the runs in `folders`: the page written to `output` if given, else the summary printed to
    `console`. Time to BLEU is given for `asked_levels`, else the levels the runs' recipes name."""
    if len(set(map(Path.resolve, folders))) < len(folders):
        raise MtxError("A run folder is given twice: name each run once.")
    if output is not None:
        require_matplotlib()
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
