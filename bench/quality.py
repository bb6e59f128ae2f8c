"""Which defaults translate best: a grid of small models on the real-data corpus, each row over several seeds.

Every quality claim a toolkit makes about a default (this vocabulary, that normalisation, this length penalty)
is a difference between rows; on small models at a small budget two seeds of one recipe can differ by more than
two rows do. So each row here is trained with several seeds on both language pairs of the real-data corpus
(bench/real_corpus.py) at fixed budgets, and reported as the mean ± standard deviation over seeds, with a paired
bootstrap test (sacreBLEU's, what `mtx score --baseline` runs) on the seeds' outputs put end to end: of each row
against the defaults' row translated the same way, and of each way of translating the defaults' row against
the ways a user's habit gives (`baselines_of`).

- Rows (`ROWS`) change one training default each from the defaults' row: the vocabulary (byte-level BPE,
  metaspace BPE, metaspace unigram), BPE-dropout, pre- against post-norm, label smoothing.
- Each run is translated several ways (`WAYS`) at each budget, from its checkpoints up to that budget alone (as
  the run would stand had it stopped there; every checkpoint carries its validation's scores): the weights of
  the budget's last update, and the average of the last `AVERAGED` (the paper's §6.1), with the paper's length
  penalty (GNMT's, α 0.6); and the defaults' row also with the α `mtx average` chooses on the valid split, for
  those two, for the average of the `AVERAGED` best by valid BLEU and by valid nll, and as `mtx average
  --dir` makes it with no flag (what README's pipeline runs). Results recorded before the grid took these ways
  (a moving average of the weights, fixed α 1.0–2.0) stay in the table, each with the training it came from.
- Tokens per training sentence of each vocabulary, on each side (from the data manifests).
- Sizes (`SIZES`): `cpu` fits these 2-core machines (a few hours for the whole grid, two runs at a time, one
  thread each); `gpu` is for one H200 (`--device cuda`), several runs at a time on the one GPU.

Everything is resumable: each result is a file under --out, written once; a run that stopped trains on from its
last checkpoint (mtx's exact resume); a larger budget trains on. One JSON line per result on stdout, progress on
stderr, and the summary table (markdown, with the spreads) in <out>/summary.md and on stdout at the end.

A grid outlives the machine it ran on: each result (its JSON line and its translations, which the bootstrap
tests read) is also copied into --record, a folder of the repository (bench/results/quality-<size>), and a
grid started where --out lacks them takes them from there. A run whose every result is recorded is not trained
again, so a CPU grid of several hours grows session by session, and its table is rebuilt from the repository.
Each result also records which training it came from (a hash of the budget's weights): a run trained again
beside recorded results would otherwise have its new results tested against the old ones as if one run's.

    nice .venv/bin/python bench/quality.py --size cpu --out runs/quality           # both pairs, 3 seeds
    .venv/bin/python bench/quality.py --size cpu --out runs/quality --summary-only  # the table of what is done
    .venv/bin/python bench/quality.py --size cpu --record none ...                 # keep nothing in the repository
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from mtx.config.decode import DecodeConfig
from mtx.config.train import TrainConfig
from mtx.score.metrics import score

ROOT = Path(__file__).resolve().parent.parent
MTX = [sys.executable, "-m", "mtx"]  # from this source tree (PYTHONPATH), as on a GPU machine with no install
AVERAGED = 5  # checkpoints averaged, the paper's number for base models


@dataclass(frozen=True)
class Row:
    """One recipe of the grid: the defaults' recipe with `changes` (dotted recipe keys) applied."""

    name: str
    why: str
    changes: dict[str, Any] = field(default_factory=dict)


ROWS = (
    Row("defaults", "the defaults: metaspace BPE, post-norm, label smoothing 0.1, no BPE-dropout"),
    Row("bytelevel-bpe", "the vocabulary before issue 27", {"data.bpe.style": "bytelevel"}),
    Row("metaspace-unigram", "SentencePiece's default model", {"data.bpe.model": "unigram"}),
    Row("bpe-dropout-0.1", "Provilkov et al.'s rate", {"train.bpe_dropout": 0.1}),
    Row("pre-norm", "the norm most toolkits default to for deep models", {"model.norm": "pre"}),
    Row("label-smoothing-0.2", "more smoothing: does 0.1 make outputs short?", {"train.label_smoothing": 0.2}),
)


