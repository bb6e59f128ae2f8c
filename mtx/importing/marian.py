"""A MarianMT model as an mtx model: the configuration, the weights in mtx's ids, and the recipe stored with them.

transformers' MarianMTModel (the layout of the OPUS-MT and Tatoeba-MT models) is the paper's post-norm Transformer
with a few options that mtx's model has too (mtx.config.model): the feed-forward activation, √d_model embedding
scaling or none, the sinusoids laid out in halves, an output bias (final_logits_bias), separate source and target
embeddings. `model_config` maps every MarianConfig key that MarianMTModel reads onto mtx's options, and refuses,
naming the key and its value, one that mtx cannot hold exactly:

    d_model, encoder_layers, decoder_layers, max_position_embeddings    the shape, as they are
    encoder_attention_heads, decoder_attention_heads                    one `heads`: refused if they differ
    encoder_ffn_dim, decoder_ffn_dim                                    one `d_ff`: refused if they differ
    activation_function                                                 relu, swish (= silu), gelu; others refused
    scale_embedding, share_encoder_decoder_embeddings                   scale_embeddings, share_embeddings
    dropout, attention_dropout, activation_dropout                      dropout, attn_dropout, relu_dropout
    vocab_size, decoder_vocab_size                                      one vocabulary: refused if they differ
    tie_word_embeddings                                                 false refused: mtx's output layer is the
                                                                        target embedding (§3.4)
    pad_token_id, decoder_start_token_id, eos_token_id                  decoding starts from pad (refused
                                                                        otherwise), one EOS; both must be
                                                                        vocab.json's <pad> and </s>
    encoder_layerdrop, decoder_layerdrop                                training only: noted, mtx drops no layer

and always: norm post, positions halves, output_bias true. The rest of a MarianConfig does not change what the
model computes: init_std (initialisation), use_cache, is_encoder_decoder, bos_token_id (Marian has no BOS) and
forced_eos_token_id (a `generate` setting). Older published configs also carry keys of BART's configuration
(normalize_before, add_final_layer_norm, normalize_embedding, static_position_embeddings, add_bias_logits,
extra_pos_embeddings, classif_dropout), which MarianMTModel never reads; they are passed over, as transformers
passes over them.

The vocabulary becomes mtx's by one more row (`marian_ids`: see mtx.spm_tokenizer): mtx's PAD, which Marian lacks,
with a zero embedding and the output bias `NEVER`; mtx's BOS is Marian's pad, its decoder start; EOS and UNK are
Marian's; every other id follows in Marian's order.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from mtx.config.model import ModelConfig
from mtx.config.recipe import as_mapping
from mtx.errors import MtxError
from mtx.export.marian import paired_modules
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD

NEVER = -1e4
"""The output bias of mtx's PAD row in an imported model, which Marian has no logit for.

