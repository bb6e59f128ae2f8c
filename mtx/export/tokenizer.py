"""mtx's tokenizer as the exported folders ship it: a `tokenizer.json` that does on its own what mtx does
around its tokenizer.

mtx normalises every sentence (`mtx.tokenizer.normalize_text`: control characters removed, NFC, runs of
whitespace made one space, no space at either end) before its BPE sees it, and appends EOS to every source.
A user of the exported model calls the tokenizer alone, so both are built into the exported copy: the
normalisation as the first steps of its normalizer, EOS as its post-processor. Its vocabulary, merges and
decoder are mtx's, unchanged, so token ids are the same and decoding is lossless as in mtx.
"""

from __future__ import annotations

import re
import sys

from tokenizers import Regex, normalizers, processors
from tokenizers import Tokenizer as HfTokenizer

from mtx.errors import MtxError
from mtx.tokenizer import EOS, SPECIAL_TOKENS

# The characters `normalize_text` removes: C0/C1 controls that are not whitespace, and the byte-order mark.
# What a model card says of the exported tokenizer, whatever the target.
TOKENIZER_NOTE = ("The tokenizer normalises text as mtx does (NFC, no control characters, single spaces) and "
                  "appends </s> to each source")
CONTROL_CHARACTERS = r"[\x{0}-\x{8}\x{e}-\x{1b}\x{7f}-\x{84}\x{86}-\x{9f}\x{feff}]"


def whitespace_class() -> str:
    """A regex class of every character Python's `str.split()` splits on (`str.isspace`), as `normalize_text`
    collapses them; the regex engine's own \\s is a different set."""
    spaces = [c for c in range(sys.maxunicode + 1) if chr(c).isspace()]
    return "[" + "".join(f"\\x{{{c:x}}}" for c in spaces) + "]+"


def exported_tokenizer(tokenizer_json: str) -> HfTokenizer:
    """mtx's tokenizer (its JSON, as a checkpoint holds it) with mtx's normalisation first and EOS appended."""
    tokenizer = HfTokenizer.from_str(tokenizer_json)
    steps = [normalizers.Replace(Regex(CONTROL_CHARACTERS), ""), normalizers.NFC(),
             normalizers.Replace(Regex(whitespace_class()), " "), normalizers.Strip()]
    if tokenizer.normalizer is not None:
        steps.append(tokenizer.normalizer)
    tokenizer.normalizer = normalizers.Sequence(steps)
    eos = SPECIAL_TOKENS[EOS]
    tokenizer.post_processor = processors.TemplateProcessing(single=f"$A {eos}", special_tokens=[(eos, EOS)])
    return tokenizer


def token_strings(tokenizer: HfTokenizer, vocab_size: int) -> list[str]:
    """The model's vocabulary as strings in id order, which is how CTranslate2 names tokens.

    Byte-level BPE spells every byte with a printable character, and metaspace spells the space as "▁" and
    bytes as "<0xNN>" (`normalize_text` leaves it no other whitespace to learn), so no token holds a space or a
    line break, which CTranslate2's one-token-a-line vocabulary files could not store.
    """
    if tokenizer.get_vocab_size() != vocab_size:
        raise MtxError(f"The checkpoint's tokenizer has {tokenizer.get_vocab_size():,} tokens but its model "
                       f"{vocab_size:,} embedding rows: the checkpoint is inconsistent and cannot be exported.")
    tokens = [tokenizer.id_to_token(i) for i in range(vocab_size)]
    if any(token is None or re.search(r"\s", token) for token in tokens):
        raise MtxError("The checkpoint's tokenizer has a token holding whitespace, which CTranslate2's "
                       "vocabulary files cannot store.")
    return tokens
