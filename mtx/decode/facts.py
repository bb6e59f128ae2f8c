"""What a model says of itself, read from its checkpoint's metadata alone: `ModelFacts`.

Every check that depends on the model takes this one value: a request's rules (mtx.decode.request), an engine's
capability table (mtx.decode.ct2_capabilities), the server's OpenAPI schema and its token counts, a shard's
description. It holds the tokenizer, the limits (vocabulary, positions, decoder layers: mtx.decode.limits), the
recipe's decoding options (with the length penalty `mtx average --tune-lenpen` chose, stored in the recipe),
the lexical table a shortlist reads, the target languages and the doubt thresholds. Reading it maps the weights
from the files and leaves them unread (mtx.decode.ensemble.read_metadata), so a process that only checks
requests, as the server's does, costs what a tokenizer costs, whatever the model's size.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtx.config.decode import DecodeConfig
from mtx.data.lexicon import Lexicon, width_of
from mtx.decode.doubts import DoubtThresholds
from mtx.decode.limits import ModelLimits
from mtx.decode.target_lang import TargetLanguages
from mtx.decode.translation import Source
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer, normalize_text


@dataclass(frozen=True, eq=False)
class ModelFacts:
    """One model, or an ensemble searched as one (the first checkpoint's recipe, table and languages decide)."""

    checkpoints: tuple[Path, ...]
    metadata: tuple[dict[str, Any], ...]  # each checkpoint's dict without its weights
    tokenizer: Tokenizer
    limits: ModelLimits
    defaults: DecodeConfig  # the first checkpoint's recipe's `decode:`, which a request's unset options take
    lexicon: Lexicon | None  # the first checkpoint's lexical table, which decode.shortlist needs
    targets: TargetLanguages  # the languages decode.target_lang may name, and their tags
    doubts: DoubtThresholds  # where a translation's doubts start (mtx.decode.doubts)

    @classmethod
    def read(cls, checkpoints: Sequence[Path]) -> ModelFacts:
        """The facts of the checkpoint files, weights left unread; refuses checkpoints that cannot be ensembled
        (their tokenizers or vocabularies differ), naming them."""
        from mtx.decode.ensemble import read_metadata

        tokenizer, metadata = read_metadata(checkpoints)
        return cls.of_metadata(checkpoints, tokenizer, metadata)

    @classmethod
    def of_metadata(cls, checkpoints: Sequence[Path], tokenizer: Tokenizer, metadata: Sequence[dict[str, Any]]
                    ) -> ModelFacts:
        """The facts of checkpoints whose metadata is at hand already (a command that loaded their weights)."""
        first = metadata[0]
        return cls(tuple(checkpoints), tuple(metadata), tokenizer, ModelLimits.of_checkpoints(metadata),
                   DecodeConfig.of_checkpoint(first), Lexicon.of_checkpoint(first),
                   TargetLanguages.of_checkpoint(first, tokenizer), DoubtThresholds.of_checkpoint(first))

    @property
    def source_language(self) -> str:
        """The first checkpoint's source language (its recipe's data.src_lang), whose rules cut sentences."""
        data = (self.metadata[0].get("recipe") or {}).get("data") or {}
        return data.get("src_lang") or "en"

    @property
    def lexicon_width(self) -> int:
        """The translations per source token the lexical table holds, 0 without one: the most a shortlist takes."""
        return width_of(self.lexicon)

    def encode(self, sentences: Sequence[str], target_lang: str | None = None) -> list[Source]:
        """`encode_sentences` with this model's tokenizer and target languages."""
        return encode_sentences(self.tokenizer, sentences, self.targets, target_lang)

    def holds(self, ids: Sequence[int]) -> bool:
        """Whether the model reads these tokens whole: they and EOS fit in its positions (a target's tokens are
        fed after BOS, so they take as many positions as a source's with EOS)."""
        return len(ids) + 1 <= self.limits.max_positions


def encode_sentences(tokenizer: Tokenizer, sentences: Sequence[str], targets: TargetLanguages | None = None,
                     target_lang: str | None = None) -> list[Source]:
    """Each sentence as its vocabulary reads it (`Tokenizer.normalize`: normalised as the training data was, or
    the raw line for an imported SentencePiece pair, as MarianTokenizer reads it) and tokenised: its token ids,
    EOS not included, or None where `normalize_text` leaves nothing (an empty line), which gets no translation.
    With the model's `targets` and a `target_lang`, a sentence without a target tag of its own gets that
    language's."""
    texts = [tokenizer.normalize(sentence) if normalize_text(sentence) else "" for sentence in sentences]
    if targets is not None:
        texts = targets.tagged(texts, target_lang)
    encoded = iter(tokenizer.encode_batch([text for text in texts if text]))
    return [next(encoded) if text else None for text in texts]


def encode_prefixes(tokenizer: Tokenizer, prefixes: Sequence[str] | None, todo: Sequence[int],
                    limits: Sequence[int], lines: Sequence[int]) -> list[list[int]] | None:
    """The target prefixes (--prefix) of the sentences `todo` (indices into `prefixes`) as token ids, None where
    no sentence has one; refused where a prefix is longer than its sentence's output limit (`limits`, one per
    sentence of `todo`), naming its input line (`lines`: each sentence's index in the input)."""
    if prefixes is None or not any(prefixes):
        return None
    ids = tokenizer.encode_batch([tokenizer.normalize(prefixes[i]) for i in todo], target=True)
    for j, (prefix, limit) in enumerate(zip(ids, limits, strict=True)):
        if len(prefix) > limit:
            raise MtxError(f"--prefix, line {lines[todo[j]] + 1}: the prefix has {len(prefix)} tokens, more than the "
                           f"{limit} its sentence's translation may have (--max-len-a, --max-len-b and the model's "
                           "positions): shorten it or raise those.")
    return ids
