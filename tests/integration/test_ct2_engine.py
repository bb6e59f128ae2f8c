"""The `ct2` engine (mtx.decode.ct2_engine) against mtx's own search, on the copy-task model.

Greedy float32 decoding gives torch's tokens on every held-out sentence, and with jsonl their log-probabilities
and doubts; beam 4 its BLEU within 0.1, n-best lists, target prefixes, forced scores, alignments and truncation as
torch gives them; int8 translates. The folder cache converts once, never reuses a changed checkpoint's folder and
survives two converters at once. Each refusal of the capability table is raised by the engine itself, before any
work. The tests skip without CTranslate2 (the extra mtx[ct2]).
"""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

import pytest
import torch
from support import copy_task, translate_cli

from mtx.checkpoint import load_model, make_checkpoint, save_checkpoint
from mtx.decode.ct2_folder import cache_key, cached_folder
from mtx.decode.engines import refusal
from mtx.decode.facts import ModelFacts
from mtx.decode.request import Request
from mtx.decode.translation import TooLongToScore
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.score.metrics import corpus_bleu

ctranslate2 = pytest.importorskip("ctranslate2")

from mtx.decode.ct2_engine import Ct2Engine, open_ct2_engine  # noqa: E402  (after the skip: it needs ctranslate2)

LONG = " ".join(["red cat"] * 60)  # more tokens than the copy model's 64 positions


@pytest.fixture(scope="module")
def setup(copy_model: dict, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The copy model's checkpoint in a folder of this module's (its converted folders are cached beside it), the
    engine over it, the torch model, and the held-out sentences plus a long one and an empty one."""
    folder = tmp_path_factory.mktemp("ct2")
    checkpoint = folder / "copy.pt"
    shutil.copy(copy_model["checkpoint"], checkpoint)
    engine = open_ct2_engine([checkpoint], device="auto", dtype="auto", threads=2, batch_tokens=4096, log=print)
    model, tokenizer, _ = load_model(checkpoint)
    sentences = [*copy_model["held_out"], "", LONG]
    yield dict(checkpoint=checkpoint, engine=engine, model=model, tokenizer=tokenizer, facts=engine.facts,
               sentences=sentences, held_out=copy_model["held_out"])
    engine.close()


def both(setup: dict, prefixes: list[str] | None = None, **options):
    """(ct2's, torch's) n-best lists of every sentence under the request `options` on top of the recipe's."""
    facts: ModelFacts = setup["facts"]
    request = Request.of(facts, options)
    sentences = setup["sentences"]
    ours = setup["engine"].translate(facts.encode(sentences), request, range(len(sentences)), prefixes)
    aligning = request.aligning_layer(facts.limits.decoder_layers)
    torch.set_num_threads(1)
    theirs = Translator(setup["model"], setup["tokenizer"], decode=request, alignment_layer=aligning,
                        doubt_thresholds=facts.doubts).translate(sentences, prefixes=prefixes)
    return ours, theirs


def test_greedy_float32_gives_torchs_tokens_log_probs_and_doubts(setup: dict) -> None:
    ours, theirs = both(setup, beam=1, format="jsonl")
    assert [[h.tokens for h in nbest] for nbest in ours] == [[list(h.tokens) for h in nbest] for nbest in theirs]
    assert [[h.text for h in nbest] for nbest in ours] == [[h.text for h in nbest] for nbest in theirs]
    for mine, torchs in zip(ours, theirs, strict=True):
        for a, b in zip(mine, torchs, strict=True):
            assert a.token_log_probs == pytest.approx(b.token_log_probs, abs=1e-4)
            assert a.score == pytest.approx(b.score, abs=1e-4)
            assert a.doubts == b.doubts
    assert ours[-2] == [] and "truncated" in ours[-1][0].doubts


def test_a_model_with_the_options_of_published_models_gives_torchs_greedy_tokens(tmp_path: Path) -> None:
    """A copy model trained with every option a MarianMT model may need that is not the paper's (swish, an output
    bias, unscaled embeddings, positions in halves), converted: CTranslate2's greedy tokens and log-probabilities
    are torch's. tests/integration/test_export.py checks each option alone, gelu too, on random weights."""
    model, tokenizer, held_out = copy_task(40, activation="swish", output_bias=True, scale_embeddings=False,
                                           positions="halves")
    with torch.no_grad():  # a bias of Marian's size, so that one left out would show
        model.output_bias.add_(torch.randn(model.vocab_size, generator=torch.Generator().manual_seed(0)))
    checkpoint = tmp_path / "options.pt"
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), {}, 250), checkpoint)
    engine = open_ct2_engine([checkpoint], device="auto", dtype="auto", threads=1, batch_tokens=4096, log=print)
    try:
        request = Request.of(engine.facts, {"beam": 1, "format": "jsonl"})
        ours = engine.translate(engine.facts.encode(held_out), request, range(len(held_out)))
    finally:
        engine.close()
    theirs = Translator(model, tokenizer, decode=request).translate(held_out)
    assert [n[0].tokens for n in ours] == [list(n[0].tokens) for n in theirs]
    assert corpus_bleu([n[0].text for n in theirs], held_out) > 50  # it copies: its choices are not near-ties
    for mine, torchs in zip(ours, theirs, strict=True):
        assert mine[0].token_log_probs == pytest.approx(torchs[0].token_log_probs, abs=1e-4)


