"""Checkpoints picked by validation: the one rule of "best" (mtx.train.best), `mtx average --best N` and what
`mtx average --dir` picks with no flag, and whether it chooses the length penalty (train.tune_lenpen, settled
when the recipe is read)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from mtx.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from mtx.cli import app
from mtx.config.loading import load_recipe, recipe_from_dict
from mtx.config.model import resolve_model
from mtx.config.recipe import ModelConfig
from mtx.model.transformer import Transformer
from mtx.train.best import best_steps, improves, ranked

TOKENIZER = '{"stand-in": "averaging never parses the tokenizer"}'
DATA = "data: {source: {demo: {pairs: 10}}, src_lang: en, tgt_lang: de}\n"


def scores(bleu: float, nll: float, step: int = 0) -> dict[str, float]:
    return {"step": step, "loss": nll + 0.5, "nll": nll, "bleu": bleu, "length_ratio": 1.0}


def test_bleu_ranks_higher_first_nll_lower_first_and_ties_go_to_the_newer() -> None:
    scored = [(10, scores(5.0, 3.0)), (20, scores(7.0, 2.5)), (30, scores(7.0, 2.0)), (40, scores(6.0, 2.2))]
    assert ranked(scored, "bleu") == [30, 20, 40, 10]
    assert ranked(scored, "nll") == [30, 40, 20, 10]
    assert best_steps(scored, "bleu", 2) == [20, 30]  # in the order of training
    assert best_steps(scored, "nll", 3) == [20, 30, 40]
    assert improves(7.1, 7.0, "bleu") and not improves(7.0, 7.0, "bleu") and improves(1.9, 2.0, "nll")
    assert improves(0.0, None, "bleu") and not improves(2.1, 2.0, "nll")


def write_run(folder: Path, valid: dict[int, dict[str, float] | None], recipe: dict[str, Any]) -> None:
    """Step checkpoints of one small model, each with the validation scores `valid` gives its step (None: saved
    between validations)."""
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=16, heads=2, d_ff=32, layers_enc=1, layers_dec=1))
    for step, scored in valid.items():
        torch.manual_seed(step)
        checkpoint = make_checkpoint(Transformer(cfg, 30), TOKENIZER, recipe, step)
        if scored is not None:
            checkpoint["valid"] = scored
        save_checkpoint(checkpoint, folder / f"step_{step}.pt")


def average(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["average", *args])
    return result.exit_code, result.output


BLEU = {10: 4.0, 20: 9.0, 30: 6.0, 40: 8.0, 50: 7.0, 60: 5.0, 70: 3.0}  # the best three: 20, 40, 50
NLL = {10: 3.0, 20: 2.9, 30: 2.1, 40: 2.8, 50: 2.2, 60: 2.0, 70: 2.5}  # the best three: 30, 50, 60


@pytest.mark.parametrize(("metric", "chosen"), [("bleu", [20, 40, 50]), ("nll", [30, 50, 60])])
def test_best_n_averages_the_checkpoints_with_the_best_recorded_validation(tmp_path: Path, metric: str,
                                                                           chosen: list[int]) -> None:
    write_run(tmp_path, {step: scores(BLEU[step], NLL[step], step) for step in BLEU},
              recipe_dict(tmp_path, f"train: {{best_metric: {metric}}}\n"))
    code, output = average("--dir", str(tmp_path), "--best", "3", "-o", str(tmp_path / "avg.pt"))
    assert code == 0, output
    averaged = load_checkpoint(tmp_path / "avg.pt")
    assert averaged["averaged_from"] == [str(tmp_path / f"step_{step}.pt") for step in chosen]
    assert f"the best 3 of 7 by valid {'BLEU' if metric == 'bleu' else 'nll'}: steps {chosen[0]} (" in output


def test_the_default_is_the_best_five_and_a_run_without_scores_gets_its_last(tmp_path: Path) -> None:
    scored, unscored = tmp_path / "scored", tmp_path / "unscored"
    write_run(scored, {step: scores(BLEU[step], NLL[step], step) for step in BLEU}, recipe_dict(tmp_path, ""))
    code, output = average("--dir", str(scored), "-o", str(tmp_path / "a.pt"))
    assert code == 0, output
    assert [Path(p).name for p in load_checkpoint(tmp_path / "a.pt")["averaged_from"]] == [
        f"step_{step}.pt" for step in (20, 30, 40, 50, 60)]

    # Saved between validations (or by an mtx from before checkpoints kept their scores): the last five, said so.
    write_run(unscored, {step: None for step in BLEU}, recipe_dict(tmp_path, ""))
    code, output = average("--dir", str(unscored), "-o", str(tmp_path / "b.pt"))
    assert code == 0, output
    assert [Path(p).name for p in load_checkpoint(tmp_path / "b.pt")["averaged_from"]] == [
        f"step_{step}.pt" for step in (30, 40, 50, 60, 70)]
    assert "0 of the 7 checkpoints" in output and "averaging the last 5 instead" in output


def test_the_length_penalty_is_chosen_unless_the_recipe_pins_it(tmp_path: Path) -> None:
    """A recipe that gives decode.lenpen keeps it, and says so; one that does not would choose α on its valid
    split, which a run folder without data cannot give: it keeps its α and says why rather than fail, unless
    --tune-lenpen was asked for by name."""
    pinned, free = tmp_path / "pinned" / "checkpoints", tmp_path / "free" / "checkpoints"
    write_run(pinned, {10: None}, recipe_dict(tmp_path, "decode: {lenpen: 0.6}\n"))
    write_run(free, {10: None}, recipe_dict(tmp_path, ""))
    code, output = average(str(pinned / "step_10.pt"), "-o", str(tmp_path / "p.pt"))
    assert code == 0 and "decode.lenpen 0.6 kept: the run's recipe pins it" in output
    code, output = average(str(free / "step_10.pt"), "-o", str(tmp_path / "f.pt"))
    assert code == 0 and "decode.lenpen kept: --tune-lenpen translates the valid split" in output
    assert "lenpen_choice" not in load_checkpoint(tmp_path / "f.pt")
    code, output = average(str(free / "step_10.pt"), "-o", str(tmp_path / "g.pt"), "--tune-lenpen")
    assert code == 1 and not (tmp_path / "g.pt").exists()


def recipe_dict(folder: Path, decode: str) -> dict[str, Any]:
    """A recipe file's dict as a run stores it in its checkpoints: read, its defaults settled."""
    path = folder / "recipe.yaml"
    path.write_text(f"name: t\n{DATA}{decode}", encoding="utf-8")
    return load_recipe(path).to_dict()


