"""Checkpoints: atomic writes, clear errors on bad files, and averaging."""

import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mtx.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    make_checkpoint,
    save_checkpoint,
    step_checkpoints,
)
from mtx.cli import app
from mtx.config import ModelConfig, resolve_model
from mtx.errors import MtxError
from mtx.files import atomic_write
from mtx.model import Transformer

TOKENIZER = '{"stand-in": "averaging never parses the tokenizer"}'


def write_checkpoint(path: Path, seed: int, d_model: int = 16, tokenizer: str = TOKENIZER, step: int = 1,
                     vocab: int = 30) -> dict:
    torch.manual_seed(seed)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=d_model, heads=2, d_ff=32, layers_enc=1, layers_dec=1))
    checkpoint = make_checkpoint(Transformer(cfg, vocab), tokenizer, {"name": "t"}, step, train_state={"epoch": 1})
    save_checkpoint(checkpoint, path)
    return checkpoint


def test_average_is_the_elementwise_mean(tmp_path: Path) -> None:
    written = [write_checkpoint(tmp_path / f"step_{i}.pt", seed=i) for i in range(3)]
    averaged = average_checkpoints([tmp_path / f"step_{i}.pt" for i in range(3)])
    for key, value in averaged["model"].items():
        expected = torch.stack([c["model"][key].double() for c in written]).mean(0).to(value.dtype)
        torch.testing.assert_close(value, expected, atol=0, rtol=0)
    assert "train_state" not in averaged
    assert averaged["tokenizer"] == TOKENIZER and averaged["model_config"] == written[0]["model_config"]


def test_the_tied_embedding_is_stored_once(tmp_path: Path) -> None:
    """Source embedding, target embedding and output projection are one matrix: one copy in a checkpoint and
    in an average of checkpoints, still one shared tensor when loaded."""
    written = [write_checkpoint(tmp_path / f"step_{i}.pt", seed=i, vocab=2000) for i in range(2)]
    save_checkpoint(average_checkpoints([tmp_path / "step_0.pt", tmp_path / "step_1.pt"]), tmp_path / "avg.pt")
    state = written[0]["model"]
    embedding = state["tgt_embed.weight"].numel() * 4
    all_names = sum(v.numel() * v.element_size() for v in state.values())
    for name in ("step_0.pt", "avg.pt"):
        model = load_checkpoint(tmp_path / name)["model"]
        assert model["src_embed.weight"].data_ptr() == model["tgt_embed.weight"].data_ptr(), name
        assert (tmp_path / name).stat().st_size < all_names - embedding // 2, name


def test_average_of_one_is_the_identity(tmp_path: Path) -> None:
    written = write_checkpoint(tmp_path / "a.pt", seed=0)
    averaged = average_checkpoints([tmp_path / "a.pt"])
    for key, value in written["model"].items():
        assert torch.equal(averaged["model"][key], value)


def test_average_refuses_mismatched_checkpoints(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "a.pt", seed=0)
    write_checkpoint(tmp_path / "b.pt", seed=1, d_model=32)
    write_checkpoint(tmp_path / "c.pt", seed=1, tokenizer='{"other": 1}')
    with pytest.raises(MtxError, match=r"b\.pt.*a\.pt.*model shape"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"])
    with pytest.raises(MtxError, match="tokenizer"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "c.pt"])


def test_step_checkpoints_sort_by_step_not_name(tmp_path: Path) -> None:
    for step in (900, 1000, 80):
        (tmp_path / f"step_{step}.pt").write_bytes(b"")
    (tmp_path / "last.pt").write_bytes(b"")
    assert [s for s, _ in step_checkpoints(tmp_path)] == [80, 900, 1000]


def test_corrupt_and_foreign_files_are_user_errors(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "good.pt", seed=0)
    data = (tmp_path / "good.pt").read_bytes()
    (tmp_path / "torn.pt").write_bytes(data[: len(data) // 2])
    torch.save({"weights": torch.zeros(2)}, tmp_path / "foreign.pt")
    with pytest.raises(MtxError, match="corrupt"):
        load_checkpoint(tmp_path / "torn.pt")
    with pytest.raises(MtxError, match="not an mtx checkpoint"):
        load_checkpoint(tmp_path / "foreign.pt")
    with pytest.raises(MtxError, match="does not exist"):
        load_checkpoint(tmp_path / "missing.pt")


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path: Path) -> None:
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")

    def crash(f) -> None:
        f.write(b"half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(target, crash)
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.bin"]


def test_atomic_write_respects_the_umask(tmp_path: Path) -> None:
    previous = os.umask(0o022)
    try:
        atomic_write(tmp_path / "shared.bin", lambda f: f.write(b"x"))
    finally:
        os.umask(previous)
    assert (tmp_path / "shared.bin").stat().st_mode & 0o777 == 0o644


def test_average_command(tmp_path: Path) -> None:
    for step in (100, 200, 300):
        write_checkpoint(tmp_path / f"step_{step}.pt", seed=step, step=step)
    runner = CliRunner()
    result = runner.invoke(app, ["average", "--dir", str(tmp_path), "--last", "2", "-o", str(tmp_path / "avg.pt")])
    assert result.exit_code == 0, result.output
    averaged = load_checkpoint(tmp_path / "avg.pt")
    assert [Path(p).name for p in averaged["averaged_from"]] == ["step_200.pt", "step_300.pt"]
    expected = average_checkpoints([tmp_path / "step_200.pt", tmp_path / "step_300.pt"])
    for key, value in expected["model"].items():
        assert torch.equal(averaged["model"][key], value)
