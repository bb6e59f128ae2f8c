"""The trainer: exact resume, signals, budgets, checkpoints, errors, and (slow) that a tiny model learns."""

import io
import math
import os
import re
import signal
import subprocess
import sys
import time
from itertools import islice
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from support import (
    FakeClock,
    base_recipe,
    events,
    prepared,
    recipe,
    run_files,
    scripted_bleu,
    write_pairs,
    write_recipe,
)
from torch.utils._python_dispatch import TorchDispatchMode

from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.config.fields import parse_duration
from mtx.config.loading import load_recipe
from mtx.config.recipe import TrainConfig
from mtx.data.lexicon import Lexicon
from mtx.data.prepare import prepare
from mtx.errors import MtxError
from mtx.train.components import Hooks, build_run
from mtx.train.trainer import learning_rate, train

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


@pytest.fixture(autouse=True)
def one_thread() -> None:
    torch.set_num_threads(1)


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
    no_warmup = TrainConfig(lr_schedule="inverse_sqrt", lr=7e-4, warmup=0)
    assert [learning_rate(no_warmup, 512, step) for step in (1, 4)] == pytest.approx([7e-4, 7e-4 / 2])


def test_dropout_seeds_differ_for_every_update_rank_and_run() -> None:
    """Each update of each rank draws its own dropout masks, from a seed torch.manual_seed takes (an int in
    [0, 2^63)); the same (seed, step, rank) gives the same masks again after a resume."""
    from mtx.train.trainer import dropout_seed

    seeds = [dropout_seed(seed, step, rank) for seed in (1, 2) for step in range(1, 2001) for rank in range(8)]
    assert len(set(seeds)) == len(seeds) == 2 * 2000 * 8
    assert all(isinstance(s, int) and 0 <= s < 2**63 for s in seeds)
    assert dropout_seed(2**62, 2**40, 7) < 2**63 and dropout_seed(1, 5, 3) == seeds[4 * 8 + 3]


def test_resume_is_exact(tmp_path: Path) -> None:
    """20 updates straight = 9 updates, stop mid-epoch, resume, 11 more: same weights and logged losses.

    Dropout, gradient accumulation, validation and a log window left open at the stop are all exercised.
    """
    settings = dict(update_freq=2, log_every=2, validate_every=4, save_every=5, keep_last=2)
    straight = prepared(tmp_path / "straight")
    prepare(recipe(straight, "data.lexicon.learn=true"), workers=1, console=Console(file=io.StringIO()))  # its table
    state = train(recipe(straight, max_steps=20, **settings))
    assert state.step == 20 and state.epoch >= 2

    resumed = prepared(tmp_path / "resumed")
    stopped = train(recipe(resumed, max_steps=9, **settings))
    assert stopped.epoch == 2 and stopped.batch_in_epoch > 0  # the stop falls inside an epoch
    (straight_ckpts, straight_metrics), (resumed_ckpts, resumed_metrics) = run_files(straight), run_files(resumed)
    carried = load_checkpoint(resumed_ckpts / "last.pt")["train_state"]["progress"]
    assert carried["window_tokens"] > 0  # and inside a log window, which the checkpoint carries over
    assert train(recipe(resumed, max_steps=20, **settings)).step == 20

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
    best = load_checkpoint(straight_ckpts / "best.pt")
    assert "train_state" not in best
    # the data's lexical table travels with every checkpoint, so a shortlist needs no data folder
    np.testing.assert_array_equal(Lexicon.of_checkpoint(best).translations,
                                  Lexicon.load(straight_ckpts.parent / "data").translations)


def test_the_trainer_runs_each_update_through_its_hook_on_the_clock_it_is_handed(tmp_path: Path) -> None:
    """What a run takes from outside comes in as Hooks: the update hook is handed the state before each update,
    its batches and the update, and its answer is the trainer's; the clock handed in is the one train_seconds
    counts. `mtx train`'s own hooks are the real clock and loss, and an update run as it is."""
    from mtx.train.components import run_update
    from mtx.train.loss import batch_loss

    clock, seen = FakeClock(per_update=7.0), []

    def observed(state, batches, update):
        before = state.step
        stepped = clock.timed_update(state, batches, update)
        seen.append((before, state.step, len(batches), stepped))
        return stepped

    path = prepared(tmp_path)
    state = train(recipe(path, max_steps=3, update_freq=2, save_every=100),
                  hooks=Hooks(clock=clock, around_update=observed))
    assert seen == [(0, 1, 2, True), (1, 2, 2, True), (2, 3, 2, True)]
    assert 21 <= state.train_seconds < 26
    assert (Hooks().clock, Hooks().loss, Hooks().around_update, Hooks().valid_bleu) == (
        time.monotonic, batch_loss, run_update, None)


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


def wait_for_step(metrics: Path, process: subprocess.Popen, step: int) -> None:
    """Until the run has logged update `step` (log_every 1): training is under way."""
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and any(e["step"] >= step for e in events(metrics, "train"))):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no update {step} within 2 minutes"
        time.sleep(0.1)


