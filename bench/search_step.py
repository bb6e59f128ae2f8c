"""ms a decoding step: one search of one batch, for a change to the search or the model's inference path.

    .venv/bin/python bench/search_step.py [--dtype int8] [--presets small,tiny] [--sentences 1,8,32]
        [--repeats 7] [--tree DIR]

Random weights of each preset (vocabulary 8,000), bench/translate.py's random sources of 15–35 tokens, the model
as `mtx translate` prepares it (`prepare_model`, `--dtype`), one thread; every sentence gets exactly 30 tokens
(`min_len` = `max_len`: 31 steps), so that a change that alters which sentences end when cannot change the work.
One line per preset, sentence count and search (beam 4, greedy): the median of `--repeats` searches, in ms per
step (the encoder included, spread over the steps).

Before and after a change: run it on the checkout before (`--tree`, whose folder goes first on the path, as
bench/serve_memory.py's does) and on this one, alternately, three times each, and compare the medians; two
checkouts' figures from one process are not possible, as each imports its own `mtx`.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "int8"], help="as mtx translate's --dtype")
    parser.add_argument("--presets", default="small,tiny", help="model presets, comma-separated")
    parser.add_argument("--sentences", default="1,8,32", help="batch sizes in sentences, comma-separated")
    parser.add_argument("--repeats", type=int, default=7, help="searches per measurement (the median is shown)")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the mtx source tree to time")
    args = parser.parse_args()
    sys.path[:0] = [str(args.tree.resolve()), str(Path(__file__).resolve().parent)]

    import torch
    from common import build_model, emit, random_batch, set_threads

    from mtx.decode.search import Constraints, LengthPenalty, search
    from mtx.decode.translator import prepare_model

    set_threads(1)
    tokens = 30
    for preset in args.presets.split(","):
        model = prepare_model(build_model(preset, 8000).eval(), torch.device("cpu"), args.dtype)
        for sentences in map(int, args.sentences.split(",")):
            batch = random_batch(sentences, 8000, 15, 35, seed=1)
            for beam in (4, 1):
                per_step = []
                for _ in range(args.repeats):
                    constraints = Constraints(torch.full((sentences,), tokens), min_len=tokens)
                    start = time.perf_counter()
                    with torch.inference_mode():
                        search(model, batch.src, batch.src_pad, constraints, LengthPenalty(1.0), beam=beam)
                    per_step.append((time.perf_counter() - start) / (tokens + 1) * 1e3)
                emit("search_step.ms", {"preset": preset, "sentences": sentences, "beam": beam, "dtype": args.dtype,
                                        "tree": str(args.tree.resolve()), "threads": 1}, per_step, "ms/step")


if __name__ == "__main__":
    main()
