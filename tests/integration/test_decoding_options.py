"""`mtx translate` beyond search: sampling (reproducible per line), shards, target prefixes, scoring given
translations, shortlists."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from support import copy_lexicon, translate_cli

from mtx.checkpoint import save_checkpoint
from mtx.config.recipe import DecodeConfig
from mtx.decode.sampling import draw, filtered, uniforms
from mtx.decode.translator import Translator
from mtx.errors import MtxError


def run(copying: dict, *flags: str) -> list[str]:
    result, lines = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), *flags])
    assert result.exit_code == 0, result.output
    return lines


# ---- the draws


def test_uniforms_depend_on_seed_line_sample_and_step_alone() -> None:
    lines, samples = torch.arange(1000), torch.zeros(1000, dtype=torch.long)
    u = uniforms(7, lines, samples, 3)
    assert u.dtype == torch.float64 and bool(((u > 0) & (u < 1)).all()) and len(set(u.tolist())) == 1000
    assert torch.equal(uniforms(7, lines.flip(0), samples, 3), u.flip(0))  # a row's number ignores its neighbours
    for other in (uniforms(8, lines, samples, 3), uniforms(7, lines, samples + 1, 3), uniforms(7, lines, samples, 4)):
        assert not bool(torch.isclose(other, u).any())
    assert abs(u.mean().item() - 0.5) < 0.03 and abs(u.var().item() - 1 / 12) < 0.01


def test_draws_follow_the_distribution_and_the_filters() -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])
    log_probs = probs.log().expand(20000, -1)
    u = uniforms(1, torch.arange(20000), torch.zeros(20000, dtype=torch.long), 0)
    counts = torch.bincount(draw(log_probs, u), minlength=5) / 20000
    torch.testing.assert_close(counts, probs, atol=0.015, rtol=0)
    kept = filtered(probs.log().unsqueeze(0), 1.0, 2, 1.0).exp()  # top-2, renormalised
    torch.testing.assert_close(kept, torch.tensor([[0.625, 0.375, 0, 0, 0]]))
    nucleus = filtered(probs.log().unsqueeze(0), 1.0, 0, 0.7).exp()  # 0.5 is short of 0.7, 0.5 + 0.3 is not
    torch.testing.assert_close(nucleus, torch.tensor([[0.625, 0.375, 0, 0, 0]]))
    wider = filtered(probs.log().unsqueeze(0), 1.0, 0, 0.85).exp()[0]  # 0.8 is short of 0.85: one more
    torch.testing.assert_close(wider, torch.tensor([0.5, 0.3, 0.15, 0, 0]) / 0.95)
    hot = filtered(probs.log().unsqueeze(0), 2.0, 0, 1.0).exp()[0]
    torch.testing.assert_close(hot[:4], probs[:4].sqrt() / probs[:4].sqrt().sum())


# ---- sampling through the command


def test_samples_do_not_depend_on_batching_threads_or_shards(copying: dict) -> None:
    """The same samples, that is: their scores agree to float rounding, which batching changes."""
    flags = ("--sampling", "--temperature", "3", "--nbest", "3", "--seed", "5")

    def samples(lines: list[str]) -> list[list[str]]:
        return [line.split("\t")[1::2] for line in lines]

    whole = run(copying, *flags)
    assert samples(run(copying, *flags, "--batch-tokens", "40", "--threads", "1")) == samples(whole)
    assert samples(run(copying, *flags, "--batch-tokens", "400", "--threads", "2")) == samples(whole)
    texts = [text for nbest in samples(whole) for text in nbest]
    assert len(set(texts)) > 40  # 90 samples of a model at temperature 3: they differ
    assert samples(run(copying, "--sampling", "--temperature", "3", "--nbest", "3", "--seed", "6")) != samples(whole)
    shard = copying["folder"] / "shard.txt"
    shard.write_text("".join(f"{s}\n" for s in copying["held_out"][10:]), encoding="utf-8")
    result, lines = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(shard), *flags, "--line-offset", "10"])
    assert samples(lines) == samples(whole)[10:]


def test_samples_are_scored_as_beam_search_scores_them(copying: dict) -> None:
    """A sample's score is the model's log-probability of it (not the tempered one's), length-normalised: the
    score --score-reference gives the same text."""
    lines = run(copying, "--sampling", "--seed", "3", "--format", "jsonl")
    samples = [json.loads(line) for line in lines]
    references = copying["folder"] / "samples.txt"
    references.write_text("".join(f"{s['text']}\n" for s in samples), encoding="utf-8")
    scored = [json.loads(line) for line in run(copying, "--score-reference", str(references), "--format", "jsonl")]
    same_tokens = [(a, b) for a, b in zip(samples, scored, strict=True) if a["tokens"] == b["tokens"]]
    assert len(same_tokens) >= 20  # the others are spelt otherwise than the tokenizer spells their text
    for sample, score in same_tokens:
        assert sample["score"] == pytest.approx(score["score"], abs=1e-4)


# ---- shards (--shard K/N)


def shard_outputs(copying: dict, folder: Path, count: int, *flags: str) -> list[str]:
    """The N shards translated one by one, their outputs concatenated in shard order."""
    lines = []
    for k in range(1, count + 1):
        out = folder / f"out.{k}"
        result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "-o", str(out),
                                   "--shard", f"{k}/{count}", *flags])
        assert result.exit_code == 0, result.output
        lines += out.read_text(encoding="utf-8").splitlines()
        assert not (folder / f"out.{k}.partial").exists() and not (folder / f"out.{k}.partial.json").exists()
    return lines


@pytest.mark.parametrize("count", [1, 4])
def test_shards_concatenated_in_order_are_the_whole_output(copying: dict, tmp_path: Path, count: int) -> None:
    assert shard_outputs(copying, tmp_path, count) == run(copying)


def test_sharded_forced_scores_and_prefixes_are_the_whole_files(copying: dict, tmp_path: Path) -> None:
    """A shard reads the same lines of the --score-reference or --prefix file as of the input; scores agree to
    float rounding, which batching changes."""
    scored = ("--score-reference", str(copying["source"]))

    def split(lines: list[str]) -> tuple[list[float], list[str]]:
        return [float(line.split("\t")[0]) for line in lines], [line.split("\t")[1] for line in lines]

    whole_scores, whole_texts = split(run(copying, *scored))
    (tmp_path / "scored").mkdir()
    shard_scores, shard_texts = split(shard_outputs(copying, tmp_path / "scored", 3, *scored))
    assert shard_texts == whole_texts and shard_scores == pytest.approx(whole_scores, abs=1e-4)
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("".join(f"{s.split()[0]}\n" for s in copying["held_out"]), encoding="utf-8")
    (tmp_path / "prefixed").mkdir()
    prefixed = shard_outputs(copying, tmp_path / "prefixed", 3, "--prefix", str(prefixes))
    assert prefixed == run(copying, "--prefix", str(prefixes))


def test_a_shard_of_no_lines_writes_an_empty_output(copying: dict, tmp_path: Path) -> None:
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "-o",
                               str(tmp_path / "out"), "--shard", "1/31"])  # 31 shards of 30 lines: the first is empty
    assert result.exit_code == 0 and (tmp_path / "out").read_bytes() == b""


def test_sharded_samples_are_the_whole_files(copying: dict, tmp_path: Path) -> None:
    """A line's draws depend on its index in the whole file, which a shard keeps; the n-best's texts are compared
    (their scores agree to float rounding, which batching changes)."""
    flags = ("--sampling", "--temperature", "3", "--nbest", "3", "--seed", "5", "--format", "jsonl")

    def samples(lines: list[str]) -> list[list[str]]:
        return [[hypothesis["text"] for hypothesis in json.loads(line)["nbest"]] for line in lines]

    whole = samples(run(copying, *flags))
    assert samples(shard_outputs(copying, tmp_path, 3, *flags)) == whole
    assert len({text for nbest in whole for text in nbest}) > 40


def test_an_interrupted_shard_goes_on_from_its_first_missing_line(copying: dict, tmp_path: Path) -> None:
    """Stopped after it has written 4 lines and part of a fifth, the shard keeps those 4 as they are (they are
    marked here, so a translation of them again would show) and translates the others, whose lines are then the
    whole file's."""
    from mtx.decode.command import translate_file
    from mtx.decode.shards import Shard

    expected = run(copying)[10:20]  # shard 2 of 3 of 30 lines
    out = tmp_path / "out.de"

    class Interrupted(Exception):
        pass

    def stop_at_the_shard_line(text: str) -> None:
        if text.startswith("shard 2/3: lines 11–20"):
            raise Interrupted

    def shard(log) -> object:
        return translate_file([copying["checkpoint"]], copying["source"], out, options={}, batch_tokens=4096,
                              device="cpu", dtype="fp32", threads=1, errors="strict", log=log, shard=Shard(2, 3))

    with pytest.raises(Interrupted):
        shard(stop_at_the_shard_line)
    partial = tmp_path / "out.de.partial"
    assert partial.read_bytes() == b"" and (tmp_path / "out.de.partial.json").exists()
    kept = [f"KEPT {i}" for i in range(4)]
    partial.write_text("".join(f"{line}\n" for line in kept) + expected[4][:3], encoding="utf-8")
    said: list[str] = []
    stats = shard(said.append)
    assert out.read_text(encoding="utf-8").splitlines() == kept + expected[4:]
    assert stats.sentences == 6 and any("from line 15 (4 already in" in line for line in said)
    assert not partial.exists() and not (tmp_path / "out.de.partial.json").exists()


def test_another_translations_partial_is_refused(copying: dict, tmp_path: Path) -> None:
    """(A finished shard asked again: tests/integration/test_sharded_translation.py.)"""
    command = ["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "-o", str(tmp_path / "out.de"),
               "--shard", "1/2"]
    (tmp_path / "out.de.partial").write_text("a line\n", encoding="utf-8")
    (tmp_path / "out.de.partial.json").write_text(json.dumps({"shard": "1/2"}), encoding="utf-8")
    result, _ = translate_cli([*command, "--beam", "2"])
    assert result.exit_code == 1 and "was written by another translation" in str(result.exception)
    assert (tmp_path / "out.de.partial").read_text(encoding="utf-8") == "a line\n"


@pytest.mark.parametrize(("flags", "message"), [
    (("--shard", "0/3"), "--shard '0/3' is not K/N with 1 ≤ K ≤ N"),
    (("--shard", "2"), "--shard '2' is not K/N"),
    (("--shard", "3/2"), "--shard '3/2' is not K/N"),
])
def test_a_bad_shard_is_refused(copying: dict, tmp_path: Path, flags: tuple[str, ...], message: str) -> None:
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "-o",
                               str(tmp_path / "out"), *flags])
    assert result.exit_code == 1 and message in str(result.exception)