def test_beam_4_within_a_tenth_of_a_bleu_point_and_nbest_lists_equal(setup: dict) -> None:
    ours, theirs = both(setup, beam=4, nbest=4)
    held = len(setup["held_out"])
    bleu = [corpus_bleu([nbest[0].text for nbest in side[:held]], setup["held_out"]) for side in (ours, theirs)]
    assert abs(bleu[0] - bleu[1]) <= 0.1
    assert [[h.tokens for h in nbest] for nbest in ours] == [[list(h.tokens) for h in nbest] for nbest in theirs]
    assert [h.score for nbest in ours for h in nbest] == pytest.approx(
        [h.score for nbest in theirs for h in nbest], abs=1e-4)


def test_text_scores_without_a_scoring_pass_are_close_to_torchs(setup: dict) -> None:
    """One translation a sentence as text: CTranslate2's own score, which its renormalisation moves a little."""
    for beam in (1, 4):
        ours, theirs = both(setup, beam=beam)
        held = len(setup["held_out"])
        assert [n[0].score for n in ours[:held]] == pytest.approx([n[0].score for n in theirs[:held]], abs=5e-3)
        assert ours[0][0].token_log_probs == ()


def test_greedy_prefixes_and_greedy_min_len_and_no_repeat_ngram_give_torchs_tokens(setup: dict) -> None:
    prefixes = [" ".join(s.split()[:2]) for s in setup["sentences"]]
    for options, given in (({"beam": 1}, prefixes), ({"beam": 1, "min_len": 12}, None),
                           ({"beam": 1, "no_repeat_ngram": 1}, None)):
        ours, theirs = both(setup, given, **options)
        assert [[h.tokens for h in n] for n in ours] == [[list(h.tokens) for h in n] for n in theirs], options
        if given is not None:
            assert [h.score for n in ours for h in n] == pytest.approx([h.score for n in theirs for h in n], abs=1e-4)


def test_alignments_are_torchs(setup: dict) -> None:
    ours, theirs = both(setup, beam=4, alignment=True)
    assert [[h.alignment for h in n] for n in ours] == [[h.alignment for h in n] for n in theirs]


def test_forced_scores_are_torchs(setup: dict) -> None:
    facts, sentences = setup["facts"], setup["sentences"]
    translations = [*reversed(setup["held_out"]), "red", LONG[:40]]
    sentences = [*sentences[:-1], "red cat"]
    translations[-1] = LONG  # a translation too long to score
    request = Request.of(facts, {})
    ours = setup["engine"].score(sentences, translations, request)
    theirs = Translator(setup["model"], setup["tokenizer"], decode=request).forced_scores(sentences, translations)
    assert ours[-2] is None and isinstance(ours[-1], TooLongToScore) and ours[-1] == theirs[-1]
    for a, b in zip(ours[:-2], theirs[:-2], strict=True):
        assert (a.text, list(a.tokens)) == (b.text, list(b.tokens))
        assert a.score == pytest.approx(b.score, abs=1e-4)
        assert a.token_log_probs == pytest.approx(b.token_log_probs, abs=1e-4)


def test_int8_translates_as_well(setup: dict) -> None:
    engine = open_ct2_engine([setup["checkpoint"]], device="cpu", dtype="int8", threads=1, batch_tokens=4096,
                             log=print)
    held = setup["held_out"]
    out = engine.translate(engine.facts.encode(held), Request.of(engine.facts, {}), range(len(held)))
    assert engine.provenance()["compute_type"] == "int8"
    assert corpus_bleu([n[0].text for n in out], held) >= 90
    engine.close()


def test_engine_counts_truncated_sources_and_is_safe_from_several_threads(setup: dict) -> None:
    engine: Ct2Engine = setup["engine"]
    facts = engine.facts
    before = engine.stats.truncated
    request = Request.of(facts, {"beam": 1})
    alone = engine.translate(facts.encode(setup["held_out"]), request, range(len(setup["held_out"])))
    found: list = [None] * 4

    def call(k: int) -> None:
        found[k] = engine.translate(facts.encode([*setup["held_out"], LONG]), request, range(41))

    threads = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result[:-1] == alone for result in found)
    assert engine.stats.truncated == before + 4


