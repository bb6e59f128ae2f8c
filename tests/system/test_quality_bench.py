"""The quality benchmarks, so that they cannot rot between their long runs. bench/quality.py at its `check` size,
end to end on a generated corpus: the script, not its figures, is under test: every row trains, every way of
translating is scored, the summary has each row's spread and its bootstrap test against the defaults, a
rerun redoes nothing, and the results recorded for the repository give the same table where no run is left.
bench/short_outputs.py on the copy-task model, whose outputs are short only against references made longer than
what it learnt, and then by the model's choice, never the search's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT, write_pairs

sys.path[:0] = [str(ROOT / "bench")]

from short_outputs import diagnose  # noqa: E402


def corpus(directory: Path) -> Path:
    """The real-data corpus' layout (<pair>/<split>.<lang>), with the reverse-copy task as its language pair."""
    pair = directory / "en-de"
    pair.mkdir(parents=True)
    for split, pairs, seed in (("train", 600, 1), ("valid", 20, 2), ("test", 30, 3)):
        source, target = write_pairs(pair, split, pairs, seed, max_words=4)
        source.rename(pair / f"{split}.en")
        target.rename(pair / f"{split}.de")
    return directory


def grid(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, str(ROOT / "bench" / "quality.py"), "--size", "check", "--corpus",
                           str(tmp_path / "corpus"), "--out", str(tmp_path / "grid"), "--pairs", "en-de",
                           "--rows", "defaults", "bytelevel-bpe", *extra],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_the_grid_trains_translates_and_summarises_every_row(tmp_path: Path) -> None:
    corpus(tmp_path / "corpus")
    record = tmp_path / "record"
    done = grid(tmp_path, "--record", str(record))
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    runs = [r for r in records if r["name"] == "quality.run"]
    # Two rows × two seeds at one budget; two ways each with the paper's penalty, and five more for the defaults,
    # each with α chosen on the valid split by mtx average, which the result records.
    assert len(runs) == 2 * (2 + 5) + 2 * 2
    assert {(r["row"], r["seed"]) for r in runs} == {(row, seed) for row in ("defaults", "bytelevel-bpe")
                                                     for seed in (1, 2)}
    assert all(0 <= r["bleu"] <= 100 and r["ratio"] >= 0 and r["train_seconds"] > 0 for r in runs)

    # Each result names the training run it came from: one per (row, seed).
    assert len({r["run"] for r in runs}) == 4 and all(len(r["run"]) == 16 for r in runs)
    assert {r["cpu"] for r in runs} == {torch.backends.cpu.get_cpu_capability()}
    tuned = [r for r in runs if r["way"] == "average/fairseq-valid"]
    assert len(tuned) == 2 and all(0 <= r["lenpen"] <= 10 and round(r["lenpen"], 1) == r["lenpen"] for r in tuned)
    # Each way takes the checkpoints it names from those up to the budget: the last five, or the five with the best
    # valid scores, which is what mtx average makes with no flag at all (the recipe pins no α: it is chosen).
    by_way = {(r["seed"], r["way"]): r for r in runs if r["row"] == "defaults"}
    for seed in (1, 2):
        assert by_way[(seed, "average/fairseq-valid")]["steps"] == [10, 20, 30, 40, 50]
        assert by_way[(seed, "last/fairseq-valid")]["steps"] == [50]
        assert len(by_way[(seed, "best-nll/fairseq-valid")]["steps"]) == 5
        assert by_way[(seed, "default/fairseq-valid")]["steps"] == by_way[(seed, "best/fairseq-valid")]["steps"]
        assert by_way[(seed, "default/fairseq-valid")]["lenpen"] is not None

    means = {(r["row"], r["way"]): r for r in records if r["name"] == "quality.mean"}
    assert len(means) == 7 + 2
    bytelevel = means[("bytelevel-bpe", "average/gnmt-0.6")]
    assert bytelevel["seeds"] == [1, 2] and bytelevel["bleu_sd"] is not None
    assert 0 < bytelevel["p_bleu"] <= 1
    assert means[("defaults", "last/gnmt-0.6")]["p_bleu"] is None  # the baseline is not tested against itself
    assert 0 < means[("defaults", "average/fairseq-valid")]["p_bleu"] <= 1  # against the last, α chosen alike
    # The checkpoints chosen by default, against both that a user's habit gives.
    assert set(means[("defaults", "default/fairseq-valid")]["p_each"]) == {"last/fairseq-valid",
                                                                            "average/fairseq-valid"}

    tokens = {r["row"]: r for r in records if r["name"] == "quality.tokens_per_sentence"}
    assert set(tokens) == {"defaults", "bytelevel-bpe"} and all(r["src"] > 1 and r["tgt"] > 1 for r in tokens.values())

    table = (tmp_path / "grid" / "summary.md").read_text(encoding="utf-8")
    assert table in done.stdout
    assert "| en-de | 50 | bytelevel-bpe | average/gnmt-0.6 | 2 | " in table and " ± " in table
    alphas = ", ".join(f"{r['lenpen']:g}" for r in sorted(tuned, key=lambda r: r["seed"]))
    assert f"| en-de | 50 | defaults | average/fairseq-valid (α {alphas}) | 2 | " in table

    # The two rows of one pair share nothing but the corpus: each vocabulary is prepared once, for both seeds.
    run = tmp_path / "grid" / "en-de" / "defaults-seed2"
    assert (run / "data").resolve() == (tmp_path / "grid" / "en-de" / "data-defaults").resolve()
    # Once measured, only the newest checkpoint is kept, for a longer budget to train on.
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*.pt")) == ["step_50.pt"]
    assert not list(run.glob("at-*")) and not (run / "weights").exists()

    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "grid").rglob("*") if p.is_file()}
    again = grid(tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "train " not in again.stderr and "prepare " not in again.stderr
    changed = [p for p, mtime in before.items() if p.stat().st_mtime_ns != mtime and p.name != "summary.md"]
    assert changed == []

    # A fresh checkout (no --out) has the recorded results: the same table, bootstrap tests included, from the
    # record alone, and a grid that trains nothing again.
    shutil.rmtree(tmp_path / "grid")
    recalled = grid(tmp_path, "--record", str(record), "--summary-only")
    assert recalled.returncode == 0, recalled.stderr[-3000:]
    assert [line for line in recalled.stdout.splitlines() if '"quality.mean"' in line] == [
        line for line in done.stdout.splitlines() if '"quality.mean"' in line]
    resumed = grid(tmp_path, "--record", str(record))
    assert resumed.returncode == 0 and "train " not in resumed.stderr, resumed.stderr[-3000:]

    # A result from another training of the same run is not tested against this one's.
    result = tmp_path / "grid" / "en-de" / "defaults-seed1" / "results" / "50-average-fairseq-valid.json"
    result.write_text(json.dumps({**json.loads(result.read_text()), "run": "0" * 16}))
    mixed = grid(tmp_path, "--summary-only")
    line = next(json.loads(line) for line in mixed.stdout.splitlines()
                if '"quality.mean"' in line and '"average/fairseq-valid"' in line)
    assert line["p_bleu"] is None and "another training run" in mixed.stderr


@pytest.mark.slow
def test_a_budget_that_cannot_be_averaged_is_refused(tmp_path: Path) -> None:
    done = grid(tmp_path, "--budgets", "45")
    assert done.returncode != 0 and "multiple of 10" in done.stderr


def test_short_outputs_tells_the_model_from_the_search(copy_model: dict, tmp_path: Path) -> None:
    held_out = copy_model["held_out"]
    copied = diagnose(copy_model["checkpoint"], held_out, held_out, batch_tokens=512)
    assert copied["sentences"] == len(held_out)
    for way in ("greedy", "beam4/gnmt-0.6", "beam4/fairseq-1"):
        assert 0.9 <= copied[way]["ratio"] <= 1.1 and copied[way]["short"] <= 0.1
    assert "search_errors" not in copied["greedy"] and copied["beam4/gnmt-0.6"]["search_errors"] <= 0.1
    assert copied["p_eos_at_end"] > 0.5 and copied["eos_first_choice_early"] <= 0.1

    # References that say every word twice: the model copies once and ends, and prefers that to the reference.
    doubled = [" ".join(word for word in sentence.split() for _ in range(2)) for sentence in held_out]
    longer = diagnose(copy_model["checkpoint"], held_out, doubled, batch_tokens=512)
    beam = longer["beam4/gnmt-0.6"]
    assert beam["ratio"] < 0.7 and beam["short"] > 0.8
    assert beam["search_errors"] == beam["search_errors_among_short"] == 0.0
    assert longer["eos_first_choice_early"] > 0.5 and longer["p_eos_at_end"] < copied["p_eos_at_end"]