def test_a_shard_needs_an_input_and_an_output_file(copying: dict, tmp_path: Path) -> None:
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "--shard", "1/2", "-o", str(tmp_path / "o")],
                              stdin=b"a b\n")
    assert result.exit_code == 1 and "--shard 1/2 needs -i and -o files" in str(result.exception)


# ---- prefixes


@pytest.mark.parametrize("flags", [(), ("--beam", "1"), ("--nbest", "3"), ("--sampling", "--temperature", "2")])
def test_translations_start_with_their_prefix(copying: dict, flags: tuple[str, ...]) -> None:
    held_out = copying["held_out"]
    prefixes = ["red green" if i % 3 == 0 else "" for i in range(len(held_out))]
    prefix_file = copying["folder"] / "prefixes.txt"
    prefix_file.write_text("".join(f"{p}\n" for p in prefixes), encoding="utf-8")
    lines = run(copying, "--prefix", str(prefix_file), *flags)
    plain = run(copying, *flags)
    for line, prefix, unprefixed in zip(lines, prefixes, plain, strict=True):
        texts = line.split("\t")[1::2] if "--nbest" in flags else [line]
        if prefix:
            assert all(text.startswith(prefix) for text in texts), (prefix, texts)
        else:
            assert line == unprefixed  # a line without a prefix is translated as if there were no --prefix


