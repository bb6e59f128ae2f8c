"""The kept benchmarks in bench/, so that they cannot rot between the runs that record their figures. Each script
with a quick mode runs here for a few seconds (tiny models, a few sentences, one repeat) and its JSON lines are
checked: the script, not its figures, is under test. bench/README.md lists every kept script and what tests it.

The benchmark pages of the site take their tables from bench/README.md, between snippet markers: those pages,
and every section of the notebook they include, must read as curated figures, not as a work log."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from support import ROOT

BENCH = ROOT / "bench"
PAGES = ROOT / "docs" / "benchmarks"
INCLUDE = re.compile(r'--8<-- "bench/README\.md:([a-z0-9_-]+)"')
ISSUE = re.compile(r"\bissues? \d+", re.IGNORECASE)


def run(script: str, *args: str, timeout: float = 120) -> list[dict]:
    """The script's JSON lines, after it exits 0 (one thread, as the suite runs beside other work)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, done.stdout[-2000:]
    return lines


def by_name(lines: list[dict]) -> dict[str, dict]:
    return {line["name"]: line for line in lines if "name" in line}


def timed(line: dict) -> bool:
    """A measurement line: a positive median over its repeats, between its min and max."""
    return line["repeats"] >= 1 and 0 < line["min"] <= line["median"] <= line["max"]


def checks_pass(lines: list[dict]) -> None:
    """Every correctness check a script makes of its peers' set-up holds (a peer not installed is `skipped`)."""
    for line in lines:
        if line.get("name", "").endswith("_check") and "ok" in line:
            assert line["ok"], line


@pytest.mark.slow
def test_model_times_forward_and_decode_step() -> None:
    lines = run("model.py", "--preset", "tiny", "--vocab", "300", "--batch", "4", "--steps", "3", "--repeats", "1",
                "--threads", "1")
    checks_pass(lines)
    names = by_name(lines)
    for name in ("mtx.forward", "mtx.forward.tokens_per_s", "mtx.decode_step", "mtx.decode_step.tokens_per_s"):
        assert timed(names[name]), names.get(name)


@pytest.mark.slow
def test_train_times_an_update() -> None:
    lines = run("train.py", "--presets", "tiny", "--vocab", "300", "--max-tokens", "512", "--repeats", "1",
                "--threads", "1")
    checks_pass(lines)
    names = by_name(lines)
    for name in ("mtx.train.tokens_per_s", "mtx.train.step_ms", "mtx.train.tflops"):
        assert timed(names[name]), names.get(name)


@pytest.mark.slow
def test_translate_times_every_system_on_the_same_batches() -> None:
    lines = run("translate.py", "--preset", "tiny", "--vocab", "300", "--sentences", "8", "--batch", "4",
                "--tokens", "5", "--repeats", "1", "--threads", "1", "--beams", "1")
    names = by_name(lines)
    # mtx's own int8 and float32 give its greedy tokens; the peers' figures come where they are installed.
    assert names["mtx.fp32.greedy_check"]["identical_to_mtx_fp32"] == 1.0
    for system in ("mtx.fp32", "mtx.int8"):
        line = names[f"{system}.beam1.sentences_per_s"]
        assert timed(line) and line["config"]["sentences"] == 8 and line["config"]["beam"] == 1
        assert timed(names[f"{system}.beam1.tokens_per_s"])


@pytest.mark.slow
def test_plan_times_the_batch_plan_and_matches_the_former_algorithm() -> None:
    lines = run("plan.py", "--pairs", "20000", "--reference-pairs", "5000", "--repeats", "1", "--max-tokens", "4096")
    plans = [line for line in lines if line["name"] == "plan.make_batches.seconds"]
    assert {line["config"]["pairs"] for line in plans} == {20000, 5000}
    assert all(timed(line) for line in plans)
    assert all(line["median"] > 0 for line in lines if line["name"].endswith(".peak_memory"))
    assert by_name(lines)["plan.same_batches_as_reference"]["ok"] is True


