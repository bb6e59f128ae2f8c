"""Checkpoint I/O at scale (issue 23): resumes map the file, only the newest step checkpoints keep the training
state, step checkpoints are written in the background, and a kill at any moment of a save leaves a run that
resumes. The trainer's CheckpointKeeper is driven directly, on a model of a few thousand parameters."""

import gc
import io
import os
import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

import mtx.train.checkpoints
from mtx.checkpoint import load_checkpoint, load_model, step_checkpoints
from mtx.cli import app
from mtx.config.loading import recipe_from_dict
from mtx.config.recipe import DecodeConfig
from mtx.decode.translator import Translator
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer
from mtx.train.checkpoints import RESUMABLE, CheckpointKeeper
from mtx.train.distributed import Context

TOKENIZER = Tokenizer.train([f"w{i} v{i} x{i % 7}" for i in range(80)], vocab_size=120, style="bytelevel")
KILLED = 17  # the exit status of a child process killed on purpose


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def make_keeper(run: Path, keep_last: int = 5, seed: int = 0, d_model: int = 32) -> CheckpointKeeper:
    """A keeper of a fresh model (initialised from `seed`) and AdamW, on the run directory `run`."""
    recipe = recipe_from_dict({
        "name": "io", "run_dir": str(run), "seed": 1, "data": {"source": {"demo": {}}},
        "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": d_model, "heads": 2,
                  "d_ff": 2 * d_model, "max_positions": 64},
        "train": {"keep_last": keep_last, "device": "cpu"}})
    torch.manual_seed(seed)
    model = Transformer(recipe.model, TOKENIZER.vocab_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    keeper = CheckpointKeeper(recipe, Context(0, 1, torch.device("cpu")), model, TOKENIZER, optimizer,
                              torch.amp.GradScaler("cpu", enabled=False), say=lambda line: None)
    keeper.background = True  # as on a GPU: these tests are about the writes a thread makes
    return keeper


def take_update(keeper: CheckpointKeeper, step: int) -> None:
    """An optimizer update with gradients drawn from `step`: it changes the weights and Adam's moments."""
    generator = torch.Generator().manual_seed(step)
    for parameter in keeper.model.parameters():
        parameter.grad = torch.randn(parameter.shape, generator=generator)
    keeper.optimizer.step()
    keeper.optimizer.zero_grad(set_to_none=True)


def weights(keeper: CheckpointKeeper) -> dict[str, torch.Tensor]:
    return {name: tensor.clone() for name, tensor in keeper.model.state_dict().items()}


def assert_same_tensors(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal names, dtypes, shapes and bytes."""
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert got[name].reshape(-1).view(torch.uint8).equal(tensor.reshape(-1).view(torch.uint8)), name


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    return {f"{index}.{key}": value for index, state in optimizer.state_dict()["state"].items()
            for key, value in state.items()}


def holds_train_state(path: Path) -> bool:
    return "train_state" in load_checkpoint(path, mmap=True)


def read_bytes_so_far() -> int:
    """Bytes this process has read with read() and its kin (not through mapped files)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="reads /proc/self/io (Linux)")
def test_a_resume_maps_the_checkpoint_and_lets_go_of_the_file(tmp_path: Path) -> None:
    """Every rank resumes from the same file: mapped, each pages in only what it copies into its model and
    optimizer, from a page cache the ranks of a machine share, instead of each reading the whole file
    (Adam's moments included) into memory of its own. The restored state is exact, and afterwards nothing
    keeps the file mapped: once pruned, its disk space comes back."""
    saved = make_keeper(tmp_path / "run", d_model=128)
    take_update(saved, 1)
    saved.save(1, {"step": 1, "epoch": 1}, wait=True)
    path = saved.directory / "step_1.pt"
    make_keeper(tmp_path / "run", seed=1, d_model=128).resume()  # imports and caches on the way, not measured

    resumed = make_keeper(tmp_path / "run", seed=2, d_model=128)
    before = read_bytes_so_far()
    assert resumed.resume()["step"] == 1
    read = read_bytes_so_far() - before

    optimizer_bytes = sum(t.numel() * t.element_size() for t in optimizer_tensors(saved.optimizer).values())
    assert path.stat().st_size > optimizer_bytes > 1_000_000
    assert read < optimizer_bytes / 10, f"read {read:,} bytes of a {path.stat().st_size:,}-byte checkpoint"
    assert_same_tensors(weights(resumed), weights(saved))
    assert_same_tensors(optimizer_tensors(resumed.optimizer), optimizer_tensors(saved.optimizer))
    gc.collect()
    assert str(path) not in Path("/proc/self/maps").read_text()


def test_only_the_newest_step_checkpoints_keep_the_training_state(tmp_path: Path) -> None:
    """keep_last 5 over 9 saves: the newest two keep the optimizer's state (the newest is last.pt), the three
    before them hold the weights of their step alone, about a third of the size, and still translate and
    average on their own. The run resumes from the newest. A stop's save (wait=True) returns with its file in
    place and leaves the dropping to the next save; files of an mtx that kept the state in every step
    checkpoint lose it at the next save too."""
    keeper = make_keeper(tmp_path / "run", keep_last=5)
    checkpoints = keeper.directory
    at_step = {}
    for step in range(1, 10):
        take_update(keeper, step)
        at_step[step] = weights(keeper)
        keeper.save(step, {"step": step, "epoch": 1}, wait=step in (4, 5, 6))  # as stops save
        if step == 6:
            assert {s for s, path in step_checkpoints(checkpoints) if holds_train_state(path)} == {2, 3, 4, 5, 6}
    keeper.flush()

    assert [step for step, _ in step_checkpoints(checkpoints)] == [5, 6, 7, 8, 9]
    assert [step for step, path in step_checkpoints(checkpoints) if holds_train_state(path)] == [8, 9] == list(
        range(10 - RESUMABLE, 10))
    assert (checkpoints / "last.pt").samefile(checkpoints / "step_9.pt")
    assert load_checkpoint(checkpoints / "last.pt")["train_state"]["progress"] == {"step": 9, "epoch": 1}
    full, weights_only = (checkpoints / "step_9.pt").stat().st_size, (checkpoints / "step_7.pt").stat().st_size
    assert weights_only < 0.4 * full
    for step, path in step_checkpoints(checkpoints):
        assert_same_tensors(load_checkpoint(path)["model"], at_step[step])

    model, tokenizer, checkpoint = load_model(checkpoints / "step_5.pt")
    assert checkpoint["step"] == 5 and tokenizer.to_str() == TOKENIZER.to_str()
    [[translation]] = Translator(model, tokenizer, DecodeConfig(beam=1, max_len_a=0, max_len_b=5)).translate(["w1 v1"])
    assert isinstance(translation.text, str)
    result = CliRunner().invoke(app, ["average", "--dir", str(checkpoints), "--last", "5", "-o",
                                      str(tmp_path / "average.pt")])
    assert result.exit_code == 0, result.output
    averaged = load_checkpoint(tmp_path / "average.pt")
    assert "train_state" not in averaged and averaged["tokenizer"] == TOKENIZER.to_str()

    resumed = make_keeper(tmp_path / "run", seed=1)
    assert resumed.resume() == {"step": 9, "epoch": 1} and resumed.saved_step == 9
    assert_same_tensors(weights(resumed), at_step[9])
    assert_same_tensors(optimizer_tensors(resumed.optimizer), optimizer_tensors(keeper.optimizer))


def test_a_background_save_writes_the_state_of_its_step(tmp_path: Path, monkeypatch) -> None:
    """The write of a background save is held back until the next update has changed the weights and Adam's
    moments in place: the file still holds the state of the step saved, byte for byte the same as a
    synchronous save of that state writes."""
    background, synchronous = make_keeper(tmp_path / "background"), make_keeper(tmp_path / "synchronous")
    for keeper in (background, synchronous):
        take_update(keeper, 1)
    synchronous.save(1, {"step": 1}, wait=True)

    save, update_done = mtx.train.checkpoints.save_checkpoint, threading.Event()

    def after_the_next_update(checkpoint: dict, path: Path) -> None:
        assert update_done.wait(timeout=60)
        save(checkpoint, path)

    monkeypatch.setattr(mtx.train.checkpoints, "save_checkpoint", after_the_next_update)
    background.save(1, {"step": 1})
    take_update(background, 2)
    update_done.set()
    background.flush()

    written, expected = (load_checkpoint(k.directory / "step_1.pt") for k in (background, synchronous))
    assert not torch.equal(expected["model"]["tgt_embed.weight"], background.model.tgt_embed.weight)
    assert_same_tensors(written["model"], expected["model"])
    ours, theirs = written["train_state"], expected["train_state"]
    assert ours["optimizer"]["param_groups"] == theirs["optimizer"]["param_groups"]
    assert_same_tensors(*({f"{index}.{key}": value for index, state in saved["optimizer"]["state"].items()
                           for key, value in state.items()} for saved in (ours, theirs)))
    assert (ours["scaler"], ours["progress"]) == (theirs["scaler"], theirs["progress"]) == ({}, {"step": 1})


def test_a_failed_background_write_is_raised_by_the_next_save_or_flush(tmp_path: Path, monkeypatch) -> None:
    """A write that fails on its thread (a full disk) stops the run at the next save or at the end, rather
    than letting it train on without checkpoints; the one before it still resumes."""
    keeper = make_keeper(tmp_path / "run")
    keeper.save(1, {"step": 1, "epoch": 1})
    keeper.flush()

    def disk_full(checkpoint: dict, path: Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(mtx.train.checkpoints, "save_checkpoint", disk_full)
    for call in (lambda: keeper.save(3, {"step": 3, "epoch": 1}), keeper.flush):
        keeper.save(2, {"step": 2, "epoch": 1})
        with pytest.raises(OSError, match="No space left on device"):
            call()
    keeper.flush()  # the failure was raised once
    assert make_keeper(tmp_path / "run", seed=1).resume() == {"step": 1, "epoch": 1}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="kills forked copies of this process")
def test_a_kill_at_any_moment_of_a_save_leaves_a_checkpoint_to_resume_from(tmp_path: Path) -> None:
    """A save of step 5 with keep_last 3, killed (os._exit, no clean-up) before each file operation in turn:
    the writes of step_5.pt and of the file that loses its training state (half-way included), the fsyncs,
    the renames, last.pt's link and the pruning. After each kill the run resumes, from the newest step file
    in place, with its exact weights, and no file under a checkpoint's name is torn."""
    keeper = make_keeper(tmp_path / "base" / "run", keep_last=3)
    at_step = {}
    for step in range(1, 6):
        take_update(keeper, step)
        at_step[step] = weights(keeper)
        if step < 5:
            keeper.save(step, {"step": step, "epoch": 1})
    keeper.flush()

    outcomes = []
    for moment in range(1, 100):
        run = tmp_path / f"killed_at_{moment}" / "run"
        shutil.copytree(tmp_path / "base" / "run", run)
        keeper.directory = run / "checkpoints"
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            save_killed_at(keeper, moment)
        _, status = os.waitpid(pid, 0)
        outcome = os.waitstatus_to_exitcode(status)
        assert outcome in (0, KILLED), f"the save killed at moment {moment} failed otherwise ({outcome})"
        outcomes.append(outcome)

        files = step_checkpoints(run / "checkpoints")
        for _, path in files:
            load_checkpoint(path)  # raises on a torn file
        resumed = make_keeper(run, keep_last=3, seed=1)
        resumed.remove_torn_writes()
        progress = resumed.resume()
        assert progress["step"] == files[-1][0] in (4, 5)
        assert_same_tensors(weights(resumed), at_step[progress["step"]])
        if outcome == 0:
            break
    assert outcomes[-1] == 0 and len(outcomes) >= 10  # killed at every moment of the save, then let finish
    assert [step for step, path in files if holds_train_state(path)] == [4, 5]


def save_killed_at(keeper: CheckpointKeeper, moment: int) -> None:
    """In a forked child: save step 5 in the background, dying at the `moment`-th file operation."""
    status = 1
    try:
        seen = [0]

        def operation() -> None:
            seen[0] += 1
            if seen[0] == moment:
                os._exit(KILLED)

        def counted(call):
            def wrapper(*args, **kwargs):
                operation()
                return call(*args, **kwargs)
            return wrapper

        save = torch.save

        def save_in_two_halves(obj, f) -> None:
            whole = io.BytesIO()
            save(obj, whole)
            data = whole.getvalue()
            operation()
            f.write(data[: len(data) // 2])
            f.flush()
            operation()
            f.write(data[len(data) // 2:])

        torch.save = save_in_two_halves
        for name in ("replace", "link", "unlink", "fsync"):
            setattr(os, name, counted(getattr(os, name)))
        keeper.save(5, {"step": 5, "epoch": 1})
        keeper.flush()
        status = 0
    finally:
        os._exit(status)
