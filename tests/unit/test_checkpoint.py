"""Checkpoints: atomic writes, clear errors on bad files, and averaging."""

import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from mtx.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint, step_checkpoints
from mtx.cli import app
from mtx.config.recipe import ModelConfig, resolve_model
from mtx.errors import MtxError
from mtx.files import atomic_write
from mtx.model.transformer import Transformer
from mtx.train.average import average_checkpoints

TOKENIZER = '{"stand-in": "averaging never parses the tokenizer"}'


def write_checkpoint(path: Path, seed: int, d_model: int = 16, tokenizer: str = TOKENIZER, step: int = 1,
                     vocab: int = 30, dtype: torch.dtype = torch.float32) -> dict:
    torch.manual_seed(seed)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=d_model, heads=2, d_ff=32, layers_enc=1, layers_dec=1))
    model = Transformer(cfg, vocab).to(dtype)
    checkpoint = make_checkpoint(model, tokenizer, {"name": "t"}, step, train_state={"epoch": 1})
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_checkpoints_average_in_float64_and_keep_their_dtype(tmp_path: Path,
                                                                            dtype: torch.dtype) -> None:
    """Checkpoints trained in bf16 or fp16 come back in that dtype, each parameter the float64 mean rounded
    once: within half a unit in the last place of the dtype. A running sum kept in the half-precision dtype
    rounds at every addition and loses whole digits where the checkpoints' values nearly cancel; a result left
    in float32 or float64 would double or quadruple the checkpoint's size."""
    paths = [tmp_path / f"step_{i}.pt" for i in range(3)]
    written = [write_checkpoint(path, seed=i, dtype=dtype) for i, path in enumerate(paths)]
    assert {v.dtype for c in written for v in c["model"].values()} == {dtype}

    averaged = average_checkpoints(paths)

    info = torch.finfo(dtype)
    for key, value in averaged["model"].items():
        assert value.dtype == dtype, key
        reference = torch.stack([c["model"][key].double() for c in written]).mean(0)
        # Half the spacing of the dtype's numbers around the reference; the second term covers subnormals.
        half_ulp = info.eps * reference.abs() / 2 + info.smallest_normal * info.eps / 2
        error = (value.double() - reference).abs()
        assert bool((error <= half_ulp).all()), f"{key}: off by up to {(error / half_ulp).max():.1f} half-ulps"


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
    """Another model shape, another tokenizer, or a tensor whose shape its config does not explain (a file
    edited by hand or by another tool): each refused by name, before any arithmetic."""
    write_checkpoint(tmp_path / "a.pt", seed=0)
    write_checkpoint(tmp_path / "b.pt", seed=1, d_model=32)
    write_checkpoint(tmp_path / "c.pt", seed=1, tokenizer='{"other": 1}')
    edited = write_checkpoint(tmp_path / "d.pt", seed=1)
    edited["model"]["tgt_embed.weight"] = edited["model"]["tgt_embed.weight"][:-1]
    save_checkpoint(edited, tmp_path / "d.pt")
    same_run = "Average only checkpoints of the same run."
    for other, what in (("b", "model shape or config"), ("c", "tokenizer"), ("d", "model shape or config")):
        expected = f"Cannot average {tmp_path / other}.pt with {tmp_path / 'a.pt'}: their {what} differs. {same_run}"
        with pytest.raises(MtxError) as error:
            average_checkpoints([tmp_path / "a.pt", tmp_path / f"{other}.pt"])
        assert str(error.value) == expected
    with pytest.raises(MtxError) as error:
        average_checkpoints([])
    assert str(error.value) == "No checkpoints to average: pass files, or --dir RUN/checkpoints --last N."


def test_load_model_restores_the_model_in_eval_mode_with_its_tokenizer(tmp_path: Path) -> None:
    """What `mtx translate` and validation decode with: the same weights, config and tokenizer, on the asked
    device, in eval mode (dropout off); a state that its own config does not fit is a user error."""
    from mtx.checkpoint import load_model
    from mtx.tokenizer import Tokenizer

    tokenizer = Tokenizer.train([f"w{i} v{i}" for i in range(50)], vocab_size=60, style="bytelevel")
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=16, heads=2, d_ff=32, layers_enc=1, layers_dec=1))
    model = Transformer(cfg, tokenizer.vocab_size)
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), {"name": "t"}, 7), tmp_path / "m.pt")
    loaded, loaded_tokenizer, checkpoint = load_model(tmp_path / "m.pt")
    assert not loaded.training and loaded.cfg == model.cfg and loaded.vocab_size == model.vocab_size
    assert next(loaded.parameters()).device == torch.device("cpu")
    for name, tensor in model.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, atol=0, rtol=0)
    assert loaded_tokenizer.to_str() == tokenizer.to_str() and checkpoint["step"] == 7
    assert next(load_model(tmp_path / "m.pt", device="meta")[0].parameters()).is_meta

    checkpoint["model"] = {k: v for k, v in checkpoint["model"].items() if "encoder" not in k}
    save_checkpoint(checkpoint, tmp_path / "bad.pt")
    with pytest.raises(MtxError) as error:
        load_model(tmp_path / "bad.pt")
    start = f"Checkpoint {tmp_path / 'bad.pt'} does not match its own model config: "
    assert str(error.value).startswith(start + "Error(s) in loading state_dict for Transformer")
    assert len(str(error.value)) == len(start) + 300  # PyTorch's list of missing keys, cut short


