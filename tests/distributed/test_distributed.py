"""Two gloo processes train exactly as one process accumulating two micro-batches per update."""

import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from support import NO_DROPOUT, WINDOW, free_port, join_group, prepared, recipe, run_ranks

from mtx.checkpoint import load_checkpoint, step_checkpoints
from mtx.train.checkpoints import CheckpointKeeper
from mtx.train.components import Hooks, build_run
from mtx.train.trainer import Trainer, distributed, learning_rate, train

pytestmark = pytest.mark.dist

SETTINGS = dict(max_steps=6, validate_every=3, log_every=2, save_every=100)


def rank_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    """What torchrun would start: the environment it sets, then the trainer; each rank saves its weights."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    ctx = distributed.setup("cpu")
    try:
        trainer = Trainer(build_run(recipe(Path(recipe_path), NO_DROPOUT, update_freq=1, ema_decay=0.7, **SETTINGS),
                                    ctx))
        trainer.fit()
        torch.save({"model": trainer.parts.model.state_dict(), "ema": trainer.parts.ema.state_dict()},
                   Path(out) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_two_processes_equal_one_with_update_freq_two(tmp_path: Path) -> None:
    """The weights, their moving average (which validation scores) and the logs of 2 ranks are those of 1
    process accumulating 2 micro-batches; the ranks hold the very same weights and average."""
    torch.set_num_threads(1)
    one, two = prepared(tmp_path / "one"), prepared(tmp_path / "two")
    single = Trainer(build_run(recipe(one, NO_DROPOUT, update_freq=2, ema_decay=0.7, **SETTINGS),
                               distributed.setup("cpu")))
    single.fit()

    mp.spawn(rank_worker, args=(2, free_port(), str(two), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for kind, state in (("model", single.parts.model.state_dict()), ("ema", single.parts.ema.state_dict())):
        for name, expected in state.items():
            torch.testing.assert_close(ranks[0][kind][name], expected, atol=1e-5, rtol=0, msg=f"{kind} {name}")
            assert torch.equal(ranks[0][kind][name], ranks[1][kind][name]), f"{kind} {name} differs between ranks"

    def logged(path: Path) -> list[dict]:
        rows = [json.loads(line) for line in (path.parent / "run" / "metrics.jsonl").read_text().splitlines()]
        return [{k: v for k, v in row.items() if k != "tokens_per_s"} for row in rows]

    single_log, multi_log = logged(one), logged(two)
    assert [(e["event"], e["step"]) for e in multi_log] == [(e["event"], e["step"]) for e in single_log]
    for a, b in zip(multi_log, single_log, strict=True):
        for key in ("loss", "nll", "grad_norm", "valid_loss", "valid_bleu", "tokens"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
        assert (a["gpu_seconds"], b["gpu_seconds"]) == (2 * a["seconds"], b["seconds"])  # processes × seconds


def inf_gradient_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    """fp16 training in which rank 0's third backward produces an inf gradient: what each update did."""
    ctx = join_group(rank, world, port)
    try:
        updates: list[dict] = []

        def observed(state, batches, update):
            before = [p.detach().clone() for p in trainer.parts.model.parameters()]
            adam_steps = [float(s["step"]) for s in trainer.parts.optimizer.state.values()]
            inject = rank == 0 and len(updates) == 2
            hook = weight.register_hook(lambda g: torch.full_like(g, math.inf)) if inject else None
            stepped = update()
            if hook is not None:
                hook.remove()
            unchanged = all(torch.equal(b, p) for b, p in zip(before, trainer.parts.model.parameters(), strict=True))
            updates.append({"injected": inject, "stepped": stepped, "step": trainer.state.step,
                            "unchanged": unchanged, "lr": trainer.last_lr, "adam_steps": adam_steps})
            return stepped

        run = recipe(Path(recipe_path), NO_DROPOUT, precision="fp16", max_steps=5, log_every=1, validate_every=100,
                     save_every=100)
        trainer = Trainer(build_run(run, ctx, Hooks(around_update=observed)))
        weight = trainer.parts.model.tgt_embed.weight
        state = trainer.fit()
        torch.save({"updates": updates, "skipped": state.skipped_steps, "model": trainer.parts.model.state_dict()},
                   Path(out) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_an_inf_gradient_under_fp16_is_skipped_on_both_ranks(tmp_path: Path) -> None:
    """An inf gradient on one rank reaches both through the all-reduce: the grad scaler skips that update on
    both, which leaves weights, Adam's state, `step` and the learning rate schedule as they were, and counts
    it; the next update is step 3, at step 3's learning rate, and the run still ends at max_steps."""
    path = prepared(tmp_path / "run")
    run_ranks(inf_gradient_worker, str(path), str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    for saved in ranks:
        updates = saved["updates"]
        assert [u["stepped"] for u in updates] == [True, True, False, True, True, True]
        assert [u["step"] for u in updates] == [1, 2, 2, 3, 4, 5]
        assert updates[2]["unchanged"] and updates[3]["adam_steps"] == updates[2]["adam_steps"]
        assert saved["skipped"] == 1
    for name, tensor in ranks[0]["model"].items():
        assert torch.equal(tensor, ranks[1]["model"][name]), name
    logged = [json.loads(line) for line in (tmp_path / "run" / "run" / "metrics.jsonl").read_text().splitlines()]
    train_cfg = recipe(path).train
    assert [e["step"] for e in logged] == [1, 2, 3, 4, 5]
    assert [e["lr"] for e in logged] == pytest.approx([learning_rate(train_cfg, 32, s) for s in range(1, 6)])
    assert [e["skipped_steps"] for e in logged] == [0, 0, 1, 1, 1]


def stale_listing_worker(rank: int, world: int, port: int, recipe_path: str, out: str) -> None:
    """Resume to step 6, rank 1 seeing an old listing of checkpoints/ (only step 2) as a lagging network
    filesystem might show it."""
    ctx = join_group(rank, world, port)
    try:
        if rank == 1:  # this process only: a spawned rank shares no module state with the other
            CheckpointKeeper.latest = lambda keeper: keeper.directory / "step_2.pt"
        trainer = Trainer(build_run(recipe(Path(recipe_path), NO_DROPOUT, update_freq=1, max_steps=6, save_every=2,
                                           log_every=1, validate_every=100, keep_last=0), ctx))
        resumed_at = trainer.state.step
        trainer.fit()
        torch.save({"resumed_at": resumed_at, "model": trainer.parts.model.state_dict()}, Path(out) / f"rank{rank}.pt")
    finally:
        distributed.teardown()


def test_every_rank_resumes_from_the_checkpoint_rank_0_chose(tmp_path: Path) -> None:
    path = prepared(tmp_path / "run")
    train(recipe(path, NO_DROPOUT, update_freq=2, max_steps=4, save_every=2, log_every=1, keep_last=0))
    run_ranks(stale_listing_worker, str(path), str(tmp_path))
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    assert [r["resumed_at"] for r in ranks] == [4, 4]
    for name, tensor in ranks[0]["model"].items():
        assert torch.equal(tensor, ranks[1]["model"][name]), name


def test_sigterm_to_torchrun_stops_both_ranks_in_time_and_the_run_resumes(tmp_path: Path) -> None:
    """torchrun forwards SIGTERM to its workers and kills them after --shutdown-timeout: both ranks must stop
    within that window, rank 0 having written the checkpoint of the step they stopped at; torchrun on the
    same run then resumes from it to max_steps."""
    path = prepared(tmp_path)
    metrics, checkpoints = tmp_path / "run" / "metrics.jsonl", tmp_path / "run" / "checkpoints"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def torchrun(*sets: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(free_port()), f"--shutdown-timeout={WINDOW}", "-m", "mtx", "train", str(path), "--set",
                   "train.log_every=1", *(arg for item in sets for arg in ("--set", item))]
        return subprocess.Popen(command, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    process = torchrun("train.max_steps=1000000", "train.save_every=1000000")
    deadline = time.monotonic() + 120
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "torchrun did not start training within 2 minutes"
        time.sleep(0.1)
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    took = time.monotonic() - signalled
    assert took < WINDOW - 5, f"the workers took {took:.1f} s to stop\n{err}"
    assert "SIGKILL" not in err
    stopped = int(re.search(r"Training stopped at step (\d+): stopped by SIGTERM", err).group(1))
    assert [step for step, _ in step_checkpoints(checkpoints)] == [stopped]

    process = torchrun(f"train.max_steps={stopped + 3}")
    _, err = process.communicate(timeout=180)
    assert process.returncode == 0, err
    assert f"Resuming from {checkpoints / f'step_{stopped}.pt'}" in err
    assert load_checkpoint(checkpoints / "last.pt")["step"] == stopped + 3
