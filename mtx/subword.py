"""What every mtx vocabulary shares, whichever library segments its text (mtx.tokenizer's own, learnt by mtx;
mtx.spm_tokenizer's, imported with a MarianMT model): the four special tokens at fixed ids, the word mark of
SentencePiece's spelling, the normalised text mtx's own vocabularies are learnt on, and the words of text pieces.
"""

from __future__ import annotations

import functools
import re
import unicodedata

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # in id order
METASPACE = "▁"

# C0/C1 control characters that are not whitespace (those are collapsed separately), and the byte-order mark.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ufeff]")


def normalize_text(text: str) -> str:
    """NFC, no control characters, single spaces, no leading or trailing space.

    Applied to every sentence before training and translation with mtx's own vocabulary
    (`Tokenizer.normalize`), so the model never sees two spellings of the same text (composed vs decomposed
    umlauts, tabs vs spaces) and a line always stays one line.
    """
    text = unicodedata.normalize("NFC", _CONTROL.sub("", text))
    return " ".join(text.split())


def word_of_each_piece(pieces: list[str]) -> list[int | None]:
    """For the text pieces whose concatenation is a sentence, the index of the word of
    `normalize_text(sentence)` where each piece's first visible character falls; None for a piece that shows
    none (a lone space, a control character). An empty piece (a token holding the later bytes of a character
    that an earlier one starts) belongs to the word of the character before it.

    The words are those `normalize_text` separates: control characters removed, then runs of whitespace
    split. Its NFC composition neither joins nor splits words, so the words counted here are its words.
    """
    words, in_word, owners = 0, False, []  # words begun so far; whether the last character is part of one
    for piece in pieces:
        if not piece:
            owners.append(words - 1 if in_word else None)
            continue
        visible = _CONTROL.sub("", piece)
        words_in_piece = visible.split()
        if not words_in_piece:  # whitespace alone ends a word; control characters alone change nothing
            owners.append(None)
            in_word = in_word and not visible
            continue
        continues = in_word and not visible[0].isspace()
        owners.append(words - 1 if continues else words)
        words += len(words_in_piece) - continues
        in_word = not visible[-1].isspace()
    return owners


class Tags:
    """What both tokenizers derive from their tags (the special tokens beyond the fixed four: corpus and
    target-language tags, `<bt>`, `<2de>`, or an imported model's `>>fra<<` codes), given each tag's id in id
    order as `_tag_ids`."""

    _tag_ids: dict[str, int]

    @property
    def tags(self) -> list[str]:
        """The tags, in id order."""
        return list(self._tag_ids)

    @functools.cached_property
    def special_tokens(self) -> dict[int, str]:
        """Every special token by its id, tags included: they add no text and belong to no word."""
        return {**dict(enumerate(SPECIAL_TOKENS)), **{i: tag for tag, i in self._tag_ids.items()}}