@pytest.mark.parametrize(("options", "field"), [
    ({"lenpen_style": "gnmt", "lenpen": 0.6}, "lenpen_style"), ({"sampling": True, "beam": 1}, "sampling"),
    ({"shortlist": 2}, "shortlist"), ({"beam": 4, "min_len": 2}, "min_len"),
    ({"beam": 4, "no_repeat_ngram": 2}, "no_repeat_ngram"),
])
def test_the_engine_refuses_what_the_table_refuses_before_any_work(setup: dict, options: dict, field: str) -> None:
    """(alignment_layer's refusal needs a decoder of two layers or more: tests/unit/test_ct2_capabilities.py.)"""
    engine: Ct2Engine = setup["engine"]
    request = Request.of(engine.facts, {**options, "engine": "ct2"})
    sentences_before = engine.stats.sentences
    problem = refusal(request, engine.facts)
    assert problem is not None and problem[0] == field
    with pytest.raises(MtxError, match="--engine torch does it"):
        engine.translate(engine.facts.encode(["red cat"]), request, [0])
    assert engine.stats.sentences == sentences_before


def test_prefixes_with_a_beam_and_a_length_penalty_are_refused(setup: dict) -> None:
    engine: Ct2Engine = setup["engine"]
    with pytest.raises(MtxError, match="--prefix with --beam 4 and --lenpen 0.6"):
        engine.translate(engine.facts.encode(["red cat"]), Request.of(engine.facts, {"beam": 4}), [0], ["red"])


@pytest.mark.parametrize(("kwargs", "named"), [
    ({"device": "cuda"}, "--device cuda"), ({"dtype": "bf16"}, "--dtype bf16"), ({"dtype": "fp16"}, "--dtype fp16"),
    ({"copies": 2}, "-m"),
])
def test_opening_refuses_gpus_half_precision_and_ensembles(setup: dict, kwargs: dict, named: str) -> None:
    options = {"device": "cpu", "dtype": "fp32", **kwargs}
    copies = options.pop("copies", 1)
    with pytest.raises(MtxError, match=named):
        open_ct2_engine([setup["checkpoint"]] * copies, threads=1, batch_tokens=4096, log=print, **options)


def test_provenance_names_engine_version_compute_type_and_cpu(setup: dict) -> None:
    provenance = setup["engine"].provenance()
    assert provenance["engine"] == "ct2" and ctranslate2.__version__ in provenance["version"]
    assert provenance["compute_type"] == "float32" and provenance["device"] == "cpu" and provenance["cpu"]


# The folder cache.

def slow_converter(calls: list, pause: float = 0.0):
    def convert(folder: Path) -> None:
        calls.append(folder)
        time.sleep(pause)
        (folder / "model.bin").write_bytes(b"weights")

    return convert


def test_a_folder_is_converted_once_and_reused(tmp_path: Path) -> None:
    checkpoint = tmp_path / "a.pt"
    checkpoint.write_bytes(b"one")
    calls: list = []
    key = cache_key(checkpoint, None, 0, "4.8.5")
    first = cached_folder(checkpoint, key, slow_converter(calls))
    assert cached_folder(checkpoint, key, slow_converter(calls)) == first and len(calls) == 1
    assert first.parent == tmp_path / "a.pt.ct2" and (first / "model.bin").is_file()
    assert [p.name for p in first.parent.iterdir()] == [key]  # no temporary folder left


def test_a_changed_checkpoint_or_option_never_reuses_a_folder(tmp_path: Path) -> None:
    checkpoint = tmp_path / "a.pt"
    checkpoint.write_bytes(b"one")
    keys = {cache_key(checkpoint, None, 0, "4.8.5"), cache_key(checkpoint, "int8", 0, "4.8.5"),
            cache_key(checkpoint, None, 1, "4.8.5"), cache_key(checkpoint, None, 0, "4.9.0")}
    checkpoint.write_bytes(b"two")  # same size, same name: another checkpoint
    keys.add(cache_key(checkpoint, None, 0, "4.8.5"))
    assert len(keys) == 5


