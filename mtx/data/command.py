"""`mtx prepare`: a recipe's corpus cleaned, its joint BPE learnt and its splits written to the run's data/."""

from __future__ import annotations

from typing import Annotated

import typer

from mtx.config.command import RecipeArg, SetOpt, read_run_recipe


def prepare(
    recipe: RecipeArg,
    set_: SetOpt = None,
    workers: Annotated[
        int | None, typer.Option("--workers", min=1, help="Processes for cleaning and encoding [default: all cores].")
    ] = None,
) -> None:
    """Clean the recipe's corpus, learn the joint BPE and write the memory-mapped splits to the run's data/.

    Re-running with an unchanged data section and input files does nothing.

    Example: mtx prepare recipes/demo.yaml --workers 4
    """
    from mtx.data.prepare import prepare as prepare_data

    prepare_data(read_run_recipe(recipe, set_), workers=workers)
