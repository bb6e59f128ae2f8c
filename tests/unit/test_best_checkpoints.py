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
from mtx.decode.lenpen_choice import LenpenChoice, PenaltyScore
from mtx.model.transformer import Transformer
from mtx.train.average import default_candidates
from mtx.train.best import best_steps, improves, ranked
from mtx.train.tune_lenpen import chosen_on_valid

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
    """Its exit code, and what it wrote, with the error it stopped on (a user's, MtxError) after it."""
    result = CliRunner().invoke(app, ["average", *args])
    return result.exit_code, result.output + (str(result.exception) if result.exception else "")


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
    """With no valid split to choose on, the first of what mtx average would choose among: the best five by the
    run's train.best_metric (nll unless the recipe says), or by --best-metric."""
    scored, unscored = tmp_path / "scored", tmp_path / "unscored"
    write_run(scored, {step: scores(BLEU[step], NLL[step], step) for step in BLEU}, recipe_dict(tmp_path, ""))
    for flags, best in (((), (30, 40, 50, 60, 70)), (("--best-metric", "bleu"), (20, 30, 40, 50, 60))):
        code, output = average("--dir", str(scored), "-o", str(tmp_path / "a.pt"), *flags)
        assert code == 0, output
        assert [Path(p).name for p in load_checkpoint(tmp_path / "a.pt")["averaged_from"]] == [
            f"step_{step}.pt" for step in best]
    code, output = average("--dir", str(scored), "-o", str(tmp_path / "c.pt"), "--best-metric", "chrf")
    assert code == 1 and "--best-metric 'chrf' is not one of bleu, nll" in output
    code, output = average("--dir", str(scored), "--last", "2", "-o", str(tmp_path / "c.pt"), "--best-metric", "nll")
    assert code == 1 and "--best-metric ranks a run's checkpoints by validation" in output
    assert not (tmp_path / "c.pt").exists()

    # Saved between validations (or by an mtx from before checkpoints kept their scores): the last five, said so
    # (with no valid split to choose on, the first of what mtx average would choose among).
    write_run(unscored, {step: None for step in BLEU}, recipe_dict(tmp_path, ""))
    code, output = average("--dir", str(unscored), "-o", str(tmp_path / "b.pt"))
    assert code == 0, output
    assert [Path(p).name for p in load_checkpoint(tmp_path / "b.pt")["averaged_from"]] == [
        f"step_{step}.pt" for step in (30, 40, 50, 60, 70)]
    assert f"Fewer than 5 checkpoints in {unscored} carry a validation score" in output


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
    assert code == 0 and "Nothing chosen on the valid split: --tune-lenpen translates the valid split" in output
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


class ScriptedValid:
    """A valid split whose BLEU for each average is scripted by the newest step it holds, under each α."""

    def __init__(self, bleu: dict[int, dict[float, float]], before: float) -> None:
        self.bleu, self.before = bleu, before

    def scored(self, checkpoint: dict[str, Any], device: str, log: Any) -> LenpenChoice:
        newest = max(int(Path(p).stem.removeprefix("step_")) for p in checkpoint["averaged_from"])
        table = self.bleu[newest]
        chosen = max(table, key=lambda alpha: table[alpha])
        return LenpenChoice("fairseq", 10, 4, self.before, chosen,
                            tuple(PenaltyScore(alpha, bleu, 1.0) for alpha, bleu in sorted(table.items())))


def test_the_default_keeps_the_candidate_that_translates_the_valid_split_best(tmp_path: Path) -> None:
    """mtx average --dir chooses among its candidates by valid BLEU: under each one's chosen α, or, α pinned, under
    the recipe's; of equal BLEU, the first (the average)."""
    write_run(tmp_path, {step: scores(BLEU[step], NLL[step], step) for step in BLEU},
              recipe_dict(tmp_path, "train: {best_metric: bleu}\n"))
    candidates = default_candidates(tmp_path, lambda _: None)
    assert [(description, [Path(p).name for p in paths]) for description, paths in candidates] == [
        ("the average of the best 5 by validation", [f"step_{s}.pt" for s in (20, 30, 40, 50, 60)]),
        ("the average of the last 5", [f"step_{s}.pt" for s in (30, 40, 50, 60, 70)]),
        ("the newest checkpoint, step 70", ["step_70.pt"])]
    # The best five end at step 60, the last five and the newest at 70: scripted by the newest step, the last
    # five and the newest alone score alike, so the newest counts by its own entry below.
    valid = ScriptedValid({60: {1.0: 10.0, 1.2: 11.0}, 70: {1.0: 10.5, 1.2: 10.6}}, before=1.0)
    tuned = chosen_on_valid(candidates[:2], valid, tune=True, device="cpu", log=lambda _: None)
    assert tuned["averaged_from"] == [str(p) for p in candidates[0][1]]  # 11.0 at α 1.2 beats 10.6
    assert tuned["recipe"]["decode"]["lenpen"] == 1.2 and tuned["lenpen_choice"]["chosen"] == 1.2
    pinned = chosen_on_valid(candidates[:2], valid, tune=False, device="cpu", log=lambda _: None)
    assert pinned["averaged_from"] == [str(p) for p in candidates[1][1]]  # at α 1.0: 10.5 beats 10.0
    assert "lenpen_choice" not in pinned
    tie = ScriptedValid({60: {1.0: 10.0}, 70: {1.0: 10.0}}, before=1.0)
    assert chosen_on_valid(candidates[:2], tie, tune=True, device="cpu",
                           log=lambda _: None)["averaged_from"] == [str(p) for p in candidates[0][1]]