@dataclass(frozen=True)
class Way:
    """How a trained run is translated: which weights, and with which length penalty: α as given, or, `tuned`, as
    `mtx average` chooses it on the run's valid split (in the style of mtx's default, fairseq's).

    The weights, each taken from the checkpoints up to the budget only, as a run stopped there would have them:
    "last", the budget's own; "average", the mean of the last AVERAGED (the paper's §6.1); "best", the mean of the
    AVERAGED with the best valid BLEU (`mtx average --best N --best-metric bleu`); "best-nll", of the AVERAGED
    with the best valid nll; "default", what `mtx average --dir RUN/checkpoints -o OUT` makes with no other flag,
    as README's pipeline runs it."""

    weights: str
    lenpen_style: str = "gnmt"
    lenpen: float = 0.6
    rows: tuple[str, ...] | None = None  # the rows it is measured on; None: all
    tuned: bool = False

    @property
    def penalty(self) -> str:
        return f"{self.lenpen_style}-{'valid' if self.tuned else f'{self.lenpen:g}'}"

    @property
    def name(self) -> str:
        return f"{self.weights}/{self.penalty}"


TUNED = DecodeConfig().lenpen_style  # the style `mtx average` tunes in, a recipe's default
WAYS = (
    Way("last"), Way("average"),
    *(Way(weights, TUNED, rows=("defaults",), tuned=True) for weights in ("last", "average", "best", "best-nll",
                                                                           "default")),
)


@dataclass(frozen=True)
class Size:
    """The model and budgets of one size of the grid, and how runs share the machine."""

    preset: str
    budgets: tuple[int, ...]  # updates; each budget's checkpoints are measured, the longest is trained to
    max_tokens: int
    lr: float
    warmup: int
    save_every: int  # checkpoints this far apart: the last AVERAGED up to a budget are averaged
    device: str
    parallel: int  # runs at a time
    threads: int  # CPU threads of each run
    seeds: tuple[int, ...] = (1, 2, 3)
    decode_batch_tokens: int = 8192
    vocab_size: int = 8000
    model: dict[str, Any] = field(default_factory=dict)  # model keys over the preset's


SIZES = {
    "cpu": Size(preset="tiny", budgets=(800, 2000), max_tokens=4096, lr=2e-3, warmup=300, save_every=50,
                device="cpu", parallel=2, threads=1),
    "gpu": Size(preset="small", budgets=(1000, 2000), max_tokens=16384, lr=1e-3, warmup=500, save_every=100,
                device="cuda", parallel=12, threads=1, decode_batch_tokens=32768),
    # Every step of the grid in a minute on a CPU, for the suite (tests/system/test_quality_bench.py): not measured.
    "check": Size(preset="tiny", budgets=(50,), max_tokens=256, lr=3e-3, warmup=10, save_every=10, device="cpu",
                  parallel=2, threads=1, seeds=(1, 2), vocab_size=300,
                  model={"layers_enc": 1, "layers_dec": 1, "d_model": 32, "d_ff": 64, "max_positions": 64}),
}


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def nested(changes: dict[str, Any]) -> dict[str, Any]:
    """{"data.bpe.style": "x"} as {"data": {"bpe": {"style": "x"}}}."""
    tree: dict[str, Any] = {}
    for key, value in changes.items():
        *parents, leaf = key.split(".")
        node = tree
        for parent in parents:
            node = node.setdefault(parent, {})
        node[leaf] = value
    return tree