@pytest.mark.parametrize("signame", ["SIGTERM", "SIGUSR1"])
def test_a_stop_signal_saves_the_step_it_stopped_at_and_exits_0(tmp_path: Path, signame: str) -> None:
    """SIGTERM (a pre-emption) or SIGUSR1 (SLURM's warning, forwarded by torchrun): the run stops after the
    update in progress and writes the checkpoint of that very step, with no scheduled save to fall back on.
    Meanwhile a second `mtx train` on the same run refuses, naming the first one's process."""
    path = prepared(tmp_path)
    checkpoints, metrics = run_files(path)
    process = start_training(path, "train.max_steps=1000000", "train.save_every=1000000", "train.log_every=1")
    wait_for_step(metrics, process, 3)
    if signame == "SIGTERM":
        second = subprocess.run([sys.executable, "-m", "mtx", "train", str(path)], env=ENV, text=True,
                                capture_output=True, timeout=120)
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stderr
        assert "is in use by another `mtx train`" in second.stderr and f"pid {process.pid}" in second.stderr
    process.send_signal(getattr(signal, signame))
    _, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    stopped = int(re.search(r"Training stopped at step (\d+): stopped by " + signame, err).group(1))
    assert "Run the same command again to resume" in err
    assert [step for step, _ in step_checkpoints(checkpoints)] == [stopped]
    last = load_checkpoint(checkpoints / "last.pt")
    assert last["step"] == last["train_state"]["progress"]["step"] == stopped
    assert not (path.parent / "run" / "train.lock").exists()
    assert train(recipe(path, max_steps=stopped + 2)).step == stopped + 2


def test_a_signal_during_validation_stops_without_finishing_it(tmp_path: Path, monkeypatch) -> None:
    """A pre-emption gives seconds, not a validation's minutes: a signal that arrives while the valid set is
    being decoded abandons the validation (nothing logged for it) and stops on a checkpoint of that step."""
    import mtx.decode.translator
    from mtx.train.trainer import Trainer, distributed

    path = prepared(tmp_path)
    trainer = Trainer(build_run(recipe(path, max_steps=50, validate_every=4, save_every=100),
                                distributed.setup("cpu")))
    decode = mtx.decode.translator.translate_sentences

    def signal_arrives(*args, **kwargs):
        trainer.parts.signals.received = "SIGTERM"
        return decode(*args, **kwargs)

    monkeypatch.setattr(mtx.decode.translator, "translate_sentences", signal_arrives)
    assert trainer.fit().step == 4
    checkpoints, metrics = run_files(path)
    assert [step for step, _ in step_checkpoints(checkpoints)] == [4]
    assert events(metrics, "valid") == [] and not (checkpoints / "best.pt").exists()


KILLED_WHILE_SAVING = """
import io, os, signal, sys
import torch
from mtx.config.loading import load_recipe
from mtx.train.trainer import train

save, saves = torch.save, []

def save_and_die_on_the_third(obj, f):
    saves.append(1)
    if len(saves) < 3:
        return save(obj, f)
    whole = io.BytesIO()
    save(obj, whole)
    f.write(whole.getvalue()[: len(whole.getvalue()) // 2])
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)

torch.save = save_and_die_on_the_third
train(load_recipe(sys.argv[1], sys.argv[2:]))
"""


