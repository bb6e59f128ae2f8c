"""How fast `mtx prepare` runs and how much memory it needs, on a synthetic WMT-sized corpus.

Writes N aligned sentence pairs as plain files (Zipf-distributed pseudo-words, 5–40 words a sentence, like
news text), then prepares them once per --workers value, each in a fresh process so peak memory is measured
alone. One JSON line per run on stdout: pairs, workers, seconds, pairs_per_second and the peak resident
memory of the main process and of the largest worker.

    OMP_WAIT_POLICY=PASSIVE python bench/prepare.py --pairs 1000000 --workers 1 2
    OMP_WAIT_POLICY=PASSIVE python bench/prepare.py --pairs 2000000 --workers 2 --language-id both

--language-id on adds data.filter.language_id (py3langid, mtx[langid]); both prepares once without, once with.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml


def write_corpus(folder: Path, pairs: int, seed: int = 0) -> tuple[Path, Path]:
    """Two aligned files; the target is a deterministic rewrite of the source (other words, other lengths)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyzäöüß"))
    vocabulary = ["".join(rng.choice(letters, size=rng.integers(2, 12))) for _ in range(50_000)]
    source, target = folder / "train.src", folder / "train.tgt"
    with open(source, "w", encoding="utf-8") as src, open(target, "w", encoding="utf-8") as tgt:
        for start in range(0, pairs, 100_000):
            count = min(100_000, pairs - start)
            lengths = rng.integers(5, 41, size=count)
            words = np.minimum(rng.zipf(1.3, size=int(lengths.sum())), len(vocabulary)) - 1
            offset = 0
            for length in lengths:
                ids = words[offset : offset + length]
                offset += length
                src.write(" ".join(vocabulary[i] for i in ids).capitalize() + ".\n")
                tgt.write(" ".join(vocabulary[(i * 7 + 3) % len(vocabulary)] for i in ids[::-1]).capitalize() + " .\n")
    return source, target


def run_once(folder: Path, workers: int, language_id: bool) -> dict:
    """Prepare the corpus in `folder` in this process and report time and peak memory."""
    from mtx.config.loading import load_recipe
    from mtx.data.prepare import prepare

    recipe = {
        "name": "bench",
        "run_dir": str(folder / f"run-{workers}-{language_id}"),
        "data": {"source": {"files": {"train": [str(folder / "train.src"), str(folder / "train.tgt")]}},
                 "bpe": {"vocab_size": 32000}, "filter": {"language_id": language_id}},
    }
    path = folder / f"recipe-{workers}-{language_id}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    started = time.perf_counter()
    manifest = prepare(load_recipe(path), workers=workers)
    seconds = time.perf_counter() - started
    pairs = manifest["filter"]["read"]
    return {
        "pairs": pairs,
        "kept": manifest["filter"]["kept"],
        "workers": workers,
        "language_id": language_id,
        "dropped_language": manifest["filter"]["dropped"]["language"],
        "seconds": round(seconds, 1),
        "pairs_per_second": round(pairs / seconds),
        "peak_rss_mb_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
        "peak_rss_mb_largest_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--folder", type=Path, help="reuse or keep the corpus here (default: a temp dir)")
    parser.add_argument("--language-id", choices=["off", "on", "both"], default="off")
    parser.add_argument("--once", action="store_true", help=argparse.SUPPRESS)  # one run, in this process
    args = parser.parse_args()
    if args.once:
        print(json.dumps(run_once(args.folder, args.workers[0], args.language_id == "on")), flush=True)
        return
    settings = ["off", "on"] if args.language_id == "both" else [args.language_id]
    with tempfile.TemporaryDirectory() as temp:
        folder = args.folder or Path(temp)
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "train.src").is_file():
            write_corpus(folder, args.pairs)
        for workers in args.workers:
            for setting in settings:
                subprocess.run([sys.executable, __file__, "--once", "--folder", str(folder), "--workers", str(workers),
                                "--language-id", setting], check=True)


if __name__ == "__main__":
    main()
