"""`mtx import`: a MarianMT model (an OPUS-MT or Tatoeba-MT folder, or its Hugging Face hub id) as an mtx checkpoint.

The model is read with transformers (its config, its weights) and its tokenizer with sentencepiece
(mtx.spm_tokenizer), the optional extra `mtx[marian]`; mtx.importing.marian maps them, refusing by name what mtx
cannot hold exactly, before any weight is read. The checkpoint is written whole or not at all (mtx.files), and
it is an ordinary one: translate, serve, inspect, export, average and fine-tune it (train.init_from).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from mtx.errors import MtxError, first_line, require_extra

NEEDS = ("transformers", "safetensors", "sentencepiece")  # the modules of the extra mtx[marian]
# Weights that MarianMTModel makes rather than loads: the sinusoids, rebuilt from the config, and a bias that
# older conversions left out, zero (Marian's own default).
MADE_NOT_LOADED = {"final_logits_bias", "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}


def import_model(
    source: Annotated[str, typer.Argument(metavar="FOLDER|HUB_ID", show_default=False, help=(
        "A MarianMT folder (config.json, model.safetensors or pytorch_model.bin, source.spm, target.spm, "
        "vocab.json: what save_pretrained writes), or a Hugging Face hub id such as Helsinki-NLP/opus-mt-en-de, "
        "fetched into the hub's cache (or found there, offline)."))],
    output: Annotated[Path, typer.Option("-o", "--output", metavar="OUT.pt", help="The checkpoint to write.")],
    force: Annotated[bool, typer.Option("--force", help="Replace OUT.pt if it exists.")] = False,
) -> None:
    """Import a MarianMT model (OPUS-MT, Tatoeba-MT) as an mtx checkpoint (needs mtx[marian]).

    The checkpoint holds the model, its SentencePiece tokenizer (source.spm, target.spm, vocab.json) and a recipe
    with its languages and its generation settings (beam, length penalty). It translates as transformers'
    generate does, token for token; export it back with `mtx export --to hf`, or fine-tune it with
    train.init_from. A configuration mtx cannot hold exactly is refused, naming the key.

    Example: mtx import Helsinki-NLP/opus-mt-en-de -o opus-mt-en-de.pt
    """
    require_extra("marian", NEEDS, "mtx import")
    checkpoint = import_checkpoint(source, output, force)
    cfg, notes = checkpoint["model_config"], checkpoint["imported_from"]["notes"]
    sys.stderr.write(f"imported {source} → {output}: {cfg['layers_enc']} + {cfg['layers_dec']} layers, d_model "
                     f"{cfg['d_model']}, {cfg['activation']}, {checkpoint['vocab_size']:,} tokens"
                     f"{''.join(f'; {note}' for note in notes)}\n")


def import_checkpoint(source: str, output: Path, force: bool = False) -> dict[str, Any]:
    """Import `source` (a MarianMT folder or hub id) into the checkpoint file `output`; the checkpoint."""
    import transformers

    from mtx.checkpoint import make_checkpoint, save_checkpoint
    from mtx.importing.marian import check_vocabulary, languages, model_config, mtx_model, stored_recipe
    from mtx.importing.source import CONFIG_FILES, WEIGHT_FILES, local_folder
    from mtx.spm_tokenizer import SpmPairTokenizer

    check_output(output, force)
    folder = local_folder(source, CONFIG_FILES)
    hub = folder != Path(source)
    where = f"{source} (config.json)" if hub else str(folder / "config.json")
    raw = read_config(folder, where)
    config = marian_config(folder, where)
    cfg, notes = model_config(config, where)
    tokenizer = SpmPairTokenizer.from_marian_folder(folder)
    check_vocabulary(config, tokenizer.marian_ids, where)
    folder = local_folder(source, WEIGHT_FILES)
    model = mtx_model(load_marian(folder), cfg, tokenizer.marian_ids)
    name = source.split("/")[-1] if hub else folder.resolve().name
    generation_file = folder / "generation_config.json"  # an older folder keeps these settings in config.json
    generation = read_json(generation_file) if generation_file.is_file() else raw
    recipe = stored_recipe(name, cfg, *languages(tokenizer.source_lang, tokenizer.target_lang, name),
                           tokenizer.token_strings(), generation)
    checkpoint = make_checkpoint(model, tokenizer.to_str(), recipe, step=0)
    origin = f"{source}@{folder.name}" if hub else str(folder.resolve())  # a hub snapshot's folder is its commit
    checkpoint["imported_from"] = {"source": origin, "transformers": transformers.__version__, "notes": notes}
    check_output(output, force)  # again: another process may have written there meanwhile
    save_checkpoint(checkpoint, output)
    return checkpoint


def check_output(output: Path, force: bool) -> None:
    """The checkpoint goes to a new file; `force` replaces an existing one."""
    if output.is_dir():
        raise MtxError(f"{output} is a folder: name the checkpoint file to write, e.g. {output / 'model.pt'}.")
    if output.exists() and not force:
        raise MtxError(f"{output} already exists: name a new file, or pass --force to replace it.")


def read_config(folder: Path, where: str) -> dict[str, Any]:
    """config.json as it is, once it is known to be a MarianMT model's."""
    path = folder / "config.json"
    if not path.is_file():
        raise MtxError(f"{folder} is not a MarianMT folder: it has no config.json (save_pretrained writes one "
                       "beside the weights, source.spm, target.spm and vocab.json).")
    raw = read_json(path)
    kind = raw.get("model_type")
    if kind != "marian":
        raise MtxError(f"{where}: model_type = {kind!r}, and mtx import takes MarianMT models (model_type "
                       "\"marian\": the OPUS-MT and Tatoeba-MT models), whose architecture is the Transformer mtx "
                       "has. Other architectures (T5, BART, mBART, NLLB's M2M100) are not imported.")
    return raw


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`; a damaged file is refused, naming it."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        value = e
    if not isinstance(value, dict):
        reason = first_line(value) if isinstance(value, Exception) else "not a JSON object"
        raise MtxError(f"{path} cannot be read ({reason}): the file is damaged. Download or save the model again.")
    return value


def marian_config(folder: Path, where: str) -> dict[str, Any]:
    """Every key of the folder's MarianConfig, as transformers reads config.json: its defaults filled in."""
    from transformers import MarianConfig

    try:
        return MarianConfig.from_pretrained(folder).to_dict()
    except Exception as e:  # transformers' checks of the values' types and ranges
        raise MtxError(f"{where} is not a MarianConfig that transformers reads ({type(e).__name__}: "
                       f"{first_line(e, 200)}). Download or save the model again.") from None


def load_marian(folder: Path):
    """The folder's MarianMTModel in float32 (its weights' own precision first: widening is exact), refusing
    weights that cannot be read or that leave some of the model's weights unset."""
    from transformers import MarianMTModel
    from transformers.utils import logging

    logging.set_verbosity_error()  # what a refusal below says better, without its progress bars
    logging.disable_progress_bar()
    try:
        marian, info = MarianMTModel.from_pretrained(folder, output_loading_info=True)
    except Exception as e:  # a missing, truncated or damaged file, in safetensors' or torch's words
        raise MtxError(f"The weights in {folder} cannot be read ({type(e).__name__}: {first_line(e, 200)}): a "
                       "MarianMT folder holds model.safetensors or pytorch_model.bin, whole. Download or save the "
                       "model again.") from None
    unset = sorted(set(info["missing_keys"]) - MADE_NOT_LOADED)
    if unset or info.get("mismatched_keys"):
        wrong = unset or [str(key) for key in info["mismatched_keys"]]
        raise MtxError(f"The weights in {folder} are not those of its config.json: {len(wrong)} of the model's "
                       f"weights are missing or of another shape ({', '.join(wrong[:3])}...). Download or save the "
                       "model again.")
    return marian.float().eval()