def test_a_kill_in_the_middle_of_a_checkpoint_leaves_a_run_that_resumes(tmp_path: Path) -> None:
    """SIGKILL half-way through writing the third checkpoint, every time (not by luck of timing): the torn
    bytes never take a checkpoint's name, the two saved before load, and the run resumes from the second with
    the events logged after it replaced, not repeated."""
    path = prepared(tmp_path)
    checkpoints, metrics = run_files(path)
    killed = subprocess.run([sys.executable, "-c", KILLED_WHILE_SAVING, str(path), "train.max_steps=100",
                             "train.save_every=1", "train.keep_last=0", "train.log_every=1"],
                            env=ENV, text=True, capture_output=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert [step for step, _ in step_checkpoints(checkpoints)] == [1, 2]
    assert len(list(checkpoints.glob(".step_3.pt.*.tmp"))) == 1  # the torn write, under a temporary name
    for _, checkpoint in step_checkpoints(checkpoints):
        load_checkpoint(checkpoint)  # raises on a torn file
    assert load_checkpoint(checkpoints / "last.pt")["step"] == 2
    assert [e["step"] for e in events(metrics, "train")] == [1, 2, 3]  # step 3 was logged before its save

    assert train(recipe(path, max_steps=5, log_every=1, save_every=1, keep_last=0)).step == 5
    assert [e["step"] for e in events(metrics, "train")] == [1, 2, 3, 4, 5]
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
    with pytest.raises(MtxError, match=r"No training pair fits.*train.max_tokens = 2 or model.max_positions = 64"):
        train(recipe(path, max_tokens=2))
    with pytest.raises(MtxError, match=r"No training pair fits.*model.max_positions = 2\. Raise them"):
        train(load_recipe(path, ["model.max_positions=2"]))
    if not torch.cuda.is_available():
        with pytest.raises(MtxError, match=r"train.device = 'cuda' but PyTorch sees no CUDA GPU"):
            train(recipe(path, device="cuda"))
    with pytest.raises(MtxError, match=r"The model has [\d,]+ parameters: .* need [\d,.]+ GiB, more than"):
        train(load_recipe(path, ["model.d_model=131072", "model.heads=1"]))


@pytest.mark.slow
def test_a_tiny_model_learns_to_reverse(tmp_path: Path) -> None:
    """Reverse-copy of 2–8 random words: the best checkpoint scores BLEU ≥ 97 on a held-out test set.

    Calibrated on a shared 2-core CPU (one thread): valid BLEU passes 95 around update 700 and wobbles between
    92 and 99.6 afterwards, so the best checkpoint by valid BLEU (train.best_metric) is scored. With the recipe's seed
    1 it scores 99.47 on the test set; seeds 2 and 3 score 97.74 and 99.20. The bar is the lowest of the three
    seeds less a margin of 0.74 BLEU, for float rounding that differs between machines. lr 2e-3 with patience
    3, calibrated earlier, stopped early at 93.7 after a change of float rounding alone (the fused loss): too
    close to the edge to be a test.
    """
    from mtx.checkpoint import load_model
    from mtx.config.recipe import DecodeConfig
    from mtx.decode.translator import translate_sentences
    from mtx.score.metrics import corpus_bleu

    raw = base_recipe(tmp_path, train_pairs=4000, valid_pairs=100)
    test_files = write_pairs(tmp_path / "text", "test", 300, seed=3)
    raw["data"]["source"]["files"]["test"] = [str(p) for p in test_files]
    raw["model"].update(layers_enc=2, layers_dec=2, d_model=64, d_ff=256, dropout=0.0, norm="pre")
    raw["train"].update(max_tokens=1000, lr=1e-3, warmup=200, clip_norm=1.0, max_steps=1300, validate_every=100,
                        patience=5, best_metric="bleu", log_every=100, save_every=100)
    path = write_recipe(tmp_path, raw)
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    started = time.monotonic()
    state = train(load_recipe(path))
    seconds = time.monotonic() - started

    model, tokenizer, _ = load_model(load_recipe(path).run_path / "checkpoints" / "best.pt")
    sources, references = (p.read_text().splitlines() for p in test_files)
    hyps = translate_sentences(model, tokenizer, sources, DecodeConfig(beam=1, lenpen=0.6, max_len_a=1.0, max_len_b=5))
    bleu = corpus_bleu(hyps, references)
    print(f"reverse task: test BLEU {bleu:.2f}, best valid BLEU {state.best_bleu:.2f}, "
          f"{state.step} updates in {seconds:.0f} s")
    assert bleu >= 97


def test_pairs_too_long_for_the_model_are_left_out_with_a_warning(tmp_path: Path, capfd) -> None:
    """Data prepared for longer positions than the model has: the pairs that do not fit are left out of every
    batch and counted in a warning; the rest trains. One over-long pair never stops a run."""
    from mtx.data.batching import pair_costs
    from mtx.train.trainer import Trainer, distributed

    path = prepared(tmp_path)
    trainer = Trainer(build_run(load_recipe(path, ["model.max_positions=6", "train.max_steps=2"]),
                                distributed.setup("cpu")))
    split = trainer.parts.train_split
    costs = pair_costs(split.src_lens, split.tgt_lens)
    left_out = int((costs > 6).sum())
    assert 0 < left_out < len(costs)
    batched = np.concatenate(trainer.parts.plan.batches)
    assert len(batched) == len(costs) - left_out and costs[batched].max() <= 6
    assert f"warning: {left_out:,} of {len(costs):,} training pairs are longer than 6 tokens" in capfd.readouterr().err
    assert trainer.fit().step == 2


def train_losses(path: Path, *overrides: str, **settings: object) -> list[float]:
    """The logged train losses of a fresh run of `path` (log_every 10) with these overrides."""
    train(recipe(path, *overrides, log_every=10, validate_every=1000, save_every=1000, **settings), restart=True)
    return [e["loss"] for e in events(run_files(path)[1], "train")]


def test_half_precision_training_learns_as_float32_does(tmp_path: Path) -> None:
    """bf16 autocast, and fp16 autocast with the grad scaler (both run on a CPU as on a GPU), learn the reverse
    task: the loss falls by a clear margin, tracking float32's curve."""
    path = prepared(tmp_path)
    fp32 = train_losses(path, "model.dropout=0.0", max_steps=80, precision="fp32")
    assert fp32[-1] < 0.7 * fp32[0]
    for precision in ("bf16", "fp16"):
        half = train_losses(path, "model.dropout=0.0", max_steps=80, precision=precision)
        assert half == pytest.approx(fp32, rel=0.03), precision


class HostSyncs(TorchDispatchMode):
    """Records the operations that make the host wait for the device: reading a value (`.item()`,
    `.tolist()`, `bool(tensor)`) and data-dependent shapes (boolean-mask indexing, `nonzero`)."""

    SYNCING = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "unique", "equal"}

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in self.SYNCING or (name == "index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []))):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_micro_batch_never_waits_for_the_device(tmp_path: Path, precision: str) -> None:
    """Forward, loss and backward of a micro-batch queue GPU work without reading anything back: the target
    positions come with the batch, padding is masked by multiplication, sums stay on the device."""
    from mtx.data.batching import collate
    from mtx.train.trainer import Trainer, distributed

    trainer = Trainer(build_run(recipe(prepared(tmp_path), precision=precision), distributed.setup("cpu")))
    (_, indices), *_ = trainer.parts.plan.updates(1)
    batch = collate(trainer.parts.train_split, indices[0])
    assert bool((batch.tgt_out == 0).any())  # the batch has target padding to skip
    with HostSyncs() as syncs:
        sums = trainer._forward_backward(batch, scale=1.0 / batch.n_tgt_tokens, sync=True)
    assert syncs.seen == []
    assert sums.shape == (2,) and trainer.parts.model.tgt_embed.weight.grad is not None


@pytest.mark.parametrize(("precision", "decoded_in"), [("fp32", torch.float32), ("bf16", torch.bfloat16)])
def test_validation_decodes_in_the_trainings_precision(tmp_path: Path, monkeypatch, precision: str,
                                                       decoded_in: torch.dtype) -> None:
    """Valid BLEU's decoding runs under the training's autocast (bf16 on GPUs that have it), not in float32
    beside a bf16 training; a float32 training allows TF32 on a GPU (and changes nothing on a CPU)."""
    import mtx.decode.translator
    import mtx.train.components
    from mtx.train import distributed
    from mtx.train.trainer import Trainer

    decoded: list[torch.dtype] = []
    translate = mtx.decode.translator.translate_sentences

    def recorded(*args, **kwargs):
        decoded.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
        return translate(*args, **kwargs)

    tf32: list[torch.device] = []
    monkeypatch.setattr(mtx.decode.translator, "translate_sentences", recorded)
    monkeypatch.setattr(mtx.train.components, "allow_tf32", tf32.append)
    trainer = Trainer(build_run(recipe(prepared(tmp_path), precision=precision), distributed.setup("cpu")))
    scores = trainer.parts.validator.run()
    assert decoded and set(decoded) == {decoded_in} and 0.0 <= scores.bleu <= 100.0 and scores.loss > 0
    assert scores.length_ratio >= 0
    assert tf32 == ([torch.device("cpu")] if precision == "fp32" else [])


def test_compiled_training_matches_eager_without_compiling_each_shape(tmp_path: Path) -> None:
    """`train.compile: true`: updates over batches of changing shapes give eager training's losses and
    gradient norms, from one compiled graph (dynamic shapes) rather than one per shape — two where some
    batches' sources are padded and some not (those pass no mask: `Batch.src_pad_if_any`). Inductor generates
    and builds C++ here as it generates Triton on a GPU: the slowest fast test (most of it compilation)."""
    import torch._dynamo

    from mtx.data.batching import collate
    from mtx.train.trainer import Trainer, distributed

    path = prepared(tmp_path)
    settings = dict(max_steps=6, log_every=1, validate_every=1000, save_every=1000)
    train(recipe(path, "model.dropout=0.0", **settings))
    eager = events(run_files(path)[1], "train")
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    trainer = Trainer(build_run(recipe(path, "model.dropout=0.0", compile=True, **settings), distributed.setup("cpu")),
                      restart=True)
    collated = [collate(trainer.parts.train_split, b) for _, batches in islice(trainer.parts.plan.updates(1), 6)
                for b in batches]
    assert len({(c.src.shape, c.tgt_in.shape) for c in collated}) >= 4  # the six updates' batches vary in shape
    trainer.fit()
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == len({c.src_padded for c in collated})
    compiled = events(run_files(path)[1], "train")
    for key in ("loss", "grad_norm"):
        assert [e[key] for e in compiled] == pytest.approx([e[key] for e in eager], rel=1e-3), key


def test_dist_timeout_reaches_both_process_groups(tmp_path: Path, monkeypatch) -> None:
    """train.dist_timeout bounds how long ranks wait for one another (the default group and the gloo group
    the trainer agrees on), so a rank that never arrives fails the run instead of hanging it."""
    from datetime import timedelta

    import torch.distributed as dist

    from mtx.train import distributed

    joined: list[dict] = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda **kwargs: joined.append(kwargs))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    path = write_recipe(tmp_path, base_recipe(tmp_path, 50, 5))
    config = recipe(path, dist_timeout="90s").train
    ctx = distributed.setup("cpu", parse_duration(config.dist_timeout, "train.dist_timeout"))
    distributed.teardown()
    assert (ctx.rank, ctx.world) == (1, 2)
    assert joined == [{"backend": "gloo", "timeout": timedelta(seconds=90)}]
    with pytest.raises(MtxError, match=r"train.dist_timeout = '0s' must be a positive duration"):
        recipe(path, dist_timeout="0s")


