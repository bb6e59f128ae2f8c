"""`mtx config`: a recipe resolved, presets expanded, with the model's parameter count; or every recipe key.

The recipe arguments that `mtx prepare` and `mtx train` share with it are defined here too (`RecipeArg`,
`SetOpt`), and the reading of a run's recipe (`read_run_recipe`), so that the three commands read recipes alike.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from mtx.config.recipe import Recipe
    from mtx.config.run_recipe import CheckpointReader

RecipeArg = Annotated[
    Path, typer.Argument(help="A YAML recipe, e.g. recipes/demo.yaml.", metavar="RECIPE.yaml", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key by its dotted path, e.g. --set train.max_steps=200."),
]


def read_run_recipe(recipe: Path, overrides: list[str] | None = None) -> Recipe:
    """The recipe as the commands run it: a fine-tuning recipe takes its parent's model section, its parent
    checked (mtx.config.run_recipe), the checkpoints read by mtx.checkpoint."""
    from mtx.config.run_recipe import load_run_recipe

    return load_run_recipe(recipe, overrides, _checkpoint_reader)


def _checkpoint_reader() -> CheckpointReader:
    import mtx.checkpoint  # and torch with it: only for a recipe that fine-tunes

    return mtx.checkpoint


def config(
    ctx: typer.Context,
    recipe: Annotated[Path | None, typer.Argument(
        help="A YAML recipe, e.g. recipes/demo.yaml.", metavar="RECIPE.yaml", show_default=False)] = None,
    set_: SetOpt = None,
    keys: Annotated[bool, typer.Option(
        "--keys", help="List every recipe key with its type, default and help instead (with RECIPE: and the "
        "recipe's own value where it differs from the default).")] = False,
) -> None:
    """Print the fully resolved recipe (presets expanded) and the model's parameter count; or every recipe key.

    Example: mtx config recipes/wmt14_en_de_base.yaml --set model.preset=big

    Example: mtx config --keys | grep -A1 train.max_tokens
    """
    from mtx.config.keys import all_keys, format_keys
    from mtx.config.loading import dump_recipe

    if recipe is None and not keys:
        ctx.fail("Missing argument 'RECIPE.yaml'.")
    resolved = None if recipe is None else read_run_recipe(recipe, set_)  # a fine-tuning one: its parent's model
    if keys:
        sys.stdout.write(format_keys(all_keys(), resolved))
        return
    from mtx.model.transformer import count_parameters_for

    sys.stdout.write(dump_recipe(resolved))
    vocab_size = resolved.data.bpe.vocab_size
    if resolved.data.bpe.from_ is not None:  # the borrowed vocabulary's size, not the unused vocab_size key
        from mtx.data.vocabulary import borrowed_tokenizer

        vocab_size = borrowed_tokenizer(resolved.data).vocab_size
    params = count_parameters_for(resolved.model, vocab_size)
    sys.stdout.write(f"# params: {params:,} (vocabulary {vocab_size:,})\n")
