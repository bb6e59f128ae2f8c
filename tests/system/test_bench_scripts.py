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
from pathlib import Path

import pytest
from support import ROOT, snippet

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


# The scripts that measure a trained model run on one that a module fixture trains for ten updates: what they
# measure is meaningless there, but every step they take runs.

TINY_RUN = {
    "name": "bench", "seed": 1,
    "data": {"source": {"demo": {"pairs": 600, "valid": 12, "test": 12, "seed": 2}},
             "bpe": {"style": "bytelevel", "vocab_size": 300}, "filter": {"max_ratio": 0}},
    "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": 32, "heads": 4, "d_ff": 64,
              "dropout": 0.0, "max_positions": 256},  # export.py's greedy check decodes up to 200 tokens
    "train": {"max_tokens": 1000, "lr": 3.0e-3, "warmup": 5, "max_steps": 10, "save_every": 5,
              "validate_every": 1000, "log_every": 1000, "keep_last": 0, "device": "cpu", "precision": "fp32"},
    "decode": {"beam": 2, "max_len_a": 1.0, "max_len_b": 5},
}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of the demo corpus (600 training pairs; valid and test splits of 12, with their gold alignments), a
    1+1-layer model trained for 10 updates: its folder, with data/ and checkpoints/step_10.pt."""
    import io

    import torch
    import yaml
    from rich.console import Console

    from mtx.config.loading import load_recipe
    from mtx.data.prepare import prepare
    from mtx.train.trainer import train

    folder = tmp_path_factory.mktemp("bench_run")
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({**TINY_RUN, "run_dir": str(folder / "run")}), encoding="utf-8")
    recipe = load_recipe(path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        prepare(recipe, workers=1, console=Console(file=io.StringIO()))
        train(recipe)
    finally:
        torch.set_num_threads(threads)
    assert (folder / "run" / "checkpoints" / "step_10.pt").is_file()
    return folder / "run"


@pytest.mark.slow
def test_serve_load_serves_every_level_and_stops_cleanly(tiny_run: Path) -> None:
    lines = run("serve_load.py", "--model", str(tiny_run / "checkpoints" / "step_10.pt"),
                "--sentences", str(tiny_run / "data" / "test.en"), "--file-repeats", "1", "--in-process", "8",
                "--concurrency", "1", "2", "--requests", "10", "--warmup", "1", "--seconds", "10", "--threads", "1",
                "--beam", "1")
    names = by_name(lines)
    assert names["serve.file"]["sentences"] == 12 and names["serve.file"]["sentences_per_s"] > 0
    alone = names["serve.in_process_one_sentence"]
    assert alone["sentences"] == 8 and 0 < alone["p50_ms"] <= alone["p95_ms"]
    assert [line["batch"] for line in lines if line["name"] == "serve.in_process_batch"] == [1, 4, 8]
    levels = [line for line in lines if line["name"] == "serve.serve"]
    assert [level["concurrency"] for level in levels] == [1, 2]
    for level in levels:
        assert level["ok"] == level["requests"] == 10 and level["errors"] == 0, level
        assert level["sentences_per_s"] > 0 and 0 < level["p50_ms"] <= level["p99_ms"]
        assert level["mean_batch"], level  # the server's batch histogram was found on /metrics
    assert names["serve.server_stopped"]["exit_code"] == 0
    summary = names["serve.summary"]
    assert summary["server_exit_code"] == 0 and summary["c1_p50_over_in_process"] > 0


@pytest.mark.slow
def test_alignment_cost_times_plain_and_aligned_translation(tiny_run: Path) -> None:
    lines = run("alignment_cost.py", "--checkpoint", str(tiny_run / "checkpoints" / "step_10.pt"),
                "--test", str(tiny_run / "data" / "test.en"), "--sentences", "8", "--preset", "tiny", "--tokens", "5",
                "--preset-sentences", "4", "--vocab", "300", "--synthetic-pairs", "2000", "--threads", "1",
                "--repeats", "1")
    for model in ("trained", "tiny"):
        for kind in ("plain", "aligned"):
            (line,) = [x for x in lines if x["name"] == f"translate.{kind}" and x["config"]["model"] == model]
            assert timed(line), line
        (cost,) = [x for x in lines if x["name"] == "alignment.cost" and x["model"] == model]
        assert cost["ratio"] > 0


@pytest.mark.slow
def test_shortlist_measures_coverage_and_decodes_with_it(tiny_run: Path) -> None:
    lines = run("shortlist.py", "--checkpoint", str(tiny_run / "checkpoints" / "step_10.pt"),
                "--data", str(tiny_run / "data"), "--iterations", "0", "1", "--translations", "5", "--frequent", "10",
                "--beam", "1", "--threads", "1")
    assert by_name(lines)["shortlist.whole_vocabulary"]["sentences_per_s"] > 0
    rows = [line for line in lines if line["name"] == "shortlist"]
    assert [row["iterations"] for row in rows] == [0, 1]
    for row in rows:
        assert row["pairs"] == 600 and 0 < row["coverage"] <= 1 and row["tokens_a_sentence"] >= 10, row
        assert row["sentences_per_s"] > 0 and row["bleu"] >= 0, row


@pytest.mark.slow
def test_export_decodes_as_mtx_and_times_every_system(tiny_run: Path) -> None:
    pytest.importorskip("ctranslate2")
    lines = run("export.py", "--model", str(tiny_run / "checkpoints" / "step_10.pt"), "--data",
                str(tiny_run / "data"), "--repeats", "1", "--threads", "1")
    names = by_name(lines)
    for check in (name for name in names if name.endswith(".greedy_identical")):
        assert names[check]["identical"] == names[check]["of"] == 12, names[check]
    assert "export.ct2.fp32.greedy_identical" in names
    for system in ("mtx.fp32", "mtx.int8", "ct2.fp32", "ct2.int8"):
        line = names[f"export.{system}.sentences_per_s"]
        assert timed(line) and line["bleu"] >= 0, line
    for system in ("mtx.int8", "ct2.fp32", "ct2.int8"):
        assert "met" in names[f"export.{system}.bleu_below_mtx_fp32"]


@pytest.mark.slow
def test_doubts_counts_every_flag(tiny_run: Path) -> None:
    lines = run("doubts.py", str(tiny_run), "--steps", "5", "10")
    for step in (5, 10):
        flags = {line["name"]: line for line in lines if line["step"] == step}
        assert set(flags) == {f"flags.{name}" for name in ("loop", "length_ratio", "copied", "low_log_prob", "any")}
        assert all(line["sentences"] == 12 and 0 <= line["marked"] <= 12 for line in flags.values())
        assert flags["flags.any"]["marked"] == max(line["marked"] for line in flags.values())


@pytest.mark.slow
def test_documents_scores_paragraphs_whole_and_cut(tiny_run: Path, tmp_path: Path) -> None:
    """Scored whole and cut by sentencex, and by pysbd where it is installed (a peer, no dependency of mtx: a
    `skipped` line otherwise)."""
    try:
        import pysbd  # noqa: F401
        compared = {"pysbd"}
    except ImportError:
        compared = set()
    # The test split, and a last line of four of its sentences: one that the segmenters cut, and a long one.
    for lang in ("en", "de"):
        lines = (tiny_run / "data" / f"test.{lang}").read_text(encoding="utf-8").splitlines()
        (tmp_path / f"test.{lang}").write_text("\n".join([*lines, " ".join(lines[:4])]) + "\n", encoding="utf-8")
    lines = run("documents.py", "paragraphs", "-m", str(tiny_run / "checkpoints" / "step_10.pt"), "--data",
                str(tmp_path), "--threads", "1")
    records = [line for line in lines if line["name"] == "documents.paragraphs"]
    assert records[0]["set"] == "timing" and records[0]["strings"] > 13
    scored = {(r["set"], r["way"]): r for r in records if "bleu" in r}
    assert {way for _, way in scored} == {"whole", "sentencex", *compared}
    assert compared or by_name(lines)["documents.paragraphs.pysbd"]["skipped"]
    assert scored["test", "whole"]["lines"] == 13 and scored["test, lines sentencex cuts", "sentencex"]["lines"] >= 1
    joins = [r for r in records if r["set"] == "joins found"]
    assert {r["way"] for r in joins} == {"sentencex", *compared} and all(r["found"] > 0 for r in joins)


@pytest.mark.slow
def test_documents_times_placing_a_line_of_many_elements() -> None:
    names = by_name(run("documents.py", "place", "--elements", "200", "--repeats", "1"))
    for name in ("documents.place.read", "documents.place.project"):
        assert timed(names[name]) and names[name]["config"]["elements"] == 200, names.get(name)


@pytest.mark.slow
def test_lenpen_sample_chooses_on_each_sample(tiny_run: Path) -> None:
    lines = run("lenpen_sample.py", "-m", str(tiny_run / "checkpoints" / "step_10.pt"), "--sentences", "5")
    assert [line["sentences"] for line in lines] == [5, 12]
    assert all(line["alpha"] >= 0 and "test_bleu" in line for line in lines)
    assert lines[-1]["loss"] == 0  # choosing on all the lines is the choice it is measured against


@pytest.mark.slow
def test_alignment_reports_each_layer_and_head(tiny_run: Path) -> None:
    lines = run("alignment.py", "-m", str(tiny_run / "checkpoints" / "step_10.pt"), "--data", str(tiny_run / "data"),
                "--threads", "1")
    names = by_name(lines)
    expected = {"alignment.diagonal", "alignment.layer0", "alignment.layers_averaged", "alignment.default",
                *(f"alignment.layer0.head{h}" for h in range(4))}
    assert set(names) == expected
    for line in names.values():
        assert line["config"]["sentences"] == 12 and 0 <= line["aer"] <= 1 and line["sure"] > 0, line
    assert names["alignment.diagonal"]["links"] > 0


def test_benchmarks_section_names_no_issue() -> None:
    """The curated pages say what was measured, when, where and how: no "issue N" in them (nor in the notebook's
    sections they include: the next test reads every page's)."""
    pages = sorted(PAGES.glob("*.md"))
    assert pages
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert not ISSUE.search(text), f"{page.name}: {ISSUE.search(text).group()}"


def test_every_table_a_page_includes_says_when_and_how() -> None:
    """Each table of figures a page of the site includes (benchmarks and guides alike) carries its date and the
    command that measured it, inside its section, and no "issue N"."""
    included = {name for page in sorted((ROOT / "docs").rglob("*.md"))
                for name in INCLUDE.findall(page.read_text(encoding="utf-8"))}
    assert len(included) > 40
    for name in sorted(included):
        text = snippet(f"bench/README.md:{name}")
        assert re.search(r"\b20\d\d-\d\d-\d\d\b", text), f"bench/README.md:{name} has no date"
        assert re.search(r"`[^`]*(bench/|make |mtx |examples/)[^`]*`", text), f"bench/README.md:{name} has no command"
        assert not ISSUE.search(text), f"bench/README.md:{name}: {ISSUE.search(text).group()}"


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
