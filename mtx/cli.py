"""The `mtx` command line. Each command reads its arguments and calls one library function.

Heavy imports (torch, datasets) happen inside the commands that need them, so `mtx --help` and `mtx score`
start at once. A user error (MtxError) becomes a one-paragraph message on standard error and exit code 1;
`--debug` shows the traceback instead.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx import __version__
from mtx.errors import MtxError

app = typer.Typer(
    name="mtx",
    help="Machine translation with the Transformer of 'Attention Is All You Need'.\n\n"
    "Example: mtx prepare recipes/demo.yaml && mtx train recipes/demo.yaml",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_state = {"debug": False}

RecipeArg = Annotated[
    Path, typer.Argument(help="A YAML recipe, e.g. recipes/demo.yaml.", metavar="RECIPE.yaml", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key by its dotted path, e.g. --set train.max_steps=200."),
]


def _version(value: bool) -> None:
    if value:
        print(f"mtx {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit.")
    ] = False,
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
) -> None:
    _state["debug"] = debug


def fail(message: str) -> None:
    """Print a user error and exit 1."""
    from rich.console import Console

    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(1)


@app.command()
def config(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Print the fully resolved recipe (presets expanded) and the model's parameter count.

    Example: mtx config recipes/wmt14_en_de_base.yaml --set model.preset=big
    """
    from mtx.config import dump_recipe, load_recipe
    from mtx.model import count_parameters_for

    resolved = load_recipe(recipe, set_)
    sys.stdout.write(dump_recipe(resolved))
    params = count_parameters_for(resolved.model, resolved.data.bpe.vocab_size)
    sys.stdout.write(f"# params: {params:,} (vocabulary {resolved.data.bpe.vocab_size:,})\n")


@app.command()
def average(
    output: Annotated[Path, typer.Option("-o", "--output", help="The averaged checkpoint to write.")],
    checkpoints: Annotated[
        list[Path] | None, typer.Argument(help="Checkpoints to average.", metavar="CKPT...", show_default=False)
    ] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="A run's checkpoints/ folder; use with --last.")
    ] = None,
    last: Annotated[int | None, typer.Option("--last", min=1, help="Average the last N step_<N>.pt by step.")] = None,
) -> None:
    """Average checkpoints parameter-wise into one self-contained checkpoint for translation.

    The paper averages the last 5 checkpoints of base models and the last 20 of big ones.

    Example: mtx average --dir runs/demo/checkpoints --last 5 -o runs/demo/average.pt
    """
    from mtx.checkpoint import average_checkpoints, save_checkpoint, step_checkpoints

    if bool(checkpoints) == (directory is not None):
        raise MtxError("Name the checkpoints to average one way: as files (mtx average a.pt b.pt -o avg.pt) "
                       "or as --dir RUN/checkpoints --last N.")
    if directory is not None:
        if last is None:
            raise MtxError("--dir needs --last N: how many of the latest step checkpoints to average.")
        found = step_checkpoints(directory)
        if not found:
            raise MtxError(f"No step_<N>.pt checkpoints in {directory}: train first with `mtx train RECIPE`.")
        if len(found) < last:
            raise MtxError(f"--last {last} asks for more checkpoints than the {len(found)} in {directory}.")
        checkpoints = [path for _, path in found[-last:]]
    elif last is not None:
        raise MtxError("--last only applies with --dir.")
    save_checkpoint(average_checkpoints(checkpoints), output)
    sys.stderr.write(f"averaged {len(checkpoints)} checkpoints → {output}\n")


@app.command()
def score(
    references: Annotated[
        list[Path],
        typer.Option("-r", "--ref", metavar="REF", help="A reference file, one line per sentence; repeat for more."),
    ],
    input_: Annotated[
        Path | None,
        typer.Option("-i", "--input", metavar="HYP", help="Hypotheses, one line per sentence [default: stdin]."),
    ] = None,
    metrics: Annotated[
        str, typer.Option("--metrics", metavar="LIST", help="Comma-separated: bleu, chrf, ter.")
    ] = "bleu",
    tokenize: Annotated[
        str, typer.Option("--tokenize", metavar="13a|intl|zh|none", help="The BLEU tokenizer.")
    ] = "13a",
    paper_bleu: Annotated[
        bool, typer.Option("--paper-bleu", help="Also the paper's tokenized En-De BLEU (Moses + ##AT##).")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    min_bleu: Annotated[
        float | None,
        typer.Option("--min-bleu", metavar="X", help="Exit 1 if BLEU (the paper's, with --paper-bleu) is below X."),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", metavar="OTHER_HYP", help="Another system's output: paired bootstrap p-values."),
    ] = None,
) -> None:
    """Score translations with sacreBLEU (BLEU, chrF, TER), each score with its signature.

    Example: mtx translate -m avg.pt -i newstest2014.en | mtx score -r newstest2014.de --paper-bleu --min-bleu 25
    """
    import json

    from mtx.score import check_min_bleu, print_table, score_files

    result = score_files(references, input_, metrics.split(","), tokenize, paper_bleu, baseline)
    if json_:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print_table(result)
    if min_bleu is not None:
        check_min_bleu(result, min_bleu)


def main() -> None:
    """Entry point: Typer handles usage errors (exit 2); an MtxError becomes a clean message and exit 1."""
    try:
        app()
    except MtxError as e:
        if _state["debug"]:
            raise
        try:
            fail(str(e))
        except typer.Exit as exit_:
            sys.exit(exit_.exit_code)
