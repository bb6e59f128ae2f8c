"""An mtx Transformer as a `transformers` MarianMT model that computes the same function.

Marian in `transformers` is the paper's post-norm Transformer with sinusoidal positions, which is what mtx
trains by default. Three things differ in layout only, and are mapped here:

- mtx packs self-attention's Q, K, V into one matrix and cross-attention's K, V into another; Marian keeps
  them separate, so those are split.
- mtx's sinusoidal table interleaves sines and cosines across channels (sin in the even channels, cos in the
  odd ones); Marian's puts all the sines first. Marian rebuilds its table when a saved model is loaded
  (it is not among the saved weights), so instead of copying mtx's table, the channels of the whole
  residual stream are reordered to Marian's order (`residual_order`): every matrix that reads the stream
  has its input columns permuted, every one that writes it its output rows, and every LayerNorm its
  parameters. LayerNorm and the tied output projection are indifferent to the order of channels, so the
  reordered model computes exactly the same log-probabilities with Marian's own positions.
- Decoding starts from BOS, as mtx's does (Marian's own models start from PAD's zero embedding).

Pre-norm models have no Marian counterpart and are refused; models whose source embedding is not shared
map onto Marian's separate encoder embedding (`share_encoder_decoder_embeddings=False`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mtx.config.recipe import ModelConfig
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD


def residual_order(d_model: int) -> Tensor:
    """Marian's channel c is mtx's channel order[c]: mtx's sine channels 0, 2, 4, ... then its cosine channels
    1, 3, 5, ..., which is where Marian's table has the same sinusoids (the same frequency in both halves)."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


def check_marian_can_express(cfg: ModelConfig) -> None:
    """Refuse, naming the reason, a model that MarianMT's layers cannot compute exactly."""
    if cfg.norm != "post":
        raise MtxError("This model is pre-norm (model.norm: pre), and MarianMT's layers in transformers are "
                       "post-norm only, so no MarianMT model computes it. Export it with --to ctranslate2, "
                       "which has pre-norm layers.")
    if cfg.d_model % 2:
        raise MtxError(f"d_model {cfg.d_model} is odd: Marian's sinusoidal table needs an even d_model.")


def marian_config(cfg: ModelConfig, vocab: int):
    """A `transformers.MarianConfig` of the same architecture as an mtx model of config `cfg`.

    The settings that differ from Marian's defaults are spelled out: ReLU (its default is GELU), √d_model
    embedding scaling, the output projection tied to the target embedding, whether the source embedding is
    that same matrix, dropout only on embeddings and residual branches, and mtx's special-token ids with
    decoding starting from BOS.
    """
    from transformers import MarianConfig

    check_marian_can_express(cfg)
    return MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=cfg.d_model,
        encoder_layers=cfg.layers_enc, decoder_layers=cfg.layers_dec,
        encoder_attention_heads=cfg.heads, decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function="relu",
        dropout=cfg.dropout, attention_dropout=cfg.attn_dropout, activation_dropout=cfg.relu_dropout,
        max_position_embeddings=cfg.max_positions, scale_embedding=True,
        share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=True,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS,
    )


def build_marian(cfg: ModelConfig, vocab: int, attn_implementation: str = "sdpa"):
    """A MarianMTModel of the same shape as mtx's, with its own random weights."""
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(cfg, vocab))
    model.config._attn_implementation = attn_implementation
    return model


def marian_from_mtx(model: Transformer, attn_implementation: str = "sdpa"):
    """A float32 MarianMTModel that computes the same function as `model`: every weight copied across, with the
    residual stream's channels in Marian's order (see the module's docstring)."""
    marian = build_marian(model.cfg, model.vocab_size, attn_implementation)
    order = residual_order(model.cfg.d_model)
    with torch.no_grad():
        marian.model.decoder.embed_tokens.weight.copy_(model.tgt_embed.weight[:, order])
        marian.model.encoder.embed_tokens.weight.copy_(model.src_embed.weight[:, order])
        for ours, theirs in zip(model.encoder_layers, marian.model.encoder.layers, strict=True):
            _copy_reading(ours.self_attn.qkv_proj, (theirs.self_attn.q_proj, theirs.self_attn.k_proj,
                                                   theirs.self_attn.v_proj), order)
            _copy_writing(ours.self_attn.out_proj, theirs.self_attn.out_proj, order)
            _copy_norm(ours.attn_residual.norm, theirs.self_attn_layer_norm, order)
            _copy_reading(ours.ffn.fc1, (theirs.fc1,), order)
            _copy_writing(ours.ffn.fc2, theirs.fc2, order)
            _copy_norm(ours.ffn_residual.norm, theirs.final_layer_norm, order)
        for ours, theirs in zip(model.decoder_layers, marian.model.decoder.layers, strict=True):
            _copy_reading(ours.self_attn.qkv_proj, (theirs.self_attn.q_proj, theirs.self_attn.k_proj,
                                                   theirs.self_attn.v_proj), order)
            _copy_writing(ours.self_attn.out_proj, theirs.self_attn.out_proj, order)
            _copy_norm(ours.self_residual.norm, theirs.self_attn_layer_norm, order)
            _copy_reading(ours.cross_attn.q_proj, (theirs.encoder_attn.q_proj,), order)
            _copy_reading(ours.cross_attn.kv_proj, (theirs.encoder_attn.k_proj, theirs.encoder_attn.v_proj), order)
            _copy_writing(ours.cross_attn.out_proj, theirs.encoder_attn.out_proj, order)
            _copy_norm(ours.cross_residual.norm, theirs.encoder_attn_layer_norm, order)
            _copy_reading(ours.ffn.fc1, (theirs.fc1,), order)
            _copy_writing(ours.ffn.fc2, theirs.fc2, order)
            _copy_norm(ours.ffn_residual.norm, theirs.final_layer_norm, order)
        marian.final_logits_bias.zero_()
    _check_tied(marian, model.cfg.share_embeddings)
    return marian


def _copy_reading(packed: nn.Linear, targets: tuple[nn.Linear, ...], order: Tensor) -> None:
    """A projection that reads the residual stream (packed: its rows split into `targets`): input columns
    permuted, its outputs (attention heads, the feed-forward's hidden units) left as they are."""
    for weight, bias, target in zip(packed.weight.chunk(len(targets)), packed.bias.chunk(len(targets)), targets,
                                    strict=True):
        target.weight.copy_(weight[:, order])
        target.bias.copy_(bias)


def _copy_writing(source: nn.Linear, target: nn.Linear, order: Tensor) -> None:
    """A projection that writes the residual stream: output rows permuted."""
    target.weight.copy_(source.weight[order])
    target.bias.copy_(source.bias[order])


def _copy_norm(source: nn.LayerNorm, target: nn.LayerNorm, order: Tensor) -> None:
    target.weight.copy_(source.weight[order])
    target.bias.copy_(source.bias[order])


def _check_tied(marian, shared: bool) -> None:
    """The output projection must be the target embedding itself, and the source embedding too if shared: a
    transformers version that untied them would save a model that is not mtx's."""
    target = marian.model.decoder.embed_tokens.weight.data_ptr()
    tied = marian.lm_head.weight.data_ptr() == target
    if shared:
        tied = tied and marian.model.encoder.embed_tokens.weight.data_ptr() == target
    if not tied:
        raise RuntimeError("Marian's output projection and embeddings are not the shared matrix mtx's model has")
