"""`mtx export`: a checkpoint as a folder that another toolkit serves, Hugging Face `transformers` or CTranslate2.

    hf           a MarianMT folder (mtx.export.hf) for AutoModelForSeq2SeqLM / AutoTokenizer / generate
                 (transformers 4 or 5; also transformers 4's translation pipeline)
    ctranslate2  a CTranslate2 model directory (mtx.export.ctranslate2), quantized if asked

Both hold mtx's tokenizer with its normalisation and the source's EOS built in (mtx.export.tokenizer) and a
model card (mtx.export.model_card). The packages they need are the optional extra `mtx[export]`, never
mtx's own dependencies, so they are imported only here and a missing one is a user error naming the extra.
The folder is written whole or not at all (mtx.export.folder).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from mtx.errors import MtxError, require_extra
from mtx.export.folder import check_destination, write_folder

TARGETS = {"hf": ("transformers", "safetensors"), "ctranslate2": ("ctranslate2",)}  # target → modules it needs


def export(
    model: Annotated[Path, typer.Option("-m", "--model", metavar="CKPT.pt", help="A checkpoint (mtx train/average).")],
    output: Annotated[Path, typer.Argument(help="The folder to write.", metavar="OUT/", show_default=False)],
    to: Annotated[str, typer.Option("--to", metavar="hf|ctranslate2", help="hf: a Hugging Face transformers "
                                    "MarianMT folder; ctranslate2: a CTranslate2 model directory.")],
    quantization: Annotated[str | None, typer.Option(
        metavar="int8|int8_float16|float16|bfloat16", help="CTranslate2 weights' type [default: float32].")] = None,
    force: Annotated[bool, typer.Option("--force", help="Replace OUT/ if it exists and is not empty.")] = False,
    shortlist: Annotated[int | None, typer.Option(
        metavar="K", help="ctranslate2: write vmap.txt, CTranslate2's shortlist (translate_batch(use_vmap=True)), "
        "from the checkpoint's lexical table: K translations per source token and the recipe's "
        "decode.shortlist_frequent most frequent tokens; 0: none [default: the recipe's decode.shortlist].")] = None,
) -> None:
    """Export a checkpoint for serving with Hugging Face transformers or CTranslate2 (needs mtx[export]).

    OUT/ holds the model, mtx's tokenizer (normalising text and ending sources with </s> as mtx does) and a
    README.md model card: the code that translates with it, the recipe, the data counts and the best
    validation BLEU. An hf folder loads with AutoModelForSeq2SeqLM and AutoTokenizer, and its
    generation_config.json holds the recipe's beam and length penalty. Pre-norm models export to ctranslate2
    only: MarianMT has no pre-norm layers.

    Example: mtx export -m runs/demo/average.pt --to ctranslate2 demo-ct2/ --quantization int8
    """
    from mtx.checkpoint import describe_checkpoint

    exported = export_checkpoint(model, to, output, quantization=quantization, force=force, shortlist=shortlist)
    sys.stderr.write(f"exported {model} ({describe_checkpoint(exported)}) → {output} "
                     f"({to}{f', {quantization}' if quantization else ''})\n")


def export_checkpoint(checkpoint_path: Path, target: str, folder: Path, quantization: str | None = None,
                      force: bool = False, shortlist: int | None = None) -> dict:
    """Export the checkpoint at `checkpoint_path` to `folder` in the `target` format (see the module's docstring);
    the checkpoint. Its weights to translate with are exported: the moving average's, where the run kept one.
    `shortlist`: the translations per source token of CTranslate2's vmap.txt (None: the recipe's)."""
    from mtx.checkpoint import load_model
    from mtx.config.recipe import DecodeConfig
    from mtx.export.ctranslate2 import QUANTIZATIONS
    from mtx.export.marian import check_marian_can_express
    from mtx.export.model_card import model_card
    from mtx.spm_tokenizer import SpmPairTokenizer

    if target not in TARGETS:
        raise MtxError(f"--to {target} is not an export format: use one of {', '.join(TARGETS)}.")
    if quantization is not None and target != "ctranslate2":
        raise MtxError("--quantization applies to --to ctranslate2 only: a Hugging Face export keeps float32 "
                       "weights, which transformers can load in another precision (torch_dtype=...).")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise MtxError(f"--quantization {quantization} is not one of {', '.join(QUANTIZATIONS)}.")
    if shortlist is not None and target != "ctranslate2":
        raise MtxError("--shortlist applies to --to ctranslate2 only: transformers has no vocabulary shortlist.")
    require_extra("export", TARGETS[target], f"mtx export --to {target}")
    check_destination(folder, force)
    model, tokenizer, checkpoint = load_model(checkpoint_path)
    decode = DecodeConfig.of_checkpoint(checkpoint, **({} if shortlist is None else {"shortlist": shortlist}))
    imported = isinstance(tokenizer, SpmPairTokenizer)  # an imported MarianMT model's: exported with its own files
    if target == "hf":
        from mtx.export.hf import hf_notes, hf_usage, save_hf_folder

        check_marian_can_express(model.cfg)
        card = model_card(checkpoint_path, checkpoint, "Hugging Face transformers", hf_usage(folder),
                          hf_notes(decode, imported))
        write_folder(folder, lambda out: save_hf_folder(model, checkpoint["tokenizer"], decode, out), card, force)
    else:
        from mtx.data.lexicon import Lexicon, width_of
        from mtx.export.ctranslate2 import ctranslate2_notes, ctranslate2_usage, save_ctranslate2_folder

        lexicon = Lexicon.of_checkpoint(checkpoint)
        decode.validate_flags(model.vocab_size, lexicon_width=width_of(lexicon))  # a shortlist needs the table
        listed = decode.shortlist > 0
        card = model_card(checkpoint_path, checkpoint, f"CTranslate2, {quantization or 'float32'}",
                          ctranslate2_usage(folder, decode, listed, imported), ctranslate2_notes(decode, imported))
        write_folder(folder, lambda out: save_ctranslate2_folder(model, checkpoint["tokenizer"], out, quantization,
                                                                 (lexicon, decode) if listed else None),
                     card, force)
    return checkpoint
