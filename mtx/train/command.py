"""`mtx train` and `mtx average`: a recipe trained on its prepared data, and a run's checkpoints averaged."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from mtx.config.command import RecipeArg, SetOpt, read_run_recipe
from mtx.config.decode import DecodeConfig
from mtx.errors import MtxError


def train(
    recipe: RecipeArg,
    set_: SetOpt = None,
    restart: Annotated[
        bool, typer.Option("--restart", help="Delete the run's checkpoints and metrics and train from scratch.")
    ] = False,
) -> None:
    """Train on the run's prepared data/, writing checkpoints/ and metrics.jsonl; resumes if it has checkpoints.

    On a budget (max_steps, max_epochs, max_time), early stopping or SIGTERM/SIGINT it saves a checkpoint and
    exits 0; the same command resumes. Several GPUs or nodes: torchrun --nproc-per-node 8 -m mtx train RECIPE.yaml

    Example: mtx train recipes/demo.yaml --set train.max_steps=2000
    """
    from mtx.train.trainer import train as run_training

    run_training(read_run_recipe(recipe, set_), restart=restart)


def average(
    output: Annotated[Path, typer.Option("-o", "--output", help="The averaged checkpoint to write.")],
    checkpoints: Annotated[
        list[Path] | None, typer.Argument(help="Checkpoints to average.", metavar="CKPT...", show_default=False)
    ] = None,
    directory: Annotated[
        Path | None, typer.Option("--dir", help="A run's checkpoints/ folder; use with --last.")
    ] = None,
    last: Annotated[int | None, typer.Option("--last", min=1, help="Average the last N step_<N>.pt by step.")] = None,
    tune_lenpen: Annotated[bool, typer.Option(
        "--tune-lenpen", help="Choose the length penalty α (0 to 2 by tenths, and on while the best is the largest; "
        "in the recipe's decode.lenpen_style) that translates the run's whole valid split best by BLEU, with the "
        "recipe's beam, and store it as the checkpoint's decode.lenpen, which mtx translate and mtx serve then use: "
        "one beam search, every α rescored.")] = False,
    device: Annotated[str, typer.Option(
        metavar="auto|cpu|cuda", help="With --tune-lenpen: where to translate the valid split; auto: cuda if there "
        "is one.")] = "auto",
) -> None:
    """Average checkpoints parameter-wise into one self-contained checkpoint for translation.

    The paper averages the last 5 checkpoints of base models and the last 20 of big ones.

    Example: mtx average --dir runs/demo/checkpoints --last 5 -o runs/demo/average.pt --tune-lenpen
    """
    from mtx.checkpoint import describe_weights, load_checkpoint, save_checkpoint
    from mtx.decode.command import check_choice
    from mtx.devices import DeviceName
    from mtx.train.average import average_checkpoints, last_checkpoints

    if bool(checkpoints) == (directory is not None):
        raise MtxError("Name the checkpoints to average one way: as files (mtx average a.pt b.pt -o avg.pt) "
                       "or as --dir RUN/checkpoints --last N.")
    check_choice("--device", device, DeviceName)
    if directory is not None:
        if last is None:
            raise MtxError("--dir needs --last N: how many of the latest step checkpoints to average.")
        checkpoints = last_checkpoints(directory, last)
    elif last is not None:
        raise MtxError("--last only applies with --dir.")
    valid = None if not tune_lenpen else ValidToTune.of_run(
        load_checkpoint(checkpoints[0], mmap=True, weights=False), checkpoints[0])
    averaged = average_checkpoints(checkpoints)
    weights = f" (their {describe_weights(averaged)})" if "ema_decay" in averaged else ""
    sys.stderr.write(f"averaged {len(checkpoints)} checkpoints{weights}\n")
    if valid is not None:
        averaged = valid.with_chosen_lenpen(averaged, device, sys.stderr.write)
    save_checkpoint(averaged, output)
    sys.stderr.write(f"→ {output}\n")


@dataclass(frozen=True)
class ValidToTune:
    """What `--tune-lenpen` chooses α on: the whole valid split of the checkpoints' run, as `mtx prepare` wrote it,
    and the recipe's search. Read, and refused, before averaging.

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
    def of_run(cls, checkpoint: dict[str, Any], path: Path) -> ValidToTune:
        """The valid split of the run of `checkpoint`, read from the file `path`."""
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
        sources, refs, _ = valid_text(recipe.data, manifest, data_dir)
        return cls(data_dir, decode, sources, refs)

    def with_chosen_lenpen(self, checkpoint: dict[str, Any], device: str, log: Callable[[str], None]
                           ) -> dict[str, Any]:
        """`checkpoint` with the α that translates the valid split best as its recipe's decode.lenpen, and what
        choosing it found as its `lenpen_choice` (mtx.decode.lenpen_choice)."""
        from mtx.checkpoint import model_of
        from mtx.decode.ensemble import without_weights
        from mtx.decode.facts import ModelFacts
        from mtx.decode.lenpen_choice import choose_lenpen
        from mtx.decode.torch_engine import engine_of_model
        from mtx.decode.translator import prepare_model
        from mtx.devices import choose_device

        model, tokenizer = model_of(checkpoint, "the average")
        model = prepare_model(model, choose_device(device, "--device"), "auto")
        facts = ModelFacts.of_metadata([Path("the average")], tokenizer, [without_weights(checkpoint)])
        log(f"choosing the length penalty α ({self.decode.lenpen_style}) on the {len(self.sources):,} valid "
            f"sentences of {self.data_dir}, beam {self.decode.beam}\n")
        shown = sys.stderr.isatty()  # the progress line, as mtx translate shows it
        choice = choose_lenpen(engine_of_model(model, facts, every_ending=True), self.sources, self.refs, self.decode,
                               progress=(lambda stats: log(f"\r{stats.summary()}")) if shown else None)
        if shown:
            log("\n")
        log(f"{choice.table()}\ndecode.lenpen: {choice.before:g} → {choice.chosen:g}\n")
        stored = checkpoint["recipe"]
        return {**checkpoint, "recipe": {**stored, "decode": {**stored.get("decode", {}), "lenpen": choice.chosen}},
                "lenpen_choice": choice.to_dict()}


def run_data_places(checkpoint: Path, recipe_data: Path) -> list[Path]:
    """Where a checkpoint's run keeps its prepared data, in the order to look: beside the checkpoints' folder when
    it is a run's (RUN/checkpoints → RUN/data), then `recipe_data` (the recipe's run_dir/data), once each."""
    folder = checkpoint.resolve().parent
    beside = [folder.parent / "data"] if folder.name == "checkpoints" else []
    return list(dict.fromkeys([*beside, recipe_data.resolve()]))
