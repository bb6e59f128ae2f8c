"""The README.md of an exported folder: what the model is, what it was trained on, how good it was, how to use it.

A checkpoint holds the model's config and the run's recipe; the data manifest's counts and the validation
BLEU live in the run folder (data/manifest.json, metrics.jsonl), which is found next to the checkpoint:
RUN/checkpoints/step_N.pt, or RUN/average.pt where `make demo` writes it. A folder whose manifest names
another tokenizer is not this model's run and is not used. What cannot be found is said, not guessed.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from mtx import __version__
from mtx.decode.target_lang import TargetLanguages
from mtx.tokenizer import Tokenizer


def run_folder(checkpoint_path: Path, tokenizer_json: str) -> Path | None:
    """The run folder of the checkpoint, if one next to it has a data manifest of the same tokenizer."""
    digest = hashlib.sha256(tokenizer_json.encode("utf-8")).hexdigest()
    for folder in (checkpoint_path.parent, checkpoint_path.parent.parent):
        manifest = folder / "data" / "manifest.json"
        if manifest.is_file() and json.loads(manifest.read_text(encoding="utf-8")).get("tokenizer_sha256") == digest:
            return folder
    return None


def best_validation(run: Path | None, checkpoint: dict[str, Any]) -> tuple[float, int | None] | None:
    """(the best validation BLEU, the step it was reached at): from the run's metrics.jsonl, else from the
    trainer's progress a training checkpoint carries (no step then); None if neither has one."""
    metrics = None if run is None else run / "metrics.jsonl"
    if metrics is not None and metrics.is_file():
        records = [json.loads(line) for line in metrics.read_text(encoding="utf-8").splitlines() if line.strip()]
        valid = [r for r in records if r.get("event") == "valid" and r.get("valid_bleu") is not None]
        if valid:
            best = max(valid, key=lambda r: r["valid_bleu"])
            return float(best["valid_bleu"]), best.get("step")
    progress = checkpoint.get("train_state", {}).get("progress", {})
    return (float(progress["best_bleu"]), None) if progress.get("best_bleu") is not None else None


def vocabulary(tokenizer_json: str) -> str:
    """The kind of subword vocabulary, as the card names it: what a user must know to tokenize as the model
    does (byte-level BPE, or SentencePiece-style metaspace BPE or unigram), read from the tokenizer itself."""
    tokenizer = Tokenizer.from_str(tokenizer_json)
    if tokenizer.style == "bytelevel":
        return "byte-level BPE"
    return f"metaspace {'BPE' if tokenizer.model == 'bpe' else 'unigram'}"


def model_card(checkpoint_path: Path, checkpoint: dict[str, Any], target: str, usage: str, notes: list[str]) -> str:
    """The card as Markdown; `target` names the format, `usage` is the code that translates with the folder,
    `notes` say where the export's decoding differs from mtx's."""
    recipe = checkpoint["recipe"]
    data, cfg = recipe.get("data") or {}, checkpoint["model_config"]
    run = run_folder(checkpoint_path, checkpoint["tokenizer"])
    targets = TargetLanguages.of_checkpoint(checkpoint, Tokenizer.from_str(checkpoint["tokenizer"]))
    if targets.tags:  # a model of several target languages: the tag chooses, and the example has none
        notes = [*notes, "This model translates into " + ", ".join(targets.languages) + ": start each source sentence "
                 "with the tag of the language wanted and a space (" + ", ".join(f"`{tag} `" for tag in
                                                                          targets.tags.values()) + ")."]
    lines = [
        f"# {recipe.get('name', checkpoint_path.stem)}: {data.get('src_lang', 'en')} → "
        f"{', '.join(targets.languages)} translation (mtx, {target})",
        "",
        _provenance(checkpoint_path, checkpoint),
        "",
        "## Use",
        "",
        "```python",
        usage.strip(),
        "```",
        "",
        *[f"- {note}" for note in notes],
        "",
        "## Model",
        "",
        f"{cfg['layers_enc']} encoder and {cfg['layers_dec']} decoder layers, d_model {cfg['d_model']}, "
        f"{cfg['heads']} heads, d_ff {cfg['d_ff']}, {cfg['norm']}-norm, "
        f"{'shared' if cfg['share_embeddings'] else 'separate'} source and target embeddings (the output "
        f"projection is the target embedding), {checkpoint['vocab_size']:,} {vocabulary(checkpoint['tokenizer'])} "
        f"tokens, sources and translations up to {cfg['max_positions']:,} tokens.",
        "",
        *_data_section(run),
        *_validation_section(run, checkpoint),
        "## Recipe",
        "",
        "```yaml",
        yaml.safe_dump(recipe, sort_keys=False, allow_unicode=True, default_flow_style=None).strip(),
        "```",
        "",
    ]
    return "\n".join(lines)


