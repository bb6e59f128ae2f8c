"""An mtx checkpoint as a Hugging Face `transformers` folder: a MarianMT model, its tokenizer and how to decode.

What the folder holds, and what `AutoModelForSeq2SeqLM.from_pretrained` and `AutoTokenizer.from_pretrained`
read from it, in transformers 4 and 5 alike (and transformers 4's `pipeline("translation")`, which version 5
removed):

- config.json, model.safetensors: the MarianMT twin of the model (mtx.export.marian).
- tokenizer.json, tokenizer_config.json: mtx's tokenizer with its normalisation and the source's EOS built in
  (mtx.export.tokenizer), wrapped as a fast tokenizer with mtx's special tokens, and with special-token text
  in the input split as ordinary text, as mtx encodes it; tags (<bt>, a multilingual model's <2fr>) stay one
  token each.
- generation_config.json: the recipe's decoding, as far as `generate` can state it (`generation_config`).

A model imported from MarianMT (mtx.importing) goes back as it came: Marian's ids (mtx.export.marian's
`MarianIds.of_import`) and MarianTokenizer's own files (source.spm, target.spm, vocab.json and its
tokenizer_config.json), which its SentencePiece-pair tokenizer (mtx.spm_tokenizer) holds as imported.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer

from mtx.config.recipe import DecodeConfig, ModelConfig
from mtx.export.marian import MarianIds, marian_from_mtx
from mtx.export.tokenizer import TOKENIZER_NOTE, exported_tokenizer
from mtx.model.transformer import Transformer
from mtx.spm_tokenizer import SpmPairTokenizer
from mtx.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Tokenizer

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # the class name transformers 4 and 5 both load
# The model card's line before the commented-out translation pipeline, which transformers 5 removed.
TRANSFORMERS_4_ONLY = "# or, with transformers 4 only (version 5 has no translation pipeline):"


def generation_config(decode: DecodeConfig, cfg: ModelConfig, ids: MarianIds):
    """`generate`'s settings for the recipe's decoding: beam size, length penalty α, minimum length, and
    decoding that starts from the start token (`ids`: mtx's BOS, or an imported model's own) and never emits it
    or PAD, as mtx's search.

    Two of mtx's settings have no counterpart, so the nearest is written (and the model card says so):
    `generate` divides a hypothesis' log-probability by |Y|^α (fairseq's penalty), so α is written as is
    whether the recipe's penalty is that one or GNMT's ((5 + |Y|) / 6)^α; and it has no output limit relative
    to the source's length (mtx's a · |X| + b), so the limit is the model's own: max_positions tokens after
    the start token, the last of them a forced EOS. Greedy search (beam 1) gets no α: no penalty changes which
    token is the most probable, and transformers refuses to save a length penalty that it would ignore.
    Beam search stops as mtx's (fairseq's) does, once `beam` hypotheses have ended: generate's early_stopping
    true; its default goes on while a longer hypothesis might still score better, and can end elsewhere.
    """
    from transformers import GenerationConfig

    return GenerationConfig(
        num_beams=decode.beam, length_penalty=decode.lenpen if decode.beam > 1 else 1.0, do_sample=False,
        early_stopping=decode.beam > 1,
        max_length=cfg.max_positions + 1, min_new_tokens=decode.min_len or None,
        decoder_start_token_id=ids.start, eos_token_id=ids.eos, pad_token_id=ids.pad,
        forced_eos_token_id=ids.eos, suppress_tokens=sorted({ids.pad, ids.start}),
        **({"bos_token_id": BOS} if ids.rows is None else {}),
    )


def fast_tokenizer(tokenizer_json: str, max_positions: int):
    """The exported tokenizer as a `transformers` fast tokenizer with mtx's special tokens, giving the inputs a
    MarianMT model takes (no token type ids, which `generate` refuses)."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(
        tokenizer_object=_tags_kept_whole(exported_tokenizer(tokenizer_json)), pad_token=SPECIAL_TOKENS[PAD],
        bos_token=SPECIAL_TOKENS[BOS], eos_token=SPECIAL_TOKENS[EOS], unk_token=SPECIAL_TOKENS[UNK],
        split_special_tokens=True, model_max_length=max_positions, model_input_names=["input_ids", "attention_mask"],
    )


def _tags_kept_whole(tokenizer: HfTokenizer) -> HfTokenizer:
    """The tokenizer with its tags (corpus and target-language tags: the special tokens after mtx's four) as
    ordinary added tokens. `split_special_tokens`, which reads "</s>" in the input as text, as mtx does, would
    split them too, and a multilingual model's <2fr> must reach it as its one token."""
    spec = json.loads(tokenizer.to_str())
    for token in spec["added_tokens"]:
        if token["id"] >= len(SPECIAL_TOKENS):
            token["special"] = False
    return HfTokenizer.from_str(json.dumps(spec))


