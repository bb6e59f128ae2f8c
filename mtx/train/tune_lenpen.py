"""The length penalty chosen on a run's valid split and stored in a checkpoint: what `mtx average` (by default,
or with --tune-lenpen) and the end of `mtx train` (train.tune_lenpen) do, through mtx.decode.lenpen_choice's
one beam search with every α rescored.

Whether to choose at all is the recipe's train.tune_lenpen, settled when the recipe is read (mtx.config.loading):
on, unless the recipe gives decode.lenpen itself, as the WMT14 recipes give the paper's 0.6.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mtx.config.decode import TUNE_SENTENCES, DecodeConfig
from mtx.decode.lenpen_choice import LenpenChoice
from mtx.errors import MtxError

if TYPE_CHECKING:
    from mtx.config.recipe import Recipe
    from mtx.decode.torch_engine import TorchEngine
    from mtx.train.checkpoints import CheckpointKeeper


@dataclass(frozen=True)
class ValidToTune:
    """What `--tune-lenpen` chooses α on: the valid split of the checkpoints' run, as `mtx prepare` wrote it (at
    most TUNE_SENTENCES of each language pair's, spread evenly over it), and the recipe's search. Read, and
    refused, before averaging.

    The run's data is looked for beside the checkpoints first (RUN/data for RUN/checkpoints/step_<N>.pt), then
    where the recipe's run_dir says: a run folder moved or copied elsewhere keeps its data beside its
    checkpoints, while run_dir still names where it was trained, where another run may now be. Either way the
    data must have been prepared with the checkpoints' own tokenizer: on text another tokenizer splits, the
    model's token ids mean other subwords, and the α chosen would be chosen on nonsense.
    """

    data_dir: Path
    decode: DecodeConfig
    sources: list[str]
    refs: list[str]

    @classmethod
    def of_run(cls, checkpoint: dict[str, Any], path: Path, most: int | None = TUNE_SENTENCES) -> ValidToTune:
        """The valid split of the run of `checkpoint`, read from the file `path`: `most` of its sentences (of each
        language pair's), spread evenly over it, or all (None)."""
        from mtx.config.loading import recipe_from_dict
        from mtx.data.prepared import load_manifest
        from mtx.decode.lenpen_choice import check_searchable
        from mtx.tokenizer import Tokenizer
        from mtx.train.run_data import has_valid_split, valid_text

        recipe, decode = recipe_from_dict(checkpoint["recipe"]), DecodeConfig.of_checkpoint(checkpoint)
        check_searchable(decode, f"--tune-lenpen: the recipe of run {recipe.name}")
        places = run_data_places(path, recipe.run_path / "data")
        data_dir = next((place for place in places if (place / "manifest.json").is_file()), None)
        if data_dir is None:
            raise MtxError(f"--tune-lenpen translates the valid split of the checkpoints' run, {recipe.name}, and "
                           f"its prepared data is not at {' or at '.join(map(str, places))} (looked for beside the "
                           f"folder of {path}, then where its recipe's run_dir says): average the checkpoints inside "
                           "their own run folder (RUN/checkpoints beside RUN/data), or leave out --tune-lenpen.")
        manifest = load_manifest(data_dir)
        own, theirs = Tokenizer.from_str(checkpoint["tokenizer"]).sha256, str(manifest.get("tokenizer_sha256"))
        if theirs != own:
            raise MtxError(f"--tune-lenpen would choose α on {data_dir}, but that data was prepared with another "
                           f"tokenizer than {path} was trained with (sha256 {theirs[:12]} there, {own[:12]} in the "
                           "checkpoint): it is another run's data. Average the checkpoints inside their own run "
                           "folder (RUN/checkpoints beside RUN/data), or leave out --tune-lenpen.")
        if not has_valid_split(manifest):
            raise MtxError(f"--tune-lenpen translates the valid split of the checkpoints' run, and {data_dir} has "
                           "none: add one to the recipe's data.source and run `mtx prepare` again, or leave out "
                           "--tune-lenpen.")
        sources, refs, _ = valid_text(recipe.data, manifest, data_dir, most)
        return cls(data_dir, decode, sources, refs)

    def with_chosen_lenpen(self, checkpoint: dict[str, Any], device: str, log: Callable[[str], None]
                           ) -> dict[str, Any]:
        """`checkpoint` with the α that translates the valid split best as its recipe's decode.lenpen, and what
        choosing it found as its `lenpen_choice` (mtx.decode.lenpen_choice)."""
        choice = self.scored(checkpoint, device, log)
        log(f"decode.lenpen: {choice.before:g} → {choice.chosen:g}\n")
        return with_choice(checkpoint, choice)

    def scored(self, checkpoint: dict[str, Any], device: str, log: Callable[[str], None]) -> LenpenChoice:
        """The valid BLEU and length ratio of `checkpoint`'s weights under every α (mtx.decode.lenpen_choice), the
        table logged."""
        from mtx.decode.lenpen_choice import choose_lenpen

        log(f"choosing the length penalty α ({self.decode.lenpen_style}) on the {len(self.sources):,} valid "
            f"sentences of {self.data_dir}, beam {self.decode.beam}\n")
        shown = sys.stderr.isatty()  # the progress line, as mtx translate shows it
        choice = choose_lenpen(searcher(checkpoint, device), self.sources, self.refs, self.decode,
                               progress=(lambda stats: log(f"\r{stats.summary()}")) if shown else None)
        if shown:
            log("\n")
        log(f"{choice.table()}\n")
        return choice


def searcher(checkpoint: dict[str, Any], device: str) -> TorchEngine:
    """A torch engine of `checkpoint`'s weights that keeps every hypothesis that ends, as choosing α needs."""
    from mtx.checkpoint import model_of
    from mtx.decode.ensemble import without_weights
    from mtx.decode.facts import ModelFacts
    from mtx.decode.torch_engine import engine_of_model
    from mtx.decode.translator import prepare_model
    from mtx.devices import choose_device

    model, tokenizer = model_of(checkpoint, "the average")
    model = prepare_model(model, choose_device(device, "--device"), "auto")
    facts = ModelFacts.of_metadata([Path("the average")], tokenizer, [without_weights(checkpoint)])
    return engine_of_model(model, facts, every_ending=True)


def choose_at_the_end(recipe: Recipe, has_valid: bool, keeper: CheckpointKeeper, device: str,
                      say: Callable[[str], None]) -> None:
    """train.tune_lenpen: the checkpoint training ends on gets the α that translates the valid split best as its
    decode.lenpen, rewritten in place with what choosing it found (`keeper.rewrite_newest`), by rank 0 on the
    training's `device` ("cuda" is rank 0's GPU, cuda:0); it still resumes. The trainer never calls it after a
    stop signal, which may leave seconds: the same command resumes, and chooses at the end. Where there is
    nothing to choose (`has_valid`: the prepared data has a valid split), it says why."""
    from mtx.decode.lenpen_choice import check_searchable

    decode = recipe.decode
    if not recipe.train.tune_lenpen:
        say("train.tune_lenpen is off (the recipe pins decode.lenpen or turns it off): decode.lenpen "
            f"{decode.lenpen:g} kept.")
        return
    if not has_valid:
        say(f"train.tune_lenpen: the prepared data has no valid split to choose α on: decode.lenpen "
            f"{decode.lenpen:g} kept.")
        return
    try:
        check_searchable(decode, "train.tune_lenpen: the recipe")
    except MtxError as e:
        say(f"{e} decode.lenpen {decode.lenpen:g} kept.")
        return

    def with_chosen_lenpen(checkpoint: dict[str, Any], path: Path) -> dict[str, Any]:
        return ValidToTune.of_run(checkpoint, path).with_chosen_lenpen(checkpoint, device, sys.stderr.write)

    tuned = keeper.rewrite_newest(with_chosen_lenpen)
    say(f"train.tune_lenpen: decode.lenpen {tuned['recipe']['decode']['lenpen']:g} chosen on the valid split, "
        f"stored in {keeper.directory / 'last.pt'}.")


def with_choice(checkpoint: dict[str, Any], choice: LenpenChoice) -> dict[str, Any]:
    """`checkpoint` with the chosen α as its recipe's decode.lenpen, and the choice as its `lenpen_choice`."""
    stored = checkpoint["recipe"]
    return {**checkpoint, "recipe": {**stored, "decode": {**stored.get("decode", {}), "lenpen": choice.chosen}},
            "lenpen_choice": choice.to_dict()}


def valid_bleu(choice: LenpenChoice, tuned: bool) -> float:
    """The valid BLEU a checkpoint translates with: under the α chosen, or, `tuned` False, the α it has."""
    alpha = choice.chosen if tuned else choice.before
    return next(score.bleu for score in choice.scores if score.alpha == alpha)


def chosen_on_valid(candidates: list[tuple[str, list[Path]]], valid: ValidToTune, tune: bool, device: str,
                    log: Callable[[str], None]) -> dict[str, Any]:
    """Of `candidates` (a description and the checkpoints to average), the average that translates the valid split
    best by BLEU, under the α chosen for each (`tune`) or under its recipe's: what `mtx average --dir` makes with
    neither --last nor --best. Ties go to the first. One search of the valid split per candidate."""
    from mtx.train.average import average_checkpoints

    best: tuple[float, str, dict[str, Any], LenpenChoice] | None = None
    for description, paths in candidates:
        log(f"{description}:\n")
        averaged = average_checkpoints(paths)
        choice = valid.scored(averaged, device, log)
        bleu = valid_bleu(choice, tune)
        if best is None or bleu > best[0]:
            best = (bleu, description, averaged, choice)
    assert best is not None
    bleu, description, averaged, choice = best
    log(f"chosen on the valid split: {description} (valid BLEU {bleu:.2f})\n")
    if not tune:
        return averaged
    log(f"decode.lenpen: {choice.before:g} → {choice.chosen:g}\n")
    return with_choice(averaged, choice)


def run_data_places(checkpoint: Path, recipe_data: Path) -> list[Path]:
    """Where a checkpoint's run keeps its prepared data, in the order to look: beside the checkpoints' folder when
    it is a run's (RUN/checkpoints → RUN/data), then `recipe_data` (the recipe's run_dir/data), once each."""
    folder = checkpoint.resolve().parent
    beside = [folder.parent / "data"] if folder.name == "checkpoints" else []
    return list(dict.fromkeys([*beside, recipe_data.resolve()]))
