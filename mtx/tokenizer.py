"""The joint subword vocabulary over both languages, with fixed special-token ids, in one of two styles.

Both styles are lossless and never produce UNK: `decode(encode(s)) == s` for every string that
`normalize_text` returns (control characters removed, NFC, runs of whitespace made one space, no space at
either end: mtx applies it to every sentence before encoding, so it is part of the contract), spacing around
punctuation included ("Hallo , Welt" and "Hallo, Welt" stay different). UNK keeps its fixed id only for the
contract.

- `bytelevel` (GPT-2's): every string is a sequence of UTF-8 bytes, and the 256 bytes, spelled as printable
  characters ("Ġ" for the space), are the BPE's initial alphabet, so any character — an emoji, a CJK ideograph,
  a symbol never seen in training — is encoded exactly, as its bytes when no merge covers it. A space is
  prepended before pre-tokenization so a word is spelled the same at the start of a sentence as inside it; the
  decoder strips that one space again. Punctuation and digits are split from letters before BPE.
- `metaspace` (SentencePiece's, as Marian, OpenNMT-py, Sockeye and most WMT systems use): a space becomes "▁"
  and starts the word it precedes (one is put before the first word too), words are split at spaces only,
  and the initial alphabet is characters, not bytes: a French "é" is one symbol before any merge, so a
  vocabulary of a given size spends fewer tokens on accented text. A character the vocabulary lacks is spelled
  as its UTF-8 bytes, tokens "<0x00>" … "<0xFF>" that follow the special tokens (byte fallback). The model is
  BPE or unigram (Kudo 2018). A literal "▁" in the text would decode as a space, so the normalizer first
  makes it U+0001, a control character that normalized text never holds, and the decoder makes that "▁" again.

Special tokens are never added by `encode`: the stored data holds plain sentence ids and the trainer adds
BOS/EOS where the model needs them. Literal text such as "</s>" in the input is encoded as ordinary text.

Tags are the exception: special tokens beyond the fixed four, one per tagged corpus (`data.sources[i].tag`, e.g.
"<bt>" before back-translated sentences) and one per target language of a model of several (`data.target_tag`,
e.g. "<2de>"), which the vocabulary holds whole so that BPE never splits them. The tags that start a sentence,
each followed by a space, are encoded as their one id each, and `decode` drops them like every special token; a
tag anywhere else is ordinary text, as "</s>" is. So the tagged lines of a prepared valid or test set
("<bt> The house is red.") translate as the model was trained on them.

Word alignments need to know which word of the decoded text each token belongs to: `pieces` gives the text
each token adds, and `word_of_each_token` the word, counted as `normalize_text` separates words.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import Tokenizer as HfTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

# The shared facts, kept importable from here (`X as X`: named for the modules that import them from mtx.tokenizer).
from mtx.subword import BOS as BOS
from mtx.subword import EOS as EOS
from mtx.subword import METASPACE, SPECIAL_TOKENS, UNK, Tags, normalize_text, word_of_each_piece
from mtx.subword import PAD as PAD

if TYPE_CHECKING:
    from mtx.spm_tokenizer import SpmPairTokenizer

BYTE_LEVEL_SPACE = "Ġ"  # how a byte-level vocabulary spells the space byte: its tokens' word mark
_METASPACE_STAND_IN = "\x01"  # what a literal "▁" is while encoded: normalize_text removes every U+0001
BYTE_TOKENS = [f"<0x{byte:02X}>" for byte in range(256)]  # metaspace's byte fallback, in byte order
_BYTE_TOKEN = re.compile(r"<0x([0-9A-F]{2})>")
_ALPHABET_LIMIT = 1000  # metaspace: the most frequent characters that are symbols; the rest are bytes
_REPEATS = 4096  # unigram training: the copies of a counted word in one string handed to the trainer
_FALLBACK_SCORE = -1e9  # a unigram score no segmentation of ordinary text prefers: see `_metaspace_unigram`


def why_not_a_tag(text: str) -> str | None:
    """Why `text` cannot be a corpus tag (`data.sources[i].tag`), said as the end of a sentence that names it and
    what to do instead; None if it can be one.

    A tag is a special token that the vocabulary holds whole and decoding drops, read as such only at the start
    of a line and before a space (`Tokenizer.encode`). So it must be one word that `normalize_text` leaves as it
    is, or a line that starts with it would not start with it once normalized. And it must spell nothing the
    vocabulary already uses, or that use would become the tag: every "A" of the text would vanish with a tag
    "A" (a character is a symbol of the alphabet in both styles), every space with a tag "▁", and a tag
    "<0x41>" would take the byte token's place in a metaspace vocabulary, leaving an id no embedding has. So
    are refused: the four fixed special tokens; the spelling of a byte token, in both styles and in either
    case (Hugging Face's byte-fallback decoder reads lower-case hex digits too); a single character; and any
    tag holding a word mark ("▁", "Ġ"), with which the pieces of text of either style spell a space.
    """
    if text.split() != [text]:
        return "must be one word without spaces, e.g. <bt>"
    if (normalized := normalize_text(text)) != text:
        return (f"becomes {normalized!r} when mtx normalizes a line (NFC, control characters removed), so a line "
                "starting with it would not start with it any more: write it in NFC without control characters, "
                "e.g. <bt>")
    if text in SPECIAL_TOKENS:
        return f"is one of mtx's own special tokens ({', '.join(SPECIAL_TOKENS)}): choose another, e.g. <bt>"
    if re.fullmatch(_BYTE_TOKEN.pattern, text, re.IGNORECASE):
        return ("spells a byte token (<0x00> … <0xFF>, how a metaspace vocabulary spells the bytes of a character "
                "it has no piece for): choose another, e.g. <bt>")
    if mark := next((mark for mark in (METASPACE, BYTE_LEVEL_SPACE) if mark in text), None):
        return (f"holds {mark!r}, the word mark with which the vocabulary's own pieces spell a space: choose a tag "
                "without it, e.g. <bt>")
    if len(text) == 1:
        return ("is a single character, a symbol of the vocabulary's own alphabet, which would become the tag "
                "wherever the text holds it: choose a longer tag, e.g. <bt>")
    return None


def byte_level_spelling() -> dict[str, int]:
    """The byte each character of a byte-level BPE token stands for (GPT-2's alphabet, which the ByteLevel
    pre-tokenizer uses): the printable Latin-1 bytes stand for themselves, the other bytes (controls, the
    space, the non-breaking space, the soft hyphen) for the characters from U+0100 on, in byte order, so no
    token's spelling holds a space or a control character. The space is spelled "Ġ", U+0120."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    spelling, moved = {}, 0
    for byte in range(256):
        if byte in printable:
            spelling[chr(byte)] = byte
        else:
            spelling[chr(256 + moved)] = byte
            moved += 1
    return spelling


_BYTE_OF = byte_level_spelling()


def _bytelevel_bpe(lines: Iterable[str], vocab_size: int, min_frequency: int, specials: list[str]) -> HfTokenizer:
    """GPT-2's byte-level BPE, as every mtx before vocabulary styles learnt it: their checkpoints hold this. A
    merge whose result spells a tag is dropped, with every merge built on it (`_without_reserved`); no merge of
    a corpus without such words is, and its vocabulary is the one mtx always learnt."""
    hf = HfTokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK]))
    hf.normalizer = normalizers.Prepend(" ")
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = decoders.Sequence([decoders.ByteLevel(), decoders.Strip(" ", 1, 0)])
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    hf.train_from_iterator(lines, trainer)
    spec = json.loads(hf.to_str())
    tokens, merges = _without_reserved(spec["model"], specials, set(specials))
    spec["model"].update(vocab={t: i for i, t in enumerate([*specials, *tokens])}, merges=merges)
    return HfTokenizer.from_str(json.dumps(spec))