def _provenance(checkpoint_path: Path, checkpoint: dict[str, Any]) -> str:
    """Where the model comes from: trained with mtx (at a step, averaged, a moving average), or imported by
    `mtx import` from a MarianMT model (mtx.importing) and maybe trained further."""
    averaged = checkpoint.get("averaged_from")
    origin = f" (the average of {len(averaged)} checkpoints)" if averaged else ""
    if "ema_decay" in checkpoint:
        origin += f", its exponential moving average of the weights (decay {checkpoint['ema_decay']:g})"
    exported = f"exported by `mtx export` (mtx {__version__}) from `{checkpoint_path.name}`"
    imported = checkpoint.get("imported_from")
    if imported is None:
        return f"A Transformer trained with mtx and {exported}, at step {checkpoint['step']:,}{origin}."
    further = f", then trained with mtx for {checkpoint['step']:,} steps{origin}" if checkpoint["step"] else origin
    return (f"A MarianMT model imported by `mtx import` from `{imported['source']}` (transformers "
            f"{imported['transformers']}){further}, and {exported}.")


def _data_section(run: Path | None) -> list[str]:
    if run is None:
        return ["## Data", "", "The run's data manifest was not found next to the checkpoint.", ""]
    manifest = json.loads((run / "data" / "manifest.json").read_text(encoding="utf-8"))
    rows = [f"| {name} | {split['pairs']:,} | {split['src_tokens']:,} | {split['tgt_tokens']:,} |"
            for name, split in manifest["splits"].items()]
    kept = manifest.get("filter", {})
    cleaning = (f"Training pairs read: {kept['read']:,}, kept after cleaning: {kept['kept']:,}. "
                if "read" in kept and "kept" in kept else "")
    return ["## Data", "", f"Source: {_sources(manifest)}. {cleaning}"
            f"From the run's data manifest (`{run / 'data' / 'manifest.json'}`):", "",
            "| split | pairs | source tokens | target tokens |", "|---|---:|---:|---:|", *rows, ""]


def _sources(manifest: dict[str, Any]) -> str:
    """The source's kind; for several corpora, each with its kind, tag and training pairs kept."""
    corpora = manifest.get("corpora", [])
    if len(corpora) < 2:
        return manifest["source"].get("kind", "unknown")
    return f"{len(corpora)} corpora: " + ", ".join(
        f"{c['name']} ({c['kind']}{', tagged ' + c['tag'] if c['tag'] else ''}, {c['filter']['kept']:,} training "
        "pairs)" for c in corpora)


def _validation_section(run: Path | None, checkpoint: dict[str, Any]) -> list[str]:
    chosen = _lenpen_choice(checkpoint.get("lenpen_choice"))
    best = best_validation(run, checkpoint)
    if best is None:
        return ["## Validation", "", "No validation BLEU was found (no metrics.jsonl next to the checkpoint).", "",
                *chosen]
    bleu, step = best
    train = checkpoint["recipe"].get("train", {})
    search = "greedy" if train.get("valid_beam", 1) == 1 else f"beam {train['valid_beam']}"
    subset = train.get("valid_max_sentences")
    sentences = f"{subset:,} of the validation sentences" if subset else "the validation set"
    at = f" at step {step:,}" if step is not None else ""
    return ["## Validation", "", f"Best validation BLEU during training: **{bleu:.2f}**{at} (sacreBLEU, "
            f"{search} decoding of {sentences}).", "", *chosen]


def _lenpen_choice(choice: dict[str, Any] | None) -> list[str]:
    """What `mtx average --tune-lenpen` found (mtx.decode.lenpen_choice), where it chose the length penalty."""
    if choice is None:
        return []
    scores = {s["alpha"]: s for s in choice["scores"]}
    chosen, before = scores[choice["chosen"]], scores[choice["before"]]
    return [f"Length penalty α = {choice['chosen']:g} ({choice['style']}), chosen by `mtx average --tune-lenpen` on "
            f"the {choice['sentences']:,} validation sentences, beam {choice['beam']}: BLEU {chosen['bleu']:.2f}, "
            f"length ratio {chosen['length_ratio']:.3f}, against {before['bleu']:.2f} and "
            f"{before['length_ratio']:.3f} with the recipe's α = {choice['before']:g}.", ""]
