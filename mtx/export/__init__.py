"""`mtx export`: a checkpoint as a folder that another toolkit serves, Hugging Face `transformers` or CTranslate2.

    hf           a MarianMT folder (mtx.export.hf) for AutoModelForSeq2SeqLM / AutoTokenizer / pipeline
    ctranslate2  a CTranslate2 model directory (mtx.export.ctranslate2), quantized if asked

Both hold mtx's tokenizer with its normalisation and the source's EOS built in (mtx.export.tokenizer) and a
model card (mtx.export.model_card). The packages they need are the optional extra `mtx[export]`, never
mtx's own dependencies, so they are imported only here and a missing one is a user error naming the extra.

The folder is written next to its destination under a temporary name and renamed into place when complete,
so a failed export never leaves a folder that looks like a finished one.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mtx.errors import MtxError
from mtx.files import current_umask

TARGETS = {"hf": ("transformers", "safetensors"), "ctranslate2": ("ctranslate2",)}  # target → modules it needs


def require_packages(target: str) -> None:
    """Refuse, naming the extra to install, an export whose packages are not importable."""
    missing = []
    for module in TARGETS[target]:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MtxError(f"mtx export --to {target} needs {' and '.join(missing)}, not installed here: "
                       "pip install 'mtx[export]'")


def export_checkpoint(checkpoint_path: Path, target: str, folder: Path, quantization: str | None = None,
                      force: bool = False) -> None:
    """Export the checkpoint at `checkpoint_path` to `folder` in the `target` format (see the module's docstring)."""
    from mtx.checkpoint import load_model
    from mtx.config.recipe import DecodeConfig
    from mtx.export.ctranslate2 import QUANTIZATIONS
    from mtx.export.marian import check_marian_can_express
    from mtx.export.model_card import model_card

    if target not in TARGETS:
        raise MtxError(f"--to {target} is not an export format: use one of {', '.join(TARGETS)}.")
    if quantization is not None and target != "ctranslate2":
        raise MtxError("--quantization applies to --to ctranslate2 only: a Hugging Face export keeps float32 "
                       "weights, which transformers can load in another precision (torch_dtype=...).")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise MtxError(f"--quantization {quantization} is not one of {', '.join(QUANTIZATIONS)}.")
    require_packages(target)
    check_destination(folder, force)
    model, _, checkpoint = load_model(checkpoint_path)
    decode = DecodeConfig.of_checkpoint(checkpoint)
    if target == "hf":
        from mtx.export.hf import hf_notes, hf_usage, save_hf_folder

        check_marian_can_express(model.cfg)
        card = model_card(checkpoint_path, checkpoint, "Hugging Face transformers", hf_usage(folder),
                          hf_notes(decode))
        write_folder(folder, lambda out: save_hf_folder(model, checkpoint["tokenizer"], decode, out), card, force)
    else:
        from mtx.export.ctranslate2 import ctranslate2_notes, ctranslate2_usage, save_ctranslate2_folder

        card = model_card(checkpoint_path, checkpoint, f"CTranslate2, {quantization or 'float32'}",
                          ctranslate2_usage(folder, decode), ctranslate2_notes(decode))
        write_folder(folder, lambda out: save_ctranslate2_folder(model, checkpoint["tokenizer"], out, quantization),
                     card, force)


def check_destination(folder: Path, force: bool) -> None:
    """An export goes into a new or empty folder; `force` replaces a non-empty one."""
    if folder.exists() and not folder.is_dir():
        raise MtxError(f"{folder} is a file, not a folder: name a folder to export into.")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise MtxError(f"{folder} already exists and is not empty: name a new folder, or pass --force to replace it.")


def write_folder(folder: Path, fill: Callable[[Path], None], readme: str, force: bool) -> None:
    """Call `fill(staging)` on a new folder beside `folder`, add README.md, then rename it to `folder`
    (replacing an existing one only with `force`, once the new one is complete)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    replaced = staging.with_suffix(".old")
    try:
        fill(staging)
        (staging / "README.md").write_text(readme, encoding="utf-8")
        for path in (staging, *staging.iterdir()):  # mkdtemp's folder, like some writers' files, is private
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~current_umask())
        check_destination(folder, force)  # again: another process may have written there meanwhile
        if folder.is_dir() and any(folder.iterdir()):
            folder.rename(replaced)
        os.replace(staging, folder)  # onto a missing or empty folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if replaced.exists() and not folder.exists():
            replaced.rename(folder)
        raise
    shutil.rmtree(replaced, ignore_errors=True)