def _without_reserved(model: dict, specials: list[str], reserved: set[str]) -> tuple[list[str], list[list[str]]]:
    """The learnt tokens of a trained BPE `model` (its vocabulary after the specials, in id order) and its merges,
    less every merge whose result spells a `reserved` token and every merge built on one.

    Hugging Face's trainer gives a merge that spells a special token (a tag "og", or "Ġdog" in a byte-level
    vocabulary) that token's own id, so the text it spells would vanish as the special token when decoded; one
    that spells a byte token would decode as that byte. Without those merges, the text is spelled by the
    pieces they were made of."""
    reserved, merges = set(reserved), []
    for left, right in model["merges"]:
        if left in reserved or right in reserved or left + right in reserved:
            reserved.add(left + right)
        else:
            merges.append([left, right])
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda item: item[1])[len(specials):]
              if t not in reserved]
    return tokens, merges


def _alphabet_limit(pieces: int) -> int:
    """How many of the text's characters, the most frequent, a metaspace vocabulary of `pieces` learnt pieces
    (besides its specials and byte tokens) holds as pieces of their own: `_ALPHABET_LIMIT`, or half the pieces
    in a small vocabulary, so that room is left for pieces longer than a character. The others are spelled by
    their bytes."""
    return min(_ALPHABET_LIMIT, max(1, pieces // 2))


def _metaspace(hf: HfTokenizer) -> HfTokenizer:
    """The normalizer, pre-tokenizer and decoder of the metaspace style, around `hf`'s model."""
    hf.normalizer = normalizers.Replace(METASPACE, _METASPACE_STAND_IN)
    hf.pre_tokenizer = pre_tokenizers.Metaspace(replacement=METASPACE, prepend_scheme="always", split=True)
    hf.decoder = decoders.Sequence([
        decoders.Replace(METASPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
        decoders.Replace(_METASPACE_STAND_IN, METASPACE),
    ])
    return hf


def _metaspace_bpe(lines: Iterable[str], vocab_size: int, min_frequency: int, specials: list[str]) -> HfTokenizer:
    """Characters as the initial alphabet (the most frequent, `_alphabet_limit`), merges learnt over them, then the
    byte tokens put after the specials and every learnt token's id moved up. A merge whose result spells a
    special or byte token is dropped, with every merge built on it (`_without_reserved`)."""
    learnt = vocab_size - len(BYTE_TOKENS)  # the trainer counts the specials in its size
    trainer = trainers.BpeTrainer(vocab_size=learnt, min_frequency=min_frequency, special_tokens=specials,
                                  limit_alphabet=_alphabet_limit(learnt - len(specials)), show_progress=False)
    hf = _metaspace(HfTokenizer(models.BPE(unk_token=SPECIAL_TOKENS[UNK])))
    hf.train_from_iterator(lines, trainer)
    spec = json.loads(hf.to_str())
    tokens, merges = _without_reserved(spec["model"], specials, {*specials, *BYTE_TOKENS})
    spec["model"].update(vocab={t: i for i, t in enumerate([*specials, *BYTE_TOKENS, *tokens])}, merges=merges,
                         byte_fallback=True)
    return HfTokenizer.from_str(json.dumps(spec))


def _metaspace_words(lines: Iterable[str]) -> Counter[str]:
    """How often each word of `lines` occurs, the words cut as the metaspace normalizer and pre-tokenizer cut
    them (`Tokenizer.words`): a literal "▁" made the stand-in, then each space a "▁" that starts the word after
    it, and one put before the first word of a line that does not start with a space."""
    counts: Counter[str] = Counter()
    for line in lines:
        if line:
            text = line.replace(METASPACE, _METASPACE_STAND_IN)
            counts.update((text[1:] if text[0] == " " else text).split(" "))
    return Counter({METASPACE + word: count for word, count in counts.items()})


def _unigram_required(specials: list[str]) -> set[str]:
    """The characters a unigram vocabulary with `specials` holds as pieces whatever its text: the word mark, which
    starts every word, and every character that the special and byte tokens are spelt with (why: see
    `_metaspace_unigram`)."""
    return {METASPACE} | {character for token in [*specials, *BYTE_TOKENS] for character in token}


def smallest_vocab_size(style: str, model: str, tags: Iterable[str] = ()) -> int:
    """The fewest tokens a vocabulary of `style` and `model` with `tags` can be learnt with: its special tokens
    and 256 tokens for bytes (the byte-level alphabet; metaspace's byte tokens); for metaspace, at least one
    piece more (`_alphabet_limit`), and for unigram every character it must hold besides
    (`_unigram_required`, `_unigram_alphabet`). With fewer, the trainer fails or makes a larger vocabulary than
    asked for."""
    specials = [*SPECIAL_TOKENS, *tags]
    if style == "bytelevel":
        return len(specials) + 256
    required = _unigram_required(specials) if model == "unigram" else set()
    return len(specials) + len(BYTE_TOKENS) + len(required) + 1


def _unigram_alphabet(characters: Counter[str], required: set[str], pieces: int) -> set[str]:
    """The characters that are pieces of a unigram vocabulary of `pieces` learnt pieces: the `required` ones, and
    the text's most frequent as a metaspace BPE keeps them (`_alphabet_limit`), as many as fit beside them with
    one piece to spare: Hugging Face's trainer stops adding pieces at the vocabulary's size only when it reaches
    that size from below, and would add every piece it found to an alphabet that fills the vocabulary."""
    frequent = [character for character, _ in characters.most_common(_alphabet_limit(pieces))]
    room = max(0, pieces - 1 - len(required))
    return required | set([character for character in frequent if character not in required][:room])


def _repeated(words: Counter[str], cuts: dict[int, str]) -> Iterator[str]:
    """Text in which a split at spaces finds each of `words` as often as it is counted, cut into the parts between
    the characters that `cuts` maps to a space (a word of those alone is no part at all)."""
    for word, count in words.items():
        word = word.translate(cuts)
        for start in range(0, count, _REPEATS):
            yield " ".join([word] * min(_REPEATS, count - start))


def _metaspace_unigram(lines: Iterable[str], vocab_size: int, specials: list[str]) -> HfTokenizer:
    """A unigram language model over pieces (SentencePiece's default), then the byte tokens after the specials.

    Hugging Face's unigram trainer makes every character of its input a piece, and fails when they do not fit
    the vocabulary, yet byte fallback spells a character the vocabulary lacks. So the words are counted here
    (`_metaspace_words`, what the trainer would count), only the most frequent characters kept
    (`_unigram_alphabet`: SentencePiece's character coverage), and the trainer handed the counted words cut at
    every other character: no piece holds one, and the text spells it by its bytes.

    A unigram model matches pieces against the text, special and byte tokens included, so "<s>" typed by a user
    could become BOS. Those tokens get a score no segmentation of ordinary text prefers, and every character of
    their spelling is in the alphabet, so spelling them as ordinary pieces always scores higher."""
    learnt = vocab_size - len(BYTE_TOKENS)  # the trainer counts the specials in its size
    words = _metaspace_words(lines)
    characters: Counter[str] = Counter()
    for word, count in words.items():
        for character in word:
            characters[character] += count
    reserved = [*specials, *BYTE_TOKENS]
    required = _unigram_required(specials)
    alphabet = _unigram_alphabet(characters, required, learnt - len(specials))
    trainer = trainers.UnigramTrainer(vocab_size=learnt, special_tokens=specials, unk_token=SPECIAL_TOKENS[UNK],
                                      initial_alphabet=sorted(required), max_piece_length=16, show_progress=False)
    hf = HfTokenizer(models.Unigram())
    hf.pre_tokenizer = pre_tokenizers.Split(" ", "removed")  # the words as `_repeated` spells them
    hf.train_from_iterator(_repeated(words, {ord(c): " " for c in characters if c not in alphabet}), trainer)
    spec = json.loads(_metaspace(hf).to_str())
    taken = set(reserved)
    pieces = [piece for piece in spec["model"]["vocab"][len(specials):] if piece[0] not in taken]
    spec["model"].update(vocab=[[token, _FALLBACK_SCORE] for token in reserved] + pieces, byte_fallback=True)
    return HfTokenizer.from_str(json.dumps(spec))


class Tokenizer(Tags):
    """A trained subword vocabulary of either style: text ↔ ids without special tokens."""

    def __init__(self, hf: HfTokenizer) -> None:
        hf.encode_special_tokens = True  # "<s>" typed by a user is text, not a control token
        self._hf = hf

    @classmethod
    def train(cls, lines: Iterable[str], vocab_size: int, min_frequency: int = 2, tags: Iterable[str] = (),
              style: str = "metaspace", model: str = "bpe") -> Tokenizer:
        """Learn a vocabulary of `vocab_size` tokens, specials (and byte tokens) included, from `lines`
        (streamed: only word counts are held in memory); `tags` become special tokens after the fixed four, in
        their order, each one that `why_not_a_tag` accepts. `min_frequency` applies to BPE merges."""
        specials = [*SPECIAL_TOKENS, *tags]
        for tag in specials[len(SPECIAL_TOKENS):]:
            if (problem := why_not_a_tag(tag)) is not None:
                raise ValueError(f"The tag {tag!r} {problem}.")
        if style == "bytelevel":
            return cls(_bytelevel_bpe(lines, vocab_size, min_frequency, specials))
        if model == "bpe":
            return cls(_metaspace_bpe(lines, vocab_size, min_frequency, specials))
        return cls(_metaspace_unigram(lines, vocab_size, specials))

    @classmethod
    def from_str(cls, json_text: str) -> Tokenizer | SpmPairTokenizer:
        """The tokenizer `to_str` wrote: mtx's own, or an imported SentencePiece pair (mtx.spm_tokenizer), which
        checkpoints and data folders store in the same place."""
        from mtx.spm_tokenizer import SpmPairTokenizer  # here: sentencepiece is loaded only for an imported pair

        if SpmPairTokenizer.wrote(json_text):
            return SpmPairTokenizer.from_str(json_text)
        return cls(HfTokenizer.from_str(json_text))

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer | SpmPairTokenizer:
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

    @functools.cached_property
    def _tag_ids(self) -> dict[str, int]:
        """Each tag's id, in id order, read from the vocabulary: a tokenizer loaded from JSON knows its tags."""
        return {token.content: i for i, token in sorted(self._hf.get_added_tokens_decoder().items())
                if token.special and i >= len(SPECIAL_TOKENS)}

    def split_tags(self, text: str) -> tuple[list[int], str]:
        """(the ids of the tags that start `text`, each followed by a space; the text after them)."""
        ids = []
        while self._tag_ids:
            first, _, rest = text.partition(" ")
            if first not in self._tag_ids:
                break
            ids.append(self._tag_ids[first])
            text = rest
        return ids, text

    def normalize(self, text: str) -> str:
        """The text this vocabulary reads for a line of input: `normalize_text`'s, as the text it was learnt on.
        Callers hand `encode` this, never the raw line (an imported SentencePiece pair reads the raw line)."""
        return normalize_text(text)

    def token_strings(self) -> list[str]:
        """The vocabulary as strings in id order: how CTranslate2 names tokens."""
        return [self._hf.id_to_token(i) for i in range(self.vocab_size)]

    def encode(self, text: str, target: bool = False) -> list[int]:
        """The ids of `text`, no special token added. `target` (the text is on the target side) changes nothing:
        one joint model segments both languages, unlike an imported pair's (mtx.spm_tokenizer)."""
        tags, rest = self.split_tags(text)
        return [*tags, *self._hf.encode(rest, add_special_tokens=False).ids]

    def encode_batch(self, texts: list[str], target: bool = False) -> list[list[int]]:
        """Many sentences at once, in Rust (parallel unless TOKENIZERS_PARALLELISM=false): the texts after their
        leading tags are encoded in one call, and the tags' ids put before their text's. `target`: as `encode`."""
        split = [self.split_tags(text) for text in texts]
        encoded = self._hf.encode_batch([rest for _, rest in split], add_special_tokens=False)
        return [[*tags, *e.ids] for (tags, _), e in zip(split, encoded, strict=True)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text for `ids`, skipping special tokens (pad, bos, eos, the never-produced unk and tags)."""
        return self._hf.decode(list(ids), skip_special_tokens=True)

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return self._hf.decode_batch([list(ids) for ids in batch], skip_special_tokens=True)

    @property
    def style(self) -> str:
        """bytelevel or metaspace, read from the tokenizer itself: a checkpoint's tokenizer knows its style."""
        return "metaspace" if isinstance(self._hf.pre_tokenizer, pre_tokenizers.Metaspace) else "bytelevel"

    @property
    def model(self) -> str:
        """bpe or unigram."""
        return "unigram" if isinstance(self._hf.model, models.Unigram) else "bpe"

    @property
    def word_mark(self) -> str:
        """The character that starts a word's first token: a subword never spans one."""
        return METASPACE if self.style == "metaspace" else BYTE_LEVEL_SPACE

    def words(self, text: str) -> list[str]:
        """The words BPE segments `text` into, in its symbols' spelling: what this tokenizer's normalizer and
        pre-tokenizer make of it (byte-level splits punctuation and digits from letters; metaspace at spaces)."""
        return [word for word, _ in self._hf.pre_tokenizer.pre_tokenize_str(self._hf.normalizer.normalize_str(text))]

    @functools.cached_property
    def _text_of_token(self) -> dict[int, str]:
        """The text of each id whose bytes are whole UTF-8 characters (for metaspace: every token but the byte
        tokens, "▁" as a space; none for a special token), the ids `pieces` needs not decode byte by byte. Made on
        first use: only word alignments need it."""
        texts = {}
        for token, i in self._hf.get_vocab().items():
            if i in self.special_tokens:
                texts[i] = ""
            elif self.style == "metaspace" and not _BYTE_TOKEN.fullmatch(token):
                texts[i] = token.replace(METASPACE, " ")
            elif self.style == "bytelevel" and all(character in _BYTE_OF for character in token):
                with contextlib.suppress(UnicodeDecodeError):
                    texts[i] = bytes(_BYTE_OF[character] for character in token).decode("utf-8")
        return texts

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The text each token adds to `decode(ids)`, one piece per id, with the space the decoder strips
        from the start still there: "".join(pieces(ids)) is decode(ids), but for that space.

        A character whose UTF-8 bytes are spread over several tokens belongs to the token of its first byte.
        Special tokens (tags included) add nothing. Bytes that make no character decode as U+FFFD, each style
        as its decoder does: byte-level per invalid sequence, metaspace one per byte token of a run of byte
        tokens that is not valid UTF-8 as a whole.
        """
        ids = list(ids)
        if self.style == "bytelevel":
            return self._byte_level_pieces(ids)
        pieces = [""] * len(ids)
        run: list[int] = []  # positions of byte tokens in a row; special tokens between them, dropped, join them

        def decode_run() -> None:
            data = bytes(int(self._hf.id_to_token(ids[p])[3:5], 16) for p in run)
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                for p in run:
                    pieces[p] = "\ufffd"
            else:
                start = 0
                for character in text:
                    pieces[run[start]] += character
                    start += len(character.encode("utf-8"))
            run.clear()

        for position, i in enumerate(ids):
            if i in self.special_tokens:
                continue
            if i in self._text_of_token:
                decode_run()
                pieces[position] = self._text_of_token[i]
            else:
                run.append(position)
        decode_run()
        return [piece.replace(_METASPACE_STAND_IN, METASPACE) for piece in pieces]

    def _byte_level_pieces(self, ids: list[int]) -> list[str]:
        """`pieces` for byte-level tokens, whose characters may span tokens: an incremental UTF-8 decoder, as
        the byte-level decoder decodes (U+FFFD per invalid sequence)."""
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[list[str]] = []
        started = None  # the token holding the first byte of an unfinished character
        for token, i in enumerate(ids):
            if started is None and i in self._text_of_token:  # most tokens: whole characters
                pieces.append([self._text_of_token[i]])
                continue
            pieces.append([])
            for character in "" if i in self.special_tokens else self._hf.id_to_token(i):
                text = utf8.decode(bytes([_BYTE_OF[character]]))
                if text and started is not None:  # that character is complete, or known to be invalid
                    pieces[started].append(text[0])
                    text, started = text[1:], None
                pieces[token].append(text)
                if started is None and utf8.getstate()[0]:
                    started = token
        if started is not None:
            pieces[started].append(utf8.decode(b"", final=True))
        return ["".join(piece) for piece in pieces]

    def word_of_each_token(self, ids: Iterable[int]) -> list[int | None]:
        """For each token, the index of its word among the whitespace-separated words of
        `normalize_text(decode(ids))`, or None for a token that is part of no word (a special token or a tag, a
        lone space): what pooling subword attention to words needs (mtx.decode.alignment)."""
        ids = list(ids)
        owners = word_of_each_piece(self.pieces(ids))
        return [None if i in self.special_tokens else owner for i, owner in zip(ids, owners, strict=True)]
