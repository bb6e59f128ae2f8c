"""`mtx inspect`: translate one sentence and show what every attention head saw, in the terminal or a page.

What is printed: the sentence and its translation, then one heatmap per selected view (mtx.analysis.attention_terminal),
then the table of the selected views' statistics. With `-o PAGE.html` the page (mtx.analysis.attention_page), which
holds every kind, layer and head, is written instead of the heatmaps. With `--json` standard output is one JSON
object instead: the sentence, the translation, the labels and the selected views' statistics.
"""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.text import Text

from mtx.analysis.attention_page import write_page
from mtx.analysis.attention_terminal import print_heatmaps, statistics_table
from mtx.analysis.inspection import KINDS, Inspection, View, inspect_sentence, select_views
from mtx.checkpoint import load_model
from mtx.config.recipe import DecodeConfig


def summary_json(inspection: Inspection, views: list[View]) -> str:
    """The --json object: the pair, its labels per kind, and the selected views' statistics (head null: the
    layer's heads averaged)."""
    labels = {kind: dict(zip(("rows", "columns"), inspection.labels(kind), strict=True)) for kind in KINDS}
    statistics = [view.statistics(inspection).as_dict() for view in views]
    return json.dumps({"source": inspection.source, "translation": inspection.translation, "score": inspection.score,
                       "forced": inspection.forced, "labels": labels, "statistics": statistics}, ensure_ascii=False)


def inspect_checkpoint(checkpoint: Path, sentence: str, *, target: str | None, kind: str, layer: int | None,
                       head: str, output: Path | None, as_json: bool, console: Console) -> Inspection:
    """`mtx inspect`: the model of `checkpoint` on the CPU, `sentence` translated with its recipe's decoding
    settings (or `target` taken as the translation), the views that `kind`, `layer` and `head` select printed
    to `console` (see the module docstring), and the page written to `output` if given."""
    model, tokenizer, loaded = load_model(checkpoint, "cpu")
    inspection = inspect_sentence(model, tokenizer, DecodeConfig.of_checkpoint(loaded, nbest=1), sentence, target)
    views = select_views(inspection, kind, layer, head)
    if output is not None:
        write_page(output, inspection)
    if as_json:
        console.file.write(summary_json(inspection, views) + "\n")
        return inspection
    console.print(Text.assemble(("source       ", "bold"), inspection.source))
    console.print(Text.assemble(("target       " if inspection.forced else "translation  ", "bold"),
                                inspection.translation, (f"  (score {inspection.score:.4f})", "dim")))
    console.print()
    if output is None:
        print_heatmaps(console, inspection, views)
    console.print(statistics_table([view.statistics(inspection) for view in views]))
    if output is not None:
        console.print(Text(f"wrote {output}: every kind, layer and head, with a picker", style="dim"))
    return inspection
