"""The joint subword vocabulary: byte-level BPE over both languages, with fixed special-token ids.

Why byte-level: every string is a sequence of UTF-8 bytes, and the 256 bytes are the BPE's initial alphabet,
so any character — an emoji, a CJK ideograph, a symbol never seen in training — is encoded exactly (as its
bytes when no merge covers it) and nothing ever becomes UNK. Decoding is therefore lossless for every string:
`decode(encode(s)) == s`, including spacing around punctuation ("Hallo , Welt" and "Hallo, Welt" stay
different). A space is prepended before pre-tokenization so a word is spelled the same at the start of a
sentence as inside it; the decoder strips that one space again. UNK keeps its fixed id only for the contract.

Special tokens are never added by `encode`: the stored data holds plain sentence ids and the trainer adds
BOS/EOS where the model needs them. Literal text such as "</s>" in the input is encoded as ordinary text.
"""

from __future__ import annotations

import hashlib
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

PAD, BOS, EOS, UNK = 0, 1, 2, 3
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]  # in id order

# C0/C1 control characters that are not whitespace (those are collapsed separately), and the byte-order mark.
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1b\x7f-\x84\x86-\x9f\ufeff]")


def normalize_text(text: str) -> str:
    """NFC, no control characters, single spaces, no leading or trailing space.

    Applied to every sentence before training and translation, so the model never sees two spellings of the
    same text (composed vs decomposed umlauts, tabs vs spaces) and a line always stays one line.
    """
    text = unicodedata.normalize("NFC", _CONTROL.sub("", text))
    return " ".join(text.split())


class Tokenizer:
    """A trained BPE vocabulary: text ↔ ids without special tokens."""

    def __init__(self, hf: HfTokenizer) -> None:
        hf.encode_special_tokens = True  # "<s>" typed by a user is text, not a control token
        self._hf = hf

    @classmethod
    def train(cls, lines: Iterable[str], vocab_size: int, min_frequency: int = 2) -> Tokenizer:
        """Learn merges from `lines` (streamed: only word counts are held in memory)."""
        hf = HfTokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK]))
        hf.normalizer = normalizers.Prepend(" ")
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        hf.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        hf.train_from_iterator(lines, trainer)
        return cls(hf)

    @classmethod
    def from_str(cls, json_text: str) -> Tokenizer:
        return cls(HfTokenizer.from_str(json_text))

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        return cls.from_str(Path(path).read_text(encoding="utf-8"))

    def to_str(self) -> str:
        """The whole tokenizer as JSON: what checkpoints embed so they need no other file."""
        return self._hf.to_str()

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(), encoding="utf-8")

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_str().encode("utf-8")).hexdigest()

    @property
    def vocab_size(self) -> int:
        return self._hf.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self._hf.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Many sentences at once, in Rust (parallel unless TOKENIZERS_PARALLELISM=false)."""
        return [e.ids for e in self._hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text for `ids`, skipping special tokens (pad, bos, eos and the never-produced unk)."""
        return self._hf.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return self._hf.decode_batch([list(ids) for ids in batch], skip_special_tokens=True)