def test_tune_lenpen_is_settled_by_whether_the_recipe_gives_an_alpha(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    for text, expected in (("", True), ("decode: {lenpen: 0.6}\n", False), ("decode: {beam: 5}\n", True),
                           ("decode: {lenpen: 0.6}\ntrain: {tune_lenpen: true}\n", True),
                           ("train: {tune_lenpen: false}\n", False)):
        path.write_text(f"name: t\n{DATA}{text}", encoding="utf-8")
        recipe = load_recipe(path)
        assert recipe.train.tune_lenpen is expected, text
        assert recipe_from_dict(recipe.to_dict()).train.tune_lenpen is expected  # as a checkpoint stores it
    # A recipe stored before the key existed gives every decode key: its α counts as pinned.
    stored = {**recipe.to_dict(), "decode": {"lenpen": 1.0, "beam": 4}}
    del stored["train"]["tune_lenpen"]
    assert recipe_from_dict(stored).train.tune_lenpen is False


@pytest.mark.parametrize("name", ["wmt14_en_de_base", "wmt14_en_de_big", "wmt14_en_fr_big"])
def test_the_wmt14_recipes_keep_the_papers_alpha(name: str) -> None:
    """The paper's 0.6 (§6.1), which the WMT14 recipes give: neither training's end nor mtx average changes it."""
    recipe = load_recipe(Path(__file__).resolve().parents[2] / "recipes" / f"{name}.yaml")
    assert recipe.decode.lenpen == 0.6 and recipe.decode.lenpen_style == "gnmt"
    assert recipe.train.tune_lenpen is False