It is exact: a softmax computes exp(logit − max logit), and exp(x) of a float32 x below about −103.3 is exactly 0
(the smallest positive float32 is 2⁻¹⁴⁹), so PAD's term adds exactly nothing to the normaliser while any logit of
the model stays above NEVER + 104: every other token's log-probability is Marian's. It is finite, so nothing that
subtracts logits meets ∞ − ∞, and it fits float16 and bfloat16, where the same underflow holds."""

ACTIVATIONS = {"relu": "relu", "swish": "swish", "silu": "swish", "gelu": "gelu"}  # transformers' → mtx's name
MULTILINGUAL_TAG = re.compile(r">>[\w-]+<<")  # a target-language token of a multilingual OPUS-MT model: >>fra<<
TARGET_TAG = ">>{lang}<<"


def refuse(where: str, key: str, value: Any, why: str) -> MtxError:
    """The error that refuses a model, naming the key at fault and its value."""
    return MtxError(f"{where}: {key} = {value!r} {why}. mtx cannot hold this model exactly, so it is not imported.")


def model_config(config: Mapping[str, Any], where: str) -> tuple[ModelConfig, list[str]]:
    """The mtx model of a MarianConfig (`config`: its every key, transformers' defaults filled in), and notes on
    what the import leaves out; `where` names the config in a refusal (see the module's docstring)."""
    for key, other, ours in (("decoder_attention_heads", "encoder_attention_heads", "model.heads"),
                             ("decoder_ffn_dim", "encoder_ffn_dim", "model.d_ff"),
                             ("decoder_vocab_size", "vocab_size", "one vocabulary")):
        if config[key] != config[other]:
            raise refuse(where, key, config[key], f"differs from {other} ({config[other]}), and mtx's model has one "
                         f"for both sides ({ours})")
    if config["activation_function"] not in ACTIVATIONS:
        raise refuse(where, "activation_function", config["activation_function"],
                     f"is not one of the feed-forward activations mtx has ({', '.join(ACTIVATIONS)})")
    if not config["tie_word_embeddings"]:
        raise refuse(where, "tie_word_embeddings", False, "gives the output layer a matrix of its own, and mtx's "
                     "output layer is the target embedding itself (§3.4)")
    if config["pad_token_id"] is None or config["decoder_start_token_id"] != config["pad_token_id"]:
        raise refuse(where, "decoder_start_token_id", config["decoder_start_token_id"],
                     f"is not pad_token_id ({config['pad_token_id']}): mtx decodes from one start token, which an "
                     "imported model's vocabulary holds as Marian's pad, as every published OPUS-MT model has it")
    if not isinstance(config["eos_token_id"], int):
        raise refuse(where, "eos_token_id", config["eos_token_id"], "names several end tokens, and mtx has one (EOS)")
    cfg = ModelConfig(
        layers_enc=config["encoder_layers"], layers_dec=config["decoder_layers"], d_model=config["d_model"],
        heads=config["encoder_attention_heads"], d_ff=config["encoder_ffn_dim"], dropout=config["dropout"],
        attn_dropout=config["attention_dropout"], relu_dropout=config["activation_dropout"], norm="post",
        share_embeddings=config["share_encoder_decoder_embeddings"], max_positions=config["max_position_embeddings"],
        activation=ACTIVATIONS[config["activation_function"]], output_bias=True,
        scale_embeddings=config["scale_embedding"], positions="halves",
    )
    cfg.validate("model")
    notes = [f"{key} = {config[key]} is a training setting mtx does not have: training in mtx drops no layer"
             for key in ("encoder_layerdrop", "decoder_layerdrop") if config[key]]
    return cfg, notes


def check_vocabulary(config: Mapping[str, Any], marian_ids: Sequence[int | None], where: str) -> None:
    """Refuse a config whose vocabulary is not the tokenizer's: its size, and its pad and end tokens, which are
    vocab.json's <pad> and </s> (`marian_ids` holds the Marian id of each mtx id, mtx.spm_tokenizer)."""
    if config["vocab_size"] != len(marian_ids) - 1:
        raise refuse(where, "vocab_size", config["vocab_size"], f"is not the size of the folder's vocab.json "
                     f"({len(marian_ids) - 1:,} tokens): the weights and the tokenizer are not one model's")
    for key, mtx_id in (("pad_token_id", BOS), ("eos_token_id", EOS)):
        if config[key] != marian_ids[mtx_id]:
            raise refuse(where, key, config[key], f"is not vocab.json's id of the token "
                         f"{'<pad>' if mtx_id == BOS else '</s>'} ({marian_ids[mtx_id]})")


def mtx_model(marian: torch.nn.Module, cfg: ModelConfig, marian_ids: Sequence[int | None]) -> Transformer:
    """An mtx Transformer of config `cfg` with the weights of `marian` (a float32 MarianMTModel): the layers'
    as they are (mtx.export.marian's `paired_modules`, the two directions' one list), the embeddings' rows and the
    output bias in mtx's ids, PAD's row zero with the bias NEVER."""
    model = Transformer(cfg, len(marian_ids))
    rows = torch.tensor(marian_ids[1:])  # the Marian id of each mtx id after PAD
    with torch.no_grad():
        for ours, theirs in ((model.tgt_embed, marian.model.decoder.embed_tokens),
                             (model.src_embed, marian.model.encoder.embed_tokens)):
            ours.weight[PAD].zero_()
            ours.weight[1:] = theirs.weight[rows]
        for _, ours, theirs in paired_modules(model, marian):
            ours.weight.copy_(torch.cat([module.weight for module in theirs]))
            ours.bias.copy_(torch.cat([module.bias for module in theirs]))
        model.output_bias[PAD] = NEVER
        model.output_bias[1:] = marian.final_logits_bias[0, rows]
    return model.eval()


def decode_settings(generation: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe's `decode:` of a model's generation settings (generation_config.json, or config.json where an
    older folder keeps them): its beam and its length penalty, which `generate` applies as fairseq's |Y|^α."""
    return {"beam": int(generation.get("num_beams") or 1), "lenpen": float(generation.get("length_penalty", 1.0)),
            "lenpen_style": "fairseq"}


def languages(source_lang: str | None, target_lang: str | None, name: str) -> tuple[str, str]:
    """The model's source and target languages: its tokenizer_config.json's, else its name's last two parts
    (opus-mt-en-de: en, de), else src and tgt; each a language code as a recipe takes one."""
    code = re.compile(r"[A-Za-z][\w\-]*")
    named = name.split("-")[-2:] if name.count("-") else []
    for pair in ((source_lang, target_lang), tuple(named)):
        if len(pair) == 2 and all(isinstance(lang, str) and code.fullmatch(lang) for lang in pair):
            return pair
    return "src", "tgt"


def stored_recipe(name: str, cfg: ModelConfig, src_lang: str, tgt_lang: str, tokens: Sequence[str],
                  generation: Mapping[str, Any]) -> dict[str, Any]:
    """The recipe an imported checkpoint carries: a run name, the languages (and, for a model whose vocabulary
    holds target-language tokens such as >>fra<<, the target tag that puts one first), the model and the decoding
    settings."""
    data: dict[str, Any] = {"src_lang": src_lang, "tgt_lang": tgt_lang}
    if any(MULTILINGUAL_TAG.fullmatch(token) for token in tokens):
        data["target_tag"] = TARGET_TAG
    return {"name": re.sub(r"[^\w.\-]", "-", name) or "imported", "data": data, "model": as_mapping(cfg),
            "decode": decode_settings(generation)}