def merged(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in changes.items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


class Grid:
    """The runs of one size under one folder: recipes, training, translations and scores, each done once."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.size: Size = SIZES[args.size]
        self.out: Path = args.out.resolve()
        self.corpus: Path = args.corpus.resolve()
        self.pairs: list[str] = args.pairs
        self.rows = [row for row in ROWS if row.name in args.rows]
        self.seeds: tuple[int, ...] = tuple(args.seeds or self.size.seeds)
        self.budgets: tuple[int, ...] = tuple(args.budgets or self.size.budgets)
        self.parallel = args.parallel or self.size.parallel
        self.deadline = None if args.deadline_minutes is None else time.monotonic() + 60 * args.deadline_minutes
        self.vocab_size: int = args.vocab_size or self.size.vocab_size
        self.record: Path | None = None if args.record in (None, "none") else Path(args.record).resolve()
        for budget in self.budgets:
            if budget % self.size.save_every or budget < AVERAGED * self.size.save_every:
                raise SystemExit(f"a budget must be a multiple of {self.size.save_every} updates and at least "
                                 f"{AVERAGED * self.size.save_every}, for its last {AVERAGED} checkpoints")

    # ---------------------------------------------------------------------------------------- recipes

    def recipe(self, pair: str, row: Row, seed: int) -> dict[str, Any]:
        src, tgt = pair.split("-")
        files = {split: [str(self.corpus / pair / f"{split}.{src}"), str(self.corpus / pair / f"{split}.{tgt}")]
                 for split in ("train", "valid", "test")}
        size = self.size
        base = {
            "name": f"{pair}-{row.name}-seed{seed}", "run_dir": str(self.run_dir(pair, row, seed)), "seed": seed,
            "data": {"source": {"files": files}, "src_lang": src, "tgt_lang": tgt,
                     "filter": {"min_len": 1, "max_len": 250, "max_ratio": 0, "dedup": True},
                     "bpe": {"vocab_size": self.vocab_size}},
            "model": {"preset": size.preset, **size.model},
            "train": {"max_tokens": size.max_tokens, "lr": size.lr, "warmup": size.warmup,
                      "max_steps": max(self.budgets), "save_every": size.save_every, "keep_last": 0,
                      "validate_every": size.save_every, "valid_max_sentences": 200, "log_every": 100,
                      "device": size.device, "precision": "auto"},
            "decode": {"beam": 4},
        }
        return merged(base, nested(row.changes))

    def run_dir(self, pair: str, row: Row, seed: int) -> Path:
        return self.out / pair / f"{row.name}-seed{seed}"

    def data_dir(self, pair: str, row: Row) -> Path:
        """Runs whose data sections agree share one prepared data folder (the seed does not enter prepare), named
        after the first such row of ROWS, whichever rows this grid runs."""
        data = self.recipe(pair, row, 1)["data"]
        first = next(r for r in ROWS if self.recipe(pair, r, 1)["data"] == data)
        return self.out / pair / f"data-{first.name}"

    # ------------------------------------------------------------------------------------------ steps

    def mtx(self, *command: str, threads: int) -> str:
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE",
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        done = subprocess.run([*MTX, *command], env=env, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"mtx {' '.join(command)} failed:\n{done.stderr[-3000:]}")
        return done.stdout

    def prepared(self, pair: str, row: Row, seed: int) -> Path:
        """The recipe file of a run, its data prepared (once per data folder) and linked into the run."""
        run = self.run_dir(pair, row, seed)
        run.mkdir(parents=True, exist_ok=True)
        recipe = self.recipe(pair, row, seed)
        path, text = run / "recipe.yaml", yaml.safe_dump(recipe, sort_keys=False)
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
        shared = self.data_dir(pair, row)
        if not (shared / "manifest.json").exists():
            say(f"prepare {shared.name} ({pair})")
            preparing = merged(recipe, {"name": shared.name, "run_dir": str(shared.parent / f"{shared.name}-prep")})
            prep_recipe = shared.parent / f"{shared.name}.yaml"
            prep_recipe.write_text(yaml.safe_dump(preparing, sort_keys=False), encoding="utf-8")
            self.mtx("prepare", str(prep_recipe), threads=2)
            (shared.parent / f"{shared.name}-prep" / "data").rename(shared)
        if not (run / "data").exists():
            (run / "data").symlink_to(shared, target_is_directory=True)
        return path

    def trained(self, pair: str, row: Row, seed: int) -> Path:
        """The run's folder once it has trained to the longest budget."""
        path = self.prepared(pair, row, seed)
        run = path.parent
        last = max(self.budgets)
        if not (run / "checkpoints" / f"step_{last}.pt").exists():
            say(f"train {pair} {row.name} seed {seed} to {last} updates")
            started = time.perf_counter()
            self.mtx("train", str(path), threads=self.size.threads)
            (run / f"train-seconds-{last}.json").write_text(json.dumps(time.perf_counter() - started))
        return run

    def weights(self, run: Path, budget: int, way: Way) -> Path:
        """The checkpoint to translate with, made as a user makes it from the run stopped at `budget`
        (`view`): the budget's own step checkpoint, or `mtx average` of the ones the way names, with the length
        penalty of a tuned way chosen on the valid split and stored in it."""
        view = self.view(run, budget)
        folder = view / "checkpoints"
        out = run / "weights" / f"{budget}-{way.name.replace('/', '-')}.pt"
        if way.weights == "last" and not way.tuned:
            return folder / f"step_{budget}.pt"
        if out.exists():
            return out
        out.parent.mkdir(exist_ok=True)
        chosen: list[str] = {
            "last": [str(folder / f"step_{budget}.pt")],
            "average": ["--dir", str(folder), "--last", str(AVERAGED)],
            "best": ["--dir", str(folder), "--best", str(AVERAGED), "--best-metric", "bleu"],
            "best-nll": ["--dir", str(folder), "--best", str(AVERAGED), "--best-metric", "nll"],
            # A run's checkpoints store the train.best_metric it was trained under, and its step checkpoints do
            # not depend on it (the grid keeps them all and sets no patience): the default of this mtx is what a
            # run trained under it would rank by.
            "default": ["--dir", str(folder), "--best-metric", TrainConfig().best_metric],
        }[way.weights]
        tuning = [] if way.weights == "default" else ["--tune-lenpen" if way.tuned else "--no-tune-lenpen"]
        self.mtx("average", *chosen, "-o", str(out), *tuning, "--device", self.size.device,
                 threads=self.size.threads)
        return out

    def view(self, run: Path, budget: int) -> Path:
        """The run as it stood after `budget` updates: a folder of links to its step checkpoints up to then, and
        to its data, where `mtx average --dir` sees what it would have seen had the run stopped there."""
        view = run / f"at-{budget}"
        if not (view / "checkpoints").is_dir():
            staging = run / f".at-{budget}"
            shutil.rmtree(staging, ignore_errors=True)
            (staging / "checkpoints").mkdir(parents=True)
            for path in (run / "checkpoints").glob("step_*.pt"):
                if int(path.stem.removeprefix("step_")) <= budget:
                    os.link(path, staging / "checkpoints" / path.name)
            (staging / "data").symlink_to(run / "data", target_is_directory=True)
            staging.rename(view)
        return view

    @staticmethod
    def run_identity(step_checkpoint: Path) -> str:
        """A short hash of a budget's step checkpoint's own weights, recorded with each result: a run trained
        again (into the same folder) gets another, so its results are never tested against the first one's."""
        weights = torch.load(step_checkpoint, map_location="cpu", weights_only=True, mmap=True)["model"]
        digest = hashlib.sha256()
        for name in sorted(weights):
            digest.update(name.encode())
            digest.update(weights[name].contiguous().view(torch.uint8).numpy().tobytes())
        return digest.hexdigest()[:16]

    @staticmethod
    def steps_of(checkpoint: Path) -> list[int]:
        """The updates whose weights a checkpoint holds: the one of a step checkpoint, those an average is of."""
        loaded = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
        sources = loaded.get("averaged_from") or [checkpoint.name]
        return [int(Path(source).stem.removeprefix("step_")) for source in sources]

    @staticmethod
    def chosen_lenpen(checkpoint: Path) -> float | None:
        """The α `mtx average --tune-lenpen` chose for a checkpoint; None for one it did not make."""
        choice = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True).get("lenpen_choice")
        return None if choice is None else choice["chosen"]

    def result_file(self, pair: str, row: Row, seed: int, budget: int, way: Way) -> Path:
        """Where one result's JSON line is kept under --out; its translations beside it, named for the target."""
        return self.run_dir(pair, row, seed) / "results" / f"{budget}-{way.name.replace('/', '-')}.json"

    def results_of(self, pair: str, row: Row, seed: int) -> list[Path]:
        """The result files of a run: one per budget and way of translating that the row is measured with."""
        return [self.result_file(pair, row, seed, budget, way) for budget in self.budgets for way in WAYS
                if way.rows is None or row.name in way.rows]

    def restore(self) -> None:
        """Copy into --out the recorded results it lacks (a fresh checkout's grid starts from the repository's)."""
        if self.record is None or not self.record.is_dir():
            return
        for kept in [*self.record.glob("*/test.*"), *self.record.glob("*/*-seed*/results/*")]:
            here = self.out / kept.relative_to(self.record)
            if not here.exists():
                here.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(kept, here)

    def keep(self, *files: Path) -> None:
        """Copy a new result's files into --record, the result last, so that a copy cut short leaves no result
        without its translations."""
        if self.record is None:
            return
        for file in files:
            kept = self.record / file.relative_to(self.out)
            kept.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, kept)

    def references(self, pair: str, run: Path) -> list[str]:
        """The test set's references as prepared (cleaned as every row's are), kept once per pair beside the runs
        and in --record, for the bootstrap tests of a summary made where no run's data is prepared."""
        _, tgt = pair.split("-")
        kept = self.out / pair / f"test.{tgt}"
        if not kept.exists():
            shutil.copyfile(run / "data" / f"test.{tgt}", kept)
            self.keep(kept)
        return kept.read_text(encoding="utf-8").splitlines()

    def translated(self, pair: str, row: Row, seed: int, budget: int, way: Way) -> dict[str, Any]:
        run = self.run_dir(pair, row, seed)
        result_file = self.result_file(pair, row, seed, budget, way)
        if result_file.exists():
            return json.loads(result_file.read_text())
        src, tgt = pair.split("-")
        hypothesis = result_file.with_suffix(f".{tgt}")
        result_file.parent.mkdir(exist_ok=True)
        checkpoint = self.weights(run, budget, way)
        penalty = [] if way.tuned else ["--lenpen", str(way.lenpen)]  # a tuned checkpoint holds its own
        self.mtx("translate", "-m", str(checkpoint), "-i", str(run / "data" / f"test.{src}"), "-o", str(hypothesis),
                 "--beam", "4", *penalty, "--lenpen-style", way.lenpen_style,
                 "--batch-tokens", str(self.size.decode_batch_tokens), "--threads", str(self.size.threads),
                 "--device", self.size.device, threads=self.size.threads)
        references = self.references(pair, run)
        scored = score(hypothesis.read_text(encoding="utf-8").splitlines(), [references], ("bleu", "chrf"))
        seconds_file = run / f"train-seconds-{max(self.budgets)}.json"
        result = {"name": "quality.run", "pair": pair, "row": row.name, "seed": seed, "budget": budget,
                  "way": way.name, "preset": self.size.preset, "bleu": round(scored["bleu"], 2),
                  "chrf": round(scored["chrf"], 2), "ratio": round(scored["ratio"], 3),
                  "train_seconds": round(json.loads(seconds_file.read_text()), 1) if seconds_file.exists() else None,
                  "lenpen": self.chosen_lenpen(checkpoint) if way.tuned else way.lenpen,
                  "steps": self.steps_of(checkpoint),
                  "run": self.run_identity(run / "checkpoints" / f"step_{budget}.pt"),
                  # the kernels PyTorch runs here (AVX2, AVX-512): runs trained on another kind of CPU differ
                  "cpu": torch.backends.cpu.get_cpu_capability()}
        result_file.write_text(json.dumps(result), encoding="utf-8")
        self.keep(hypothesis, result_file)
        return result

    def run(self, pair: str, row: Row, seed: int) -> list[dict[str, Any]]:
        """Train one run and measure it every way at every budget; a run whose every result is there (recorded
        by an earlier session) is neither trained nor translated again."""
        run = self.run_dir(pair, row, seed)
        if not all(path.exists() for path in self.results_of(pair, row, seed)):
            self.trained(pair, row, seed)
        results = []
        for budget in self.budgets:
            for way in WAYS:
                if way.rows is None or row.name in way.rows:
                    results.append(self.translated(pair, row, seed, budget, way))
                    print(json.dumps(results[-1]), flush=True)
        self.prune(run)
        return results

    def prune(self, run: Path) -> None:
        """Once a run's every result is in: delete what only translating read (the budgets' views, the checkpoints
        made from them) and every step checkpoint but the newest, which a longer budget trains on."""
        for made in [*run.glob("at-*"), run / "weights"]:
            shutil.rmtree(made, ignore_errors=True)
        steps = sorted((run / "checkpoints").glob("step_*.pt"), key=lambda path: int(path.stem.split("_")[1]))
        for path in steps[:-1]:
            path.unlink()

    # --------------------------------------------------------------------------------------- the grid

    def jobs(self) -> list[tuple[str, Row, int]]:
        """Seed-major, so that a grid stopped half-way has every row at its first seeds."""
        return [(pair, row, seed) for seed in self.seeds for pair in self.pairs for row in self.rows]

    def run_all(self) -> bool:
        """Every run of the grid, `parallel` at a time: False if any failed (the others are still done)."""
        # Each data folder prepared once, in parallel, before the runs that share it start.
        self.restore()
        firsts = {self.data_dir(pair, row): (pair, row) for pair in self.pairs for row in self.rows}
        with ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(lambda job: self.prepared(*job, self.seeds[0]), firsts.values()))
        failures, late = [], []

        def attempt(job: tuple[str, Row, int]) -> None:
            if self.deadline is not None and time.monotonic() > self.deadline:
                late.append(job)
                return
            try:
                self.run(*job)
            except RuntimeError as error:  # one failed run must not take the grid's other runs with it
                failures.append(job)
                say(f"{job[0]} {job[1].name} seed {job[2]} failed: {error}")

        with ThreadPoolExecutor(self.parallel) as pool:
            list(pool.map(attempt, self.jobs()))
        if late:
            say(f"{len(late)} runs not started: past --deadline-minutes; rerun to do them")
        if failures:
            say(f"{len(failures)} runs failed; rerun to retry them")
        return not failures

    def results(self) -> list[dict[str, Any]]:
        return [json.loads(path.read_text()) for path in sorted(self.out.glob("*/*-seed*/results/*.json"))]