def test_the_trainer_learns_at_the_scheduled_rate(tmp_path: Path) -> None:
    """The fast guard that training works: train and valid loss fall by a clear margin within 80 updates,
    every logged lr is the schedule's value at its step, and that rate is the one the optimizer used."""
    path = prepared(tmp_path)
    for schedule in ("inverse_sqrt", "noam"):
        lr = 3e-3 if schedule == "inverse_sqrt" else 0.08  # both peak at 3e-3 at step 20
        run = recipe(path, "model.dropout=0.0", max_steps=80, lr_schedule=schedule, lr=lr, warmup=20, log_every=10,
                     validate_every=10, save_every=1000)
        train(run, restart=True)
        checkpoints, metrics = run_files(path)
        logged, valid = events(metrics, "train"), events(metrics, "valid")
        assert [e["step"] for e in logged] == list(range(10, 81, 10))
        assert logged[-1]["loss"] < 0.7 * logged[0]["loss"], schedule
        assert valid[-1]["valid_loss"] < 0.75 * valid[0]["valid_loss"], schedule
        for event in logged:
            assert event["lr"] == pytest.approx(learning_rate(run.train, 32, event["step"]), rel=1e-12)
        [group] = load_checkpoint(checkpoints / "last.pt")["train_state"]["optimizer"]["param_groups"]
        assert group["lr"] == pytest.approx(learning_rate(run.train, 32, 80), rel=1e-12)


