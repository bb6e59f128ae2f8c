"""An mtx Transformer as a CTranslate2 model directory.

CTranslate2's `TransformerSpec` describes the paper's encoder-decoder in both of mtx's variants, post-norm and
pre-norm (with the final LayerNorm of each stack), so the spec is filled from mtx's weights directly, with no
intermediate model: mtx's packed Q/K/V and K/V matrices are CTranslate2's fused ones, in the same order; the
sinusoidal table is mtx's own (interleaved sines and cosines), stored in the model rather than recomputed;
the output projection is the target embedding; decoding starts from BOS, as mtx's does. Quantization
(`QUANTIZATIONS`) happens while saving; any saved model can also be quantized when loaded (`compute_type`).

An int8 export stores each weight row as integers within ±`INT8_WEIGHT_LEVELS` rather than CTranslate2's ±127.
On CPUs without VNNI (AVX2, and AVX-512 before it), CTranslate2's int8 products run through oneDNN's u8/s8
GEMM: activations shifted to unsigned bytes (0…255) times signed weight bytes, with adjacent products summed in
16 bits (vpmaddubsw), which saturates when two large products meet; oneDNN's "Nuances of int8 Computations"
describes this and the remedy, weights with one bit less. Within ±64 no such sum overflows (2 · 255 · 64 =
32640 ≤ 32767) on any CPU, for one bit of weight precision. CTranslate2 keeps saved int8 weights as they are
when a model is loaded with an int8 compute type, but quantizes float32 ones to its own ±127 rows, so every
weight that takes part in a product is saved already quantized: the embedding matrix too, which the output
projection shares.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from mtx.config.recipe import DecodeConfig
from mtx.data.lexicon import Lexicon
from mtx.export.tokenizer import TOKENIZER_NOTE, exported_tokenizer, token_strings
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

QUANTIZATIONS = ("int8", "int8_float16", "float16", "bfloat16")
INT8_QUANTIZATIONS = ("int8", "int8_float16")
INT8_WEIGHT_LEVELS = 64  # the widest int8 weights whose products cannot saturate oneDNN's u8/s8 GEMM
LAYER_NORM_EPS = 1e-5  # mtx's LayerNorm keeps torch's default epsilon


def ctranslate2_spec(model: Transformer, tokens: list[str]):
    """The `ctranslate2.specs.TransformerSpec` of `model`, whose vocabulary (ids in order) is `tokens`."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    pre_norm = cfg.norm == "pre"
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.layers_enc, cfg.layers_dec), cfg.heads, pre_norm=pre_norm, activation=common_spec.Activation.RELU)
    positions = _array(model.positions)
    for stack in (spec.encoder, spec.decoder):
        stack.scale_embeddings = True  # by √d_model, as mtx's `embed_scale`
        stack.position_encodings.encodings = positions
    spec.encoder.embeddings[0].weight = _array(model.src_embed.weight)
    spec.decoder.embeddings.weight = _array(model.tgt_embed.weight)
    spec.decoder.projection.weight = spec.decoder.embeddings.weight
    if pre_norm:
        _set_norm(spec.encoder.layer_norm, model.encoder_norm)
        _set_norm(spec.decoder.layer_norm, model.decoder_norm)
    for ours, theirs in zip(model.encoder_layers, spec.encoder.layer, strict=True):
        _set_linear(theirs.self_attention.linear[0], ours.self_attn.qkv_proj)
        _set_linear(theirs.self_attention.linear[1], ours.self_attn.out_proj)
        _set_norm(theirs.self_attention.layer_norm, ours.attn_residual.norm)
        _set_feed_forward(theirs.ffn, ours)
    for ours, theirs in zip(model.decoder_layers, spec.decoder.layer, strict=True):
        _set_linear(theirs.self_attention.linear[0], ours.self_attn.qkv_proj)
        _set_linear(theirs.self_attention.linear[1], ours.self_attn.out_proj)
        _set_norm(theirs.self_attention.layer_norm, ours.self_residual.norm)
        _set_linear(theirs.attention.linear[0], ours.cross_attn.q_proj)
        _set_linear(theirs.attention.linear[1], ours.cross_attn.kv_proj)
        _set_linear(theirs.attention.linear[2], ours.cross_attn.out_proj)
        _set_norm(theirs.attention.layer_norm, ours.cross_residual.norm)
        _set_feed_forward(theirs.ffn, ours)
    spec.config.bos_token, spec.config.eos_token = SPECIAL_TOKENS[BOS], SPECIAL_TOKENS[EOS]
    spec.config.unk_token, spec.config.decoder_start_token = SPECIAL_TOKENS[UNK], SPECIAL_TOKENS[BOS]
    spec.config.layer_norm_epsilon = LAYER_NORM_EPS
    spec.register_source_vocabulary(tokens)
    spec.register_target_vocabulary(tokens)
    return spec


def convert_to_ctranslate2(model: Transformer, tokens: list[str], folder: str | Path,
                           quantization: str | None = None) -> str:
    """Save `model` as a CTranslate2 model in `folder` (which must not hold another model), its weights
    quantized to `quantization` (None: float32); returns the folder's path."""
    spec = ctranslate2_spec(model, tokens)
    spec.validate()
    weights = quantizable_weights(spec)
    spec.optimize(quantization=quantization)
    if quantization in INT8_QUANTIZATIONS:
        narrow_int8_weights(spec, weights)
    Path(folder).mkdir(parents=True, exist_ok=True)
    spec.save(str(folder))
    return str(folder)


