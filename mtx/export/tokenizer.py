"""mtx's tokenizer as the exported folders ship it: a `tokenizer.json` that does on its own what mtx does
around its tokenizer.

mtx normalises every sentence (`mtx.tokenizer.normalize_text`: control characters removed, NFC, runs of
whitespace made one space, no space at either end) before its BPE sees it, and appends EOS to every source.
A user of the exported model calls the tokenizer alone, so both are built into the exported copy: the
normalisation as the first steps of its normalizer, EOS as its post-processor. Its vocabulary, merges and
decoder are mtx's, unchanged, so token ids are the same and decoding is lossless as in mtx.
"""

from __future__ import annotations

import sys

from tokenizers import Regex, normalizers, processors
from tokenizers import Tokenizer as HfTokenizer

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
