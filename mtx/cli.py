"""The `mtx` command line: Typer wired to the commands, each of which lives in its stage's `command.py`.

    mtx config                mtx/config/command.py       mtx translate    mtx/decode/command.py
    mtx prepare               mtx/data/command.py         mtx score        mtx/score/command.py
    mtx train, mtx average    mtx/train/command.py        mtx inspect      mtx/analysis/command.py
    mtx export                mtx/export/command.py       mtx report       mtx/report/command.py
    mtx serve                 mtx/serve/command.py        mtx import       mtx/importing/command.py

A command module holds the command's arguments, help and examples, and what only the command does (reading its
inputs, printing its results); it imports torch and the rest of its stage inside the command, so that
`mtx --help` and `mtx score` start at once. Here: the global options, and a user error (MtxError) turned into
a one-paragraph message on standard error and exit code 1; `--debug` shows the traceback instead.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from mtx import __version__
from mtx.analysis.command import inspect
from mtx.config.command import config
from mtx.data.command import prepare
from mtx.decode.command import translate
from mtx.errors import MtxError, PeersLostError, first_line, is_out_of_memory
from mtx.export.command import export
from mtx.importing.command import import_model
from mtx.report.command import report
from mtx.score.command import score
from mtx.serve.command import serve
from mtx.train.command import average, train

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

for command in (config, prepare, train, average, translate, score, inspect, export, serve, report):  # in pipeline order
    app.command()(command)
app.command(name="import")(import_model)  # a published model to start from; `import` is Python's keyword


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
    """Print a user error and exit 1.

    The message is printed verbatim, never read as rich markup or emoji codes: it quotes file names and
    values, and a path like `runs/[old]/ref.de` must be shown as it is, not lose `[old]` or raise a MarkupError.
    """
    from rich.console import Console
    from rich.text import Text

    Console(stderr=True, highlight=False, soft_wrap=True).print(Text.assemble(("error:", "bold red"), " ", message))
    raise typer.Exit(1)


def _out_of_memory(error: BaseException) -> str:
    """What to do when a command runs out of memory: ask for less at once. PyTorch's allocators fail for what
    a batch needs; Python's MemoryError (numpy's too) for what the command holds on the host, the data above all."""
    if isinstance(error, MemoryError):
        return (f"Out of memory ({first_line(error)}): the machine cannot hold what the command asked for. Ask for "
                "less at once — for `mtx prepare`, fewer lines to learn the vocabulary on (data.bpe.max_lines); "
                "for `mtx train`, lower data.sources' weights (an epoch holds each corpus' pairs times its "
                "weight); for `mtx translate`, a smaller --batch-tokens.")
    return (f"Out of memory ({first_line(error)}): ask for less at once — train.max_tokens for training, "
            "--batch-tokens or --beam for translation.")


def main() -> None:
    """Entry point: Typer handles usage errors (exit 2); an MtxError, or running out of memory, becomes a
    clean message and exit 1 (at once, skipping the interpreter's clean-up, after a PeersLostError)."""
    try:
        app()
    except Exception as e:
        if _state["debug"] or not (isinstance(e, MtxError) or is_out_of_memory(e)):
            raise
        message = str(e) if isinstance(e, MtxError) else _out_of_memory(e)
        try:
            fail(message)
        except typer.Exit as exit_:
            if isinstance(e, PeersLostError):
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(exit_.exit_code)
            sys.exit(exit_.exit_code)
