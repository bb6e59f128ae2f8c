"""Issue 35: what one sampling draw costs, the filters (`mtx.decode.sampling.filtered`) and the draw itself.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/sampling_filters.py [--against OTHER_CHECKOUT]

Random float32 log-probabilities of (rows, vocab), one thread: the draw alone (temperature 1, no top-p), and with
the filters of a back-translation run (temperature 0.7, top-p 0.9), whose sort is the costliest step. One JSON
line each: the median of the repeats in milliseconds. `--against` times another checkout's
mtx/decode/sampling.py too, its repeats alternating with this one's in the same process: timed in separate
processes, even identical code differs by several times here (the allocator's state), so only figures taken
side by side compare.
"""

from __future__ import annotations

import argparse
import importlib.util
import time
from pathlib import Path
from types import ModuleType

import torch
from common import emit

import mtx.decode.sampling


def load_sampling(checkout: Path) -> ModuleType:
    """Another checkout's mtx/decode/sampling.py as a module of its own (it imports only torch)."""
    spec = importlib.util.spec_from_file_location("other_sampling", checkout / "mtx" / "decode" / "sampling.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vocab", type=int, default=37000)
    parser.add_argument("--rows", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--against", type=Path, help="another checkout of mtx, timed alongside")
    args = parser.parse_args()
    torch.set_num_threads(1)
    versions = {"this": mtx.decode.sampling, **({"against": load_sampling(args.against)} if args.against else {})}
    generator = torch.Generator().manual_seed(0)
    for rows in args.rows:
        log_probs = torch.randn(rows, args.vocab, generator=generator).log_softmax(dim=1)
        u = torch.rand(rows, dtype=torch.float64, generator=generator)
        for temperature, topp in ((1.0, 1.0), (0.7, 0.9)):
            samples: dict[str, list[float]] = {name: [] for name in versions}
            for _ in range(args.repeats):
                for name, sampling in versions.items():
                    started = time.perf_counter()
                    sampling.draw(sampling.filtered(log_probs, temperature, 0, topp), u)
                    samples[name].append(1000 * (time.perf_counter() - started))
            for name, times in samples.items():
                emit("sampling_draw", {"version": name, "rows": rows, "vocab": args.vocab,
                                       "temperature": temperature, "topp": topp}, times, "ms")


if __name__ == "__main__":
    main()
