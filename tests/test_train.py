"""The trainer: exact resume, signals, budgets, checkpoints, errors, and (slow) that a tiny model learns."""

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from copy_task import base_recipe, prepared, recipe, write_pairs, write_recipe
from rich.console import Console

from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.config import TrainConfig, load_recipe
from mtx.data import prepare
from mtx.errors import MtxError
from mtx.train import learning_rate, train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


def run_files(path: Path) -> tuple[Path, Path]:
    run = load_recipe(path).run_path
    return run / "checkpoints", run / "metrics.jsonl"


def events(metrics: Path, kind: str) -> list[dict]:
    """Logged events of one kind, without the wall-clock rate (the one field that depends on timing)."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [{k: v for k, v in row.items() if k not in ("event", "tokens_per_s")} for row in rows
            if row["event"] == kind]


def test_learning_rate_schedules() -> None:
    noam = TrainConfig(lr_schedule="noam", lr=1.0, warmup=4000)
    peak = 512**-0.5 * 4000**-0.5  # the paper's schedule peaks at step = warmup
    assert learning_rate(noam, 512, 4000) == pytest.approx(peak)
    assert learning_rate(noam, 512, 400) == pytest.approx(peak / 10)
    assert learning_rate(noam, 512, 16000) == pytest.approx(peak / 2)
    fairseq = TrainConfig(lr_schedule="inverse_sqrt", lr=7e-4, warmup=4000)
    assert learning_rate(fairseq, 512, 1000) == pytest.approx(7e-4 / 4)
    assert learning_rate(fairseq, 512, 4000) == pytest.approx(7e-4)
    assert learning_rate(fairseq, 512, 16000) == pytest.approx(7e-4 / 2)


def test_resume_is_exact(tmp_path: Path) -> None:
    """20 updates straight = 9 updates, stop mid-epoch, resume, 11 more: same weights and logged losses.

    Dropout, gradient accumulation, validation and a log window left open at the stop are all exercised.
    """
    settings = dict(update_freq=2, log_every=2, validate_every=4, save_every=5, keep_last=2)
    straight = prepared(tmp_path / "straight")
    state = train(recipe(straight, max_steps=20, **settings))
    assert state.step == 20 and state.epoch >= 2

    resumed = prepared(tmp_path / "resumed")
    stopped = train(recipe(resumed, max_steps=9, **settings))
    assert stopped.epoch == 2 and stopped.update_in_epoch > 0  # the stop falls inside an epoch
    assert stopped.window_tokens > 0  # and inside a log window
    assert train(recipe(resumed, max_steps=20, **settings)).step == 20

    (straight_ckpts, straight_metrics), (resumed_ckpts, resumed_metrics) = run_files(straight), run_files(resumed)
    expected = load_checkpoint(straight_ckpts / "last.pt")["model"]
    actual = load_checkpoint(resumed_ckpts / "last.pt")["model"]
    for name, tensor in expected.items():
        torch.testing.assert_close(actual[name], tensor, atol=1e-6, rtol=0, msg=name)
    for kind in ("train", "valid"):
        got, want = events(resumed_metrics, kind), events(straight_metrics, kind)
        assert [sorted(e) for e in got] == [sorted(e) for e in want]
        assert [list(e.values()) for e in got] == [pytest.approx(list(e.values()), rel=1e-6) for e in want]
    assert len(events(straight_metrics, "valid")) == 5
    assert [step for step, _ in step_checkpoints(straight_ckpts)] == [15, 20]  # keep_last
    assert (straight_ckpts / "best.pt").is_file() and "train_state" not in load_checkpoint(straight_ckpts / "best.pt")


def test_a_finished_run_has_nothing_to_do_and_restart_starts_over(tmp_path: Path, capfd) -> None:
    path = prepared(tmp_path)
    train(recipe(path, max_steps=3))
    assert train(recipe(path, max_steps=3)).step == 3
    assert "Nothing to do: train.max_steps = 3 reached" in capfd.readouterr().err
    assert train(recipe(path, max_steps=2), restart=True).step == 2
    checkpoints, metrics = run_files(path)
    assert [step for step, _ in step_checkpoints(checkpoints)] == [2]
    assert [e["step"] for e in events(metrics, "train")] == [2]


def test_a_checkpoint_of_another_model_shape_is_refused_until_restart(tmp_path: Path) -> None:
    path = prepared(tmp_path)
    train(recipe(path, max_steps=2))
    wider = load_recipe(path, ["model.d_model=64", "train.max_steps=3"])
    with pytest.raises(MtxError, match=r"model.d_model is 32 there, 64 here.*--restart"):
        train(wider)
    assert train(wider, restart=True).step == 3


def start_training(path: Path, *overrides: str) -> subprocess.Popen:
    sets = [arg for item in overrides for arg in ("--set", item)]
    return subprocess.Popen([sys.executable, "-m", "mtx", "train", str(path), *sets], env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_checkpoint(checkpoints: Path, process: subprocess.Popen, at_least: int = 1) -> None:
    deadline = time.monotonic() + 120
    while not (checkpoints.is_dir() and len(step_checkpoints(checkpoints)) >= at_least):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "no checkpoint within 2 minutes"
        time.sleep(0.1)


def test_sigterm_writes_a_checkpoint_and_exits_0(tmp_path: Path) -> None:
    path = prepared(tmp_path)
    checkpoints, _ = run_files(path)
    process = start_training(path, "train.max_steps=1000000", "train.save_every=1000", "train.save_every=7",
                             "train.log_every=1000")
    wait_for_checkpoint(checkpoints, process)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    assert "stopped by SIGTERM" in err and "Run the same command again to resume" in err
    last = load_checkpoint(checkpoints / "last.pt")
    assert last["step"] == step_checkpoints(checkpoints)[-1][0]
    assert last["train_state"]["progress"]["step"] == last["step"]
    assert train(recipe(path, max_steps=last["step"] + 2)).step == last["step"] + 2


def test_sigkill_leaves_a_run_that_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    path = prepared(tmp_path)
    checkpoints, metrics = run_files(path)
    process = start_training(path, "train.max_steps=1000000", "train.save_every=1", "train.keep_last=3",
                             "train.log_every=1")
    wait_for_checkpoint(checkpoints, process, at_least=3)
    process.kill()
    process.communicate(timeout=60)
    saved = step_checkpoints(checkpoints)
    for _, checkpoint in saved:
        load_checkpoint(checkpoint)  # raises on a torn file
    latest = saved[-1][0]
    assert train(recipe(path, max_steps=latest + 3, log_every=1)).step == latest + 3
    steps = [e["step"] for e in events(metrics, "train")]
    assert steps == list(range(1, latest + 4))  # events logged after the checkpoint were replaced, not repeated
    assert not list(checkpoints.glob(".*.tmp"))


def test_errors_are_clear(tmp_path: Path) -> None:
    unprepared = write_recipe(tmp_path, base_recipe(tmp_path, 50, 5), "unprepared.yaml")
    result = subprocess.run([sys.executable, "-m", "mtx", "train", str(unprepared)], env=ENV, text=True,
                            capture_output=True, timeout=120)
    assert result.returncode == 1 and "run `mtx prepare RECIPE` first" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr

    path = prepared(tmp_path)
    with pytest.raises(MtxError, match=r"data.bpe.vocab_size = 300 .* asks for 400.*mtx prepare"):
        train(load_recipe(path, ["data.bpe.vocab_size=400"]))
    with pytest.raises(MtxError, match=r"train.max_tokens = 5 cannot fit even one sentence pair.*at least \d+"):
        train(recipe(path, max_tokens=5))
    with pytest.raises(MtxError, match=r"more than model.max_positions = 4"):
        train(load_recipe(path, ["model.max_positions=4"]))
    if not torch.cuda.is_available():
        with pytest.raises(MtxError, match=r"train.device = 'cuda' but PyTorch sees no CUDA GPU"):
            train(recipe(path, device="cuda"))


@pytest.mark.slow
def test_a_tiny_model_learns_to_reverse(tmp_path: Path) -> None:
    """Reverse-copy of 2–8 random words: the best checkpoint scores BLEU ≥ 95 on a held-out test set.

    Calibrated on a shared 2-core CPU (one thread): valid BLEU passes 95 around update 700 and wobbles between
    92 and 99.6 afterwards, so the best checkpoint (chosen on the valid set) is scored. With the recipe's seed
    1 it scores 99.47 on the test set (seeds 2 and 3: 97.74 and 99.20), 2.7–4.5 above the bar, in about two
    minutes. lr 2e-3 with patience 3, calibrated earlier, stopped early at 93.7 after a change of float
    rounding alone (the fused loss): too close to the edge to be a test.
    """
    from mtx.checkpoint import load_model
    from mtx.score import corpus_bleu
    from mtx.translate import translate_sentences

    raw = base_recipe(tmp_path, train_pairs=4000, valid_pairs=100)
    test_files = write_pairs(tmp_path / "text", "test", 300, seed=3)
    raw["data"]["source"]["files"]["test"] = [str(p) for p in test_files]
    raw["model"].update(layers_enc=2, layers_dec=2, d_model=64, d_ff=256, dropout=0.0, norm="pre")
    raw["train"].update(max_tokens=1000, lr=1e-3, warmup=200, clip_norm=1.0, max_steps=1300, validate_every=100,
                        patience=5, log_every=100, save_every=100)
    path = write_recipe(tmp_path, raw)
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    started = time.monotonic()
    state = train(load_recipe(path))
    seconds = time.monotonic() - started

    model, tokenizer, _ = load_model(load_recipe(path).run_path / "checkpoints" / "best.pt")
    sources, references = (p.read_text().splitlines() for p in test_files)
    hyps = translate_sentences(model, tokenizer, sources, beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=5)
    bleu = corpus_bleu(hyps, references)
    print(f"reverse task: test BLEU {bleu:.2f}, best valid BLEU {state.best_bleu:.2f}, "
          f"{state.step} updates in {seconds:.0f} s")
    assert bleu >= 95
