"""Lines longer than the model's positions, as a noisy crawl holds them: scoring given translations goes to the end
of the file and marks them unscored (`mtx translate --score-reference`), keep_best drops them and counts them, and
a translation of a source cut to fit is flagged. The copy-task model reads at most 64 positions; the long lines
here are ten times that."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from support import COPY_MAX_POSITIONS, translate_cli

from mtx.config.loading import load_recipe
from mtx.config.recipe import DecodeConfig
from mtx.data.corpora import TOO_LONG_TO_SCORE
from mtx.data.prepare import prepare
from mtx.decode.doubts import TRUNCATED
from mtx.decode.translator import TooLongToScore, Translation, Translator

LONG = " ".join(["red green"] * 5 * COPY_MAX_POSITIONS)  # 10 × the positions in words, so at least in tokens


def _lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def test_a_pair_the_model_cannot_hold_is_not_scored_and_the_others_are_as_alone(copying: dict) -> None:
    """A source or a translation of 10 × the positions gets `TooLongToScore` (its text and tokens), counted; every
    other pair's score is what it is without them."""
    translator = Translator(copying["model"], copying["tokenizer"], DecodeConfig(beam=4, lenpen=0.6))
    held_out = copying["held_out"][:6]
    alone = translator.forced_scores(held_out, held_out)
    sources = [*held_out[:2], LONG, held_out[2], "", *held_out[3:], held_out[0]]
    given = [*held_out[:2], held_out[0], held_out[2], "", *held_out[3:], LONG]
    scored = translator.forced_scores(sources, given)
    assert isinstance(scored[2], TooLongToScore) and scored[2].text == held_out[0]
    assert isinstance(scored[-1], TooLongToScore) and scored[-1].text == LONG
    assert len(scored[-1].tokens) >= 10 * COPY_MAX_POSITIONS
    assert scored[4] is None
    rest = [s for i, s in enumerate(scored) if i not in (2, 4, len(scored) - 1)]
    assert all(isinstance(s, Translation) for s in rest)
    assert [s.score for s in rest] == pytest.approx([a.score for a in alone], abs=1e-5)  # other batches
    assert translator.stats.too_long_to_score == 2 and translator.stats.truncated == 0


def test_scoring_a_file_with_lines_ten_times_too_long_reaches_its_end_and_keep_best_drops_them(
        copying: dict, tmp_path: Path) -> None:
    """`mtx translate --score-reference --format jsonl` of a file holding a run-on source, a run-on translation
    and an empty line writes a line for each (text: 'nan' for the two), and `mtx prepare`'s keep_best drops the
    two first, counting them as too_long_to_score in the manifest."""
    held_out = copying["held_out"][:8]
    sources = _lines(tmp_path / "train.en", [*held_out[:3], LONG, held_out[3], "", *held_out[4:], held_out[0]])
    given = _lines(tmp_path / "train.de", [*held_out[:3], held_out[1], held_out[3], "", *held_out[4:], LONG])
    scoring = ["-m", str(copying["checkpoint"]), "-i", str(sources), "--score-reference", str(given)]
    result, text = translate_cli(scoring)
    assert result.exit_code == 0, result.exception
    assert len(text) == 11 and [i for i, line in enumerate(text) if line.startswith("nan\t")] == [3, 10]
    assert text[5] == "" and "2 lines had a source or translation longer" in result.stderr
    jsonl = tmp_path / "train.de.jsonl"
    result, _ = translate_cli([*scoring, "--format", "jsonl", "-o", str(jsonl)])
    assert result.exit_code == 0, result.exception
    lines = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == 11
    for i in (3, 10):
        assert lines[i]["flags"] == [TOO_LONG_TO_SCORE] and lines[i]["token_log_probs"] is None
        assert lines[i]["score"] is None and lines[i]["log_prob"] is None
    assert lines[10]["text"] == LONG and len(lines[10]["tokens"]) > 10 * COPY_MAX_POSITIONS
    assert all(line["flags"] == [] for i, line in enumerate(lines) if i not in (3, 10))

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "t", "run_dir": str(tmp_path / "run"), "model": {"preset": "tiny"},
                                      "data": {"source": {"files": {"train": [str(sources), str(jsonl)],
                                                                    "keep_best": 0.5}},
                                               "bpe": {"vocab_size": 300, "min_frequency": 1}}}))
    summary = io.StringIO()
    manifest = prepare(load_recipe(recipe, []), workers=1, console=Console(file=summary, width=200))
    dropped = manifest["filter"]["dropped"]
    # round(0.5 · 11) = 6 of the 9 others kept: the empty line (ranked last) and the two worst dropped.
    assert dropped[TOO_LONG_TO_SCORE] == 2 and dropped["teacher_confidence"] == 3
    assert manifest["filter"]["kept"] == 6 and "too long to score" in summary.getvalue()


def test_a_translation_of_a_source_cut_to_the_positions_is_flagged_truncated(copying: dict, tmp_path: Path) -> None:
    source = _lines(tmp_path / "in.txt", [copying["held_out"][0], LONG, copying["held_out"][1]])
    result, lines = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(source), "--format", "jsonl"])
    assert result.exit_code == 0, result.exception
    flags = [json.loads(line)["flags"] for line in lines]
    assert TRUNCATED in flags[1] and TRUNCATED not in flags[0] + flags[2]
    assert "1 sentences were longer than the model's 64 positions" in result.stderr
