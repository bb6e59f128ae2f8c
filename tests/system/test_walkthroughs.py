"""The distillation walkthrough, so that it cannot rot between its long runs: examples/distillation/run.sh in its
smoke forms, both variants end to end in one folder (a miniature of the demo corpus, 25 updates a model, no
network): two `tiny` teachers as an ensemble (`smoke`), then a MarianMT model made by marian_teacher.py and
brought in by `mtx import` (`imported-smoke`). The script, not its figures, is under test: each prints the table
its README shows, every row scored, and the imported teacher's translations are what its student learnt from."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT

pytestmark = pytest.mark.slow

HEADER = ["model", "test BLEU", "chrF", "size (MB)", "greedy, 1 / 2 threads (sentences/s)", "beam 4, 1 / 2 threads"]
STUDENTS = ["student, original pairs", "student, distilled", "student, distilled, int8",
            "student, distilled, int8, shortlist of 20"]


def walkthrough(folder: Path, variant: str) -> list[list[str]]:
    """The Markdown table `run.sh VARIANT` prints, as rows of cells (the header first)."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(["bash", str(ROOT / "examples" / "distillation" / "run.sh"), variant], cwd=folder,
                            env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, f"run.sh {variant} failed:\n{result.stderr[-3000:]}"
    lines = [line for line in result.stdout.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines if "---" not in line]


@pytest.fixture(scope="module")
def tables(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, list[list[str]]]]:
    folder = tmp_path_factory.mktemp("walkthrough")
    return folder / "runs" / "smoke", {variant: walkthrough(folder, variant) for variant in ("smoke", "imported-smoke")}


@pytest.mark.parametrize("variant, teacher", [("smoke", "teachers (ensemble of two tiny)"),
                                              ("imported-smoke", "teacher (imported MarianMT)")])
def test_each_variant_prints_its_table(tables, variant: str, teacher: str) -> None:
    """The header and one row a model, each with its BLEU, chrF and size; the smoke forms time nothing."""
    header, *rows = tables[1][variant]
    assert header == HEADER
    assert [row[0] for row in rows] == [teacher, *STUDENTS]
    for name, bleu, chrf, size, greedy, beam in rows:
        assert 0 <= float(bleu) <= 100 and 0 <= float(chrf) <= 100, name
        assert float(size) > 0 and greedy == beam == "- / -", name
    sizes = {row[0]: float(row[3]) for row in rows}
    assert sizes["student, distilled, int8"] < sizes["student, distilled"]


def test_the_imported_teachers_translations_train_its_student(tables) -> None:
    """The imported variant's student learnt from the MarianMT teacher: the checkpoint `mtx import` wrote from the
    folder marian_teacher.py made translated every training source, and keep_best dropped the 5% it was least
    sure of, beside the other variant's distilled corpus rather than over it."""
    runs = tables[0] / "runs"
    checkpoint = torch.load(runs / "kd-imported.pt", map_location="cpu", weights_only=False)
    assert Path(checkpoint["imported_from"]["source"]) == (runs / "kd-marian").resolve()
    sources = (runs / "kd-corpus" / "train.en").read_text(encoding="utf-8").splitlines()
    imported = (runs / "kd-corpus" / "train.imported.de.jsonl").read_text(encoding="utf-8").splitlines()
    ensemble = (runs / "kd-corpus" / "train.distilled.de.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(imported) == len(ensemble) == len(sources) == 1000 and imported != ensemble
    assert all("text" in json.loads(line) for line in imported)
    manifest = json.loads((runs / "kd-imported-student" / "data" / "manifest.json").read_text(encoding="utf-8"))
    [corpus] = manifest["corpora"]
    assert "train.imported.de.jsonl" in corpus["splits"]["train"]["origin"]
    assert corpus["filter"]["dropped"]["teacher_confidence"] == 50 and corpus["splits"]["train"]["pairs"] == 950