def test_max_time_counts_training_time_across_resumes(tmp_path: Path, capfd) -> None:
    """Updates of 10 s: a budget of 45 s stops after the 5th update, checkpointed; raised to 95 s, the
    resumed run stops after the 10th, since the 50 s already trained count (not after the 15th)."""
    clock = FakeClock(per_update=10.0)
    path = prepared(tmp_path)
    assert train(recipe(path, max_steps=1000, max_time="45s", save_every=1000), hooks=clock.hooks).step == 5
    last = run_files(path)[0] / "last.pt"
    assert (f"Training stopped at step 5: train.max_time = 45s of training reached. Checkpoint: {last}. To train "
            "on, raise that budget and run the same command again: it resumes from here.") in capfd.readouterr().err
    state = train(recipe(path, max_steps=1000, max_time="95s", save_every=1000), hooks=clock.hooks)
    assert state.step == 10 and 100 <= state.train_seconds < 105
    assert [step for step, _ in step_checkpoints(run_files(path)[0])] == [5, 10]
    assert train(recipe(path, max_steps=1000, max_time="95s"), hooks=clock.hooks).step == 10
    assert "Nothing to do: train.max_time = 95s of training reached at step 10" in capfd.readouterr().err


def test_save_every_minutes_saves_by_the_wall_clock(tmp_path: Path) -> None:
    """Updates of 10 s and save_every_minutes 0.5: a checkpoint every third update, besides the last."""
    clock = FakeClock(per_update=10.0)
    path = prepared(tmp_path)
    train(recipe(path, max_steps=10, save_every_minutes=0.5, save_every=1000), hooks=clock.hooks)
    assert [step for step, _ in step_checkpoints(run_files(path)[0])] == [3, 6, 9, 10]


def test_a_resume_on_another_shape_continues_at_the_batch_where_the_run_stopped(tmp_path: Path,
                                                                                 capfd) -> None:
    """update_freq 2 for 3 updates (batches 0-5 of the epoch's order), then update_freq 1: the second session
    trains batches 6, 7, 8 …, none skipped or repeated, and says the effective batch changed. (Counting the
    position in updates, as mtx did, would have restarted at batch 3.)"""
    from mtx.data.batching import collate
    from mtx.train import distributed
    from mtx.train.trainer import Trainer

    trained: list[torch.Tensor] = []

    def recorded(state, batches, update):
        trained.extend(batch.tgt_out for batch in batches)
        return update()

    hooks = Hooks(around_update=recorded)
    path = prepared(tmp_path)
    assert train(recipe(path, max_steps=3, update_freq=2, save_every=100), hooks=hooks).batch_in_epoch == 6
    capfd.readouterr()
    trainer = Trainer(build_run(recipe(path, max_steps=7, update_freq=1), distributed.setup("cpu"), hooks))
    message = capfd.readouterr().err
    assert ("Resuming on 1 process × update_freq 1 where the run stopped on 1 × 2: it continues at batch 6 of "
            "epoch 1. The effective batch changes from 2 to 1 batches") in " ".join(message.split())
    trainer.fit()
    distributed.teardown()
    order = trainer.parts.plan.epoch_order(1)
    expected = [collate(trainer.parts.train_split, trainer.parts.plan.batches[i]).tgt_out for i in order[:10]]
    assert len(trained) == 10
    assert all(torch.equal(a, b) for a, b in zip(trained, expected, strict=True))
    state = load_checkpoint(run_files(path)[0] / "last.pt")["train_state"]["progress"]
    assert (state["batch_in_epoch"], state["world"], state["update_freq"]) == (10, 1, 1)


def test_update_tokens_sets_each_sessions_micro_batches_from_its_processes(tmp_path: Path, capfd) -> None:
    """train.update_tokens 320 with max_tokens 160: 2 micro-batches of 160 on one process, 1 each on two, 1 of
    107 each on three; the run trains exactly as max_tokens 160 with update_freq 2 does, and says so."""
    from mtx.train import distributed
    from mtx.train.components import for_this_session
    from mtx.train.trainer import Trainer

    path = prepared(tmp_path / "a")
    shapes = {world: (cfg.max_tokens, cfg.update_freq) for world in (1, 2, 3)
              for cfg in [for_this_session(recipe(path, update_tokens=320), world).train]}
    assert shapes == {1: (160, 2), 2: (160, 1), 3: (107, 1)}
    assert for_this_session(recipe(path), 8).train == recipe(path).train  # without update_tokens: as it is

    chosen = Trainer(build_run(recipe(path, update_tokens=320, max_steps=3, save_every=100),
                               distributed.setup("cpu")))
    assert "train.update_tokens 320 on 1 process: micro-batches of up to 160 tokens, update_freq 2." in \
        " ".join(capfd.readouterr().err.split())
    chosen.fit()
    explicit = Trainer(build_run(recipe(prepared(tmp_path / "b"), update_freq=2, max_steps=3, save_every=100),
                                 distributed.setup("cpu")))
    explicit.fit()
    distributed.teardown()
    assert chosen.state.batch_in_epoch == explicit.state.batch_in_epoch == 6
    for name, tensor in explicit.parts.model.state_dict().items():
        assert torch.equal(chosen.parts.model.state_dict()[name], tensor), name