# ------------------------------------------------------------------------------------------- summary


def spread(values: list[float], digits: int) -> str:
    """mean ± standard deviation over seeds (the sample standard deviation; none for one seed)."""
    mean = statistics.mean(values)
    if len(values) < 2:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} ± {statistics.stdev(values):.{digits}f}"


BASELINE_WAY = WAYS[0].name  # the budget's last checkpoint, with the paper's length penalty
DEFAULT_PENALTY = Way("last", DecodeConfig().lenpen_style, DecodeConfig().lenpen).penalty  # mtx translate's
LAST_TUNED, AVERAGE_TUNED = (Way(weights, TUNED, tuned=True).name for weights in ("last", "average"))


def baselines_of(row: str, way: str) -> tuple[tuple[str, str], ...]:
    """What a line is tested against, so that each test changes one thing. Another row: the defaults' row
    translated the same way. The defaults' row with α chosen on valid: the last checkpoint's with α chosen alike,
    and, for checkpoints chosen otherwise (best, default), also the last five's: the two a user's habit gives.
    With a fixed α (results recorded before α was chosen by default): mtx's default α against the paper's, any
    other against mtx's default, other weights against the last checkpoint's (all with the paper's penalty)."""
    if row != "defaults":
        return (("defaults", way),)
    weights, penalty = way.split("/")
    if penalty == Way("last", TUNED, tuned=True).penalty:
        if weights == "last":
            return ()
        return (("defaults", LAST_TUNED),) if weights == "average" else (("defaults", LAST_TUNED),
                                                                           ("defaults", AVERAGE_TUNED))
    paper = WAYS[0].penalty
    if penalty != paper:
        return (("defaults", f"{weights}/{paper if penalty == DEFAULT_PENALTY else DEFAULT_PENALTY}"),)
    return () if way == BASELINE_WAY else (("defaults", BASELINE_WAY),)