def test_the_search_goes_on_from_the_prefix(copying: dict) -> None:
    """The copy model, forced to start with the sentence's first word, copies the rest: the prefix is where the
    search goes on from, not text pasted before a translation."""
    held_out = copying["held_out"]
    prefix_file = copying["folder"] / "first_words.txt"
    prefix_file.write_text("".join(f"{s.split()[0]}\n" for s in held_out), encoding="utf-8")
    assert run(copying, "--prefix", str(prefix_file)) == held_out


# ---- scoring given translations


def test_scoring_the_search_s_own_best_gives_back_its_score(copying: dict) -> None:
    for flags in ((), ("--lenpen", "1.0", "--lenpen-style", "fairseq"), ("--lenpen", "0")):
        best = [json.loads(line) for line in run(copying, "--format", "jsonl", *flags)]
        hypotheses = copying["folder"] / "best.txt"
        hypotheses.write_text("".join(f"{b['text']}\n" for b in best), encoding="utf-8")
        scored = [json.loads(line) for line in run(copying, "--score-reference", str(hypotheses), "--format",
                                                   "jsonl", *flags)]
        for b, s in zip(best, scored, strict=True):
            assert s["tokens"] == b["tokens"] and s["text"] == b["text"]
            assert s["score"] == pytest.approx(b["score"], abs=1e-4)
            assert s["token_log_probs"] == pytest.approx(b["token_log_probs"], abs=1e-4)
            assert s["log_prob"] == pytest.approx(sum(b["token_log_probs"]), abs=1e-4)
    text = run(copying, "--score-reference", str(hypotheses))
    assert [line.split("\t")[1] for line in text] == [b["text"] for b in best]


