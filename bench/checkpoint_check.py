"""Issue 56: what checking a checkpoint's weights for NaN and infinities adds to loading it.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/checkpoint_check.py [--preset base] [--vocab 32000] [--repeats 7]

A model of the preset's shape with random weights, saved as a checkpoint in a temporary folder (`--dir`; the
file stays in the page cache between repeats, as a file just written or read again does). Timed, interleaved:

  load             `load_checkpoint(path)`, the weights read into memory and checked: what translate, export,
                   inspect and serve's decoding processes do
  load.unchecked   the same with `weights=False`: the load without the check
  mmap             `load_checkpoint(path, mmap=True)`, the tensors mapped from the file and checked, which pages
                   them in: what average, resume and train.init_from do
  mmap.unchecked   the same with `weights=False`: what a reader of the metadata alone does (serve's own
                   process, --tune-lenpen's look at the run, mtx report), which pages in nothing
  check            `require_finite_weights` alone on weights in memory
  isfinite         the plain expression it replaces, `torch.isfinite(t).all()` for every tensor, for comparison

Each is the median wall-clock time in seconds of `--repeats` rounds, on `--threads` threads.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from common import build_model, emit, emit_info, set_threads, time_interleaved

from mtx.checkpoint import load_checkpoint, make_checkpoint, require_finite_weights, save_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=None, help="where the checkpoint is written (default: a "
                        "temporary folder)")
    args = parser.parse_args()
    set_threads(args.threads)
    config = {"preset": args.preset, "vocab": args.vocab, "threads": args.threads}

    model = build_model(args.preset, args.vocab)
    checkpoint = make_checkpoint(model, "{}", {"name": "bench"}, 1)
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        path = Path(folder) / "checkpoint.pt"
        save_checkpoint(checkpoint, path)
        emit_info("checkpoint_check.file", megabytes=path.stat().st_size / 2**20,
                  parameters=sum(p.numel() for p in model.parameters()))
        weights = checkpoint["model"]
        runs = {
            "load": lambda: load_checkpoint(path),
            "load.unchecked": lambda: load_checkpoint(path, weights=False),
            "mmap": lambda: load_checkpoint(path, mmap=True),
            "mmap.unchecked": lambda: load_checkpoint(path, mmap=True, weights=False),
            "check": lambda: require_finite_weights(checkpoint, path),
            "isfinite": lambda: all(bool(torch.isfinite(t).all()) for t in weights.values()),
        }
        for name, seconds in time_interleaved(runs, args.repeats).items():
            emit(f"checkpoint_check.{name}", config, seconds, "s")


if __name__ == "__main__":
    main()
