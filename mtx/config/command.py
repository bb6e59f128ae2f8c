"""`mtx config`: a recipe resolved, presets expanded, with the model's parameter count; or every recipe key.

The recipe arguments that `mtx prepare` and `mtx train` share with it are defined here too (`RecipeArg`,
`SetOpt`), so that the three commands read recipes alike.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

RecipeArg = Annotated[
    Path, typer.Argument(help="A YAML recipe, e.g. recipes/demo.yaml.", metavar="RECIPE.yaml", show_default=False)
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", help="Override a recipe key by its dotted path, e.g. --set train.max_steps=200."),
]


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
    if recipe is not None:
        from mtx.train.fine_tuning import load_run_recipe  # a fine-tuning recipe takes its parent's model section

        resolved = load_run_recipe(recipe, set_)
    else:
        resolved = None
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