@pytest.mark.slow
def test_ema_cost_times_the_average_against_an_update() -> None:
    lines = run("ema.py", "cost", "--preset", "tiny", "--vocab", "300", "--pairs", "16", "--repeats", "1",
                "--threads", "1")
    names = by_name(lines)
    for name in ("ema.train_update", "ema.train_update_with_ema", "ema.average_update"):
        assert timed(names[name]), names.get(name)
    assert "ema.overhead" in names


@pytest.mark.slow
def test_checkpoint_io_times_each_way_of_saving() -> None:
    lines = run("checkpoint_io.py", "--preset", "tiny", "--vocab", "300", "--pairs", "2", "--updates", "1",
                "--repeats", "1", "--threads", "1")
    names = by_name(lines)
    for way in ("stop", "flushed", "background"):
        assert names[f"checkpoint.{way}.call"]["median"] > 0, names.get(f"checkpoint.{way}.call")


@pytest.mark.slow
def test_prepare_reports_its_speed_and_memory() -> None:
    (line,) = run("prepare.py", "--pairs", "2000", "--workers", "1", "--set", "data.bpe.vocab_size=500")
    assert line["commit"] == "HEAD" and line["pairs"] == 2000 and line["workers"] == 1
    assert line["seconds"] > 0 and line["pairs_per_second"] > 0 and line["peak_rss_mb_main"] > 0


@pytest.mark.slow
def test_bpe_dropout_cost_times_two_epochs() -> None:
    lines = run("bpe_dropout_cost.py", "--pairs", "1000", "--vocab-size", "300", "--styles", "metaspace",
                "--workers", "0", "--max-tokens", "1024")
    epochs = [line for line in lines if line["name"] == "bpe_dropout.epoch"]
    assert [line["epoch"] for line in epochs] == [1, 2]
    assert all(line["us_per_pair"] > 0 and line["tokens_per_stored_token"] >= 1 for line in epochs)


def sections(notebook: str) -> dict[str, str]:
    """The notebook's snippet sections by name: the text between `[start:NAME]` and `[end:NAME]`."""
    found = re.findall(r"\[start:([a-z0-9_-]+)\][^\n]*\n(.*?)\n[^\n]*\[end:\1\]", notebook, flags=re.S)
    return dict(found)


def test_benchmarks_section_names_no_issue() -> None:
    """The curated pages say what was measured, when, where and how: no "issue N", in them or in the notebook's
    sections they include."""
    notebook = sections((BENCH / "README.md").read_text(encoding="utf-8"))
    pages = sorted(PAGES.glob("*.md"))
    assert pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not ISSUE.search(text), f"{page.name}: {ISSUE.search(text).group()}"
        for name in INCLUDE.findall(text):
            assert name in notebook, f"{page.name} includes bench/README.md:{name}, which has no section"
            assert not ISSUE.search(notebook[name]), f"bench/README.md:{name}: {ISSUE.search(notebook[name]).group()}"


def test_every_table_a_benchmark_page_includes_says_when_and_where() -> None:
    """Each included table carries its date and the command that measured it, inside its section."""
    notebook = sections((BENCH / "README.md").read_text(encoding="utf-8"))
    for page in sorted(PAGES.glob("*.md")):
        for name in INCLUDE.findall(page.read_text(encoding="utf-8")):
            text = notebook[name]
            assert re.search(r"\b2026-\d\d-\d\d\b", text), f"bench/README.md:{name} has no date"
            assert "bench/" in text or "make " in text, f"bench/README.md:{name} has no command"


def test_every_script_in_bench_is_listed_as_kept() -> None:
    """bench/README.md's table of kept scripts names every script in bench/, and no retired one is left there."""
    notebook = (BENCH / "README.md").read_text(encoding="utf-8")
    kept = notebook.split("## The kept scripts", 1)[1].split("\n## ", 1)[0]
    retired = notebook.split("## Retired experiments", 1)[1].split("\n## ", 1)[0]
    for script in sorted(p.name for p in BENCH.iterdir() if p.suffix in {".py", ".sh"}):
        assert f"`{script}`" in kept, f"bench/{script} is not in bench/README.md's table of kept scripts"
        assert f"`{script}`" not in retired, f"bench/{script} is listed as retired"
    for script in re.findall(r"^\| `([a-z_]+\.py)` \|", retired, flags=re.M):
        assert not (BENCH / script).exists(), f"bench/{script} is retired but still there"
