"""A whole recipe: its name, seed and run directory, and one section per stage, each declared in its own module
(mtx.config.data, mtx.config.model, mtx.config.train, mtx.config.decode), each field with its type, default,
range and help (`setting`, mtx.config.fields).

A recipe is the whole description of a run: the data and how it is prepared, the model, how it is trained and
how it decodes. Each section checks its ranges, then the rules that tie one of its keys to another
(`validate`); the rules that tie two sections together are `Recipe.validate`'s. Reading YAML into these classes
is mtx.config.loading's job. This module imports no torch: `mtx config` and recipe errors must be instant.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtx.config.data import DataConfig
from mtx.config.decode import DecodeConfig
from mtx.config.fields import ConfigError, check, recipe_key, setting
from mtx.config.model import ModelConfig, resolve_model
from mtx.config.train import TrainConfig


@dataclass
class Recipe:
    """A run: its name, seed and data, the model, how it trains and how it decodes."""

    name: str = setting(help="The run's name; the run directory is runs/<name> unless run_dir says otherwise.")
    data: DataConfig = setting(help="The corpus and how it is prepared.")
    seed: int = setting(1, "The seed of initialisation, batch order and dropout: the same seed, the same run.")
    run_dir: str | None = setting(None, "The run directory, relative to the working directory [default: runs/<name>].")
    model: ModelConfig = setting(help="The Transformer's shape.", factory=lambda: resolve_model(ModelConfig()))
    train: TrainConfig = setting(help="How the model is trained.", factory=TrainConfig)
    decode: DecodeConfig = setting(
        help="How validation and `mtx translate` search (the flags of mtx translate override it).",
        factory=DecodeConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def validate(self, key: str) -> None:
        check(bool(re.fullmatch(r"[\w.\-]+", self.name)), "name", self.name,
               "may hold only letters, digits, '.', '_' and '-' (it names the run directory)")
        check(self.train.bpe_dropout == 0 or self.data.bpe.from_ is not None or self.data.bpe.model == "bpe",
               "train.bpe_dropout", self.train.bpe_dropout,
               "needs a BPE vocabulary, and data.bpe.model is unigram: drop merges of a BPE, or set it to 0")
        problem = self.decode.first_problem(lambda name: f"decode.{name}", " = ",
                                            target_languages=self.data.target_languages)
        if problem is not None:
            raise ConfigError(problem[1])

    def to_dict(self) -> dict[str, Any]:
        return strip_nones(as_mapping(self))


def as_mapping(value: Any) -> Any:
    """A recipe or a section of one as the YAML mapping a recipe writes: `dataclasses.asdict`, but every field
    under its recipe key (`recipe_key`: `from`, not `from_`), so that a dumped recipe loads back."""
    if dataclasses.is_dataclass(value):
        return {recipe_key(f): as_mapping(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: as_mapping(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_mapping(v) for v in value]
    return value


def strip_nones(value: Any) -> Any:
    """Drop unset optional keys, so a printed recipe loads back as the same recipe and a data fingerprint does
    not change when a key is added with an unset default."""
    if isinstance(value, dict):
        return {k: strip_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_nones(v) for v in value]
    return value
