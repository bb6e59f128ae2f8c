"""Attention heatmaps and head statistics in the terminal, drawn with rich.

A heatmap has one line per query (its label on the left) and one column per key (its label on top). Each cell
shows the weight in percent, rounded ("·" where it rounds to 0, blank where the query may not attend the key),
on a background shaded from white (0) to dark blue (1); without colours (a pipe, NO_COLOR) the numbers remain.
A column is as wide as its label, up to `MAX_LABEL` terminal cells (longer labels are cut, ending in "…"). A map
wider than the terminal is cut into blocks of columns, one under the other, each with the row labels repeated,
so that no line wraps and every cell stays under its label.
"""

from __future__ import annotations

from rich.cells import cell_len, set_cell_size
from rich.console import Console
from rich.style import Style
from rich.table import Table
from rich.text import Text
from torch import Tensor

from mtx.analysis.head_stats import HeadStats
from mtx.analysis.inspection import Inspection, View

MAX_LABEL = 8  # characters of a column or row label
LIGHT, DARK = (255, 255, 255), (8, 48, 107)  # the shades of weight 0 and weight 1


def fitted(label: str, width: int) -> str:
    """`label` right-aligned in exactly `width` terminal cells (a CJK character or an emoji takes two), cut to
    end in "…" if it is wider."""
    if cell_len(label) > width:
        label = set_cell_size(label, width - 1).rstrip() + "…"
    return " " * (width - cell_len(label)) + label


def shade(weight: float) -> Style:
    """The cell style of a weight: a background between LIGHT and DARK, with text that stays legible on it."""
    r, g, b = (round(light + (dark - light) * weight) for light, dark in zip(LIGHT, DARK, strict=True))
    return Style(bgcolor=f"rgb({r},{g},{b})", color="white" if weight > 0.5 else "black")


def cell(weight: float, allowed: bool, width: int) -> Text:
    if not allowed:
        return Text(" " * width)
    percent = round(100 * weight)
    return Text(f"{percent if percent else '·':>{width}}", style=shade(weight))


def column_blocks(widths: list[int], room: int) -> list[range]:
    """Consecutive ranges of columns, each as many as fit in `room` characters (a space before each column),
    at least one."""
    blocks, start, used = [], 0, 0
    for column, width in enumerate(widths):
        if column > start and used + 1 + width > room:
            blocks.append(range(start, column))
            start, used = column, 0
        used += 1 + width
    return [*blocks, range(start, len(widths))]


def heatmap_lines(weights: Tensor, allowed: Tensor, rows: list[str], columns: list[str], width: int) -> list[Text]:
    """The lines of a (rows, columns) heatmap, cut into blocks of columns that fit in `width` characters."""
    row_width = min(max(map(cell_len, rows)), MAX_LABEL)
    widths = [min(max(cell_len(label), 3), MAX_LABEL) for label in columns]
    values, permitted = weights.tolist(), allowed.tolist()
    blocks = column_blocks(widths, max(width - row_width, 1))
    lines = []
    for number, block in enumerate(blocks):
        if len(blocks) > 1:
            lines.append(Text(f"columns {block.start + 1}–{block.stop} of {len(columns)}", style="dim"))
        header = Text(" " * row_width)
        for column in block:
            header.append(f" {fitted(columns[column], widths[column])}", style="bold")
        lines.append(header)
        for row, label in enumerate(rows):
            line = Text(fitted(label, row_width), style="bold")
            for column in block:
                line.append(" ")
                line.append_text(cell(values[row][column], permitted[row][column], widths[column]))
            lines.append(line)
        if number < len(blocks) - 1:
            lines.append(Text())
    return lines


def statistics_line(stats: HeadStats) -> str:
    return (f"entropy {stats.entropy_bits:.2f} bits · previous {stats.previous:.0%} · same {stats.same:.0%} · "
            f"boundary {stats.boundary:.0%} · punctuation {stats.punctuation:.0%}")


def axes(view: View) -> str:
    columns = {"encoder": "source tokens", "decoder": "the target tokens read so far", "cross": "source tokens"}
    rows = "source tokens" if view.kind == "encoder" else "the token each step predicts"
    return f"rows: {rows}; columns: {columns[view.kind]}"


def print_heatmaps(console: Console, inspection: Inspection, views: list[View]) -> None:
    """One heatmap per view, each under its title and its statistics."""
    for view in views:
        rows, columns = inspection.labels(view.kind)
        console.print(Text(view.title(), style="bold"))
        console.print(Text(axes(view), style="dim"))
        console.print(Text(statistics_line(view.statistics(inspection)), style="dim"))
        lines = heatmap_lines(view.weights(inspection), view.allowed(inspection), rows, columns, console.width)
        for line in lines:
            console.print(line, no_wrap=True, overflow="ignore", crop=False)
        console.print()


def statistics_table(stats: list[HeadStats]) -> Table:
    """The statistics of `stats`, one row each."""
    table = Table(title="Per-head statistics: entropy in bits; shares of attention, means over the rows",
                  title_justify="left")
    for name in ("kind", "layer", "head", "entropy", "previous", "same", "boundary", "punct."):
        table.add_column(name, justify="left" if name == "kind" else "right")
    for s in stats:
        table.add_row(s.kind, str(s.layer), "mean" if s.head is None else str(s.head),
                      f"{s.entropy_bits:.2f}", f"{s.previous:.0%}", f"{s.same:.0%}", f"{s.boundary:.0%}",
                      f"{s.punctuation:.0%}")
    return table