def test_an_ensemble_scores_as_it_decodes(copying: dict) -> None:
    model, tokenizer = copying["model"], copying["tokenizer"]
    twice = Translator([model, model], tokenizer, DecodeConfig(beam=4, lenpen=0.6))
    found = twice.translate(copying["held_out"])
    scored = twice.forced_scores(copying["held_out"], [nbest[0].text for nbest in found])
    for nbest, given in zip(found, scored, strict=True):
        assert given.score == pytest.approx(nbest[0].score, abs=1e-4)


def test_a_worse_translation_scores_lower(copying: dict) -> None:
    translator = Translator(copying["model"], copying["tokenizer"], DecodeConfig(beam=4, lenpen=0.6))
    good = translator.forced_scores(copying["held_out"], copying["held_out"])
    bad = translator.forced_scores(copying["held_out"], [" ".join(reversed(s.split())) for s in copying["held_out"]])
    assert all(b.score < g.score for g, b in zip(good, bad, strict=True) if g.text != b.text)
    assert all(math.isfinite(g.score) and g.score <= 0 for g in good)


# ---- shortlists (--shortlist)


def with_lexicon(copying: dict) -> Path:
    """The copy model's checkpoint carrying a lexical table learnt from the held-out sentences copied (each token
    its own translation, as the copy task's training pairs would teach)."""
    checkpoint = copying["folder"] / "copy-lexicon.pt"
    if not checkpoint.exists():
        lexicon = copy_lexicon(copying["tokenizer"], copying["model"].vocab_size, copying["held_out"])
        stored = torch.load(copying["checkpoint"], weights_only=True)
        save_checkpoint({**stored, "lexicon": lexicon.to_checkpoint()}, checkpoint)
    return checkpoint