def save_hf_folder(model: Transformer, tokenizer_json: str, decode: DecodeConfig, folder: Path) -> None:
    """Write the model, tokenizer and generation settings into `folder` (safetensors weights: what
    transformers 4 saves by default since 4.35, and version 5 always): with mtx's ids and tokenizer, or an
    imported model's own (see the module's docstring)."""
    tokenizer = Tokenizer.from_str(tokenizer_json)
    imported = isinstance(tokenizer, SpmPairTokenizer)
    ids = MarianIds.of_import(tokenizer.marian_ids) if imported else MarianIds.of_mtx(model.vocab_size)
    marian = marian_from_mtx(model, ids).eval()
    marian.generation_config = generation_config(decode, model.cfg, ids)
    marian.save_pretrained(folder)
    if imported:
        save_marian_tokenizer(tokenizer, model.cfg.max_positions, folder)
        return
    fast_tokenizer(tokenizer_json, model.cfg.max_positions).save_pretrained(folder)
    name_tokenizer_class(folder)


def save_marian_tokenizer(tokenizer: SpmPairTokenizer, max_positions: int, folder: Path) -> None:
    """An imported model's MarianTokenizer files as it came with them: its two SentencePiece models and its
    vocabulary, then tokenizer_config.json as MarianTokenizer itself saves it."""
    from transformers import MarianTokenizer

    (folder / "source.spm").write_bytes(tokenizer.source_spm)
    (folder / "target.spm").write_bytes(tokenizer.target_spm)
    (folder / "vocab.json").write_text(json.dumps(tokenizer.marian_vocab(), indent=2, ensure_ascii=False) + "\n",
                                       encoding="utf-8")
    MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"), str(folder / "vocab.json"),
                    source_lang=tokenizer.source_lang, target_lang=tokenizer.target_lang,
                    model_max_length=max_positions).save_pretrained(folder)


def name_tokenizer_class(folder: Path) -> None:
    """Name the tokenizer's class in tokenizer_config.json as both transformers 4 and 5 know it.

    transformers 5 saves its fast tokenizer's class as `TokenizersBackend`, which version 4's AutoTokenizer
    refuses ("does not exist"); `PreTrainedTokenizerFast` is version 4's class and version 5's alias of
    `TokenizersBackend`, so a folder exported with either version loads with either.
    """
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = TOKENIZER_CLASS
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def hf_usage(folder: Path) -> str:
    """The lines that translate with the exported folder, for its model card: `AutoModelForSeq2SeqLM`,
    `AutoTokenizer` and `generate`, which transformers 4 and 5 both have; then, commented out, the translation
    pipeline, which only version 4 has (`TRANSFORMERS_4_ONLY` marks where)."""
    return f'''from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("{folder}")
tokenizer = AutoTokenizer.from_pretrained("{folder}")
batch = tokenizer(["The old friends tidy up his kitchen."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch), skip_special_tokens=True))  # generation_config.json's search

{TRANSFORMERS_4_ONLY}
# from transformers import pipeline
# print(pipeline("translation", model="{folder}")("The old friends tidy up his kitchen."))'''


# What the card of an imported model says of its tokenizer, in place of TOKENIZER_NOTE.
MARIAN_TOKENIZER_NOTE = ("The tokenizer is the model's own MarianTokenizer (source.spm, target.spm, vocab.json), "
                         "as it was imported, and appends </s> to each source")


def hf_notes(decode: DecodeConfig, imported: bool = False) -> list[str]:
    """Where `generate` with generation_config.json decodes differently from `mtx translate`; `imported`: the
    model came from MarianMT and goes back with its MarianTokenizer."""
    penalty = ("the recipe's fairseq-style length penalty |Y|^α, as mtx's" if decode.lenpen_style == "fairseq" else
               "|Y|^α, where mtx's recipe divides by GNMT's ((5 + |Y|) / 6)^α, which generate cannot state: beam "
               "search may rank hypotheses of different lengths differently")
    search = (f"beam {decode.beam}, α = {decode.lenpen} applied as {penalty}" if decode.beam > 1 else
              "greedy search (beam 1), as the recipe's; no length penalty changes its choices")
    return [
        f"generation_config.json: {search}.",
        f"mtx limits a translation of a source of n tokens to {decode.max_len_a} · n + {decode.max_len_b} tokens; "
        "generate has no limit relative to the source, so max_length is the model's own (max_positions tokens "
        "and the start token), the last a forced </s>.",
        f"{MARIAN_TOKENIZER_NOTE if imported else TOKENIZER_NOTE}; greedy decoding gives mtx's own tokens.",
    ]
