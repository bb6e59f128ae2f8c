"""The tokenizer of an imported MarianMT (OPUS-MT) model: two SentencePiece models and one joint vocabulary.

A MarianMT folder segments its source text with source.spm and its target text with target.spm, and names the
pieces of both by their ids in one vocabulary, vocab.json. `SpmPairTokenizer` gives the ids transformers'
`MarianTokenizer` gives (transformers 5.25, its slow tokenizer: the one OPUS-MT folders load), through the
`sentencepiece` library itself (the extra `marian`), step by step as MarianTokenizer takes them:

1. The special tokens Marian's vocabulary names ("</s>", "<unk>", "<pad>"), typed anywhere in the text, are cut
   out of it and become their own ids: the slow tokenizer's `tokenize` splits its added tokens out before
   anything else, so a literal "</s>" is an end of sentence, unlike mtx's own tokenizer, which reads it as text.
2. Each stretch of text between them that starts with ">>" and holds a "<<" loses that language code, which
   becomes one piece, its vocabulary id, or unk's if the vocabulary lacks it (`MarianTokenizer.remove_language_code`):
   `>>fra<<` tells a multilingual model which language to produce.
3. The rest is segmented by the side's SentencePiece model (target.spm for a translation, `encode(...,
   target=True)`, as `text_target` selects; source.spm otherwise), which normalises it by its own rule (nmt_nfkc in
   OPUS-MT's: NFKC, some control characters removed, whitespace collapsed), and each piece becomes its
   vocabulary id, unk's for a piece the vocabulary lacks (a character neither model knows, spelled as itself).

MarianTokenizer also builds a Moses punctuation normaliser when sacremoses is installed, but in transformers 5.25
nothing calls it when encoding or decoding (its `normalize` method is never used), so „quotes“ and « » reach the
SentencePiece model as they are, and here too. Nor does mtx's `normalize_text` touch the text first: OPUS-MT's
models keep some control characters mtx removes (U+0000, U+0085) and make a byte-order mark a space where mtx
drops it, so `normalize(text)` leaves a line as it is and the SentencePiece model does all the normalising, as
MarianTokenizer leaves it to. (`mtx prepare` still normalises a corpus, which its cleaning and line files need:
fine-tuning text differs from what MarianTokenizer would read only in those characters.)

`encode` adds no special token, as in mtx.tokenizer: mtx puts EOS after a source itself, where MarianTokenizer's
`__call__` appends it. `decode` is `MarianTokenizer.decode(ids, skip_special_tokens=True, use_source_tokenizer=
False)`: the special tokens (pad, eos, unk) dropped, the pieces joined by target.spm (a piece it does not know
stays as it is spelled), "▁" made a space, the ends stripped, and transformers' clean-up of spaces before
punctuation where the folder's tokenizer_config.json asks for it. (transformers 5.25's own default for a joint
vocabulary joins them with source.spm, which gives the same text: a piece either model lacks is kept as spelled,
and "▁" becomes a space either way.) A language code a model produced is text to MarianTokenizer's decoder, and
is here; `pieces` counts it as a tag, which adds no text.

The ids are not Marian's. mtx's vocabulary keeps its four special ids (mtx.subword), so an imported vocabulary
has one id more than Marian's (`marian_order`): mtx 0 is a padding row Marian lacks; mtx 1, BOS, is Marian's
"<pad>", which Marian's decoder starts from (`decoder_start_token_id` = `pad_token_id` in every OPUS-MT model);
mtx 2 and 3 are Marian's "</s>" and "<unk>"; mtx 4, 5, … are Marian's other ids in increasing order.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from mtx.errors import MtxError, first_line
from mtx.subword import METASPACE, PAD, SPECIAL_TOKENS, UNK, Tags, word_of_each_piece

FORMAT = "mtx-spm-pair-v1"  # `to_str` writes it first, so `wrote` knows its text without parsing it
FILES = ("source.spm", "target.spm", "vocab.json")  # what a MarianMT folder's tokenizer is made of
CONFIG = "tokenizer_config.json"
# Marian's spelling of the special tokens mtx's ids BOS, EOS and UNK stand for, as its tokenizer_config.json names
# them: every published OPUS-MT model's, and MarianTokenizer's defaults.
MARIAN_SPECIALS = {"pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(token) for token in MARIAN_SPECIALS.values()) + ")")
INSTALL = "pip install 'mtx[marian]'"


def marian_order(vocab: Mapping[str, int]) -> list[int | None]:
    """For each mtx id, the Marian id of a Marian vocabulary `vocab` (piece → id, each id once) that it stands
    for: None (a padding row Marian lacks), Marian's "<pad>" (its decoder's start, mtx's BOS), "</s>", "<unk>",
    then every other Marian id in increasing order. The importer permutes the model's rows with it."""
    firsts = [vocab[MARIAN_SPECIALS[name]] for name in ("pad_token", "eos_token", "unk_token")]
    return [None, *firsts, *sorted(set(vocab.values()) - set(firsts))]


