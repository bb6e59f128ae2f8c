"""`mtx average --tune-lenpen` through the CLI: the α it stores is the best of its table by valid BLEU, each row of
the table is what `mtx translate --lenpen α` then `mtx score` give on the valid split, `mtx translate` uses the
stored α, and a run it cannot tune is refused with a message before anything is written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from support import base_recipe, write_recipe
from typer.testing import CliRunner

from mtx.checkpoint import load_checkpoint, load_model
from mtx.cli import app
from mtx.config.decode import TUNE_SENTENCES, DecodeConfig
from mtx.decode.ensemble import without_weights
from mtx.decode.facts import ModelFacts
from mtx.decode.lenpen_choice import choose_among, choose_lenpen, endings
from mtx.decode.torch_engine import engine_of_model
from mtx.errors import MtxError
from mtx.export.model_card import model_card
from mtx.score.metrics import corpus_bleu_and_ratio
from mtx.train.run_data import spread_lines
from mtx.train.tune_lenpen import ValidToTune, searcher


def mtx(*args: str) -> tuple[int, str, str]:
    """`mtx ARGS` in this process: its exit code, standard output and standard error, where a user error
    (MtxError, which `mtx` prints as its message) is the error's message."""
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, MtxError):
        return 1, result.stdout, str(result.exception)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A reverse-copy run of 60 updates, half-learnt so that α changes its translations, searching with beam 4
    and fairseq's α 1."""
    root = tmp_path_factory.mktemp("tune")
    raw = base_recipe(root, train_pairs=400, valid_pairs=40)
    raw["train"].update(max_steps=60, save_every=30, log_every=30)
    raw["decode"] = {"beam": 4, "lenpen": 1.0, "lenpen_style": "fairseq", "max_len_a": 1.0, "max_len_b": 5}
    recipe = write_recipe(root, raw)
    for command in (["prepare", str(recipe), "--workers", "1"], ["train", str(recipe)]):
        code, _, err = mtx(*command)
        assert code == 0, err
    return root


def average(run: Path, out: Path, *extra: str) -> tuple[int, str]:
    code, _, err = mtx("average", "--dir", str(run / "run" / "checkpoints"), "--last", "2", "-o", str(out), *extra)
    return code, err


def plain_average(run: Path, folder: Path) -> Path:
    """The run's average without --tune-lenpen."""
    plain = folder / "plain.pt"
    if not plain.exists():
        code, err = average(run, plain)
        assert code == 0, err
    return plain