def test_a_resume_with_another_max_tokens_continues_at_the_same_fraction_of_the_epoch(tmp_path: Path,
                                                                                        capfd) -> None:
    """Batches of 160 tokens for 4 updates, then of 80 (as after running out of memory): the second session's
    batches are others, so it continues where the same share of the epoch is done, and says so."""
    from mtx.train import distributed
    from mtx.train.trainer import Trainer

    path = prepared(tmp_path)
    first = train(recipe(path, max_steps=4, save_every=100))
    assert (first.batch_in_epoch, first.max_tokens) == (4, 160)
    capfd.readouterr()
    trainer = Trainer(build_run(recipe(path, max_tokens=80, max_steps=5), distributed.setup("cpu")))
    distributed.teardown()
    now = len(trainer.parts.plan.batches)
    assert now > first.epoch_batches
    expected = round(4 * now / first.epoch_batches)
    assert (trainer.state.batch_in_epoch, trainer.state.max_tokens, trainer.state.epoch_batches) == (expected, 80, now)
    assert (f"The batches were cut with max_tokens 160 when the run stopped and are cut with 80 now: it continues "
            f"at the same fraction of epoch 1, batch {expected} of {now} (it stopped at 4 of "
            f"{first.epoch_batches}).") in " ".join(capfd.readouterr().err.split())


def test_a_checkpoint_that_counted_updates_resumes_at_the_same_batch() -> None:
    """A checkpoint from before positions were counted in batches (update_in_epoch, no shape) resumes as
    that mtx would have resumed it: this session's shape, update_in_epoch of its updates."""
    from mtx.train.state import TrainState

    old = TrainState.from_progress({"step": 9, "epoch": 2, "update_in_epoch": 4}, world=2, update_freq=3,
                                   best_metric="bleu")
    assert (old.batch_in_epoch, old.world, old.update_freq) == (24, 2, 3)
    new = TrainState.from_progress({"step": 9, "epoch": 2, "batch_in_epoch": 7, "world": 1, "update_freq": 1},
                                   world=2, update_freq=3, best_metric="bleu")
    assert (new.batch_in_epoch, new.world, new.update_freq) == (7, 1, 1)


def test_max_epochs_stops_at_the_end_of_an_epoch_and_resumes_to_the_next(tmp_path: Path, capfd) -> None:
    from mtx.train.trainer import distributed

    path = prepared(tmp_path)
    per_epoch = build_run(recipe(path), distributed.setup("cpu")).plan.updates_per_epoch
    distributed.teardown()
    state = train(recipe(path, max_steps=1000, max_epochs=1))
    assert (state.step, state.epoch, state.batch_in_epoch) == (per_epoch, 1, per_epoch)
    assert f"Training stopped at step {per_epoch}: train.max_epochs = 1 reached" in capfd.readouterr().err
    assert train(recipe(path, max_steps=1000, max_epochs=2)).step == 2 * per_epoch


def test_patience_stops_early_and_best_pt_is_the_best_bleu_step(tmp_path: Path, capfd) -> None:
    """Validations every 2 updates score 10, 20, 15, 20, 12: with patience 3 the run stops after the fifth
    (three without improving on 20; an equal score is no improvement), and best.pt is step 4's model."""
    path = prepared(tmp_path)
    state = train(recipe(path, max_steps=1000, validate_every=2, patience=3, save_every=1000, best_metric="bleu"),
                  hooks=Hooks(valid_bleu=scripted_bleu([10.0, 20.0, 15.0, 20.0, 12.0, 30.0])))
    assert (state.step, state.best_bleu, state.bad_validations) == (10, 20.0, 3)
    assert "Training stopped at step 10: early stopping: valid BLEU has not improved in 3 validations" in (
        capfd.readouterr().err)
    checkpoints, metrics = run_files(path)
    assert [(e["step"], e["valid_bleu"], e["best_bleu"]) for e in events(metrics, "valid")] == [
        (2, 10.0, 10.0), (4, 20.0, 20.0), (6, 15.0, 20.0), (8, 20.0, 20.0), (10, 12.0, 20.0)]
    for event in events(metrics, "valid"):
        assert sorted(event) == ["best_bleu", "step", "tokens", "valid_bleu", "valid_length_ratio", "valid_loss",
                                 "valid_nll", "valid_ppl"]
        assert event["valid_length_ratio"] == event["valid_bleu"] / 20
        assert event["valid_ppl"] == pytest.approx(math.exp(event["valid_nll"]))
        assert event["valid_loss"] > event["valid_nll"] > 0  # label smoothing adds to the nll
    best = load_checkpoint(checkpoints / "best.pt")
    assert best["step"] == 4
    step_4 = train(recipe(path, max_steps=4, save_every=1000), restart=True)
    assert step_4.step == 4
    for name, tensor in load_checkpoint(checkpoints / "last.pt")["model"].items():
        torch.testing.assert_close(best["model"][name], tensor, atol=0, rtol=0, msg=name)