def is_language_code(piece: str) -> bool:
    """Whether a vocabulary piece is a target-language code such as `>>fra<<` (MarianTokenizer's
    `supported_language_codes`)."""
    return piece.startswith(">>") and piece.endswith("<<")


def _sentencepiece() -> Any:
    try:
        import sentencepiece
    except ImportError:
        raise MtxError("This checkpoint's tokenizer is an imported MarianMT model's pair of SentencePiece models, "
                       f"and reading it needs the sentencepiece library, which is not installed: {INSTALL}.") from None
    return sentencepiece


def _load_spm(data: bytes, name: str) -> Any:
    """A SentencePiece processor of a serialised model; a damaged one is refused, naming it."""
    try:
        processor = _sentencepiece().SentencePieceProcessor(model_proto=data)
    except (RuntimeError, OSError) as e:
        raise MtxError(f"{name} is not a SentencePiece model ({first_line(e, 200)}): the file is damaged. Copy the "
                       "model's folder again.") from None
    if processor.get_piece_size() == 0:
        raise MtxError(f"{name} is not a SentencePiece model (it holds no pieces): the file is damaged or empty. "
                       "Copy the model's folder again.")
    return processor


class SpmPairTokenizer(Tags):
    """An imported MarianMT tokenizer: text ↔ mtx ids without special tokens, as mtx.tokenizer.Tokenizer."""

    def __init__(self, source_spm: bytes, target_spm: bytes, vocab: Sequence[tuple[str, int]],
                 source_lang: str | None, target_lang: str | None, clean_up_spaces: bool, origin: str = "") -> None:
        """`vocab`: each mtx id's Marian piece and id, from mtx 1 on (`marian_order`); `clean_up_spaces`: the
        folder's clean_up_tokenization_spaces; `origin`: what error messages put before a file's name."""
        self.source_spm, self.target_spm = source_spm, target_spm
        self.source_lang, self.target_lang = source_lang, target_lang
        self.clean_up_spaces = clean_up_spaces
        self._vocab = [(str(piece), int(marian_id)) for piece, marian_id in vocab]
        self._spm = {False: _load_spm(source_spm, f"{origin}source.spm"),
                     True: _load_spm(target_spm, f"{origin}target.spm")}
        self._piece = [SPECIAL_TOKENS[PAD], *(piece for piece, _ in self._vocab)]  # Marian's spelling, by mtx id
        self._id = {piece: i for i, piece in enumerate(self._piece) if i != PAD}

    # ------------------------------------------------------------------------------------------- reading

    @classmethod
    def from_marian_folder(cls, folder: Path) -> SpmPairTokenizer:
        """The tokenizer of a MarianMT folder (source.spm, target.spm, vocab.json, tokenizer_config.json); a
        missing or damaged file, or a configuration MarianTokenizer would read otherwise than this class does
        (separate vocabularies, other special tokens, sampling), is refused before any work, naming it."""
        folder = Path(folder)
        for name in FILES:
            if not (folder / name).is_file():
                raise MtxError(f"{folder} has no {name}: a MarianMT folder holds its tokenizer as source.spm, "
                               "target.spm and vocab.json. Copy the whole folder, or name the right one.")
        config = _read_json(folder / CONFIG) if (folder / CONFIG).is_file() else {}
        _check_config(config, folder / CONFIG)
        vocab = _read_json(folder / "vocab.json")
        _check_vocab(vocab, folder / "vocab.json")
        order = marian_order(vocab)
        piece_of = {marian_id: piece for piece, marian_id in vocab.items()}
        return cls((folder / "source.spm").read_bytes(), (folder / "target.spm").read_bytes(),
                   [(piece_of[marian_id], marian_id) for marian_id in order[1:]], config.get("source_lang"),
                   config.get("target_lang"), bool(config.get("clean_up_tokenization_spaces", False)),
                   origin=f"{folder}/")

    @staticmethod
    def wrote(text: str) -> bool:
        """Whether `text` is what `to_str` writes (mtx.tokenizer.Tokenizer.from_str asks, for every tokenizer)."""
        return text.startswith(f'{{"format": "{FORMAT}"')

    @classmethod
    def from_str(cls, text: str) -> SpmPairTokenizer:
        spec = json.loads(text)
        return cls(base64.b64decode(spec["source_spm"]), base64.b64decode(spec["target_spm"]),
                   [(piece, marian_id) for piece, marian_id in spec["vocab"]], spec["source_lang"],
                   spec["target_lang"], spec["clean_up_tokenization_spaces"], origin="the stored tokenizer's ")

    @classmethod
    def from_file(cls, path: str | Path) -> SpmPairTokenizer:
        return cls.from_str(Path(path).read_text(encoding="utf-8"))

    def to_str(self) -> str:
        """The whole tokenizer as one JSON document, both SentencePiece models in base64: what a checkpoint
        stores in its "tokenizer" field and a data folder in tokenizer.json, as for mtx's own."""
        return json.dumps({
            "format": FORMAT, "source_lang": self.source_lang, "target_lang": self.target_lang,
            "clean_up_tokenization_spaces": self.clean_up_spaces, "vocab": self._vocab,
            "source_spm": base64.b64encode(self.source_spm).decode("ascii"),
            "target_spm": base64.b64encode(self.target_spm).decode("ascii"),
        }, ensure_ascii=False)

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_str(), encoding="utf-8")

    @functools.cached_property
    def sha256(self) -> str:
        return hashlib.sha256(self.to_str().encode("utf-8")).hexdigest()

    # ------------------------------------------------------------------------------------------- the ids

    @property
    def vocab_size(self) -> int:
        return len(self._piece)

    @property
    def marian_ids(self) -> list[int | None]:
        """Each mtx id's Marian id; None for mtx's padding row (PAD), which Marian lacks."""
        return [None, *(marian_id for _, marian_id in self._vocab)]

    def marian_vocab(self) -> dict[str, int]:
        """vocab.json as imported: each Marian piece's Marian id, in Marian's id order."""
        return dict(sorted(self._vocab, key=lambda item: item[1]))

    def token_strings(self) -> list[str]:
        """The vocabulary as strings in id order: mtx's special tokens, then Marian's pieces."""
        return [*SPECIAL_TOKENS, *self._piece[len(SPECIAL_TOKENS):]]

    @functools.cached_property
    def _tag_ids(self) -> dict[str, int]:
        """The target-language codes the vocabulary holds (`>>fra<<`): a multilingual model's tags."""
        return {piece: i for i, piece in enumerate(self._piece) if is_language_code(piece)}

    # ------------------------------------------------------------------------------------------- encoding

    def normalize(self, text: str) -> str:
        """The line unchanged: the SentencePiece models normalise it, as MarianTokenizer leaves them to."""
        return text

    def split_tags(self, text: str) -> tuple[list[int], str]:
        """(the language code that starts `text`, its id in a list, unk's if the vocabulary lacks it; the text
        after it), as `MarianTokenizer.remove_language_code`: any text from a leading ">>" to the first "<<"."""
        end = text.find("<<")
        if not text.startswith(">>") or end == -1:
            return [], text
        return [self._id.get(text[:end + 2], UNK)], text[end + 2:]

    def encode(self, text: str, target: bool = False) -> list[int]:
        """The ids MarianTokenizer gives `text` (`text_target` when `target`), without its EOS."""
        return self.encode_batch([text], target)[0]

    def encode_batch(self, texts: list[str], target: bool = False) -> list[list[int]]:
        """`encode` of each text, the stretches between special tokens segmented in one SentencePiece call."""
        plans: list[list[int | str]] = []  # per text: ids, and stretches of text still to segment
        for text in texts:
            plan: list[int | str] = []
            for k, part in enumerate(_SPECIAL_SPLIT.split(text)):  # text, a special token, text, …
                if k % 2:
                    plan.append(self._id[part])
                elif part:
                    code, rest = self.split_tags(part)
                    plan.extend([*code, rest])
            plans.append(plan)
        stretches = [part for plan in plans for part in plan if isinstance(part, str)]
        # One thread: `mtx prepare` runs one encoder per core already, and a sentence batch is too small to share.
        segmented = iter(self._spm[target].encode(stretches, out_type=str, num_threads=1) if stretches else [])
        return [[i for part in plan for i in ([part] if isinstance(part, int) else
                                              [self._id.get(piece, UNK) for piece in next(segmented)])]
                for plan in plans]

    # ------------------------------------------------------------------------------------------- decoding

    def decode(self, ids: Iterable[int]) -> str:
        """`MarianTokenizer.decode(marian ids, skip_special_tokens=True, use_source_tokenizer=False)`."""
        pieces = [self._piece[i] for i in map(int, ids) if i >= len(SPECIAL_TOKENS)]  # mtx 1-3: Marian's specials
        text = self._spm[True].decode_pieces(pieces).replace(METASPACE, " ").strip()
        return _clean_up_spaces(text) if self.clean_up_spaces else text

    def decode_batch(self, batch: Iterable[Iterable[int]]) -> list[str]:
        return [self.decode(ids) for ids in batch]

    @property
    def style(self) -> str:
        """metaspace: SentencePiece spells a space as "▁", which starts the word after it."""
        return "metaspace"

    @functools.cached_property
    def model(self) -> str:
        """The source model's kind, read from it: unigram (every OPUS-MT model's), bpe, word or char."""
        return _MODEL_TYPES.get(_model_type(self.source_spm), "unigram")

    @property
    def word_mark(self) -> str:
        return METASPACE

    def words(self, text: str) -> list[str]:
        """The words the source model segments `text` into: its normalised text cut before each "▁"."""
        return [METASPACE + word for word in self._spm[False].normalize(text).split(METASPACE) if word]

    def pieces(self, ids: Iterable[int]) -> list[str]:
        """The text each token adds to `decode(ids)`, "▁" as a space: nothing for a special token or a tag.
        "".join(pieces(ids)) is decode(ids) but for spaces at its ends (and a language code the model produced,
        which decode keeps as MarianTokenizer does)."""
        return ["" if i in self.special_tokens else self._piece[i].replace(METASPACE, " ") for i in map(int, ids)]

    def word_of_each_token(self, ids: Iterable[int]) -> list[int | None]:
        """For each token, its word among the whitespace-separated words of `decode(ids)`; None for a special
        token or a tag, or a lone space (as mtx.tokenizer.Tokenizer.word_of_each_token)."""
        ids = [int(i) for i in ids]
        owners = word_of_each_piece(self.pieces(ids))
        return [None if i in self.special_tokens else owner for i, owner in zip(ids, owners, strict=True)]