def significance(grid: Grid, pair: str, row: str, budget: int, way: str, seeds: list[int],
                 baseline: tuple[str, str]) -> float | None:
    """The paired bootstrap p-value of BLEU against `baseline` (a row and a way), over the seeds' outputs put
    end to end (each seed's test set once per seed, both sides the same seeds)."""
    hyps, base, refs = [], [], []
    _, tgt = pair.split("-")
    for seed in seeds:
        here = grid.out / pair / f"{row}-seed{seed}" / "results" / f"{budget}-{way.replace('/', '-')}.{tgt}"
        there = (grid.out / pair / f"{baseline[0]}-seed{seed}" / "results" /
                 f"{budget}-{baseline[1].replace('/', '-')}.{tgt}")
        if not (here.exists() and there.exists()):
            return None
        if baseline[0] == row and not same_run(here.with_suffix(".json"), there.with_suffix(".json")):
            say(f"{pair} {row} {budget} {way}: not tested against {baseline[1]}, which seed {seed} translated from "
                "another training run")
            return None
        hyps += here.read_text(encoding="utf-8").splitlines()
        base += there.read_text(encoding="utf-8").splitlines()
        refs += (grid.out / pair / f"test.{tgt}").read_text(encoding="utf-8").splitlines()
    return score(hyps, [refs], ("bleu",), baseline=base)["baseline"]["p_value"]["bleu"]