def test_valid_bleu_decodes_with_valid_beam_and_the_recipe_decode_settings(tmp_path: Path, monkeypatch) -> None:
    import mtx.decode.translator
    from mtx.config.recipe import DecodeConfig

    calls: list[DecodeConfig] = []
    decode = mtx.decode.translator.translate_sentences

    def recorded(model, tokenizer, sources, options):
        calls.append(options)
        return decode(model, tokenizer, sources, options)

    monkeypatch.setattr(mtx.decode.translator, "translate_sentences", recorded)
    path = prepared(tmp_path)
    train(recipe(path, "decode.lenpen=0.3", "decode.lenpen_style=fairseq", "decode.max_len_b=7", max_steps=2,
                 validate_every=2, valid_beam=3))
    assert calls == [DecodeConfig(beam=3, lenpen=0.3, lenpen_style="fairseq", max_len_a=1.0, max_len_b=7, min_len=0)]


def signals_after_update(step: int, *signums: int) -> Hooks:
    """Hooks that deliver `signums` to this process right after update `step`, as a user or a scheduler would."""
    def update_then_signal(state, batches, update):
        stepped = update()
        if state.step == step:
            for signum in signums:
                os.kill(os.getpid(), signum)
        return stepped

    return Hooks(around_update=update_then_signal)


def test_ctrl_c_stops_on_a_checkpoint_and_a_second_ctrl_c_aborts(tmp_path: Path, capfd) -> None:
    """The first SIGINT asks for a clean stop: a checkpoint of that step, the handlers given back. A second
    one, for a user who will not wait, aborts at once with KeyboardInterrupt."""
    handler = signal.getsignal(signal.SIGINT)
    path = prepared(tmp_path)
    assert train(recipe(path, max_steps=1000, save_every=1000), hooks=signals_after_update(3, signal.SIGINT)).step == 3
    last = run_files(path)[0] / "last.pt"
    assert (f"Training stopped at step 3: stopped by SIGINT. Checkpoint: {last}. Run the same command again to "
            "resume.") in capfd.readouterr().err
    assert [step for step, _ in step_checkpoints(run_files(path)[0])] == [3]
    assert signal.getsignal(signal.SIGINT) is handler

    with pytest.raises(KeyboardInterrupt):
        train(recipe(path, max_steps=1000, save_every=1000),
              hooks=signals_after_update(5, signal.SIGINT, signal.SIGINT))
    assert signal.getsignal(signal.SIGINT) is handler
    assert [step for step, _ in step_checkpoints(run_files(path)[0])] == [3]


def test_a_loss_that_turns_nan_stops_the_run_with_advice(tmp_path: Path) -> None:
    """fp32: a NaN loss from update 3 on is caught at the next log line (step 4), with what to change."""
    from mtx.train.loss import batch_loss

    def nan_from_step_3(model, batch, smoothing, run=None):
        loss_sum, nll_sum, n = batch_loss(model, batch, smoothing, run=run)
        if trainer_steps[0] >= 2:
            loss_sum = loss_sum * math.nan
        return loss_sum, nll_sum, n

    trainer_steps = [0]

    def counted(state, batches, update):
        trainer_steps[0] = state.step
        return update()

    path = prepared(tmp_path)
    with pytest.raises(MtxError, match=r"Training diverged at step 4 \(loss nan\): lower train.lr.*--restart"):
        train(recipe(path, max_steps=1000, log_every=2, save_every=1000),
              hooks=Hooks(loss=nan_from_step_3, around_update=counted))
    assert [e["step"] for e in events(run_files(path)[1], "train")] == [2]


def test_fp16_gives_up_when_the_loss_scale_collapses(tmp_path: Path) -> None:
    """fp16 with gradients that are inf at every scale: each update is skipped and the scale halved, and once
    it falls below MIN_LOSS_SCALE the run stops with advice instead of skipping forever. No update counts."""
    from mtx.train.loss import batch_loss
    from mtx.train.trainer import MIN_LOSS_SCALE

    updates: list[int] = []
    hooks = Hooks(loss=lambda *args, **kwargs: (batch_loss(*args, **kwargs)[0] * math.inf,
                                                *batch_loss(*args, **kwargs)[1:]),
                  around_update=lambda state, batches, update: updates.append(1) or update())
    path = prepared(tmp_path)
    with pytest.raises(MtxError, match=r"Training diverged at step 0: the fp16 loss scale fell below 0.0001"):
        train(recipe(path, max_steps=1000, precision="fp16", log_every=1), hooks=hooks)
    # GradScaler starts at 2^16 and halves on each skip: the 30th skip is the first below MIN_LOSS_SCALE.
    assert len(updates) == math.ceil(math.log2(2.0**16 / MIN_LOSS_SCALE)) == 30


