"""A checkpoint whose weights read back as NaN: every command that uses a checkpoint's weights refuses it.

`torch.load` checks no checksum of a tensor's bytes, so a file damaged on disk loads without complaint; before the
check in `mtx.checkpoint.load_checkpoint`, `mtx average` averaged such a file into a NaN model silently and `mtx
translate` of it ended in a traceback. Now each command exits 1 naming the file and the tensor, with no traceback,
and writes nothing; a reader of the metadata alone (`weights=False`) neither checks nor reads the weights.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from support import base_recipe, serving, write_recipe

from mtx.checkpoint import load_checkpoint
from mtx.errors import MtxError
from mtx.train.average import average_checkpoints


def damaged(checkpoint: Path, out: Path, value: float = np.nan) -> tuple[Path, str]:
    """A copy of `checkpoint` whose file has the first four values of one decoder weight overwritten with `value`,
    as damage on disk would leave it; (the copy, the tensor's name in the checkpoint)."""
    stored = torch.load(checkpoint, weights_only=True)
    name = next(n for n, t in stored["model"].items() if n.startswith("decoder_layers.") and t.dim() == 2)
    original = stored["model"][name].contiguous().numpy().tobytes()
    data = bytearray(checkpoint.read_bytes())
    at = data.find(original)
    assert at > 0 and data.find(original, at + 1) == -1  # the tensor's bytes, once in the file
    data[at : at + 16] = np.full(4, value, dtype=np.float32).tobytes()
    out.write_bytes(bytes(data))
    return out, f"model.{name}"


def mtx(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtx", *args], capture_output=True, text=True, timeout=120)


def assert_refused(done: subprocess.CompletedProcess, path: Path, tensor: str) -> None:
    message = " ".join(done.stderr.split())
    assert done.returncode == 1, done.stderr
    assert f"Checkpoint {path} holds weights that are not finite numbers" in message and tensor in message
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_loading_refuses_non_finite_weights_and_reading_the_metadata_alone_does_not_check(
        copy_model: dict, tmp_path: Path, value: float) -> None:
    bad, tensor = damaged(copy_model["checkpoint"], tmp_path / "bad.pt", value)
    for mmap in (False, True):
        with pytest.raises(MtxError, match=f"4 of the .* values of {tensor} are NaN or infinite"):
            load_checkpoint(bad, mmap=mmap)
    assert load_checkpoint(bad, mmap=True, weights=False)["vocab_size"] > 0
    with pytest.raises(MtxError, match=str(bad)):
        average_checkpoints([copy_model["checkpoint"], bad])


def test_translate_average_and_inspect_exit_1_naming_the_file_and_write_nothing(copy_model: dict,
                                                                                tmp_path: Path) -> None:
    bad, tensor = damaged(copy_model["checkpoint"], tmp_path / "bad.pt")
    out = tmp_path / "out"
    assert_refused(mtx("translate", "-m", str(bad), "-i", str(copy_model["input"]), "-o", str(out)), bad, tensor)
    assert_refused(mtx("average", str(copy_model["checkpoint"]), str(bad), "-o", str(out)), bad, tensor)
    assert_refused(mtx("inspect", "-m", str(bad), "one two", "-o", str(out)), bad, tensor)
    assert not out.exists()


@serving
def test_serve_exits_1_naming_the_file(copy_model: dict, tmp_path: Path) -> None:
    bad, tensor = damaged(copy_model["checkpoint"], tmp_path / "bad.pt")
    done = mtx("serve", "-m", str(bad), "--port", "0")
    assert_refused(done, bad, tensor)
    assert "The model could not be loaded" in done.stderr


def test_export_and_fine_tuning_from_it_exit_1_naming_the_file(copy_model: dict, tmp_path: Path) -> None:
    bad, tensor = damaged(copy_model["checkpoint"], tmp_path / "bad.pt")
    assert_refused(mtx("export", "-m", str(bad), "--to", "ctranslate2", str(tmp_path / "exported")), bad, tensor)
    assert not (tmp_path / "exported").exists()
    raw = base_recipe(tmp_path, train_pairs=20, valid_pairs=5)
    del raw["model"]  # a fine-tuning recipe takes its parent's
    raw["train"]["init_from"] = str(bad)
    assert_refused(mtx("train", str(write_recipe(tmp_path, raw))), bad, tensor)
