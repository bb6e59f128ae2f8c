"""How fast `mtx prepare` runs and how much memory it needs, on a WMT-sized corpus, at this checkout or another commit.

The corpus is N aligned sentence pairs as plain files: synthetic (Zipf-distributed pseudo-words, 5–40 words a
sentence, like news text), or a real corpus' training files repeated to N pairs (`--corpus SRC TGT`). Each run
prepares it once, in a fresh process so that peak memory is measured alone, through `mtx prepare` itself (the
command line, which every commit has), into a fresh run folder that is deleted afterwards. One JSON line per run
on stdout: commit, pairs, workers, settings, seconds (and, where a lexical table was learnt, the seconds before
it, the manifest's), pairs_per_second and the peak resident memory of the main process and of the largest worker.

    OMP_WAIT_POLICY=PASSIVE python bench/prepare.py --pairs 1000000 --workers 1 2
    OMP_WAIT_POLICY=PASSIVE python bench/prepare.py --pairs 2000000 --workers 2 --language-id both
    nice python bench/prepare.py --folder /tmp/real-2m --corpus runs/real_corpus/en-de/train.{en,de} \
        --pairs 2000000 --workers 2 --commits HEAD 62f50bd --repeats 1
    nice python bench/prepare.py --folder /tmp/real-2m --pairs 2000000 --workers 2 --set data.lexicon.learn=true

--language-id on adds data.filter.language_id (py3langid, mtx[langid]); both prepares once without, once with.
--commits runs each prepare at each commit in turn (interleaved, so that a neighbour's load hits all of them):
HEAD is this checkout; any other is checked out once into /tmp/mtx-COMMIT (`git worktree add`) and imported from
there, with this interpreter and its packages. --set KEY=VALUE sets a recipe key (a YAML value) in every run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import runpy
import shutil
import subprocess
import sys
import tempfile
import time
from itertools import cycle, islice
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent


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


def repeat_corpus(folder: Path, pairs: int, source: Path, target: Path) -> None:
    """The real corpus' pairs repeated, in order, to `pairs` pairs (dedup keeps one copy of each)."""
    with open(source, encoding="utf-8") as src, open(target, encoding="utf-8") as tgt:
        originals = list(zip(src, tgt, strict=True))
    with open(folder / "train.src", "w", encoding="utf-8") as src, \
            open(folder / "train.tgt", "w", encoding="utf-8") as tgt:
        for s, t in islice(cycle(originals), pairs):
            src.write(s)
            tgt.write(t)


def checkout(commit: str) -> Path:
    """The folder whose `mtx` package a run imports: this checkout for HEAD, else a worktree of `commit`."""
    if commit == "HEAD":
        return ROOT
    folder = Path(tempfile.gettempdir()) / f"mtx-{commit}"
    if not folder.is_dir():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(folder), commit], check=True,
                       stdout=subprocess.DEVNULL)
    return folder


def recipe_for(folder: Path, run_dir: Path, language_id: bool, settings: list[str]) -> dict:
    data: dict = {"source": {"files": {"train": [str(folder / "train.src"), str(folder / "train.tgt")]}},
                  "bpe": {"vocab_size": 32000}}
    if language_id:
        data["filter"] = {"language_id": True}
    recipe = {"name": "bench", "run_dir": str(run_dir), "data": data}
    for setting in settings:
        key, value = setting.split("=", 1)
        *path, last = key.split(".")
        node = recipe
        for part in path:
            node = node.setdefault(part, {})
        node[last] = yaml.safe_load(value)
    return recipe


def run_once(recipe_path: Path, workers: int) -> dict:
    """`mtx prepare RECIPE --workers N` in this process, as the command line runs it; time and peak memory."""
    sys.argv = ["mtx", "prepare", str(recipe_path), "--workers", str(workers)]
    started = time.perf_counter()
    try:
        runpy.run_module("mtx", run_name="__main__")
    except SystemExit as done:
        if done.code not in (0, None):
            raise
    seconds = time.perf_counter() - started
    return {"seconds": round(seconds, 1),
            "peak_rss_mb_main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
            "peak_rss_mb_largest_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024}


def measure(folder: Path, commit: str, workers: int, language_id: bool, settings: list[str]) -> dict:
    """One prepare of the corpus in `folder` at `commit`, in a process of its own, into a fresh run folder."""
    run_dir = folder / f"run-{commit}-{workers}-{language_id}"
    shutil.rmtree(run_dir, ignore_errors=True)
    recipe_path = folder / "recipe.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe_for(folder, run_dir, language_id, settings)), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(checkout(commit))}
    done = subprocess.run([sys.executable, __file__, "--once", str(recipe_path), "--workers", str(workers)],
                          env=env, check=True, stdout=subprocess.PIPE, text=True, cwd=folder)
    timing = json.loads(done.stdout.strip().splitlines()[-1])
    manifest = json.loads((run_dir / "data" / "manifest.json").read_text(encoding="utf-8"))
    lexicon = (run_dir / "data" / "lexicon.npz").is_file()
    shutil.rmtree(run_dir, ignore_errors=True)
    pairs = manifest["filter"]["read"]
    return {
        "commit": commit, "pairs": pairs, "kept": manifest["filter"]["kept"], "workers": workers,
        "language_id": language_id, "settings": settings,
        "dropped_language": manifest["filter"]["dropped"].get("language", 0),
        **({"lexicon": True, "seconds_before_lexicon": manifest["seconds"]} if lexicon else {}),
        **timing, "pairs_per_second": round(pairs / timing["seconds"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--folder", type=Path, help="reuse or keep the corpus here (default: a temp dir)")
    parser.add_argument("--corpus", type=Path, nargs=2, metavar=("SRC", "TGT"),
                        help="a real corpus' training files, repeated to --pairs pairs (default: synthetic)")
    parser.add_argument("--language-id", choices=["off", "on", "both"], default="off")
    parser.add_argument("--commits", nargs="+", default=["HEAD"], help="HEAD (this checkout) or commits to compare")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--once", type=Path, help=argparse.SUPPRESS)  # one run of this recipe, in this process
    args = parser.parse_args()
    if args.once:
        print(json.dumps(run_once(args.once, args.workers[0])), flush=True)
        return
    languages = ["off", "on"] if args.language_id == "both" else [args.language_id]
    with tempfile.TemporaryDirectory() as temp:
        folder = (args.folder or Path(temp)).resolve()
        folder.mkdir(parents=True, exist_ok=True)
        if not (folder / "train.src").is_file():
            if args.corpus:
                repeat_corpus(folder, args.pairs, *args.corpus)
            else:
                write_corpus(folder, args.pairs)
        for _ in range(args.repeats):
            for workers in args.workers:
                for language in languages:
                    for commit in args.commits:
                        print(json.dumps(measure(folder, commit, workers, language == "on", args.settings)),
                              flush=True)


if __name__ == "__main__":
    main()
