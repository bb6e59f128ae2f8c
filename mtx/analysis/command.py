"""`mtx inspect`: translate one sentence and show what every attention head saw, in the terminal or a page.

What is printed: the sentence and its translation, then one heatmap per selected view (mtx.analysis.attention_terminal),
then the table of the selected views' statistics. With `-o PAGE.html` the page (mtx.analysis.attention_page), which
holds every kind, layer and head, is written instead of the heatmaps. With `--json` standard output is one JSON
object instead: the sentence, the translation, the labels and the selected views' statistics.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from rich.console import Console

    from mtx.analysis.inspection import Inspection, View


def inspect(
    model: Annotated[Path, typer.Option("-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average).")],
    sentence: Annotated[str, typer.Argument(help="The sentence to translate and inspect.", metavar="SENTENCE",
                                            show_default=False)],
    output: Annotated[Path | None, typer.Option(
        "-o", "--output", metavar="PAGE.html", help="Write one self-contained HTML page with every kind, layer and "
        "head (a picker, the heatmap, the statistics), instead of printing the heatmaps.")] = None,
    kind: Annotated[str, typer.Option(
        metavar="encoder|decoder|cross|all", help="Which attention to print: encoder or decoder self-attention, "
        "or the decoder's cross-attention over the source.")] = "all",
    layer: Annotated[int | None, typer.Option(metavar="N", help="Print only layer N (0-based). [default: all]")] = None,
    head: Annotated[str, typer.Option(
        metavar="all|mean|N", help="all: every head, then their average; mean: the average alone; N: head N.")] = "all",
    target: Annotated[str | None, typer.Option(
        metavar="TEXT", help="Inspect this translation instead of the model's (to see why it was not chosen).")] = None,
    json_: Annotated[bool, typer.Option(
        "--json", help="Print one JSON object instead: the sentence, its translation, the token labels and the "
        "statistics of the selected heads.")] = False,
) -> None:
    """Translate one sentence and show every layer's and head's attention, with per-head statistics.

    The sentence is translated with the checkpoint's recipe settings (decode:), on the CPU, and every layer's
    and head's weights are kept: encoder self-attention (rows and columns: source tokens), decoder
    self-attention (rows: the token each step predicts, </s> last; columns: the tokens read so far, <s> first)
    and cross-attention (rows: as the decoder's; columns: source tokens). Each heatmap cell is a weight in
    percent; a map wider than the terminal is cut into blocks of columns. Tokens that continue a word are
    shown after '·'. Statistics per head: entropy in bits, and the shares of attention on the previous
    position, the same position, the sentence boundary (</s> of the source, <s> of the target) and
    punctuation, averaged over the rows.

    Example: mtx inspect -m runs/demo/average.pt "The old friends tidy up his kitchen." --kind cross --head mean

    Example: mtx inspect -m runs/demo/average.pt "The old friends tidy up his kitchen." -o attention.html
    """
    from rich.console import Console

    inspect_checkpoint(model, sentence, target=target, kind=kind, layer=layer, head=head, output=output,
                       as_json=json_, console=Console(highlight=False))


def summary_json(inspection: Inspection, views: list[View]) -> str:
    """The --json object: the pair, its labels per kind, and the selected views' statistics (head null: the
    layer's heads averaged)."""
    from mtx.analysis.inspection import KINDS

    labels = {kind: dict(zip(("rows", "columns"), inspection.labels(kind), strict=True)) for kind in KINDS}
    statistics = [view.statistics(inspection).as_dict() for view in views]
    return json.dumps({"source": inspection.source, "translation": inspection.translation, "score": inspection.score,
                       "forced": inspection.forced, "labels": labels, "statistics": statistics}, ensure_ascii=False)


def inspect_checkpoint(checkpoint: Path, sentence: str, *, target: str | None, kind: str, layer: int | None,
                       head: str, output: Path | None, as_json: bool, console: Console) -> Inspection:
    """`mtx inspect`: the model of `checkpoint` on the CPU, `sentence` translated with its recipe's decoding
    settings (or `target` taken as the translation), the views that `kind`, `layer` and `head` select printed
    to `console` (see the module docstring), and the page written to `output` if given."""
    from rich.text import Text

    from mtx.analysis.attention_page import write_page
    from mtx.analysis.attention_terminal import print_heatmaps, statistics_table
    from mtx.analysis.inspection import inspect_sentence, select_views
    from mtx.checkpoint import describe_checkpoint, load_model
    from mtx.config.recipe import DecodeConfig
    from mtx.decode.ensemble import without_weights
    from mtx.decode.facts import ModelFacts
    from mtx.decode.torch_engine import engine_of_model

    model, tokenizer, loaded = load_model(checkpoint, "cpu")
    engine = engine_of_model(model, ModelFacts.of_metadata([checkpoint], tokenizer, [without_weights(loaded)]))
    inspection = inspect_sentence(engine, DecodeConfig.of_checkpoint(loaded, nbest=1), sentence, target)
    views = select_views(inspection, kind, layer, head)
    if output is not None:
        write_page(output, inspection)
    if as_json:
        console.file.write(summary_json(inspection, views) + "\n")
        return inspection
    console.print(Text.assemble(("model        ", "bold"), f"{checkpoint} ({describe_checkpoint(loaded)})"))
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