def same_run(result: Path, other: Path) -> bool:
    """Whether two results of one run's row, seed and budget come from the same training: False only where both
    record their run (`Grid.run_identity`; results recorded before it was kept do not) and the two differ."""
    runs = [json.loads(path.read_text(encoding="utf-8")).get("run") for path in (result, other)]
    return None in runs or runs[0] == runs[1]


def tokens_per_sentence(grid: Grid) -> list[str]:
    """Per prepared vocabulary: tokens per training sentence on each side (what an epoch costs): JSON on stdout,
    and the lines of a markdown table."""
    lines = ["| pair | vocabulary of | source tokens / sentence | target tokens / sentence |", "|---|---|---|---|"]
    for manifest_file in sorted(grid.out.glob("*/data-*/manifest.json")):
        train = json.loads(manifest_file.read_text())["splits"]["train"]
        pair, row = manifest_file.parent.parent.name, manifest_file.parent.name.removeprefix("data-")
        src, tgt = (round(train[f"{side}_tokens"] / train["pairs"], 2) for side in ("src", "tgt"))
        print(json.dumps({"name": "quality.tokens_per_sentence", "pair": pair, "row": row, "src": src, "tgt": tgt}))
        lines.append(f"| {pair} | {row} | {src} | {tgt} |")
    return lines


