"""Time to BLEU: the training clock and tokens on every metrics line, BLEU milestones kept across resumes, and
the learning curves in TensorBoard (train.tensorboard) or a clear refusal without the package."""

import json
import sys
from itertools import islice
from pathlib import Path

import pytest
import torch
from support import FakeClock, events, prepared, recipe, run_files, scripted_bleu

from mtx.checkpoint import load_checkpoint
from mtx.config.fields import ConfigError
from mtx.data.batching import collate
from mtx.errors import MtxError
from mtx.train.components import Hooks, build_run
from mtx.train.milestones import describe_milestones
from mtx.train.trainer import Trainer, distributed, train


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def lines(metrics: Path, kind: str) -> list[dict]:
    """Logged events of one kind, as written (timing fields included)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in rows if row["event"] == kind]


def test_every_line_carries_the_training_clock_and_valid_lines_the_tokens_trained_on(tmp_path: Path) -> None:
    """Updates of 10 s, a run stopped at step 4 and resumed to step 8: the train line of step N says N × 10 s,
    summed over both sessions as train.max_time counts them, and on one process as many GPU-seconds; a valid
    line, written after its validation, counts the target tokens of every update so far, as the batch plan
    holds them, across the resume too."""
    clock = FakeClock(per_update=10.0)
    path = prepared(tmp_path)
    settings = dict(log_every=2, validate_every=4, save_every=1000)
    train(recipe(path, max_steps=4, **settings), hooks=clock.hooks)
    trainer = Trainer(build_run(recipe(path, max_steps=8, **settings), distributed.setup("cpu"), clock.hooks))
    try:
        trainer.fit()
    finally:
        distributed.teardown()
    metrics = run_files(path)[1]
    train_lines, valid_lines = lines(metrics, "train"), lines(metrics, "valid")
    assert [e["step"] for e in train_lines] == [2, 4, 6, 8] and [e["step"] for e in valid_lines] == [4, 8]
    for event in train_lines:
        assert 10 * event["step"] <= event["seconds"] < 10 * event["step"] + 5
    updates = [sum(collate(trainer.parts.train_split, i).n_tgt_tokens for i in batches)
               for _, batches in islice(trainer.parts.plan.updates(1), 8)]
    assert trainer.parts.plan.updates_per_epoch >= 8 and trainer.state.tokens == sum(updates)
    for event in valid_lines:
        assert event["tokens"] == sum(updates[: event["step"]])
        assert 10 * event["step"] <= event["seconds"] < 10 * event["step"] + 5
    for event in train_lines + valid_lines:
        assert event["gpu_seconds"] == event["seconds"]  # one process


def test_milestones_are_recorded_once_kept_in_the_checkpoint_and_printed(tmp_path: Path,
                                                                       capfd) -> None:
    """Validations every 2 updates score 10, 22, 21, 26, 30 against levels [20, 25, 27, 50]. A run stopped at
    step 6 has reached 20 (at step 4) and keeps it in its checkpoint; resumed, its step-8 validation (26)
    records 25 and not 20 again, step 10 records 27, and 50 is reported as not reached. The milestone lines
    equal those of a run that never stopped, but for the clock."""
    settings = dict(validate_every=2, save_every=1000, bleu_milestones=[20, 25, 27, 50])
    straight, resumed = prepared(tmp_path / "straight"), prepared(tmp_path / "resumed")
    train(recipe(straight, max_steps=10, **settings),
          hooks=Hooks(valid_bleu=scripted_bleu([10.0, 22.0, 21.0, 26.0, 30.0])))
    train(recipe(resumed, max_steps=6, **settings), hooks=Hooks(valid_bleu=scripted_bleu([10.0, 22.0, 21.0])))
    checkpoints, metrics = run_files(resumed)
    kept = load_checkpoint(checkpoints / "last.pt")["train_state"]["progress"]["milestones"]
    assert [(m["bleu_level"], m["step"]) for m in kept] == [(20.0, 4)]
    capfd.readouterr()
    state = train(recipe(resumed, max_steps=10, **settings), hooks=Hooks(valid_bleu=scripted_bleu([26.0, 30.0])))

    milestones = lines(metrics, "milestone")
    assert [(m["bleu_level"], m["step"], m["valid_bleu"]) for m in milestones] == [
        (20.0, 4, 22.0), (25.0, 8, 26.0), (27.0, 10, 30.0)]
    assert [(m["bleu_level"], m["step"]) for m in state.milestones] == [(20.0, 4), (25.0, 8), (27.0, 10)]
    kept = load_checkpoint(checkpoints / "last.pt")["train_state"]["progress"]["milestones"]
    assert kept == state.milestones == milestones
    valid_at = {e["step"]: e for e in lines(metrics, "valid")}
    for milestone in milestones:
        valid = valid_at[milestone["step"]]
        assert {k: milestone[k] for k in ("seconds", "gpu_seconds", "tokens")} == {
            k: valid[k] for k in ("seconds", "gpu_seconds", "tokens")}
        assert milestone["gpu_hours"] == pytest.approx(valid["gpu_seconds"] / 3600)
    assert events(metrics, "milestone") == events(run_files(straight)[1], "milestone")

    err = capfd.readouterr().err
    assert f"BLEU 25 reached at step 8, after {round(milestones[1]['seconds'])} s (< 0.01 GPU-hours, " in err
    assert "BLEU 20 reached at step 4" in err and "BLEU 27 reached at step 10" in err
    assert "BLEU 50 not reached (best valid BLEU so far 30.00)" in err


def test_milestones_are_described_in_hours_and_gpu_hours() -> None:
    """A run of 8 GPUs reaching 27 BLEU after 3 h 05 min: 24.7 GPU-hours. Levels are listed in order, one the
    recipe no longer names included (it was reached), one without a validation yet as such."""
    milestone = {"event": "milestone", "step": 41_000, "bleu_level": 27.0, "valid_bleu": 27.2, "seconds": 11_100.0,
                 "gpu_seconds": 88_800.0, "gpu_hours": 24.666, "tokens": 1_025_000_000}
    early = {**milestone, "bleu_level": 5.0, "step": 900, "seconds": 754.0, "gpu_seconds": 6032, "gpu_hours": 1.6756}
    assert describe_milestones([27.0, 28.4], [early, milestone], best_bleu=27.9) == [
        "BLEU 5 reached at step 900, after 12 min 34 s (1.68 GPU-hours, 1,025,000,000 target tokens)",
        "BLEU 27 reached at step 41,000, after 3 h 05 min (24.7 GPU-hours, 1,025,000,000 target tokens)",
        "BLEU 28.4 not reached (best valid BLEU so far 27.90)",
    ]
    assert describe_milestones([20.0], [], best_bleu=None) == ["BLEU 20 not reached (no validation yet)"]
    assert describe_milestones([], [], best_bleu=3.0) == []


@pytest.mark.parametrize("levels", [[25, 20], [20, 20], [0, 20], [20, 101], [-5]])
def test_bleu_milestones_must_be_ascending_levels_up_to_100(tmp_path: Path, levels: list[float]) -> None:
    path = prepared(tmp_path, train_pairs=20, valid_pairs=2)
    with pytest.raises(ConfigError, match=r"train.bleu_milestones = .* must be BLEU levels in \(0, 100\], ascending"):
        recipe(path, bleu_milestones=levels)
    assert recipe(path, bleu_milestones=[20, 25.5, 100]).train.bleu_milestones == [20.0, 25.5, 100.0]


def test_tensorboard_without_the_package_is_refused_before_any_work(tmp_path: Path, monkeypatch) -> None:
    """A missing package (an import that fails) stops the run before the data is batched or the model built,
    naming the extra to install; without train.tensorboard nothing imports it."""
    import mtx.train.components

    path = prepared(tmp_path, train_pairs=20, valid_pairs=2)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # `import` of it raises ImportError
    work: list[str] = []
    monkeypatch.setattr(mtx.train.components, "training_batches", lambda *a, **k: work.append("batches"))
    monkeypatch.setattr(mtx.train.components, "Transformer", lambda *a, **k: work.append("model"))
    with pytest.raises(MtxError, match=r"train.tensorboard is true, but TensorBoard cannot be imported .*"
                                       r"pip install 'mtx\[tensorboard\]', or set train.tensorboard: false"):
        train(recipe(path, tensorboard=True))
    assert work == []
    monkeypatch.undo()
    assert train(recipe(path, max_steps=1)).step == 1
    assert not (run_files(path)[1].parent / "tensorboard").exists()


def test_tensorboard_holds_the_curves_of_metrics_jsonl_once_across_a_resume(tmp_path: Path) -> None:
    """A run to step 8 (checkpoints at 4 and 8) loses its step-8 checkpoint and resumes from step 4: steps 6
    and 8 are logged again. TensorBoard shows every scalar of metrics.jsonl's train and valid lines at its step,
    once: the resumed session hid the first session's points after step 4."""
    event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    path = prepared(tmp_path)
    settings = dict(max_steps=8, log_every=2, validate_every=4, save_every=4, tensorboard=True)
    train(recipe(path, **settings))
    checkpoints, metrics = run_files(path)
    (checkpoints / "step_8.pt").unlink()
    (checkpoints / "last.pt").unlink()
    assert train(recipe(path, **settings)).step == 8

    board = event_accumulator.EventAccumulator(str(metrics.parent / "tensorboard"))
    board.Reload()
    expected = {f"train/{field}": [(e["step"], e[field]) for e in lines(metrics, "train")]
                for field in ("loss", "nll", "ppl", "lr", "grad_norm", "tokens_per_s", "skipped_steps")}
    expected |= {f"valid/{field}": [(e["step"], e[f"valid_{field}"]) for e in lines(metrics, "valid")]
                 for field in ("loss", "nll", "ppl", "bleu", "length_ratio")}
    assert sorted(board.Tags()["scalars"]) == sorted(expected)
    for tag, points in expected.items():
        shown = [(point.step, point.value) for point in board.Scalars(tag)]
        assert [step for step, _ in shown] == [step for step, _ in points], tag
        assert [value for _, value in shown] == pytest.approx([value for _, value in points], rel=1e-6), tag
    assert [step for step, _ in expected["train/loss"]] == [2, 4, 6, 8]
    assert len(list((metrics.parent / "tensorboard").glob("events.out.tfevents.*"))) == 2

    train(recipe(path, max_steps=2), restart=True)
    assert not (metrics.parent / "tensorboard").exists()  # --restart: the run's old curves go with its log
