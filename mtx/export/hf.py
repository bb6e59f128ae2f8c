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
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer as HfTokenizer

from mtx.config.recipe import DecodeConfig, ModelConfig
from mtx.export.marian import marian_from_mtx
from mtx.export.tokenizer import TOKENIZER_NOTE, exported_tokenizer
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

TOKENIZER_CLASS = "PreTrainedTokenizerFast"  # the class name transformers 4 and 5 both load
# The model card's line before the commented-out translation pipeline, which transformers 5 removed.
TRANSFORMERS_4_ONLY = "# or, with transformers 4 only (version 5 has no translation pipeline):"


def generation_config(decode: DecodeConfig, cfg: ModelConfig):
    """`generate`'s settings for the recipe's decoding: beam size, length penalty α, minimum length, and
    decoding that starts from BOS and never emits PAD or BOS, as mtx's search.

    Two of mtx's settings have no counterpart, so the nearest is written (and the model card says so):
    `generate` divides a hypothesis' log-probability by |Y|^α (fairseq's penalty), so α is written as is
    whether the recipe's penalty is that one or GNMT's ((5 + |Y|) / 6)^α; and it has no output limit relative
    to the source's length (mtx's a · |X| + b), so the limit is the model's own: max_positions tokens after
    the start token, the last of them a forced EOS. Greedy search (beam 1) gets no α: no penalty changes which
    token is the most probable, and transformers refuses to save a length penalty that it would ignore.
    """
    from transformers import GenerationConfig

    return GenerationConfig(
        num_beams=decode.beam, length_penalty=decode.lenpen if decode.beam > 1 else 1.0, do_sample=False,
        max_length=cfg.max_positions + 1, min_new_tokens=decode.min_len or None,
        decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        forced_eos_token_id=EOS, suppress_tokens=[PAD, BOS],
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
    transformers 4 saves by default since 4.35, and version 5 always)."""
    marian = marian_from_mtx(model).eval()
    marian.generation_config = generation_config(decode, model.cfg)
    marian.save_pretrained(folder)
    fast_tokenizer(tokenizer_json, model.cfg.max_positions).save_pretrained(folder)
    name_tokenizer_class(folder)


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


def hf_notes(decode: DecodeConfig) -> list[str]:
    """Where `generate` with generation_config.json decodes differently from `mtx translate`."""
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
        f"{TOKENIZER_NOTE}; greedy decoding gives mtx's own tokens.",
    ]
