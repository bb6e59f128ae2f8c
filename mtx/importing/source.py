"""Where `mtx import` reads a model from: a folder, or a Hugging Face hub id brought into the hub's cache.

A hub id (`owner/name`, and no such path here) is fetched with huggingface_hub's `snapshot_download`, what
transformers' `from_pretrained` fetches with, into the cache it keeps (HF_HOME, HF_HUB_CACHE): a model fetched
once is there for transformers too, and imports without the network, as HF_HUB_OFFLINE=1 asks. Only the files an
import reads are fetched, and in two steps, `CONFIG_FILES` then `WEIGHT_FILES`, so that a model mtx refuses is
refused before its weights are downloaded.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from mtx.errors import MtxError, first_line

HUB_ID = re.compile(r"[\w.\-]+/[\w.\-]+")
CONFIG_FILES = ("config.json", "generation_config.json", "tokenizer_config.json", "source.spm", "target.spm",
                "vocab.json")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")  # what from_pretrained loads, the first it finds


def local_folder(source: str, files: Sequence[str]) -> Path:
    """The folder holding `source`'s `files`: `source` itself when it is a folder; for a hub id, its snapshot in the
    hub's cache, with those of `files` that the model has fetched into it if they are not there yet."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise MtxError(f"{source} is a file: mtx import takes a MarianMT folder (config.json, model.safetensors, "
                       "source.spm, target.spm, vocab.json, as save_pretrained writes it) or a Hugging Face hub id.")
    if not HUB_ID.fullmatch(source):
        raise MtxError(f"{source} does not exist: name a MarianMT folder (config.json, model.safetensors, "
                       "source.spm, target.spm, vocab.json) or a Hugging Face hub id such as "
                       "Helsinki-NLP/opus-mt-en-de.")
    from huggingface_hub import constants, snapshot_download

    try:
        return Path(snapshot_download(source, allow_patterns=list(files)))
    except Exception as e:  # the hub's errors: offline, unreachable, no such model, no access
        raise MtxError(
            f"{source} is not a folder here, and the Hugging Face hub could not give it ({type(e).__name__}: "
            f"{first_line(e, 200)}). Without the network, or with HF_HUB_OFFLINE=1, only a model already in the "
            f"hub's cache ({constants.HF_HUB_CACHE}) can be imported: run the import once where the hub is "
            "reachable, or pass the path of the model's folder. Check the id's spelling too (owner/name)."
        ) from None
