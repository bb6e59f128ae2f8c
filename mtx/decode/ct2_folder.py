"""An mtx Transformer as a CTranslate2 model folder, and the cache of them the `ct2` engine decodes with.

CTranslate2's `TransformerSpec` describes the paper's encoder-decoder in both of mtx's variants, post-norm and
pre-norm (with the final LayerNorm of each stack), and with each of the model options that published models need
(mtx.config.model: the feed-forward activation, the embedding scale, the position layout, the output bias), so
the spec is filled from mtx's weights directly, with no intermediate model: mtx's packed Q/K/V and K/V matrices
are CTranslate2's fused ones, in the same order; the sinusoidal table is the model's own, in its layout, stored
in the model rather than recomputed; the output projection is the target embedding, plus the output bias where
the model has one; decoding starts from BOS, as mtx's does. Quantization
(`INT8_QUANTIZATIONS` and the half formats) happens while saving. `mtx export --to ctranslate2`
(mtx.export.ctranslate2) writes such a folder for users; the `ct2` engine (mtx.decode.ct2_engine) converts one
once per checkpoint and keeps it (`converted_folder`).

An int8 folder stores each weight row as integers within ±`INT8_WEIGHT_LEVELS` rather than CTranslate2's ±127.
On CPUs without VNNI (AVX2, and AVX-512 before it), CTranslate2's int8 products run through oneDNN's u8/s8
GEMM: activations shifted to unsigned bytes (0…255) times signed weight bytes, with adjacent products summed in
16 bits (vpmaddubsw), which saturates when two large products meet; oneDNN's "Nuances of int8 Computations"
describes this and the remedy, weights with one bit less. Within ±64 no such sum overflows (2 · 255 · 64 =
32640 ≤ 32767) on any CPU, for one bit of weight precision. CTranslate2 keeps saved int8 weights as they are
when a model is loaded with an int8 compute type, but quantizes float32 ones to its own ±127 rows, so every
weight that takes part in a product is saved already quantized: the embedding matrix too, which the output
projection shares.

The cache. A folder is converted once and kept beside its checkpoint, `CKPT.pt.ct2/<key>/`, the key naming
what the folder depends on: the checkpoint file's bytes (their SHA-256), the quantization, the aligning layer
and the CTranslate2 version that wrote it. The file's bytes rather than its weights alone: hashing them needs
no torch and no unpickling, takes a second for a `big` checkpoint, and any change at all (weights, EMA, a
`mtx average` written over the same name) gives a new key, so a changed checkpoint never reuses a stale folder.
A folder is converted into a temporary sibling and renamed into place, which is atomic, so a folder under its
key is always complete; two processes converting at once each finish their own, and the one whose rename loses
uses the winner's. A checkpoint whose folder is not writable is refused, naming it: the engine needs no other
cache directory to be documented, configured and cleaned.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, SPECIAL_TOKENS, UNK, Tokenizer

if TYPE_CHECKING:
    from mtx.spm_tokenizer import SpmPairTokenizer

INT8_QUANTIZATIONS = ("int8", "int8_float16")
INT8_WEIGHT_LEVELS = 64  # the widest int8 weights whose products cannot saturate oneDNN's u8/s8 GEMM
LAYER_NORM_EPS = 1e-5  # mtx's LayerNorm keeps torch's default epsilon
HASH_CHUNK = 1 << 22  # bytes of the checkpoint read at a time while hashing it


def token_strings(tokenizer: Tokenizer | SpmPairTokenizer, vocab_size: int) -> list[str]:
    """The model's vocabulary as strings in id order (`tokenizer.token_strings()`), which is how CTranslate2
    names tokens.

    Byte-level BPE spells every byte with a printable character, and metaspace spells the space as "▁" and
    bytes as "<0xNN>" (`normalize_text` leaves it no other whitespace to learn), as SentencePiece spells the
    space as "▁", so no token holds a space or a line break, which CTranslate2's one-token-a-line vocabulary
    files could not store; and no two ids share a string, which would make CTranslate2's names ambiguous.
    """
    tokens = tokenizer.token_strings()
    if len(tokens) != vocab_size:
        raise MtxError(f"The checkpoint's tokenizer has {len(tokens):,} tokens but its model {vocab_size:,} "
                       "embedding rows: the checkpoint is inconsistent and cannot be exported.")
    if any(re.search(r"\s", token) for token in tokens):
        raise MtxError("The checkpoint's tokenizer has a token holding whitespace, which CTranslate2's "
                       "vocabulary files cannot store.")
    if len(set(tokens)) != len(tokens):
        twice = next(token for token, count in Counter(tokens).items() if count > 1)
        raise MtxError(f"The checkpoint's tokenizer spells two tokens {twice!r}: CTranslate2 names tokens by their "
                       "strings, so it cannot tell them apart.")
    return tokens


def ctranslate2_spec(model: Transformer, tokens: list[str], alignment_layer: int | None = None):
    """The `ctranslate2.specs.TransformerSpec` of `model`, whose vocabulary (ids in order) is `tokens`.

    `alignment_layer`: the decoder layer (0-based) whose cross-attention, all heads averaged, the translator
    returns with `return_attention` (mtx's alignments); None: CTranslate2's default, the first head of the last
    layer, which a user of an exported folder gets."""
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model.cfg
    pre_norm = cfg.norm == "pre"
    aligning = {} if alignment_layer is None else {"alignment_layer": alignment_layer, "alignment_heads": cfg.heads}
    activation = {"relu": common_spec.Activation.RELU, "swish": common_spec.Activation.SWISH,
                  "gelu": common_spec.Activation.GELU}[cfg.activation]  # GELU: the erf form (GELUTanh the other)
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.layers_enc, cfg.layers_dec), cfg.heads, pre_norm=pre_norm, activation=activation, **aligning)
    positions = _array(model.positions)  # in the model's layout: interleaved or in halves
    for stack in (spec.encoder, spec.decoder):
        stack.scale_embeddings = cfg.scale_embeddings  # true: by √d_model, as mtx's `embed_scale`; false: by 1
        stack.position_encodings.encodings = positions
    spec.encoder.embeddings[0].weight = _array(model.src_embed.weight)
    spec.decoder.embeddings.weight = _array(model.tgt_embed.weight)
    spec.decoder.projection.weight = spec.decoder.embeddings.weight
    if model.output_bias is not None:
        spec.decoder.projection.bias = _array(model.output_bias)
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
                           quantization: str | None = None, alignment_layer: int | None = None) -> str:
    """Save `model` as a CTranslate2 model in `folder` (which must not hold another model), its weights
    quantized to `quantization` (None: float32), aligning with `alignment_layer` (`ctranslate2_spec`); returns
    the folder's path."""
    spec = ctranslate2_spec(model, tokens, alignment_layer)
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


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file's bytes, read a few MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def cache_key(checkpoint: Path, quantization: str | None, alignment_layer: int, ct2_version: str) -> str:
    """The name of a checkpoint's converted folder in its cache (the module's docstring says why these parts)."""
    return (f"{file_sha256(checkpoint)[:32]}-{quantization or 'float32'}-align{alignment_layer}"
            f"-ctranslate2_{ct2_version}")


def cached_folder(checkpoint: Path, key: str, convert: Callable[[Path], None],
                  log: Callable[[str], None] = lambda _: None) -> Path:
    """`CKPT.pt.ct2/<key>/`: the folder `convert(folder)` writes, converted now unless it is there already.

    `convert` writes into a temporary sibling, renamed to the key once complete; where another process renamed
    its own first, this one's is removed and the winner's used (the module's docstring)."""
    cache = checkpoint.parent / f"{checkpoint.name}.ct2"
    final = cache / key
    if final.is_dir():
        return final
    try:
        cache.mkdir(exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache))
    except OSError as e:
        raise MtxError(f"--engine ct2 converts {checkpoint} once into {cache}/ beside it, but cannot write there "
                       f"({e.strerror}): make {checkpoint.parent} writable, or copy the checkpoint into a folder "
                       "you can write and translate with the copy.") from None
    try:
        log(f"Converting {checkpoint} for CTranslate2 into {final} (once; later runs reuse it).\n")
        convert(work)
        try:
            os.rename(work, final)
        except OSError:
            if not final.is_dir():  # not a lost race, which leaves the winner's folder: a real failure
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def converted_folder(checkpoint: Path, quantization: str | None, alignment_layer: int,
                     log: Callable[[str], None] = lambda _: None) -> Path:
    """The CTranslate2 folder of `checkpoint` (its translating weights, `inference_weights`), quantized to
    `quantization` (None: float32) and aligning with `alignment_layer`, from its cache or converted now."""
    import ctranslate2

    def convert(folder: Path) -> None:
        from mtx.checkpoint import load_model

        model, tokenizer, _ = load_model(checkpoint)
        convert_to_ctranslate2(model, token_strings(tokenizer, model.vocab_size), folder, quantization, alignment_layer)

    return cached_folder(checkpoint, cache_key(checkpoint, quantization, alignment_layer, ctranslate2.__version__),
                         convert, log)
