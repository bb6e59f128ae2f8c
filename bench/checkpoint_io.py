"""Issue 23: how long a step checkpoint holds up the training loop, written synchronously or in the background.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/checkpoint_io.py [--preset base] [--vocab 32000] [--repeats 3]
    python bench/checkpoint_io.py --device cuda --preset big --vocab 37000 --precision bf16 --pairs 256 --updates 40

A model of the preset's shape with random weights, its AdamW state filled by one update, and the trainer's
`mtx.train.checkpoints.CheckpointKeeper` on a temporary run directory (`--dir`: put it on the filesystem to
measure; keep_last 3, so that saves prune and drop older files' training state as a run's do). Each repeat runs,
interleaved, a save followed by `--updates` training updates (bench/train.py's update: fused loss, backward, grad
norm, AdamW) on the same batch, the save made each of these ways:

  none          no save: the baseline
  stop          `save(step, progress, wait=True)`, the stop path's save: the file, last.pt, pruning, and
                nothing else (what every save did before issue 23)
  flushed       `save(step, progress)` then `flush()` at once: all of a periodic save's work done while the loop
                waits (the state copied to host memory, the file, last.pt, pruning, an older file rewritten
                without its training state)
  background    `save(step, progress)`, the updates while the keeper's thread writes, then `flush()`

`checkpoint.<mode>.lost` is the time the loop lost to the save: that repeat minus the same round's baseline (so
it counts the updates slowed by a write that competes with them for the cores, memory and disk).
`checkpoint.<mode>.call` is the save call alone, `checkpoint.background.flush` what was left to wait for after
the updates, and `checkpoint.<mode>.cpu` the CPU time of the save call and flush (`time.process_time`, every
thread; for background, the round's CPU time minus the baseline's). An info line gives the files' sizes.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from common import build_model, emit, emit_info, random_batch, set_threads, significant, synchronize
from train import Updater

from mtx.checkpoint import step_checkpoints
from mtx.config.loading import recipe_from_dict
from mtx.train.checkpoints import CheckpointKeeper
from mtx.train.distributed import Context
from mtx.train.loss import batch_loss


class StandInTokenizer:
    """What the keeper asks of a tokenizer: a few bytes of JSON in each file do not change its write time."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def to_str(self) -> str:
        return '{"stand-in": "this benchmark never decodes"}'


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="autocast of the updates")
    parser.add_argument("--pairs", type=int, default=32, help="sentence pairs (15-35 tokens) in the batch")
    parser.add_argument("--updates", type=int, default=3, help="updates after each save")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dir", type=Path, help="where the run directory goes [default: the system's temp]")
    args = parser.parse_args()
    set_threads(args.threads)
    device = torch.device(args.device)
    model = build_model(args.preset, args.vocab).to(device).train()
    batch = random_batch(args.pairs, args.vocab, 15, 35).to(device)
    updater = Updater(lambda b: batch_loss(model, b, 0.1)[0], model, device,
                      torch.bfloat16 if args.precision == "bf16" else None)

    def update() -> None:
        updater.run([batch])

    update()  # Adam's moments exist from the first update on
    with tempfile.TemporaryDirectory(dir=args.dir) as run_dir:
        recipe = recipe_from_dict({"name": "bench", "run_dir": run_dir, "data": {"source": {"demo": {}}},
                                   "model": {"preset": args.preset}, "train": {"keep_last": 3}})
        keeper = CheckpointKeeper(recipe, Context(0, 1, device), model, StandInTokenizer(args.vocab), updater.optimizer,
                                  torch.amp.GradScaler(device.type, enabled=False), say=lambda line: None)
        measure(keeper, update, device, args)
        sizes = [path.stat().st_size for _, path in step_checkpoints(keeper.directory)]
    config = {"preset": args.preset, "vocab": args.vocab, "device": device.type, "precision": args.precision,
              "parameters": sum(p.numel() for p in model.parameters()), "threads": args.threads}
    emit_info("checkpoint.sizes", **config, newest_bytes=sizes[-1], oldest_bytes=sizes[0])


def measure(keeper: CheckpointKeeper, update: Callable[[], None], device: torch.device,
            args: argparse.Namespace) -> None:
    steps = iter(range(1, 10**6))
    progress = {"epoch": 1, "batch_in_epoch": 100, "best_bleu": 25.0, "milestones": []}
    modes = {
        "none": (lambda: None, lambda: None),
        "stop": (lambda: keeper.save(next(steps), progress, wait=True), lambda: None),
        "flushed": (lambda: (keeper.save(next(steps), progress), keeper.flush()), lambda: None),
        "background": (lambda: keeper.save(next(steps), progress), keeper.flush),
    }
    samples: dict[str, list[float]] = {}

    def record(name: str, seconds: float) -> None:
        samples.setdefault(name, []).append(seconds)

    for repeat in range(args.repeats + 1):  # the first round warms up
        for mode, (save, flush) in modes.items():
            synchronize(device)
            start, cpu = time.perf_counter(), time.process_time()
            save()
            called, cpu_called = time.perf_counter(), time.process_time()
            for _ in range(args.updates):
                update()
            synchronize(device)
            updated = time.perf_counter()
            flush()
            end = time.perf_counter()
            if repeat:
                record(f"{mode}.total", end - start)
                record(f"{mode}.call", called - start)
                record(f"{mode}.flush", end - updated)
                record(f"{mode}.cpu_call", cpu_called - cpu)
                record(f"{mode}.cpu_total", time.process_time() - cpu)
    config = {"preset": args.preset, "vocab": args.vocab, "device": device.type, "threads": args.threads,
              "updates": args.updates, "update_s": significant(statistics.median(samples["none.total"]) / args.updates)}

    def over_baseline(mode: str, name: str) -> list[float]:
        return [t - b for t, b in zip(samples[f"{mode}.{name}"], samples[f"none.{name}"], strict=True)]

    for mode in ("stop", "flushed", "background"):
        emit(f"checkpoint.{mode}.lost", config, over_baseline(mode, "total"), "s")
        emit(f"checkpoint.{mode}.call", config, samples[f"{mode}.call"], "s")
        emit(f"checkpoint.{mode}.cpu", config,
             over_baseline(mode, "cpu_total") if mode == "background" else samples[f"{mode}.cpu_call"], "cpu_s")
    emit("checkpoint.background.flush", config, samples["background.flush"], "s")


if __name__ == "__main__":
    main()