def test_resume_refuses_a_checkpoint_it_cannot_continue_and_says_why(tmp_path: Path) -> None:
    """Another tokenizer or vocabulary, or no training state (an averaged model put in as last.pt, with no
    step file left): each named, with --restart as the way out. Nothing is overwritten."""
    from mtx.checkpoint import save_checkpoint
    from mtx.train.average import average_checkpoints

    path = prepared(tmp_path)
    train(recipe(path, max_steps=2, save_every=1))
    checkpoints = run_files(path)[0]
    step_2 = load_checkpoint(checkpoints / "step_2.pt")
    edits = [({"tokenizer": step_2["tokenizer"].replace('"unk_token"', '"unk_token" ')},
              "the data was prepared again since (another tokenizer)"),
             ({"vocab_size": step_2["vocab_size"] + 1},
              f"the vocabulary has {step_2['vocab_size'] + 1} tokens there, {step_2['vocab_size']} here")]
    for edit, reason in edits:
        save_checkpoint({**step_2, **edit}, checkpoints / "step_3.pt")
        with pytest.raises(MtxError) as error:
            train(recipe(path, max_steps=5))
        assert str(error.value) == (f"Cannot resume from {checkpoints / 'step_3.pt'}: {reason}. Pass --restart to "
                                    f"delete {checkpoints} and start over, or give the recipe another name or run_dir.")
    averaged = average_checkpoints([checkpoints / "step_2.pt"])
    for step_file in checkpoints.glob("step_*.pt"):
        step_file.unlink()
    save_checkpoint(averaged, checkpoints / "last.pt")
    with pytest.raises(MtxError, match=r"last\.pt: it holds no training state \(an averaged checkpoint\?\)\. Pass"):
        train(recipe(path, max_steps=5))


def test_patience_without_a_valid_split_is_refused_at_start(tmp_path: Path) -> None:
    raw = base_recipe(tmp_path, 100, 5)
    del raw["data"]["source"]["files"]["valid"]
    path = write_recipe(tmp_path, raw)
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    with pytest.raises(MtxError, match=r"^train.patience is set but the prepared data has no valid split"):
        train(recipe(path, patience=2))
    assert train(recipe(path, max_steps=2)).step == 2  # without patience it trains, validating nothing


def test_without_hard_links_last_pt_is_a_copy(tmp_path: Path, monkeypatch) -> None:
    """On a filesystem without hard links (some network and object stores), last.pt is a full copy."""
    def no_links(*args):
        raise OSError("hard links are not supported here")

    monkeypatch.setattr(os, "link", no_links)
    path = prepared(tmp_path)
    train(recipe(path, max_steps=2, save_every=1))
    checkpoints = run_files(path)[0]
    assert (checkpoints / "last.pt").read_bytes() == (checkpoints / "step_2.pt").read_bytes()
    assert not (checkpoints / "last.pt").samefile(checkpoints / "step_2.pt")
    assert not list(checkpoints.glob(".*.tmp"))


def test_a_metrics_line_torn_by_a_kill_is_dropped_on_resume(tmp_path: Path) -> None:
    path = prepared(tmp_path)
    train(recipe(path, max_steps=3, log_every=1, save_every=3))
    metrics = run_files(path)[1]
    with open(metrics, "a", encoding="utf-8") as f:
        f.write('{"event": "train", "st')
    train(recipe(path, max_steps=5, log_every=1, save_every=3))
    assert [e["step"] for e in events(metrics, "train")] == [1, 2, 3, 4, 5]


def test_a_rank_stops_when_another_rank_was_signalled(tmp_path: Path, monkeypatch, capfd) -> None:
    """Only one rank of a job may get the signal (a node's scheduler); the others learn it in the all-reduce
    before each update (`_agree_on_the_next_update`) and stop at the same update, on the same checkpoint."""
    import mtx.train.trainer

    reduce = mtx.train.trainer.distributed.all_reduce_sum
    agreed: list[int] = []

    def another_rank_signalled_at_the_third(values: torch.Tensor) -> torch.Tensor:
        total = reduce(values)
        if values.shape == (5,):  # the agreement's tokens, signalled, out of time, save due, lock lost
            agreed.append(1)
            if len(agreed) == 3:
                total[1] += 1
        return total

    monkeypatch.setattr(mtx.train.trainer.distributed, "all_reduce_sum", another_rank_signalled_at_the_third)
    path = prepared(tmp_path)
    assert train(recipe(path, max_steps=1000, save_every=1000)).step == 2
    assert "Training stopped at step 2: stopped by a signal to another rank." in capfd.readouterr().err
    assert [step for step, _ in step_checkpoints(run_files(path)[0])] == [2]


def test_a_signal_during_the_valid_loss_skips_decoding(tmp_path: Path, monkeypatch) -> None:
    """The valid loss comes first; a stop signal that arrives during it must not start the decoding."""
    import mtx.decode.translator
    from mtx.train.loss import batch_loss
    from mtx.train.trainer import Trainer, distributed

    def signal_arrives(model, batch, smoothing, run=None):
        if not model.training:
            trainer.parts.signals.received = "SIGTERM"
        return batch_loss(model, batch, smoothing, run=run)

    path = prepared(tmp_path)
    trainer = Trainer(build_run(recipe(path, max_steps=50, validate_every=4, save_every=100), distributed.setup("cpu"),
                                Hooks(loss=signal_arrives)))
    monkeypatch.setattr(mtx.decode.translator, "translate_sentences", lambda *a, **k: pytest.fail("decoding started"))
    assert trainer.fit().step == 4
    assert events(run_files(path)[1], "valid") == []