def test_a_shortlist_of_the_tables_translations_copies_as_the_whole_vocabulary_does(copying: dict) -> None:
    whole = run(copying, "--format", "jsonl")
    listed = {**copying, "checkpoint": with_lexicon(copying)}
    shortlisted = run(listed, "--shortlist", "3", "--shortlist-frequent", "0", "--format", "jsonl")
    assert [json.loads(line)["text"] for line in shortlisted] == [json.loads(line)["text"] for line in whole]
    for layout in (("--batch-tokens", "40", "--threads", "1"), ("--batch-tokens", "400", "--threads", "2")):
        again = run(listed, "--shortlist", "3", "--shortlist-frequent", "0", "--format", "jsonl", *layout)
        assert [json.loads(line)["tokens"] for line in again] == [json.loads(line)["tokens"] for line in shortlisted]
    # each sentence's distribution renormalised over its few tokens: surer of each
    assert all(json.loads(a)["score"] >= json.loads(b)["score"] - 1e-6 for a, b in zip(shortlisted, whole,
                                                                                      strict=True))


def test_a_shortlist_is_refused_without_a_table_or_beyond_its_width(copying: dict) -> None:
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "--shortlist", "5"])
    assert result.exit_code == 1 and "--shortlist 5 needs the checkpoint's lexical table" in str(result.exception)
    assert "set data.lexicon.learn: true" in str(result.exception) and "`mtx prepare` again" in str(result.exception)
    result, _ = translate_cli(["-m", str(with_lexicon(copying)), "-i", str(copying["source"]), "--shortlist", "11"])
    assert result.exit_code == 1 and "more than the 10 translations per source token" in str(result.exception)


# ---- bad input


@pytest.mark.parametrize(("flags", "message"), [
    (("--topk", "0", "--sampling"), "--topk 0 must be at least 1"),
    (("--topp", "0", "--sampling"), "--topp 0.0 must be in (0, 1]"),
    (("--topp", "1.5", "--sampling"), "--topp 1.5 must be in (0, 1]"),
    (("--temperature", "-1", "--sampling"), "--temperature -1.0 must be positive"),
    (("--topk", "5"), "--topk 5 applies only with --sampling"),
    (("--sampling", "--beam", "4"), "--sampling draws each token, --beam 4 searches"),
    (("--line-offset", "-1"), "--line-offset -1 must be at least 0"),
])
def test_contradicting_or_bad_sampling_options_are_refused(copying: dict, flags: tuple[str, ...],
                                                           message: str) -> None:
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), *flags])
    assert result.exit_code == 1 and message in str(result.exception), result.exception


def test_a_recipe_that_samples_keeps_its_beam_unused_but_a_chosen_beam_is_refused(copying: dict,
                                                                                  tmp_path: Path) -> None:
    """Sampling excludes a beam the user chooses (the rule the server applies to a request's fields too); the
    beam a sampling recipe holds all the same, its default 4, is not chosen, so the recipe translates."""
    from mtx.checkpoint import make_checkpoint, save_checkpoint

    checkpoint = tmp_path / "sampling.pt"
    recipe = {"decode": {"sampling": True, "beam": 4}}
    save_checkpoint(make_checkpoint(copying["model"], copying["tokenizer"].to_str(), recipe, 250), checkpoint)
    args = ["-m", str(checkpoint), "-i", str(copying["source"])]
    result, lines = translate_cli(args)
    assert result.exit_code == 0 and len(lines) == len(copying["held_out"])
    assert translate_cli([*args, "--beam", "1"])[0].exit_code == 0
    result, _ = translate_cli([*args, "--beam", "4"])
    assert result.exit_code == 1 and "--sampling draws each token, --beam 4 searches" in str(result.exception)


def test_companion_files_must_match_the_input_line_for_line(copying: dict, tmp_path: Path) -> None:
    short = tmp_path / "short.txt"
    short.write_text("red\n" * 5, encoding="utf-8")
    for flag in ("--prefix", "--score-reference"):
        result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), flag, str(short)])
        assert result.exit_code == 1 and f"has 5 lines but the input {copying['source']} has 30" in str(
            result.exception)
        stdin = "".join(f"{s}\n" for s in copying["held_out"]).encode()  # a pipe is checked as it is read
        result, _ = translate_cli(["-m", str(copying["checkpoint"]), flag, str(short)], stdin=stdin)
        assert result.exit_code == 1 and "has 5 lines, but the input has more: its line 6" in str(result.exception)
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "--score-reference",
                               str(copying["source"]), "--nbest", "2"])
    assert result.exit_code == 1 and "--nbest do not apply to it" in str(result.exception)
    with pytest.raises(MtxError, match=r"--prefix, line 1: the prefix has \d+ tokens, more than the \d+"):
        Translator(copying["model"], copying["tokenizer"]).translate(copying["held_out"][:1],
                                                                     prefixes=["red " * 80])


