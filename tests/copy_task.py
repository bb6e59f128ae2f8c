"""A generated reverse-copy task and a prepared run on it, for the trainer's tests.

Source sentences are random words from a small vocabulary; the target is the same words in reverse order. A
model must learn attention to do it, yet a tiny one learns it in minutes on a CPU, so a BLEU bar is a fair test
that training works end to end.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import yaml
from rich.console import Console

from mtx.config.loading import load_recipe
from mtx.config.recipe import Recipe
from mtx.data.prepare import prepare

WORDS = [f"{a}{b}" for a in "bcdfgklmnprstvz" for b in "aeiou"][:40]


def write_pairs(directory: Path, split: str, pairs: int, seed: int, max_words: int = 8) -> list[Path]:
    rng = random.Random(seed)
    sources, targets = [], []
    for _ in range(pairs):
        words = [rng.choice(WORDS) for _ in range(rng.randint(2, max_words))]
        sources.append(" ".join(words))
        targets.append(" ".join(reversed(words)))
    paths = [directory / f"{split}.src", directory / f"{split}.tgt"]
    for path, lines in zip(paths, (sources, targets), strict=True):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def base_recipe(tmp_path: Path, train_pairs: int, valid_pairs: int) -> dict:
    """A tiny model on a reverse-copy corpus, deterministic, CPU, fp32; tests override what they need."""
    text = tmp_path / "text"
    text.mkdir(parents=True, exist_ok=True)
    train = write_pairs(text, "train", train_pairs, seed=1)
    valid = write_pairs(text, "valid", valid_pairs, seed=2)
    return {
        "name": "reverse",
        "run_dir": str(tmp_path / "run"),
        "seed": 1,
        "data": {
            "source": {"files": {"train": [str(p) for p in train], "valid": [str(p) for p in valid]}},
            "filter": {"min_len": 1, "max_len": 50, "max_ratio": 0, "dedup": False},
            "bpe": {"style": "bytelevel", "vocab_size": 300, "min_frequency": 2},  # the bars were set with it
        },
        "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": 32, "heads": 4, "d_ff": 64,
                  "dropout": 0.1, "max_positions": 64},
        "train": {"max_tokens": 160, "lr": 3.0e-3, "warmup": 10, "device": "cpu", "precision": "fp32",
                  "max_steps": 20, "save_every": 5, "validate_every": 1000, "log_every": 2, "keep_last": 0},
        "decode": {"beam": 1, "max_len_a": 1.0, "max_len_b": 5},
    }


def write_recipe(tmp_path: Path, raw: dict, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def prepared(tmp_path: Path, train_pairs: int = 300, valid_pairs: int = 20) -> Path:
    """The recipe file of a run whose data/ is prepared."""
    path = write_recipe(tmp_path, base_recipe(tmp_path, train_pairs, valid_pairs))
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    return path


def recipe(path: Path, *overrides: str, **train: object) -> Recipe:
    """The recipe at `path` with dotted KEY=VALUE overrides and train.KEY=VALUE ones."""
    return load_recipe(path, [*overrides, *(f"train.{k}={json.dumps(v)}" for k, v in train.items())])
