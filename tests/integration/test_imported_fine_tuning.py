"""Fine-tuning an imported model: `mtx train` with train.init_from a checkpoint `mtx import` wrote from a MarianMT
folder, its vocabulary kept through data.bpe.from. The folder is one examples/distillation/marian_teacher.py trains
here in seconds (no mtx code, no network), so the model has learnt the demo grammar: a run that starts from it
knows the language from its first validation, and one from random weights of the same shape does not."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from rich.console import Console
from support import ROOT

from mtx.config.command import read_run_recipe
from mtx.data.prepare import prepare
from mtx.train.trainer import train

pytest.importorskip("transformers")
pytest.importorskip("sentencepiece")


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MarianMT model of 1 + 1 layers at width 64, 300 updates on 2,000 demo pairs, imported: its checkpoint
    (the demo files beside it, in corpus/)."""
    folder = tmp_path_factory.mktemp("imported")
    corpus = folder / "corpus"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    subprocess.run([sys.executable, "-m", "mtx.data.demo", str(corpus), "--pairs", "2000", "--valid", "100",
                    "--test", "10"], check=True, env=env, capture_output=True)
    subprocess.run([sys.executable, str(ROOT / "examples" / "distillation" / "marian_teacher.py"),
                    "--train", str(corpus / "train.en"), str(corpus / "train.de"),
                    "--valid", str(corpus / "valid.en"), str(corpus / "valid.de"), "--out", str(folder / "marian"),
                    "--spm-size", "300", "--d-model", "64", "--d-ff", "128", "--heads", "2", "--layers-enc", "1",
                    "--layers-dec", "1", "--max-tokens", "1024", "--lr", "3e-3", "--warmup", "30",
                    "--max-steps", "300", "--log-every", "100"], check=True, env=env, capture_output=True)
    from mtx.importing.command import import_checkpoint

    import_checkpoint(str(folder / "marian"), folder / "imported.pt")
    return folder / "imported.pt"


def first_valid_loss(tmp_path: Path, name: str, checkpoint: Path, *, init: bool) -> float:
    """The first validation's cross-entropy a token (valid_nll: the label-smoothed valid_loss adds a term that
    grows with a model's confidence), after one update of lr ~0 on the demo files, with the model and the
    vocabulary of the imported checkpoint; its weights too when `init`."""
    corpus = checkpoint.parent / "corpus"
    model = {k: v for k, v in torch.load(checkpoint, weights_only=False)["model_config"].items() if v is not None}
    recipe = {
        "name": name, "run_dir": str(tmp_path / name), "seed": 1,
        "data": {"source": {"files": {"train": [str(corpus / "train.en"), str(corpus / "train.de")],
                                      "valid": [str(corpus / "valid.en"), str(corpus / "valid.de")]}},
                 "filter": {"max_ratio": 0}, "bpe": {"from": str(checkpoint)}},
        "model": model,
        "train": {"max_tokens": 1024, "lr": 1.0e-7, "warmup": 1, "max_steps": 1, "save_every": 1,
                  "validate_every": 1, "valid_max_sentences": 100, **({"init_from": str(checkpoint)} if init else {})},
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    prepare(read_run_recipe(path), workers=1, console=Console(file=io.StringIO()))
    train(read_run_recipe(path))
    events = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    [loss] = [e["valid_nll"] for e in events if e["event"] == "valid"]
    return loss


def test_a_run_from_an_imported_model_starts_far_below_random_weights(imported: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    fine_tuned = first_valid_loss(tmp_path, "fine-tuned", imported, init=True)
    scratch = first_valid_loss(tmp_path, "scratch", imported, init=False)
    assert fine_tuned < 0.6 * scratch, (fine_tuned, scratch)
