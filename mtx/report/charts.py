"""The learning curves of `mtx report -o`, drawn by matplotlib as SVG images.

matplotlib is the optional extra `mtx[report]`: a page of static SVG needs no script and no network, prints
as it shows, and scales without blur. Text is drawn as paths from the font matplotlib ships (DejaVu Sans),
so a chart looks the same whatever fonts the machine that draws it or the one that shows it has installed.
The SVG carries no date and a fixed hash salt, so the same runs give the same bytes.

One figure per curve: train loss, valid loss, valid BLEU (and each language pair's, for a model of several) and
the learning rate, against steps and, beside
that, against the training clock (the `seconds` of metrics.jsonl: wall-clock training time summed over
resumes), every run overlaid in the same colour in both panels. Runs whose log has no clock appear against
steps only. The BLEU levels of the report are drawn across the BLEU chart, so time to BLEU can be read off.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

from mtx.report.run_folder import Run

STYLE = {"svg.fonttype": "path", "svg.hashsalt": "mtx report", "font.family": "DejaVu Sans", "font.size": 9,
         "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3}
MARKED_POINTS = 60  # a series of at most this many points shows each point


@dataclass(frozen=True)
class Curve:
    """One learning curve: a field of the train or valid lines."""

    title: str
    lines: str  # "train" or "valid"
    field: str
    pair: str | None = None  # a language pair of a model of several: the field of its valid_pairs entry

    def points(self, run: Run) -> list[tuple[int, float | None, float]]:
        """(step, training seconds or None, value) of every line of `run` that has the field."""
        return [(line["step"], line.get("seconds"), value) for line in getattr(run, self.lines)
                if (value := self.value(line)) is not None]

    def value(self, line: dict) -> float | None:
        return line.get(self.field) if self.pair is None else line.get("valid_pairs", {}).get(self.pair, {}).get(
            self.field)


CURVES = (Curve("Train loss", "train", "loss"), Curve("Valid loss", "valid", "valid_loss"),
          Curve("Valid BLEU", "valid", "valid_bleu"), Curve("Learning rate", "train", "lr"))


def pair_curves(runs: Sequence[Run]) -> list[Curve]:
    """A valid BLEU curve per language pair that a run of a model of several pairs validated."""
    pairs = dict.fromkeys(pair for run in runs for pair in run.pairs)
    return [Curve(f"Valid BLEU, {pair}", "valid", "bleu", pair) for pair in pairs]


@dataclass(frozen=True)
class Chart:
    title: str
    description: str  # what the image shows, for the page's alt text
    svg: bytes


def time_unit(seconds: float) -> tuple[float, str]:
    """(seconds per unit, name) of the clock axis: hours for a long run, minutes or seconds for a short one."""
    if seconds >= 2 * 3600:
        return 3600.0, "hours"
    return (60.0, "minutes") if seconds >= 120 else (1.0, "seconds")


def draw_charts(runs: Sequence[Run], bleu_levels: Sequence[float]) -> list[Chart]:
    """A chart per curve that some run has points of, every run overlaid."""
    return [draw_curve(curve, runs, bleu_levels if curve.field == "valid_bleu" else ())
            for curve in (*CURVES, *pair_curves(runs)) if any(curve.points(run) for run in runs)]


def draw_curve(curve: Curve, runs: Sequence[Run], levels: Sequence[float]) -> Chart:
    """`curve` of every run against steps and, where any run's log has the clock, against training time."""
    import matplotlib

    with matplotlib.rc_context(STYLE):
        return _draw(curve, runs, levels)


def _draw(curve: Curve, runs: Sequence[Run], levels: Sequence[float]) -> Chart:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    series = [(run.label, curve.points(run)) for run in runs]
    clocked = [(label, [(s, v) for _, s, v in points if s is not None]) for label, points in series]
    most_seconds = max((s for _, points in clocked for s, _ in points), default=None)
    figure = Figure(figsize=(10, 3.2) if most_seconds is not None else (5.5, 3.2), layout="constrained")
    panels = figure.subplots(1, 2 if most_seconds is not None else 1, sharey=True, squeeze=False)[0]
    for colour, (label, points) in enumerate(series):
        _plot(panels[0], [step for step, _, _ in points], [v for _, _, v in points], label, colour)
    panels[0].set_xlabel("step")
    panels[0].xaxis.set_major_locator(MaxNLocator(integer=True))
    described = "against steps"
    if most_seconds is not None:
        per_unit, unit = time_unit(most_seconds)
        for colour, (label, points) in enumerate(clocked):
            _plot(panels[1], [s / per_unit for s, _ in points], [v for _, v in points], label, colour)
        panels[1].set_xlabel(f"training time ({unit})")
        described += f" and against training time in {unit}"
    panels[0].set_ylabel(curve.title)
    if curve.field == "lr":
        panels[0].ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    for level in levels:
        for panel in panels:
            panel.axhline(level, color="0.5", linestyle=":", linewidth=0.8)
    panels[-1].legend(loc="best", fontsize=8)
    figure.suptitle(curve.title, fontsize=11)
    svg = io.BytesIO()
    figure.savefig(svg, format="svg", metadata={"Date": None})
    return Chart(curve.title, f"{curve.title} of {', '.join(run.label for run in runs)}, {described}.",
                 svg.getvalue())


def _plot(panel, xs: list[float], ys: list[float], label: str, colour: int) -> None:
    """One run's series, in the run's colour, each point marked when there are few (a single one shows)."""
    panel.plot(xs, ys, label=label, color=f"C{colour % 10}", linewidth=1.4,
               marker="o" if len(xs) <= MARKED_POINTS else None, markersize=3)
