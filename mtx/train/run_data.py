"""The prepared data of a run as the trainer takes it: checked against the recipe, cut into batches it can hold.

mtx.data.prepared reads the files back; this module decides what the trainer makes of them. A pair longer than the
model's position table or the token budget of a batch cannot be trained on, so it is left out of every batch
(with a warning for the training split) rather than failing the run at the batch that holds it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtx.config.recipe import Recipe
from mtx.data.batching import PairSource, make_batches, pair_costs, pairs_within
from mtx.data.prepared import TokenSplit, load_split
from mtx.errors import MtxError


@dataclass
class ValidSet:
    """The valid split: its pairs the model can hold, batched, for the valid loss; its text, for BLEU."""

    split: TokenSplit
    batches: list[np.ndarray]
    sources: list[str]  # the first train.valid_max_sentences source lines, decoded for BLEU
    refs: list[str]  # their references


def check_data_matches_recipe(recipe: Recipe, manifest: dict[str, Any], data_dir: Path) -> None:
    """Refuse data prepared for another vocabulary size or language pair: a model trained on it would not be
    the recipe's model, and the mismatch would otherwise surface only as a wrong result."""
    data = recipe.data
    prepared = (manifest["bpe"]["vocab_size_requested"], manifest["src_lang"], manifest["tgt_lang"])
    if prepared != (data.bpe.vocab_size, data.src_lang, data.tgt_lang):
        raise MtxError(
            f"The data in {data_dir} was prepared with data.bpe.vocab_size = {prepared[0]} for "
            f"{prepared[1]}→{prepared[2]}, but the recipe asks for {data.bpe.vocab_size} and "
            f"{data.src_lang}→{data.tgt_lang}: run `mtx prepare RECIPE` again with this recipe."
        )


def training_batches(recipe: Recipe, split: PairSource, warn: Callable[[str], None]) -> list[np.ndarray]:
    """The training batches, leaving out (and counting, in a warning) pairs that no batch or no position table
    can hold.

    `mtx prepare` drops pairs longer than model.max_positions, so what is left here comes from data prepared
    for another model, or a train.max_tokens below a pair's cost: a warning, never a refusal, unless
    nothing is left to train on.
    """
    max_tokens = recipe.train.max_tokens
    limit = min(recipe.model.max_positions, max_tokens)
    fits = pairs_within(split.src_lens, split.tgt_lens, limit)
    pairs, fitting = len(fits), int(np.count_nonzero(fits))
    if fitting == 0:
        shortest = int(pair_costs(split.src_lens, split.tgt_lens).min())
        raise MtxError(
            f"No training pair fits: the shortest needs {shortest} tokens (its longer side plus EOS), "
            f"more than train.max_tokens = {max_tokens} or model.max_positions = "
            f"{recipe.model.max_positions}. Raise them, or run `mtx prepare RECIPE` again."
        )
    if fitting < pairs:
        warn(f"warning: {pairs - fitting:,} of {pairs:,} training pairs are longer than "
             f"{limit} tokens (the smaller of train.max_tokens and model.max_positions) and are left out. "
             "Run `mtx prepare RECIPE` again to drop them from the data, or raise those limits.")
    return make_batches(split.src_lens, split.tgt_lens, max_tokens, recipe.seed, keep=fits)


def load_valid_set(recipe: Recipe, manifest: dict[str, Any], data_dir: Path) -> ValidSet | None:
    """The valid split, if the data has one. Its batches take every pair the model can hold, a batch growing
    past train.max_tokens for a pair that needs it, so that the valid loss is over the same pairs whatever the
    token budget."""
    cfg = recipe.train
    has_valid = manifest["splits"].get("valid", {}).get("pairs", 0) > 0
    if cfg.patience is not None and not has_valid:
        raise MtxError("train.patience is set but the prepared data has no valid split to validate on: add "
                       "one to data.source and run `mtx prepare` again, or unset train.patience.")
    if not has_valid:
        return None
    split = load_split(data_dir, "valid")
    usable = pairs_within(split.src_lens, split.tgt_lens, recipe.model.max_positions)
    budget = max(cfg.max_tokens, int(pair_costs(split.src_lens, split.tgt_lens)[usable].max(initial=1)))
    batches = make_batches(split.src_lens, split.tgt_lens, budget, recipe.seed, keep=usable)
    sources, refs = ((data_dir / f"valid.{lang}").read_text(encoding="utf-8").splitlines()[:cfg.valid_max_sentences]
                     for lang in (recipe.data.src_lang, recipe.data.tgt_lang))
    return ValidSet(split, batches, sources, refs)