def test_the_chosen_alpha_is_the_best_of_what_translate_and_score_give(run: Path, tmp_path: Path) -> None:
    tuned = tmp_path / "tuned.pt"
    code, err = average(run, tuned, "--tune-lenpen", "--device", "cpu")
    assert code == 0, err
    checkpoint = load_checkpoint(tuned)
    choice = checkpoint["lenpen_choice"]
    assert (choice["style"], choice["beam"], choice["before"], choice["sentences"]) == ("fairseq", 4, 1.0, 40)
    scores = {s["alpha"]: (s["bleu"], s["length_ratio"]) for s in choice["scores"]}
    assert set(scores) >= {step / 10 for step in range(21)}
    assert checkpoint["recipe"]["decode"]["lenpen"] == choice["chosen"]
    assert scores[choice["chosen"]][0] == max(bleu for bleu, _ in scores.values())
    assert f"decode.lenpen: 1 → {choice['chosen']:g}" in err and "← chosen" in err

    # Each α's row is what translating the valid split with it and scoring gives.
    data = run / "run" / "data"
    refs = (data / "valid.de").read_text(encoding="utf-8").splitlines()
    translations = {}
    for alpha in sorted({0.0, 0.5, 2.0, choice["chosen"]}):
        out = tmp_path / f"valid.{alpha}"
        code, _, err = mtx("translate", "-m", str(tuned), "-i", str(data / "valid.en"), "-o", str(out),
                           "--lenpen", str(alpha))
        assert code == 0, err
        translations[alpha] = out.read_text(encoding="utf-8").splitlines()
        assert corpus_bleu_and_ratio(translations[alpha], refs) == pytest.approx(scores[alpha])
    assert len({tuple(lines) for lines in translations.values()}) > 1  # α changes what this model says
    # Without --lenpen, translate uses the stored α.
    code, _, err = mtx("translate", "-m", str(tuned), "-i", str(data / "valid.en"), "-o", str(tmp_path / "own"))
    assert (tmp_path / "own").read_text(encoding="utf-8").splitlines() == translations[choice["chosen"]]

    # The same choice through the Python API, translated in chunks that report progress.
    model, tokenizer, checkpoint_of_tuned = load_model(tuned)
    facts = ModelFacts.of_metadata([tuned], tokenizer, [without_weights(checkpoint_of_tuned)])
    reports = []
    again = choose_lenpen(engine_of_model(model, facts, every_ending=True),
                          (data / "valid.en").read_text(encoding="utf-8").splitlines(), refs,
                          DecodeConfig.of_checkpoint(load_checkpoint(plain_average(run, tmp_path))),
                          progress=lambda stats: reports.append(stats.sentences), chunk=16)
    assert reports == [16, 32, 40]
    assert again.to_dict() == choice

    # An export's model card says how α was chosen.
    card = " ".join(model_card(tuned, checkpoint, "CTranslate2", "", []).split())
    assert (f"Length penalty α = {choice['chosen']:g} (fairseq), chosen by `mtx average --tune-lenpen` on the 40 "
            f"validation sentences, beam 4: BLEU {scores[choice['chosen']][0]:.2f}") in card

    # The weights are the plain average's.
    untuned = load_checkpoint(plain_average(run, tmp_path))
    assert "lenpen_choice" not in untuned and untuned["recipe"]["decode"]["lenpen"] == 1.0
    assert all(torch.equal(untuned["model"][k], checkpoint["model"][k]) for k in untuned["model"])