def test_two_converters_at_once_leave_one_complete_folder(tmp_path: Path) -> None:
    checkpoint = tmp_path / "a.pt"
    checkpoint.write_bytes(b"one")
    key = cache_key(checkpoint, None, 0, "4.8.5")
    calls: list = []
    start = threading.Barrier(2)
    found: list = []

    def convert() -> None:
        start.wait()
        found.append(cached_folder(checkpoint, key, slow_converter(calls, 0.3)))

    threads = [threading.Thread(target=convert) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 2 and found[0] == found[1]  # both converted; one rename won and both use its folder
    assert [p.name for p in (tmp_path / "a.pt.ct2").iterdir()] == [key]
    assert (found[0] / "model.bin").read_bytes() == b"weights"


def test_a_cache_that_cannot_be_written_is_refused_naming_it(tmp_path: Path) -> None:
    """Where the cache folder cannot be made (here a file holds its name; a read-only folder fails the same way
    for anyone but root), the error names it and says what to do."""
    checkpoint = tmp_path / "a.pt"
    checkpoint.write_bytes(b"one")
    (tmp_path / "a.pt.ct2").write_bytes(b"")
    with pytest.raises(MtxError, match=f"into {tmp_path}/a.pt.ct2/ beside it, but cannot write there"):
        cached_folder(checkpoint, "key", slow_converter([]))


# `mtx translate --engine ct2`: each refusal of the table is exit 1, names its flag, and writes nothing.

@pytest.mark.parametrize(("flags", "named"), [
    (["--lenpen-style", "gnmt", "--lenpen", "0.6"], "--lenpen-style gnmt"),
    (["--sampling", "--beam", "1"], "--sampling"), (["--beam", "4", "--min-len", "2"], "--min-len 2"),
    (["--beam", "4", "--no-repeat-ngram", "2"], "--no-repeat-ngram 2"),
])
def test_mtx_translate_with_ct2_refuses_each_field_naming_it_and_writes_nothing(setup: dict, tmp_path: Path,
                                                                                flags: list[str], named: str) -> None:
    source = tmp_path / "in.txt"
    source.write_text("red cat\n", encoding="utf-8")
    out = tmp_path / "out.txt"
    result, _ = translate_cli(["-m", str(setup["checkpoint"]), "-i", str(source), "-o", str(out), "--engine", "ct2",
                               *flags])
    assert result.exit_code == 1
    assert f"--engine ct2 cannot honour {named}" in str(result.exception) and "--engine torch" in str(result.exception)
    assert not out.exists()


def test_mtx_translate_with_ct2_refuses_prefixes_with_a_beam_before_writing(setup: dict, tmp_path: Path) -> None:
    source, prefixes, out = tmp_path / "in.txt", tmp_path / "prefixes.txt", tmp_path / "out.txt"
    source.write_text("red cat\n", encoding="utf-8")
    prefixes.write_text("red\n", encoding="utf-8")
    result, _ = translate_cli(["-m", str(setup["checkpoint"]), "-i", str(source), "-o", str(out), "--engine", "ct2",
                               "--prefix", str(prefixes), "--beam", "4", "--lenpen", "0.6"])
    assert result.exit_code == 1 and "cannot honour --prefix with --beam 4" in str(result.exception)
    assert not out.exists()


def test_a_recipe_may_choose_the_engine(setup: dict, tmp_path: Path) -> None:
    """decode.engine in the checkpoint's recipe chooses CTranslate2 without the flag; the summary line says so."""
    import torch

    stored = torch.load(setup["checkpoint"], weights_only=True)
    recipe = {**stored["recipe"], "decode": {**stored["recipe"].get("decode", {}), "engine": "ct2"}}
    chosen = tmp_path / "ct2-recipe.pt"
    torch.save({**stored, "recipe": recipe}, chosen)
    result, lines = translate_cli(["-m", str(chosen), "--beam", "1"], stdin=b"red cat\n")
    assert result.exit_code == 0, result.output
    assert "engine ct2, version ctranslate2" in result.stderr and len(lines) == 1


def test_mtx_translate_with_ct2_refuses_an_ensemble_naming_m(setup: dict, tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    result, _ = translate_cli(["-m", str(setup["checkpoint"]), "-m", str(setup["checkpoint"]), "-o", str(out),
                               "--engine", "ct2"], stdin=b"red cat\n")
    assert result.exit_code == 1 and "-m" in str(result.exception) and not out.exists()


def test_mtx_translate_with_ct2_gives_torchs_greedy_lines(setup: dict, tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{s}\n" for s in setup["held_out"]), encoding="utf-8")
    lines = {}
    for engine in ("ct2", "torch"):
        result, lines[engine] = translate_cli(["-m", str(setup["checkpoint"]), "-i", str(source), "--beam", "1",
                                               "--engine", engine])
        assert result.exit_code == 0, result.output
    assert lines["ct2"] == lines["torch"] and len(lines["ct2"]) == len(setup["held_out"])