def quantizable_weights(spec) -> dict[tuple[int, str], Tensor]:
    """The float32 weights of `spec` that CTranslate2 quantizes (those with a `<name>_scale` beside them), by
    (id of their layer spec, name): what `narrow_int8_weights` quantizes again after `optimize`."""
    from ctranslate2.specs.model_spec import Variable, visit_spec

    weights = {}

    def collect(layer, scope: str, value) -> None:
        name = scope.rsplit("/", 1)[-1]
        if isinstance(value, Variable) and hasattr(layer, f"{name}_scale"):
            weights[id(layer), name] = torch.from_numpy(value.numpy()).clone()  # optimize scales arrays in place

    visit_spec(spec, collect)
    return weights


def narrow_int8_weights(spec, weights: dict[tuple[int, str], Tensor]) -> None:
    """Quantize again, from `weights` (`quantizable_weights` before `optimize`), every weight of `spec` that
    `optimize` made int8, row by row within ±INT8_WEIGHT_LEVELS (see the module's docstring). Aliases, such as
    the output projection tied to the target embedding, follow the weight they name."""
    from ctranslate2.specs.model_spec import NumpyVariable, Variable, visit_spec

    def narrow(layer, scope: str, value) -> None:
        name = scope.rsplit("/", 1)[-1]
        if (id(layer), name) in weights and isinstance(value, Variable) and value.dtype == "int8":
            quantized, scale = quantize_rows(weights[id(layer), name], INT8_WEIGHT_LEVELS)
            setattr(layer, name, NumpyVariable(quantized.numpy()))
            setattr(layer, f"{name}_scale", NumpyVariable(scale.numpy()))

    visit_spec(spec, narrow)


def quantize_rows(weight: Tensor, levels: int) -> tuple[Tensor, Tensor]:
    """Symmetric int8 quantization of each row of `weight` to the integers within ±`levels`, with the scale
    per row that CTranslate2 divides by (an all-zero row keeps the scale 1)."""
    amax = weight.abs().amax(dim=1)
    scale = torch.where(amax > 0, levels / amax, torch.ones_like(amax))
    return torch.round(weight * scale[:, None]).to(torch.int8), scale.float()


def _array(tensor: Tensor):
    """A float32 copy of a weight, on the CPU, as the spec stores it."""
    return tensor.detach().float().cpu().numpy().copy()


def _set_linear(spec, linear: nn.Linear) -> None:
    spec.weight, spec.bias = _array(linear.weight), _array(linear.bias)


def _set_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(norm.weight), _array(norm.bias)


def _set_feed_forward(spec, layer: nn.Module) -> None:
    _set_linear(spec.linear_0, layer.ffn.fc1)
    _set_linear(spec.linear_1, layer.ffn.fc2)
    _set_norm(spec.layer_norm, layer.ffn_residual.norm)


def save_ctranslate2_folder(model: Transformer, tokenizer_json: str, folder: Path, quantization: str | None,
                            shortlist: tuple[Lexicon, DecodeConfig] | None = None) -> None:
    """The CTranslate2 model and, beside it, the tokenizer its README uses; with `shortlist` (a lexical table
    and the decoding options that say how much of it to use), its vocabulary map too (`write_vocabulary_map`)."""
    tokenizer = exported_tokenizer(tokenizer_json)
    tokens = token_strings(tokenizer, model.vocab_size)
    convert_to_ctranslate2(model, tokens, folder, quantization)
    tokenizer.save(str(folder / "tokenizer.json"))
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


def ctranslate2_usage(folder: Path, decode: DecodeConfig, shortlist: bool = False) -> str:
    """The lines that translate with the exported folder, for its README. min_decoding_length is the recipe's
    min_len, as mtx's: CTranslate2's own default of 1 would never give the empty translation that mtx can.
    `shortlist`: the folder holds a vocabulary map, which the call uses."""
    vmap = " use_vmap=True," if shortlist else ""
    return f'''import ctranslate2
from tokenizers import Tokenizer

translator = ctranslate2.Translator("{folder}", device="cpu")  # in the saved precision
tokenizer = Tokenizer.from_file("{folder}/tokenizer.json")
tokenizer.encode_special_tokens = True  # "</s>" typed in a sentence is text, as in mtx
sources = [tokenizer.encode(s).tokens for s in ["The old friends tidy up his kitchen."]]  # ends with </s>
results = translator.translate_batch(sources, beam_size={decode.beam}, length_penalty={decode.lenpen},{vmap}
                                     min_decoding_length={decode.min_len}, suppress_sequences=[["<pad>"], ["<s>"]])
print([tokenizer.decode([tokenizer.token_to_id(t) for t in r.hypotheses[0]]) for r in results])'''


def ctranslate2_notes(decode: DecodeConfig) -> list[str]:
    """Where CTranslate2 decodes differently from `mtx translate` with the recipe's settings."""
    penalty = ("fairseq-style, as the recipe's" if decode.lenpen_style == "fairseq" else
               "|Y|^α, where mtx's recipe uses GNMT's ((5 + |Y|) / 6)^α: beam search may rank hypotheses of "
               "different lengths differently")
    return [
        f"length_penalty is CTranslate2's {penalty}.",
        f"mtx limits a translation of n source tokens to {decode.max_len_a} · n + {decode.max_len_b} tokens; "
        "CTranslate2's max_decoding_length is one limit for the batch (256 unless set).",
        f"{TOKENIZER_NOTE}; greedy decoding in float32 gives mtx's own tokens.",
        "For int8, export with --quantization int8, which saves weights within ±64. compute_type=\"int8\" on a "
        "float32 export quantizes them while loading to ±127, whose products CPUs without VNNI can saturate.",
    ]