@pytest.mark.parametrize("flags", [
    ("--sampling", "--temperature", "1e-300"),  # float32 would make it 0: every score NaN, no sample ever ended
    ("--sampling", "--temperature", "5e-324"),  # the smallest positive float: still the most probable token
    ("--sampling", "--topp", "1e-300"),  # float32 would make it 0 and drop every token
    ("--sampling", "--topk", "1", "--temperature", "1e300"),  # float32 would make it infinite: NaN again
])
def test_sampling_at_its_extremes_is_greedy_search(copying: dict, flags: tuple[str, ...]) -> None:
    """As T → 0 or p → 0 a draw becomes the most probable token; every such value is a greedy translation."""
    assert run(copying, *flags) == run(copying, "--beam", "1")


def test_any_finite_length_limit_or_temperature_decodes(copying: dict) -> None:
    """Output limits past the model's positions, in floating point (a · n infinite) or as integers beyond float's
    range, are the positions' limit; a huge temperature draws from a flat distribution, a line in any file."""
    default = run(copying)
    assert run(copying, "--max-len-a", "1e308") == default
    assert run(copying, "--max-len-b", str(10**400)) == default
    assert run(copying, "--max-len-a", "1.7976931348623157e308", "--max-len-b", "1") == default
    flat = run(copying, "--sampling", "--temperature", "1e300", "--max-len-b", "3", "--max-len-a", "0")
    assert len(flat) == len(copying["held_out"])
    assert all(len(line.split()) <= 3 for line in flat)


def test_a_line_index_beyond_64_bits_samples_as_its_index_modulo_2_to_the_32(copying: dict) -> None:
    offset = 10**20
    flags = ("--sampling", "--temperature", "2", "--seed", "3")
    assert run(copying, *flags, "--line-offset", str(offset)) == run(copying, *flags, "--line-offset",
                                                                     str(offset % 2**32))


@pytest.mark.parametrize(("flags", "message"), [
    (("--lenpen", "11"), "--lenpen 11.0 must be in [0, 10]"),
    (("--lenpen", "1000", "--lenpen-style", "fairseq"), "--lenpen 1000.0 must be in [0, 10]"),
    (("--lenpen", "inf"), "--lenpen inf must be a finite number"),
    (("--max-len-a", "inf"), "--max-len-a inf must be a finite number"),
    (("--max-len-a", "nan"), "--max-len-a nan must be a finite number"),
    (("--sampling", "--temperature", "inf"), "--temperature inf must be a finite number"),
    (("--sampling", "--topp", "nan"), "--topp nan must be a finite number"),
])
def test_non_finite_and_out_of_range_floats_are_refused_naming_the_flag(copying: dict, flags: tuple[str, ...],
                                                                         message: str) -> None:
    result, _ = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), *flags])
    assert result.exit_code == 1 and message in str(result.exception), result.exception


def test_the_largest_length_penalty_decodes_in_either_style(copying: dict) -> None:
    """At α = 10 lp stays within float32's range for any output the model can produce: every line decodes."""
    for style in ("gnmt", "fairseq"):
        lines = run(copying, "--lenpen", "10", "--lenpen-style", style)
        assert len(lines) == len(copying["held_out"]) and lines == copying["held_out"]


def test_a_reference_longer_than_the_positions_is_not_scored_and_the_rest_are(copying: dict, tmp_path: Path) -> None:
    """Scoring only the part that fits would print another text's score as the reference's: its line says "nan"
    (tests/integration/test_too_long.py has the jsonl and keep_best's side)."""
    references = tmp_path / "references.txt"
    lines = list(copying["held_out"])
    lines[3] = "red green " * 200
    references.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    result, out = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(copying["source"]),
                                 "--score-reference", str(references)])
    assert result.exit_code == 0 and len(out) == len(lines)
    assert out[3].startswith("nan\t") and all(not line.startswith("nan") for i, line in enumerate(out) if i != 3)


