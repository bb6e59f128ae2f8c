"""The vocabulary `mtx prepare` encodes with: a joint one learnt on the training text, or one from elsewhere.

Learnt (mtx.tokenizer, in the style and model of data.bpe), it sees an evenly spaced sample of every corpus'
kept training pairs, untagged and each pair once whatever its corpus' weight, and holds the corpora's tags as
special tokens after the fixed four, so that no segmentation ever splits them.

Borrowed (`data.bpe.from`), it is the tokenizer of a tokenizer.json, of a prepared run's data/ folder or of an mtx
checkpoint: a model fine-tuned from that checkpoint must read its token ids, and runs meant to be compared or
ensembled must share one vocabulary. It must already hold every tag as a special token: adding one would change
the vocabulary the ids were meant to share, so a missing tag is refused before any work. An imported MarianMT
model's checkpoint (`mtx import`) lends its pair of SentencePiece models (mtx.spm_tokenizer), used as they are:
sources segmented by its source model, targets by its target model, its language codes (`>>fra<<`) its tags.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from rich.progress import Progress

from mtx.config.recipe import DataConfig
from mtx.errors import MtxError, first_line
from mtx.spm_tokenizer import SpmPairTokenizer
from mtx.tokenizer import Tokenizer

# mtx.checkpoint.FORMAT: that module sits above the data stage (it needs the model), so its marker is repeated here.
CHECKPOINT_FORMAT = "mtx-checkpoint-v1"
FROM_KEY = "data.bpe.from"


def vocabulary_file(data: DataConfig) -> Path | None:
    """The file `data.bpe.from` is read from (a data/ folder's tokenizer.json), or None when the recipe learns its
    own vocabulary: its size and time are part of the data's fingerprint."""
    if data.bpe.from_ is None:
        return None
    path = Path(data.bpe.from_)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise MtxError(
            f"{FROM_KEY} = {data.bpe.from_}: {file} does not exist (relative paths start at the working directory "
            f"{Path.cwd()}). Name a tokenizer.json, a prepared run's data/ folder or an mtx checkpoint."
        )
    return file


def read_tokenizer(file: Path) -> Tokenizer | SpmPairTokenizer:
    """The tokenizer of a tokenizer.json or of an mtx checkpoint (its tensors mapped, not read)."""
    try:
        if file.suffix == ".json":
            return Tokenizer.from_file(file)
        return Tokenizer.from_str(_checkpoint_tokenizer(file))
    except MtxError:
        raise
    except Exception as e:  # a library's error about a user's file: torch.load's, the tokenizers JSON parser's
        raise MtxError(
            f"{FROM_KEY}: cannot read a tokenizer from {file} ({type(e).__name__}: {first_line(e, 200)}). Name a "
            "tokenizer.json, a prepared run's data/ folder or an mtx checkpoint."
        ) from None


def _checkpoint_tokenizer(file: Path) -> str:
    import torch  # here: prepare's worker processes, which import this module, need no torch

    checkpoint = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    if not isinstance(checkpoint, dict) or checkpoint.get("format") != CHECKPOINT_FORMAT:
        raise MtxError(f"{FROM_KEY}: {file} is not an mtx checkpoint (no '{CHECKPOINT_FORMAT}' format marker); a "
                       "tokenizer file must end in .json.")
    return checkpoint["tokenizer"]


def borrowed_tokenizer(data: DataConfig) -> Tokenizer | SpmPairTokenizer | None:
    """The tokenizer `data.bpe.from` names, once it is known to hold every tag of the recipe; None when the recipe
    learns its own."""
    file = vocabulary_file(data)
    if file is None:
        return None
    tokenizer = read_tokenizer(file)
    for lang, tag in data.target_tags.items():
        if tag not in tokenizer.tags:
            held = ", ".join(tokenizer.tags) or "none"
            raise MtxError(
                f"data.target_tag = {data.target_tag!r} spells {tag!r} for {lang}, which is not a tag of the tokenizer "
                f"of {FROM_KEY} = {data.bpe.from_} (its tags: {held}), and adding it would change that vocabulary. "
                f"Translate into a language it has a tag for, or learn a vocabulary (unset {FROM_KEY})."
            )
    for i, corpus in enumerate(data.corpora):
        if corpus.tag is not None and corpus.tag not in tokenizer.tags:
            held = ", ".join(tokenizer.tags) or "none"
            raise MtxError(
                f"{data.corpus_key(i)}.tag = {corpus.tag!r} is not a special token of the tokenizer of "
                f"{FROM_KEY} = {data.bpe.from_} (its tags: {held}), and adding it would change that vocabulary. "
                f"Use one of its tags, drop the tag, or learn a vocabulary (unset {FROM_KEY})."
            )
    return tokenizer


def learn_tokenizer(data: DataConfig, kept_pairs: Iterable[tuple[str, str]], kept: int, sample: int,
                    progress: Progress) -> Tokenizer:
    """A joint vocabulary of data.bpe's style, model and size, learnt on `sample` of the `kept` training pairs,
    evenly spaced, with the corpora's tags as special tokens."""
    bpe = data.bpe
    task = progress.add_task(f"learning a {bpe.style} {bpe.model} vocabulary ({bpe.vocab_size:,} tokens)", total=None)
    tokenizer = Tokenizer.train(_evenly_spaced(kept_pairs, kept, sample), bpe.vocab_size, bpe.min_frequency,
                                data.tags, style=bpe.style, model=bpe.model)
    progress.update(task, total=1, completed=1)
    return tokenizer


def _evenly_spaced(pairs: Iterable[tuple[str, str]], total: int, sample: int) -> Iterator[str]:
    """Source and target lines of `sample` of the `total` pairs, evenly spaced through them."""
    for rank, (src, tgt) in enumerate(pairs):
        if (rank * sample) // total != ((rank + 1) * sample) // total:
            yield src
            yield tgt
