"""`mtx export --to ctranslate2`: an mtx Transformer as a CTranslate2 model directory for users, with the
tokenizer its README uses and, asked for, a vocabulary map.

The conversion itself (the spec filled from mtx's weights, int8 rows within ±`INT8_WEIGHT_LEVELS`) is the `ct2`
engine's, mtx.decode.ct2_folder, so an exported folder and the engine's cached one are the same model. Any saved
model can also be quantized when loaded (`compute_type`). A model imported from MarianMT (mtx.importing) ships its
own two SentencePiece models instead of a tokenizer.json, as CTranslate2's own Marian conversions do.
"""

from __future__ import annotations

from pathlib import Path

from mtx.config.recipe import DecodeConfig
from mtx.data.lexicon import Lexicon
from mtx.decode.ct2_folder import INT8_WEIGHT_LEVELS, convert_to_ctranslate2, token_strings
from mtx.export.tokenizer import TOKENIZER_NOTE, exported_tokenizer
from mtx.model.transformer import Transformer
from mtx.spm_tokenizer import SpmPairTokenizer
from mtx.tokenizer import PAD, Tokenizer

QUANTIZATIONS = ("int8", "int8_float16", "float16", "bfloat16")


def save_ctranslate2_folder(model: Transformer, tokenizer_json: str, folder: Path, quantization: str | None,
                            shortlist: tuple[Lexicon, DecodeConfig] | None = None) -> None:
    """The CTranslate2 model and, beside it, the tokenizer its README uses; with `shortlist` (a lexical table
    and the decoding options that say how much of it to use), its vocabulary map too (`write_vocabulary_map`)."""
    tokenizer = Tokenizer.from_str(tokenizer_json)
    tokens = token_strings(tokenizer, model.vocab_size)
    convert_to_ctranslate2(model, tokens, folder, quantization)
    if isinstance(tokenizer, SpmPairTokenizer):
        (folder / "source.spm").write_bytes(tokenizer.source_spm)
        (folder / "target.spm").write_bytes(tokenizer.target_spm)
    else:
        exported_tokenizer(tokenizer_json).save(str(folder / "tokenizer.json"))
    if shortlist is not None:
        lexicon, decode = shortlist
        write_vocabulary_map(lexicon, decode.shortlist, decode.shortlist_frequent, tokens, folder / "vmap.txt")


def write_vocabulary_map(lexicon: Lexicon, translations: int, frequent: int, tokens: list[str], path: Path) -> None:
    """CTranslate2's vocabulary map (its `use_vmap`) from a lexical table: a line `<tab>` + the `frequent` most
    frequent target tokens, which every batch's candidates hold, then a line `source<tab>targets` for each source
    token seen in training, its `translations` likeliest targets, tokens spelt as the exported vocabulary spells
    them. CTranslate2 takes a batch's union of them, where `mtx translate --shortlist` takes each sentence's own."""
    lines = ["\t" + " ".join(tokens[t] for t in lexicon.frequent[:frequent])]
    for source, row in enumerate(lexicon.translations[:, :translations]):
        targets = [tokens[t] for t in row if t != PAD]
        if targets:
            lines.append(f"{tokens[source]}\t{' '.join(targets)}")
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def ctranslate2_usage(folder: Path, decode: DecodeConfig, shortlist: bool = False, imported: bool = False) -> str:
    """The lines that translate with the exported folder, for its README. min_decoding_length is the recipe's
    min_len, as mtx's: CTranslate2's own default of 1 would never give the empty translation that mtx can.
    `shortlist`: the folder holds a vocabulary map, which the call uses; `imported`: its tokenizer is an imported
    MarianMT model's two SentencePiece models."""
    vmap = " use_vmap=True," if shortlist else ""
    if imported:
        return f'''import ctranslate2
import sentencepiece

translator = ctranslate2.Translator("{folder}", device="cpu")  # in the saved precision
source = sentencepiece.SentencePieceProcessor(model_file="{folder}/source.spm")
target = sentencepiece.SentencePieceProcessor(model_file="{folder}/target.spm")
sources = [source.encode(s, out_type=str) + ["</s>"] for s in ["The old friends tidy up his kitchen."]]
results = translator.translate_batch(sources, beam_size={decode.beam}, length_penalty={decode.lenpen},{vmap}
                                     min_decoding_length={decode.min_len}, suppress_sequences=[["<pad>"], ["<s>"]])
print([target.decode(r.hypotheses[0]) for r in results])'''
    return f'''import ctranslate2
from tokenizers import Tokenizer

translator = ctranslate2.Translator("{folder}", device="cpu")  # in the saved precision
tokenizer = Tokenizer.from_file("{folder}/tokenizer.json")
tokenizer.encode_special_tokens = True  # "</s>" typed in a sentence is text, as in mtx
sources = [tokenizer.encode(s).tokens for s in ["The old friends tidy up his kitchen."]]  # ends with </s>
results = translator.translate_batch(sources, beam_size={decode.beam}, length_penalty={decode.lenpen},{vmap}
                                     min_decoding_length={decode.min_len}, suppress_sequences=[["<pad>"], ["<s>"]])
print([tokenizer.decode([tokenizer.token_to_id(t) for t in r.hypotheses[0]]) for r in results])'''


# What the card of an imported model says of its tokenizer, in place of TOKENIZER_NOTE.
SPM_PAIR_NOTE = ("The tokenizer is the imported model's own: source.spm segments a source, target.spm joins a "
                 "translation's pieces, and a multilingual model's target token (>>fra<<) goes first, as one piece")


def ctranslate2_notes(decode: DecodeConfig, imported: bool = False) -> list[str]:
    """Where CTranslate2 decodes differently from `mtx translate` with the recipe's settings; `imported`: the
    folder holds an imported model's SentencePiece models."""
    penalty = ("fairseq-style, as the recipe's" if decode.lenpen_style == "fairseq" else
               "|Y|^α, where mtx's recipe uses GNMT's ((5 + |Y|) / 6)^α: beam search may rank hypotheses of "
               "different lengths differently")
    return [
        f"length_penalty is CTranslate2's {penalty}.",
        f"mtx limits a translation of n source tokens to {decode.max_len_a} · n + {decode.max_len_b} tokens; "
        "CTranslate2's max_decoding_length is one limit for the batch (256 unless set).",
        f"{SPM_PAIR_NOTE if imported else TOKENIZER_NOTE}; greedy decoding in float32 gives mtx's own tokens.",
        f"For int8, export with --quantization int8, which saves weights within ±{INT8_WEIGHT_LEVELS}. "
        "compute_type=\"int8\" on a float32 export quantizes them while loading to ±127, whose products CPUs "
        "without VNNI can saturate.",
    ]
