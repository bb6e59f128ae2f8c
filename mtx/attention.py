"""Every head's attention weights, from a teacher-forced pass written out beside the model's own.

The model attends through `mtx.model.fast_paths.attention`, which is PyTorch's fused scaled dot-product attention on
most paths: it returns the attended values and never the weights. This module runs the pass of
`Transformer.forward` again with the model's own modules and weights (its projections, residual connections,
LayerNorms and feed-forward blocks), and writes out only the attention itself, softmax(Q Kᵀ / √Dh) V (§3.2.1),
so that the weights can be kept. The model's code is untouched and its translations pay nothing: this path runs
only when asked for (`mtx translate --alignment`, mtx.decode.alignment).

Weights are kept batch first, then layer, then head, then query, then key:

    encoder: (B, L_enc, H, S, S)  encoder self-attention, source position → source position
    decoder: (B, L_dec, H, T, T)  decoder self-attention, target position → earlier or same target position
    cross:   (B, L_dec, H, T, S)  cross-attention, target position → source position

B sentences, S source and T target positions (`tgt_in`: BOS and the target, so the row of position t is the
attention of the step that predicts target token t), H heads. Each row sums to 1 over the keys its query may
attend and is exactly 0 on the others: source padding, and the later target positions of the causal mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtx.model.transformer import DecoderLayer, EncoderLayer, MultiHeadAttention, Transformer, key_padding_mask


@dataclass(frozen=True)
class AttentionMaps:
    """The weights of one teacher-forced pass, in float32 whatever the model's precision, laid out as the
    module docstring shows, and the output that `Transformer.forward` gives for the same inputs."""

    encoder: Tensor  # (B, L_enc, H, S, S)
    decoder: Tensor  # (B, L_dec, H, T, T)
    cross: Tensor  # (B, L_dec, H, T, S)
    outputs: Tensor  # (B, T, V) logits, or with project=False the final decoder states (B, T, D)


def attend_keeping_weights(attn: MultiHeadAttention, q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None,
                           weights: list[Tensor]) -> Tensor:
    """`attn`'s attention of the projected heads q (B, H, Q, Dh) over k and v (B, H, K, Dh), written out,
    its (B, H, Q, K) weights appended to `weights`. `allowed` broadcasts to (B, H, Q, K), True where a key
    may be attended. The softmax is taken in float32, so that half-precision models report weights that sum
    to 1 as closely as full-precision ones."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if allowed is not None:
        scores = scores.masked_fill(~allowed, -torch.inf)
    probabilities = scores.float().softmax(dim=-1)
    weights.append(probabilities)
    return attn.out_proj(attn.merge_heads(torch.matmul(probabilities.to(v.dtype), v)))


def encoder_layer(layer: EncoderLayer, x: Tensor, allowed: Tensor | None, weights: list[Tensor]) -> Tensor:
    """`EncoderLayer.forward`, its self-attention weights appended to `weights`."""
    attn = layer.self_attn
    x = layer.attn_residual(x, lambda h: attend_keeping_weights(attn, *attn.project_qkv(h), allowed, weights))
    return layer.ffn_residual(x, layer.ffn)


def decoder_layer(layer: DecoderLayer, x: Tensor, memory: Tensor, causal: Tensor, memory_allowed: Tensor | None,
                  self_weights: list[Tensor], cross_weights: list[Tensor]) -> Tensor:
    """`DecoderLayer.forward` (all target positions at once), its self-attention and cross-attention weights
    appended to `self_weights` and `cross_weights`."""
    own, cross = layer.self_attn, layer.cross_attn
    x = layer.self_residual(x, lambda h: attend_keeping_weights(own, *own.project_qkv(h), causal, self_weights))
    x = layer.cross_residual(x, lambda h: attend_keeping_weights(
        cross, cross.split_heads(cross.q_proj(h)), *cross.project_kv(memory), memory_allowed, cross_weights))
    return layer.ffn_residual(x, layer.ffn)


def check_eval_mode(model: Transformer) -> None:
    if model.training:
        raise ValueError("the explicit attention path needs a model in eval mode: dropout would change the weights")


def encode(model: Transformer, src: Tensor, allowed: Tensor | None, weights: list[Tensor]) -> Tensor:
    """`Transformer.encode`, each layer's self-attention weights appended to `weights`."""
    model.check_length(src.shape[1], "source")
    x = model.embed(model.src_embed, src)
    for layer in model.encoder_layers:
        x = encoder_layer(layer, x, allowed, weights)
    return model.encoder_norm(x)


def decode(model: Transformer, memory: Tensor, memory_allowed: Tensor | None, tgt_in: Tensor,
           decoder: list[Tensor], cross: list[Tensor]) -> Tensor:
    """The teacher-forced decoder of `Transformer.forward` before its final LayerNorm, each layer's weights
    appended to `decoder` and `cross`."""
    model.check_length(tgt_in.shape[1], "target")
    causal = torch.ones(tgt_in.shape[1], tgt_in.shape[1], dtype=torch.bool, device=tgt_in.device).tril()
    y = model.embed(model.tgt_embed, tgt_in)
    for layer in model.decoder_layers:
        y = decoder_layer(layer, y, memory, causal, memory_allowed, decoder, cross)
    return y


@torch.inference_mode()
def attention_maps(model: Transformer, src: Tensor, src_pad: Tensor | None, tgt_in: Tensor,
                   project: bool = True) -> AttentionMaps:
    """The attention weights of every layer and head for (B, S) sources `src` (`src_pad` True at padding)
    and (B, T) target inputs `tgt_in` (BOS, then the target), with what `model.forward` returns for them.

    The model must be in eval mode: these are the weights of the model that translates, without dropout.
    `project=False` skips the output projection onto the vocabulary.
    """
    check_eval_mode(model)
    allowed = key_padding_mask(src_pad)
    encoder: list[Tensor] = []
    decoder: list[Tensor] = []
    cross: list[Tensor] = []
    memory = encode(model, src, allowed, encoder)
    states = model.decoder_norm(decode(model, memory, allowed, tgt_in, decoder, cross))
    outputs = model.output_logits(states) if project else states
    return AttentionMaps(torch.stack(encoder, dim=1), torch.stack(decoder, dim=1), torch.stack(cross, dim=1),
                         outputs)


@torch.inference_mode()
def cross_attention(model: Transformer, memory: Tensor, src_pad: Tensor | None, tgt_in: Tensor,
                    layer: int) -> Tensor:
    """The (B, H, T, S) cross-attention weights of decoder layer `layer` (0-based) alone, for the encoder
    output `memory` (B, S, D) of sources padded as `src_pad` and the target inputs `tgt_in` (B, T): what
    aligning the hypotheses of a search needs, which has encoded their sources already.

    Only what the weights depend on is computed, so that aligning costs translation little: the layers below
    run on the model's own fast path (their weights are not wanted), then `layer`'s self-attention, and its
    cross-attention on the explicit path; its feed-forward block and the layers above are left out."""
    check_eval_mode(model)
    model.check_length(tgt_in.shape[1], "target")
    y = model.embed(model.tgt_embed, tgt_in)
    for below in model.decoder_layers[:layer]:
        y = below(y, memory, src_pad)
    chosen = model.decoder_layers[layer]
    own, cross = chosen.self_attn, chosen.cross_attn
    y = chosen.self_residual(y, lambda h: own.forward_self(h, causal=True))
    weights: list[Tensor] = []
    chosen.cross_residual(y, lambda h: attend_keeping_weights(
        cross, cross.split_heads(cross.q_proj(h)), *cross.project_kv(memory), key_padding_mask(src_pad), weights))
    return weights[0]
