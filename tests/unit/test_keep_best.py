"""keep_best on the lines `mtx translate --format jsonl` writes that have no mean log-probability: the scores of
pairs too long for the model (flag too_long_to_score), and the empty translations of empty source lines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtx.config.data import FilesSource, SourceConfig
from mtx.data.corpora import TOO_LONG_TO_SCORE, open_source
from mtx.errors import MtxError

# As mtx.decode.output writes them: a scored pair, a pair too long to score, an empty source line (scored, and
# searched with --nbest 2, whose n-best list is empty).
SCORED = {"text": "a", "score": -0.5, "tokens": ["▁x", "</s>"], "token_log_probs": [], "log_prob": -1.0,
          "flags": []}
TOO_LONG = {"text": "ein sehr langer Satz", "score": None, "tokens": ["▁ein", "</s>"], "token_log_probs": None,
            "log_prob": None, "flags": [TOO_LONG_TO_SCORE]}
EMPTY = {"text": "", "score": None, "tokens": [], "token_log_probs": [], "log_prob": None, "flags": []}
EMPTY_NBEST = {"text": "", "score": None, "tokens": [], "token_log_probs": [], "flags": [], "nbest": []}


def scored(text: str, mean: float) -> dict:
    return {**SCORED, "text": text, "token_log_probs": [mean - 0.25, mean + 0.25]}


def kept(tmp_path: Path, lines: list[dict], keep_best: float) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The training pairs a files source keeps of `lines` (sources s1, s2, ...), and what it drops, by reason."""
    source = tmp_path / "train.en"
    source.write_text("".join(f"s{n}\n" if line["text"] else "\n" for n, line in enumerate(lines, 1)))
    target = tmp_path / "train.de.jsonl"
    target.write_text("".join(json.dumps(line) + "\n" for line in lines), encoding="utf-8")
    files = FilesSource(train=[str(source), str(target)], keep_best=keep_best)
    stream = open_source(SourceConfig(files=files), "data.source", "en", "de")["train"]
    pairs = [(s.decode(), t) for chunk in stream.chunks() for s, t in chunk]
    assert stream.total == len(pairs)
    return pairs, stream.dropped_before


def test_pairs_too_long_to_score_are_dropped_first_and_counted_apart(tmp_path: Path) -> None:
    """Two of six pairs could not be scored: keep_best 0.5 keeps the 3 best of the 4 scored, drops the two first
    (too_long_to_score) and the worst scored one (teacher_confidence)."""
    lines = [scored("a", -1.0), TOO_LONG, scored("b", -3.0), scored("c", -0.5), TOO_LONG, scored("d", -2.0)]
    pairs, dropped = kept(tmp_path, lines, 0.5)
    assert pairs == [("s1", "a"), ("s4", "c"), ("s6", "d")]
    assert dropped == {TOO_LONG_TO_SCORE: 2, "teacher_confidence": 1}


def test_the_fraction_kept_is_of_every_pair_so_unscored_ones_may_leave_fewer(tmp_path: Path) -> None:
    """keep_best 0.9 of 4 pairs would keep 4, but 2 have no score: only the 2 scored are kept, none dropped for
    confidence."""
    pairs, dropped = kept(tmp_path, [TOO_LONG, scored("a", -1.0), TOO_LONG, scored("b", -2.0)], 0.9)
    assert pairs == [("s2", "a"), ("s4", "b")]
    assert dropped == {TOO_LONG_TO_SCORE: 2, "teacher_confidence": 0}


def test_without_keep_best_a_pair_too_long_to_score_is_read_as_any_other(tmp_path: Path) -> None:
    pairs, dropped = kept(tmp_path, [scored("a", -1.0), TOO_LONG], 1.0)
    assert pairs == [("s1", "a"), ("s2", "ein sehr langer Satz")] and dropped == {}


@pytest.mark.parametrize("empty", [EMPTY, EMPTY_NBEST], ids=["scored", "searched with --nbest"])
def test_an_empty_line_s_empty_translation_is_ranked_below_every_translation(tmp_path: Path, empty: dict) -> None:
    """mtx's own output for an empty source line (no tokens, not even EOS) is read, not refused, and ranked last
    among the scored pairs: it has nothing to teach, and is dropped before any translation."""
    lines = [scored("a", -4.0), empty, scored("b", -3.0), scored("c", -5.0)]
    pairs, dropped = kept(tmp_path, lines, 0.75)
    assert pairs == [("s1", "a"), ("s3", "b"), ("s4", "c")]
    assert dropped == {TOO_LONG_TO_SCORE: 0, "teacher_confidence": 1}
    pairs, _ = kept(tmp_path, lines, 1.0)
    assert pairs[1] == ("", "")


def test_a_nan_log_probability_ranks_last_rather_than_passing_for_a_pair_too_long(tmp_path: Path) -> None:
    pairs, dropped = kept(tmp_path, [scored("a", -9.0), {**scored("b", 0.0), "token_log_probs": [float("nan")]}], 0.5)
    assert pairs == [("s1", "a")] and dropped == {TOO_LONG_TO_SCORE: 0, "teacher_confidence": 1}


@pytest.mark.parametrize(("line", "message"), [
    ({**SCORED, "text": "a", "token_log_probs": []}, "it has no token_log_probs"),
    ({**TOO_LONG, "flags": []}, "it has no token_log_probs"),
    ({"text": "a", "nbest": "x"}, "not a translation as mtx translate --format jsonl writes one"),
])
def test_lines_mtx_does_not_write_are_still_refused(tmp_path: Path, line: dict, message: str) -> None:
    """A translation with text but no log-probabilities, or null ones without the flag, is not mtx's output."""
    with pytest.raises(MtxError, match=message):
        kept(tmp_path, [scored("a", -1.0), line], 0.5)
