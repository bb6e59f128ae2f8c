"""Integration: the five commands a user runs, through the real CLI, on a small demo corpus (about a minute)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

RECIPE = """\
name: pipeline
seed: 3
data:
  source: {demo: {pairs: 3000, valid: 40, test: 40}}
  bpe: {vocab_size: 600}
model: {preset: tiny, d_model: 64, heads: 4, d_ff: 128, layers_enc: 1, layers_dec: 1, dropout: 0.0}
train:
  max_tokens: 1500
  lr: 3.0e-3
  warmup: 20
  max_steps: 60
  save_every: 20
  validate_every: 30
  valid_max_sentences: 20
  log_every: 10
decode: {beam: 2, max_len_b: 20}
"""


def mtx(*args: str, stdin: str | None = None, cwd: Path) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "mtx", *args], input=stdin, capture_output=True, text=True,
                            cwd=cwd, timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "2"})
    assert result.returncode == 0, f"mtx {' '.join(args)} failed:\n{result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """prepare → train → average, once for the tests below."""
    root = tmp_path_factory.mktemp("pipeline")
    (root / "recipe.yaml").write_text(RECIPE, encoding="utf-8")
    mtx("prepare", "recipe.yaml", "--workers", "1", cwd=root)
    mtx("train", "recipe.yaml", cwd=root)
    mtx("average", "--dir", "runs/pipeline/checkpoints", "--last", "2", "-o", "runs/pipeline/average.pt", cwd=root)
    return root


def test_run_directory_describes_itself(run: Path) -> None:
    data, checkpoints = run / "runs/pipeline/data", run / "runs/pipeline/checkpoints"
    manifest = json.loads((data / "manifest.json").read_text())
    assert manifest["splits"]["train"]["pairs"] > 2000
    assert {"step_20.pt", "step_40.pt", "step_60.pt", "last.pt"} <= {p.name for p in checkpoints.iterdir()}
    events = [json.loads(line) for line in (run / "runs/pipeline/metrics.jsonl").read_text().splitlines()]
    assert any("valid_bleu" in e for e in events) and events[-1]["step"] == 60


def test_the_model_learned(run: Path) -> None:
    """Through the real CLI the run learns: the train loss falls well below where it started, and the valid
    loss falls between the two validations."""
    events = [json.loads(line) for line in (run / "runs/pipeline/metrics.jsonl").read_text().splitlines()]
    train = [e["loss"] for e in events if e["event"] == "train"]
    valid = [e["valid_loss"] for e in events if e["event"] == "valid"]
    assert len(train) == 6 and train[-1] < 0.8 * train[0]
    assert len(valid) == 2 and valid[1] < 0.97 * valid[0]


def test_translate_and_score_through_pipes(run: Path) -> None:
    test_en, test_de = run / "runs/pipeline/data/test.en", run / "runs/pipeline/data/test.de"
    source = test_en.read_text(encoding="utf-8")
    from_file = mtx("translate", "-m", "runs/pipeline/average.pt", "-i", str(test_en), cwd=run).stdout
    from_stdin = mtx("translate", "-m", "runs/pipeline/average.pt", stdin=source, cwd=run).stdout
    assert from_file == from_stdin
    assert len(from_file.splitlines()) == len(source.splitlines()) == 40
    card = json.loads(mtx("score", "-r", str(test_de), "--json", "--metrics", "bleu,chrf", stdin=from_file,
                          cwd=run).stdout)
    from sacrebleu.metrics import BLEU, CHRF

    hyps, refs = from_file.splitlines(), [test_de.read_text(encoding="utf-8").splitlines()]
    bleu = BLEU()
    assert card["bleu"] == pytest.approx(bleu.corpus_score(hyps, refs).score, abs=1e-9)
    assert card["chrf"] == pytest.approx(CHRF().corpus_score(hyps, refs).score, abs=1e-9)
    assert card["signature"] == str(bleu.get_signature())


def test_train_again_resumes_and_does_nothing_more(run: Path) -> None:
    """A finished run started again resumes at its last step, finds train.max_steps reached and writes nothing:
    no checkpoint, no metrics line. The whole message is checked, since a bare 60 is also max_steps and would be
    printed whatever happened."""
    checkpoints, metrics = run / "runs/pipeline/checkpoints", run / "runs/pipeline/metrics.jsonl"
    before = {p.name: p.stat().st_mtime_ns for p in checkpoints.iterdir()}, metrics.read_bytes()
    result = mtx("train", "recipe.yaml", cwd=run)
    assert ({p.name: p.stat().st_mtime_ns for p in checkpoints.iterdir()}, metrics.read_bytes()) == before
    said = " ".join(result.stderr.split())  # the console wraps long lines
    assert "Nothing to do: train.max_steps = 60 reached at step 60." in said, result.stderr


def test_ct2_engine_agrees_with_torch(run: Path) -> None:
    """`--engine ct2` decodes the trained model as `--engine torch` does (issue 57): greedy search gives the same
    tokens for every test sentence, with the same score to float32's rounding (so the same model, not just the
    same argmax), and beam 4 scores within 0.1 BLEU of it (a beam's ranking may break a float32 tie the other
    way). The recipe's length penalty is fairseq's, the one CTranslate2 has."""
    pytest.importorskip("ctranslate2")
    from sacrebleu.metrics import BLEU

    test_en, test_de = run / "runs/pipeline/data/test.en", run / "runs/pipeline/data/test.de"
    references = [test_de.read_text(encoding="utf-8").splitlines()]

    def translated(engine: str, *flags: str) -> list[str]:
        return mtx("translate", "-m", "runs/pipeline/average.pt", "-i", str(test_en), "--engine", engine, *flags,
                   cwd=run).stdout.splitlines()

    torch_greedy, ct2_greedy = ([json.loads(line) for line in translated(engine, "--beam", "1", "--format", "jsonl")]
                                for engine in ("torch", "ct2"))
    assert len(torch_greedy) == len(ct2_greedy) == 40
    assert [line["tokens"] for line in ct2_greedy] == [line["tokens"] for line in torch_greedy]
    assert [line["text"] for line in ct2_greedy] == [line["text"] for line in torch_greedy]
    assert [line["score"] for line in ct2_greedy] == pytest.approx([line["score"] for line in torch_greedy], abs=1e-4)
    assert len({round(line["score"], 4) for line in torch_greedy}) > 10  # scored sentence by sentence
    torch_bleu, ct2_bleu = (BLEU().corpus_score(translated(engine, "--beam", "4"), references).score
                            for engine in ("torch", "ct2"))
    assert abs(ct2_bleu - torch_bleu) <= 0.1, (torch_bleu, ct2_bleu)