def test_step_checkpoints_sort_by_step_not_name_or_time(tmp_path: Path) -> None:
    """`--last N` must take the N highest steps. By name, step_100.pt sorts before step_9.pt; by modification
    time, a copied or rsynced folder can have any order; so the newest file is given the lowest step here, and
    files that are not step_<N>.pt (last.pt, a writer's temporary file, an average) are left out."""
    steps = (9, 100, 10, 1000, 80, 900)
    for age, step in enumerate(sorted(steps, reverse=True)):
        path = tmp_path / f"step_{step}.pt"
        path.write_bytes(b"")
        os.utime(path, (1_000_000 + age, 1_000_000 + age))
    for other in ("last.pt", ".step_2000.pt.123.tmp", "step_3000.pt.tmp", "step_x.pt", "average.pt"):
        (tmp_path / other).write_bytes(b"")

    found = step_checkpoints(tmp_path)

    assert [step for step, _ in found] == sorted(steps) == [9, 10, 80, 100, 900, 1000]
    assert [path.name for _, path in found] == [f"step_{step}.pt" for step in sorted(steps)]


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


def test_average_command_takes_the_last_steps_by_number(tmp_path: Path) -> None:
    """By name the last two would be step_100.pt and step_9.pt; by step they are step_10.pt and step_100.pt."""
    for step in (9, 10, 100):
        write_checkpoint(tmp_path / f"step_{step}.pt", seed=step, step=step)
    runner = CliRunner()
    result = runner.invoke(app, ["average", "--dir", str(tmp_path), "--last", "2", "-o", str(tmp_path / "avg.pt")])
    assert result.exit_code == 0, result.output
    averaged = load_checkpoint(tmp_path / "avg.pt")
    assert [Path(p).name for p in averaged["averaged_from"]] == ["step_10.pt", "step_100.pt"]
    expected = average_checkpoints([tmp_path / "step_10.pt", tmp_path / "step_100.pt"])
    for key, value in expected["model"].items():
        assert torch.equal(averaged["model"][key], value)


def test_average_command_averages_the_files_it_is_given(tmp_path: Path) -> None:
    """The positional form, `mtx average a.pt b.pt c.pt -o out.pt`, with -o before or after the files: the
    output is the element-wise mean of exactly those files, self-contained, without training state."""
    names = ("a.pt", "b.pt", "c.pt")
    written = [write_checkpoint(tmp_path / name, seed=i, step=10 * (i + 1)) for i, name in enumerate(names)]
    write_checkpoint(tmp_path / "step_99.pt", seed=99, step=99)  # in the same folder, and not asked for
    files = [str(tmp_path / name) for name in names]
    runner = CliRunner()

    after = runner.invoke(app, ["average", *files, "-o", str(tmp_path / "after.pt")])
    before = runner.invoke(app, ["average", "--output", str(tmp_path / "before.pt"), *files])

    for result in (after, before):
        assert result.exit_code == 0, result.output
        assert "averaged 3 checkpoints" in result.output
    averaged = load_checkpoint(tmp_path / "after.pt")
    assert averaged["averaged_from"] == files
    assert "train_state" not in averaged and averaged["tokenizer"] == TOKENIZER
    for key, value in averaged["model"].items():
        expected = torch.stack([c["model"][key].double() for c in written]).mean(0).to(value.dtype)
        torch.testing.assert_close(value, expected, atol=0, rtol=0)
    again = load_checkpoint(tmp_path / "before.pt")["model"]
    assert all(torch.equal(again[key], value) for key, value in averaged["model"].items())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "Name the checkpoints to average one way"),
        (["{ckpts}/step_1.pt", "--dir", "{ckpts}", "--last", "1"], "Name the checkpoints to average one way"),
        (["--dir", "{ckpts}", "--last", "1", "--best", "1"], "Pass --last N or --best N, not both"),
        (["{ckpts}/step_1.pt", "--best", "1"], "--best only applies with --dir"),
        (["--dir", "{ckpts}", "--best", "1"], "--best 1: only 0 of the 2 checkpoints in {ckpts} carry a validation"),
        (["{ckpts}/step_1.pt", "{ckpts}/step_2.pt", "--last", "1"], "--last only applies with --dir"),
        (["--dir", "{ckpts}", "--last", "3"], "--last 3 asks for more checkpoints than the 2 in {ckpts}"),
        (["--dir", "{empty}", "--last", "1"], "No step_<N>.pt checkpoints in {empty}"),
        (["--dir", "{tmp}/nowhere", "--last", "1"], "Checkpoint directory {tmp}/nowhere does not exist"),
        (["{ckpts}/step_1.pt", "{tmp}/missing.pt"], "Checkpoint {tmp}/missing.pt does not exist"),
    ],
    ids=["no-inputs", "files-and-dir", "last-and-best", "best-without-dir", "best-unscored", "last-without-dir",
         "last-too-many", "no-step-files", "no-such-dir", "missing-file"],
)
def test_average_argument_errors_are_user_errors_and_write_nothing(tmp_path: Path, args: list[str],
                                                                   message: str) -> None:
    """Each way of asking `mtx average` for something it cannot do is an MtxError, which the CLI turns into
    its message and exit 1 (tests/integration/test_cli.py), and leaves no output file behind to be translated with."""
    ckpts, empty = tmp_path / "checkpoints", tmp_path / "empty"
    for step in (1, 2):
        write_checkpoint(ckpts / f"step_{step}.pt", seed=step, step=step)
    empty.mkdir()
    (empty / "last.pt").write_bytes(b"")
    output = tmp_path / "avg.pt"
    places = {"ckpts": ckpts, "empty": empty, "tmp": tmp_path}

    result = CliRunner().invoke(app, ["average", *(a.format(**places) for a in args), "-o", str(output)])

    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, MtxError), repr(result.exception)
    assert message.format(**places) in str(result.exception)
    assert not output.exists()