def test_a_run_that_cannot_be_tuned_is_refused_and_nothing_is_written(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "tuned.pt"
    checkpoints = run / "run" / "checkpoints"
    greedy = tmp_path / "greedy.pt"
    checkpoint = load_checkpoint(checkpoints / "step_60.pt")
    checkpoint["recipe"]["decode"]["beam"] = 1
    torch.save(checkpoint, greedy)
    code, _, err = mtx("average", str(greedy), "-o", str(out), "--tune-lenpen")
    assert code == 1 and "searches greedily (decode.beam = 1)" in err

    # The run's data moved away: the message says where it was looked for.
    data = run / "run" / "data"
    moved = run / "moved-data"
    shutil.move(data, moved)
    try:
        code, err = average(run, out, "--tune-lenpen")
        assert code == 1 and f"prepared data is not at {data} (looked for" in " ".join(err.split())
    finally:
        shutil.move(moved, data)

    # A run prepared without a valid split.
    no_valid = json.loads((data / "manifest.json").read_text())
    assert no_valid["splits"]["valid"]["pairs"] == 40
    checkpoint["recipe"]["decode"]["beam"] = 4
    checkpoint["recipe"]["run_dir"] = str(tmp_path / "other-run")
    (tmp_path / "other-run" / "data").mkdir(parents=True)
    no_valid["splits"].pop("valid")
    (tmp_path / "other-run" / "data" / "manifest.json").write_text(json.dumps(no_valid))
    elsewhere = tmp_path / "elsewhere.pt"
    torch.save(checkpoint, elsewhere)
    code, _, err = mtx("average", str(elsewhere), "-o", str(out), "--tune-lenpen")
    assert code == 1 and "has none" in err and "valid split" in err
    assert not out.exists()


def another_runs_data(folder: Path) -> Path:
    """A run prepared at `folder` from the same kind of corpus with another subword style: another tokenizer."""
    raw = base_recipe(folder, train_pairs=300, valid_pairs=30)
    raw["run_dir"] = str(folder / "run")
    raw["data"]["bpe"]["style"] = "metaspace"
    code, _, err = mtx("prepare", str(write_recipe(folder, raw)), "--workers", "1")
    assert code == 0, err
    return folder / "run"


def trained_at(checkpoints: list[Path], run_dir: Path) -> None:
    """Rewrite `checkpoints` as if their run had been trained at `run_dir` (their recipe's run_dir)."""
    for path in checkpoints:
        checkpoint = load_checkpoint(path)
        checkpoint["recipe"]["run_dir"] = str(run_dir)
        torch.save(checkpoint, path)


def test_a_moved_run_is_tuned_on_its_own_data_not_on_what_now_sits_at_its_run_dir(run: Path, tmp_path: Path) -> None:
    """The run folder moved, and another run (another tokenizer) now sits where its recipe's run_dir says: α is
    chosen on the valid split beside the checkpoints (RUN/checkpoints/../data), which travelled with them."""
    other = another_runs_data(tmp_path / "other")
    moved = tmp_path / "moved"
    shutil.copytree(run / "run", moved)
    checkpoints = sorted((moved / "checkpoints").glob("step_*.pt"))
    trained_at(checkpoints, other)
    out = tmp_path / "tuned.pt"
    code, _, err = mtx("average", "--dir", str(moved / "checkpoints"), "--last", "2", "-o", str(out),
                       "--tune-lenpen", "--device", "cpu")
    assert code == 0, err
    assert f"valid sentences of {moved / 'data'}" in " ".join(err.split())
    assert load_checkpoint(out)["lenpen_choice"]["sentences"] == 40  # the run's own 40, not the other's 30


def test_checkpoints_whose_run_dir_holds_another_tokenizers_data_are_refused(run: Path, tmp_path: Path) -> None:
    """Checkpoints copied out of their run folder, whose recipe's run_dir now holds another run: refused, naming
    the data and the checkpoint, and nothing written."""
    other = another_runs_data(tmp_path / "other")
    alone = tmp_path / "alone"
    alone.mkdir()
    copies = [Path(shutil.copy(path, alone)) for path in sorted((run / "run" / "checkpoints").glob("step_*.pt"))]
    trained_at(copies, other)
    out = tmp_path / "tuned.pt"
    code, _, err = mtx("average", *map(str, copies), "-o", str(out), "--tune-lenpen", "--device", "cpu")
    message = " ".join(err.split())
    assert code == 1 and f"--tune-lenpen would choose α on {other / 'data'}" in message
    assert f"another tokenizer than {copies[0]} was trained with" in message
    assert not out.exists()


def test_alpha_is_chosen_on_at_most_tune_sentences_spread_over_the_valid_split(run: Path) -> None:
    """All 40 valid sentences here (fewer than TUNE_SENTENCES); asked for 20, 20 spread over the split. Choosing on
    those out of one search of all 40 (what bench/lenpen_sample.py measures) is choosing on a search of them."""
    path = run / "run" / "checkpoints" / "step_60.pt"
    checkpoint = load_checkpoint(path)
    every = ValidToTune.of_run(checkpoint, path)
    assert len(every.sources) == 40 < TUNE_SENTENCES
    sample, lines = ValidToTune.of_run(checkpoint, path, most=20), spread_lines([""] * 40, 20)
    assert len(set(lines)) == 20 and lines[-1] >= 38  # from the whole split, not its head
    assert (sample.sources, sample.refs) == ([every.sources[i] for i in lines], [every.refs[i] for i in lines])
    engine = searcher(checkpoint, "cpu")
    alone = choose_among(endings(engine, sample.sources, sample.decode), sample.refs, sample.decode)
    of_all = endings(engine, every.sources, every.decode)
    rescored = choose_among([of_all[i] for i in lines], sample.refs, sample.decode)
    assert (alone.chosen, alone.sentences) == (rescored.chosen, 20)
    assert [s.alpha for s in alone.scores] == [s.alpha for s in rescored.scores]
    for field in ("bleu", "length_ratio"):
        assert [getattr(s, field) for s in alone.scores] == pytest.approx([getattr(s, field) for s in rescored.scores])
    assert len({s.length_ratio for s in alone.scores}) > 1  # α changes what it says