def summary(grid: Grid) -> str:
    """One line per (pair, budget, row, way) with every seed done, of the grid's rows and budgets (--rows,
    --budgets): JSON on stdout, and the markdown table."""
    rows, budgets = {row.name for row in grid.rows}, set(grid.budgets)
    results = [r for r in grid.results() if r["row"] in rows and r["budget"] in budgets]
    lines = ["| pair | updates | row | translated with | seeds | BLEU | chrF | length ratio | p (BLEU vs baseline) |",
             "|---|---|---|---|---|---|---|---|---|"]
    order = [w.name for w in WAYS]  # then the ways of results recorded before the grid measured them no more
    keys = sorted({(r["pair"], r["budget"], r["row"], r["way"]) for r in results},
                  key=lambda k: (k[0], k[1], [r.name for r in ROWS].index(k[2]),
                                 order.index(k[3]) if k[3] in order else len(order), k[3]))
    for pair, budget, row, way in keys:
        runs = sorted((r for r in results if (r["pair"], r["budget"], r["row"], r["way"]) == (pair, budget, row, way)),
                      key=lambda r: r["seed"])
        seeds = [r["seed"] for r in runs]
        tested = {baseline[1]: significance(grid, pair, row, budget, way, seeds, baseline)
                  for baseline in baselines_of(row, way)}
        p = next(iter(tested.values()), None)
        line = {"name": "quality.mean", "pair": pair, "budget": budget, "row": row, "way": way, "seeds": seeds,
                **{metric: round(statistics.mean(r[metric] for r in runs), 3) for metric in ("bleu", "chrf", "ratio")},
                **{f"{metric}_sd": round(statistics.stdev(r[metric] for r in runs), 3) if len(runs) > 1 else None
                   for metric in ("bleu", "chrf", "ratio")},
                "bleu_each": [r["bleu"] for r in runs], "ratio_each": [r["ratio"] for r in runs],
                "lenpen_each": [r.get("lenpen") for r in runs], "p_bleu": p, "p_each": tested}
        print(json.dumps(line), flush=True)
        # Only a tuned way's α varies by run (and results recorded before the grid had one hold no "lenpen").
        tuned = way.endswith("-valid")
        shown = "; ".join(f"{value:.3f}" + (f" vs {name}" if len(tested) > 1 else "")
                          for name, value in tested.items() if value is not None)
        chosen = " (α " + ", ".join("kept" if r["lenpen"] is None else f"{r['lenpen']:g}" for r in runs) + ")" \
            if tuned else ""
        lines.append(f"| {pair} | {budget:,} | {row} | {way}{chosen} | {len(runs)} | "
                     f"{spread([r['bleu'] for r in runs], 2)} | "
                     f"{spread([r['chrf'] for r in runs], 2)} | {spread([r['ratio'] for r in runs], 3)} | "
                     f"{shown} |")
    table = "\n".join(lines) + "\n\n" + "\n".join(tokens_per_sentence(grid)) + "\n"
    (grid.out / "summary.md").write_text(table, encoding="utf-8")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=list(SIZES), default="cpu")
    parser.add_argument("--corpus", type=Path, default=Path("runs/real_corpus"))
    parser.add_argument("--out", type=Path, default=Path("runs/quality"))
    parser.add_argument("--pairs", nargs="+", default=["en-de", "en-fr"])
    parser.add_argument("--rows", nargs="+", default=[row.name for row in ROWS], choices=[row.name for row in ROWS])
    parser.add_argument("--seeds", type=int, nargs="+", help="[default: the size's, 1 2 3]")
    parser.add_argument("--budgets", type=int, nargs="+", help="updates [default: the size's]")
    parser.add_argument("--parallel", type=int, help="runs at a time [default: the size's]")
    parser.add_argument("--vocab-size", type=int, help="[default: the size's, 8,000 but for --size check]")
    parser.add_argument("--deadline-minutes", type=float, help="start no run after this long (then the summary)")
    parser.add_argument("--summary-only", action="store_true", help="only the table of the results already there")
    parser.add_argument("--record", help="the results kept in the repository, taken from and added to; none: no "
                        "record [default: bench/results/quality-<size>; none for --size check]")
    args = parser.parse_args()
    if args.record is None and args.size != "check":
        args.record = str(ROOT / "bench" / "results" / f"quality-{args.size}")
    grid = Grid(args)
    if args.summary_only:
        grid.restore()
    ok = args.summary_only or grid.run_all()
    print(summary(grid), end="")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