_MODEL_TYPES = {1: "unigram", 2: "bpe", 3: "word", 4: "char"}  # sentencepiece_model.proto's TrainerSpec.ModelType


def _fields(data: bytes) -> Iterable[tuple[int, int | bytes]]:
    """The (field number, value) pairs of a serialised protocol buffer message: varints as ints, length-delimited
    fields as bytes (fixed-width ones skipped). Read here so that `model` needs no protobuf library."""
    def varint(at: int) -> tuple[int, int]:
        value, shift = 0, 0
        while True:
            byte = data[at]
            value, shift, at = value | (byte & 0x7F) << shift, shift + 7, at + 1
            if byte < 0x80:
                return value, at

    at = 0
    while at < len(data):
        key, at = varint(at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = varint(at)
            yield number, value
        elif wire == 2:
            size, at = varint(at)
            yield number, data[at:at + size]
            at += size
        else:  # 64-bit (1) or 32-bit (5) fixed-width
            at += 8 if wire == 1 else 4


def _model_type(model: bytes) -> int | None:
    """ModelProto.trainer_spec (field 2).model_type (field 3) of a serialised SentencePiece model; None: unset,
    which means unigram."""
    spec = next((value for number, value in _fields(model) if number == 2), b"")
    return next((value for number, value in _fields(spec) if number == 3), None)  # type: ignore[arg-type]


def _clean_up_spaces(text: str) -> str:
    """transformers' `clean_up_tokenization`: the space before punctuation and English clitics removed."""
    for spaced, joined in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
                           (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(spaced, joined)
    return text


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise MtxError(f"{path} cannot be read as JSON ({first_line(e, 200)}): the file is damaged. Copy the "
                       "model's folder again.") from None


def _token_text(value: Any) -> Any:
    """A special token as tokenizer_config.json spells it: a string, or an AddedToken's dict with its content."""
    return value.get("content") if isinstance(value, dict) else value


def _check_config(config: Any, path: Path) -> None:
    """Refuse, naming the key, a tokenizer_config.json that MarianTokenizer would read otherwise than this
    module does."""
    def refuse(key: str, what: str) -> None:
        raise MtxError(f"{path}: {key} = {json.dumps(config.get(key))} {what}, which mtx cannot read as "
                       "MarianTokenizer would. Only OPUS-MT's usual tokenizer settings can be imported.")

    if not isinstance(config, dict):
        raise MtxError(f"{path} is not a JSON object: the file is damaged. Copy the model's folder again.")
    if config.get("separate_vocabs"):
        refuse("separate_vocabs", "gives the target side its own vocabulary (target_vocab.json)")
    for key, token in MARIAN_SPECIALS.items():
        if _token_text(config.get(key, token)) != token:
            refuse(key, f"names another special token than Marian's {token}")
    for key in ("additional_special_tokens", "extra_special_tokens", "sp_model_kwargs"):
        if config.get(key):
            refuse(key, "adds special tokens or SentencePiece options (sampling)" if key != "sp_model_kwargs"
                   else "sets SentencePiece options (sampling makes a segmentation random)")
    if config.get("split_special_tokens"):
        refuse("split_special_tokens", "reads special tokens typed in the text as text")
    for entry in (config.get("added_tokens_decoder") or {}).values():
        if not isinstance(entry, dict) or entry.get("content") not in MARIAN_SPECIALS.values() or any(
                entry.get(flag) for flag in ("lstrip", "rstrip", "single_word")):
            refuse("added_tokens_decoder", "adds a token beyond Marian's three special ones, or strips spaces "
                   "around one")


def _check_vocab(vocab: Any, path: Path) -> None:
    """Refuse a vocab.json that is not a piece → id map with each id of 0 … size-1 once and Marian's three
    special tokens."""
    if not isinstance(vocab, dict) or not all(isinstance(i, int) for i in vocab.values()):
        raise MtxError(f"{path} is not a MarianMT vocabulary (a JSON object of pieces and their ids): the file is "
                       "damaged. Copy the model's folder again.")
    if sorted(vocab.values()) != list(range(len(vocab))):
        raise MtxError(f"{path} does not give each id from 0 to {len(vocab) - 1} to one piece, so its ids cannot "
                       "be a model's rows: the file is damaged or not a MarianMT vocabulary.")
    missing = [token for token in MARIAN_SPECIALS.values() if token not in vocab]
    if missing:
        raise MtxError(f"{path} lacks Marian's special token{'s' if len(missing) > 1 else ''} "
                       f"{', '.join(missing)}: it is not a MarianMT vocabulary mtx can import.")