# ---- no repeated n-grams, and flags on doubtful output


def test_banned_ngrams_are_the_continuations_of_earlier_occurrences() -> None:
    from mtx.decode.search import ban_repeated_ngrams

    history = torch.tensor([[5, 6, 7, 5, 6], [5, 6, 7, 8, 9]])
    log_probs = torch.zeros(2, 10)
    ban_repeated_ngrams(log_probs, history, 3)  # row 0 ends with "5 6", which was followed by 7
    assert log_probs[0].isinf().nonzero().flatten().tolist() == [7]
    assert not log_probs[1].isinf().any()
    unigrams = torch.zeros(2, 10)
    ban_repeated_ngrams(unigrams, history, 1)
    assert unigrams[0].isinf().nonzero().flatten().tolist() == [5, 6, 7]


@pytest.mark.parametrize("options", [{}, {"beam": 1}, {"beam": 1, "sampling": True, "temperature": 2.0}])
def test_no_repeat_ngram_keeps_every_ngram_of_a_translation_unique(copying: dict, options: dict) -> None:
    sources = ["red red red dog", "red green red green red green"]

    def translated(**more: object) -> list[list[int]]:
        translator = Translator(copying["model"], copying["tokenizer"], DecodeConfig(**options, **more))
        return [list(nbest[0].tokens) for nbest in translator.translate(sources)]

    assert any(len(set(tokens)) < len(tokens) for tokens in translated())  # copying repeats
    for n in (1, 2):
        for tokens in translated(no_repeat_ngram=n):
            ngrams = [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
            assert len(set(ngrams)) == len(ngrams), (n, tokens)


def test_flag_rules() -> None:
    from mtx.decode.doubts import DoubtThresholds, copied_share, doubts, longest_loop, training_statistics

    assert longest_loop([1, 2, 3]) == 1 and longest_loop([4, 4, 4, 1]) == 3 and longest_loop([1, 2, 1, 2, 1, 2]) == 3
    assert copied_share([1, 2, 3], [3, 4]) == 0.5 and copied_share([1], []) == 0.0
    thresholds = DoubtThresholds(length_ratio=(0.5, 2.0), copied=0.9)
    calm = [-0.1] * 5
    assert doubts([1, 2, 3, 4], [5, 6, 7, 8], calm[:5], thresholds) == []
    assert doubts([1, 2, 3, 4], [5, 5, 5, 8], calm, thresholds) == ["loop"]
    assert doubts([1, 2, 3, 4, 5, 6, 7, 8, 9], [10], calm[:2], thresholds) == ["length_ratio"]
    assert doubts([1, 2, 3, 4], [1, 2, 3, 4], calm, thresholds) == ["copied"]
    assert doubts([1, 2, 3, 4], [5, 6, 7, 8], [-2.0] * 5, thresholds) == ["low_log_prob"]
    lens = np.arange(1, 101)
    stats = training_statistics(lens, 2 * lens + 1, lambda i: ([1, 2], [3, 4]))
    assert stats["length_ratio"] == [2.0, 2.0] and stats["copied"] == 0.0
    assert DoubtThresholds.of_checkpoint({"data_stats": stats}).length_ratio == (2.0, 2.0)
    assert DoubtThresholds.of_checkpoint({}) == DoubtThresholds()


def test_jsonl_flags_a_copy_as_copied(copying: dict) -> None:
    """The copy model's translations are copies of their sources, which the default threshold flags (and a
    source with a word three times in a row gives a copy that loops)."""
    lines = [json.loads(line) for line in run(copying, "--format", "jsonl")]
    for line, source in zip(lines, copying["held_out"], strict=True):
        words = source.split()
        loops = any(words[i] == words[i + 1] == words[i + 2] for i in range(len(words) - 2))
        assert line["flags"] == (["loop", "copied"] if loops else ["copied"]), (source, line["flags"])
