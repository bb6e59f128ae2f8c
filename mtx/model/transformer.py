"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017), top to bottom.

Reading order: sinusoidal positions (§3.5) → multi-head attention (§3.2) → the feed-forward block (§3.3) →
encoder and decoder layers (§3.1) → the model: teacher-forced `forward` (what training runs), the output layer
(§3.4), and the inference API that beam search drives: `encode`, `init_state`, `decode_step` over an explicit
`DecoderState` value (mtx.model.decoder_state: the search's bookkeeping, kept out of the model). Asked for them
(`AttentionWeights`), the attention sub-layers also hand out their weights, which `mtx inspect` shows and
`mtx translate --alignment` aligns words with. CPU fast paths that compute the same thing (dropout, attention
for a few queries, the output projection) live in mtx.model.fast_paths; each call to one shows the plain PyTorch
expression it computes.

Shapes are batch-first: B sentences, S source and T target positions, D = d_model, H heads, Dh = D / H,
V the vocabulary. Padding masks are boolean with True marking padding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtx.config.recipe import ModelConfig
from mtx.errors import MtxError
from mtx.model import fast_paths
from mtx.model.decoder_state import DecoderState


class SequenceTooLongError(MtxError):
    """A sequence longer than the model's positional table: the model cannot represent it."""


# ------------------------------------------------------------------------------------------ positions §3.5


def sinusoidal_positions(max_positions: int, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/D)), PE(pos, 2i+1) = cos(...): fixed, so nothing to learn or save."""
    position = torch.arange(max_positions, dtype=torch.float32).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float32) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table


def sinusoidal_positions_in_halves(max_positions: int, d_model: int) -> Tensor:
    """The same sinusoids laid out as Marian lays them out: sin(pos / 10000^(2i/D)) in channel i of the first
    half, cos(...) in channel i of the second (with an odd D the sines take the extra channel).

    Computed as transformers' MarianSinusoidalPositionalEmbedding computes them, in float64 with NumPy's
    power, sine and cosine and cast to float32 at the end, so that an imported model adds the very table it
    was trained with: float32 arithmetic, as `sinusoidal_positions` uses, rounds the angles of distant positions
    differently."""
    import numpy as np

    channel = np.arange(d_model)
    angles = np.arange(max_positions)[:, None] / np.power(10000, 2 * (channel // 2) / d_model)
    return torch.from_numpy(np.concatenate([np.sin(angles[:, 0::2]), np.cos(angles[:, 1::2])], axis=1)).float()


POSITION_TABLES = {"interleaved": sinusoidal_positions, "halves": sinusoidal_positions_in_halves}


# ------------------------------------------------------------------------------------------ attention §3.2


def key_padding_mask(pad: Tensor | None) -> Tensor | None:
    """(B, S) True = padding → (B, 1, 1, S) True = may attend, the boolean form SDPA expects."""
    return None if pad is None else ~pad[:, None, None, :]


def attention_weights(q: Tensor, k: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """softmax(Q Kᵀ / √Dh) of q (B, H, Q, Dh) over k (B, H, K, Dh) → (B, H, Q, K) float32 weights: exactly 0 on
    the keys that `mask` (broadcastable, True = may attend) or, if `causal`, the causal mask hides, and each row
    summing to 1 over the others. The softmax is taken in float32, so that half-precision models report weights
    that sum to 1 as closely as full-precision ones."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * q.shape[-1] ** -0.5
    if causal:
        earlier = torch.ones(scores.shape[-2:], dtype=torch.bool, device=scores.device).tril()
        mask = earlier if mask is None else mask & earlier
    if mask is not None:
        scores = scores.masked_fill(~mask, -torch.inf)
    return scores.float().softmax(dim=-1)


@dataclass
class AttentionWeights:
    """The attention weights of one pass, kept when asked for (`Transformer.forward(..., attention=...)`).

    PyTorch's fused attention returns the attended values and never the weights, so a sub-layer asked for them
    computes its attention written out instead (`attention_weights`, then the product with the values), and
    appends its (B, H, queries, keys) float32 weights to its kind's list, layer by layer. Everything else runs
    as in any pass, so the weights are the model's own; a model that is not asked pays nothing.
    """

    encoder: list[Tensor] = field(default_factory=list)  # encoder self-attention, (B, H, S, S) per layer
    decoder: list[Tensor] = field(default_factory=list)  # decoder self-attention, (B, H, T, T) per layer
    cross: list[Tensor] = field(default_factory=list)  # cross-attention over the source, (B, H, T, S) per layer

    def stacked(self, kind: str) -> Tensor:
        """One kind's weights as (B, layers, H, queries, keys)."""
        return torch.stack(getattr(self, kind), dim=1)


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention (§3.2.1) over H heads of size Dh = D / H (§3.2.2).

    Queries, keys and values have separate projections (the paper's W^Q, W^K, W^V), packed into one matrix for
    self-attention (one matmul for Q, K and V) and into a K/V pair for cross-attention, whose keys and values
    come from the encoder and are projected once per sentence at inference.
    """

    def __init__(self, d_model: int, heads: int, attn_dropout: float, self_attention: bool) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, d_model // heads
        self.attn_dropout = attn_dropout
        if self_attention:
            self.qkv_proj = nn.Linear(d_model, 3 * d_model)
        else:
            self.q_proj = nn.Linear(d_model, d_model)
            self.kv_proj = nn.Linear(d_model, 2 * d_model)
        self.out_proj = nn.Linear(d_model, d_model)

    def split_heads(self, x: Tensor) -> Tensor:  # (B, L, D) -> (B, H, L, Dh)
        return x.unflatten(-1, (self.heads, self.head_dim)).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:  # (B, H, L, Dh) -> (B, L, D)
        return x.transpose(1, 2).flatten(2)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        return tuple(self.split_heads(t) for t in self.qkv_proj(x).chunk(3, dim=-1))

    def project_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        return tuple(self.split_heads(t) for t in self.kv_proj(memory).chunk(2, dim=-1))

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False,
               keep: list[Tensor] | None = None) -> Tensor:
        """softmax(Q Kᵀ / √Dh) V per head, then the output projection; `mask` is True where a key may be attended.
        With `keep`, the weights are appended to it (see `AttentionWeights`)."""
        if keep is not None:
            weights = attention_weights(q, k, mask, causal)
            keep.append(weights)
            return self.out_proj(self.merge_heads(torch.matmul(weights.to(v.dtype), v)))
        dropout = self.attn_dropout if self.training else 0.0
        # = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal)
        out = fast_paths.attention(q, k, v, mask, dropout, causal)
        return self.out_proj(self.merge_heads(out))

    def forward_self(self, x: Tensor, pad: Tensor | None = None, causal: bool = False,
                     keep: list[Tensor] | None = None) -> Tensor:
        q, k, v = self.project_qkv(x)
        return self.attend(q, k, v, key_padding_mask(pad), causal, keep)

    def forward_cross(self, x: Tensor, memory: Tensor, memory_pad: Tensor | None,
                      keep: list[Tensor] | None = None) -> Tensor:
        k, v = self.project_kv(memory)
        return self.attend(self.split_heads(self.q_proj(x)), k, v, key_padding_mask(memory_pad), keep=keep)


# ------------------------------------------------------------------------------------- feed-forward §3.3


# The feed-forward non-linearities `ModelConfig.activation` names: the paper's ReLU, and the two that published
# models also use, swish (SiLU, x·σ(x): most OPUS-MT models) and GELU (x·Φ(x), the exact erf form).
ACTIVATIONS = {"relu": F.relu, "swish": F.silu, "gelu": F.gelu}


class FeedForward(nn.Module):
    """FFN(x) = max(0, x W1 + b1) W2 + b2, applied to each position alike (max(0, ·) the paper's ReLU, or the
    activation a model names)."""

    def __init__(self, d_model: int, d_ff: int, relu_dropout: float, activation: str = "relu") -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_ff)
        self.fc2 = nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = fast_paths.Dropout(relu_dropout)  # = nn.Dropout(relu_dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.dropout(self.activation(self.fc1(x))))


# ---------------------------------------------------------------------------------------- layers §3.1


class LayerNorm(nn.LayerNorm):
    """Layer normalisation computed in float32 whatever the input's precision, returned in the input's.

    Its mean and variance sum d_model values; in bf16's 8-bit mantissa they would lose the small differences
    the normalisation exists to bring out. Training under autocast already gets float32 here; this keeps
    half-precision inference (mtx.devices.half_precision_model) the same.
    """

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype == self.weight.dtype == torch.float32:  # nothing to convert: a decoding step's calls are short
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        weight, bias = self.weight.float(), self.bias.float()  # no-ops unless the whole model was cast
        return F.layer_norm(x.float(), self.normalized_shape, weight, bias, self.eps).to(x.dtype)


class Residual(nn.Module):
    """One sub-layer's residual connection with LayerNorm and dropout (§5.4).

    post-norm (the paper): LayerNorm(x + Dropout(Sublayer(x))).
    pre-norm: x + Dropout(Sublayer(LayerNorm(x))), which trains deep or large models without warmup trouble.
    """

    def __init__(self, d_model: int, dropout: float, pre_norm: bool) -> None:
        super().__init__()
        self.norm = LayerNorm(d_model)
        self.dropout = fast_paths.Dropout(dropout)  # = nn.Dropout(dropout)
        self.pre_norm = pre_norm

    def forward(self, x: Tensor, sublayer) -> Tensor:
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x)))
        return self.norm(x + self.dropout(sublayer(x)))


class EncoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attn_dropout, self_attention=True)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout, cfg.activation)
        self.attn_residual = Residual(cfg.d_model, cfg.dropout, pre)
        self.ffn_residual = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, src_pad: Tensor | None, attention: AttentionWeights | None = None) -> Tensor:
        keep = None if attention is None else attention.encoder
        x = self.attn_residual(x, lambda h: self.self_attn.forward_self(h, src_pad, keep=keep))
        return self.ffn_residual(x, self.ffn)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        pre = cfg.norm == "pre"
        self.self_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attn_dropout, self_attention=True)
        self.cross_attn = MultiHeadAttention(cfg.d_model, cfg.heads, cfg.attn_dropout, self_attention=False)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.relu_dropout, cfg.activation)
        self.self_residual = Residual(cfg.d_model, cfg.dropout, pre)
        self.cross_residual = Residual(cfg.d_model, cfg.dropout, pre)
        self.ffn_residual = Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, memory: Tensor, src_pad: Tensor | None,
                attention: AttentionWeights | None = None) -> Tensor:
        """Training: all target positions at once, the causal mask hiding the future."""
        own, cross = (None, None) if attention is None else (attention.decoder, attention.cross)
        x = self.self_residual(x, lambda h: self.self_attn.forward_self(h, causal=True, keep=own))
        x = self.cross_residual(x, lambda h: self.cross_attn.forward_cross(h, memory, src_pad, keep=cross))
        return self.ffn_residual(x, self.ffn)

    def cross_attention_weights(self, x: Tensor, memory: Tensor, src_pad: Tensor | None) -> Tensor:
        """The (B, H, T, S) weights of this layer's cross-attention for its input `x`: its self-attention
        sub-layer, then the cross-attention's weights; the feed-forward block, which cannot change them, is
        left out."""
        x = self.self_residual(x, lambda h: self.self_attn.forward_self(h, causal=True))
        kept: list[Tensor] = []
        self.cross_residual(x, lambda h: self.cross_attn.forward_cross(h, memory, src_pad, keep=kept))
        return kept[0]

    def step(self, x: Tensor, layer: int, state: DecoderState) -> Tensor:
        """Inference: one new position (B, 1, D). Its K/V are written into the cache at `state.step`, and it
        attends to the positions cached so far, so no causal mask is needed."""
        t = state.step

        def self_attend(h: Tensor) -> Tensor:
            attn = self.self_attn
            qkv = attn.qkv_proj(h).view(h.shape[0], 3, attn.heads, 1, attn.head_dim)  # (N, Q/K/V, H, 1, Dh)
            state.self_kv[layer, :, :, :, t].copy_(qkv[:, 1:, :, 0].transpose(0, 1))  # this position's K and V
            cached = state.self_kv[layer, :, :, :, : t + 1]
            return attn.attend(qkv[:, 0], cached[0], cached[1])

        def cross_attend(h: Tensor) -> Tensor:
            # A sentence's rows (its beams) share its encoder output, so the cache holds one copy of its keys
            # and values and its beams attend to it together, as the queries of one (beams, Dh) × (Dh, S)
            # product per head, rather than one (1, Dh) × (Dh, S) product per beam against a copy of its own.
            sentences = state.cross_kv.shape[2]
            q = self.cross_attn.split_heads(self.cross_attn.q_proj(h).view(sentences, -1, h.shape[-1]))
            keys, values = state.cross_kv[layer, 0], state.cross_kv[layer, 1]
            if layer == state.attention_layer:  # its weights as well, beside (not instead of) the fast path, so
                # that the search is the same with or without them: (B, H, beams, S) → (N, S), heads averaged
                weights = attention_weights(q, keys, state.memory_mask, causal=False)
                state.attention = weights.mean(dim=1).flatten(0, 1).float()
            return self.cross_attn.attend(q, keys, values, state.memory_mask).view(h.shape)

        x = self.self_residual(x, self_attend)
        x = self.cross_residual(x, cross_attend)
        return self.ffn_residual(x, self.ffn)


# ------------------------------------------------------------------------------------------- the model


class Transformer(nn.Module):
    """Encoder-decoder Transformer with one vocabulary for source, target and output."""

    def __init__(self, cfg: ModelConfig, vocab_size: int, pad_id: int = 0) -> None:
        super().__init__()
        self.cfg, self.vocab_size, self.pad_id = cfg, vocab_size, pad_id
        d = cfg.d_model
        # §3.4: the embeddings are multiplied by sqrt(d_model); with N(0, d^-1/2) initialisation this makes
        # the scaled embeddings unit-variance, on the scale of the positional encodings. A model trained without
        # the factor (scale_embeddings: false) adds its embeddings as they are.
        self.embed_scale = math.sqrt(d) if cfg.scale_embeddings else 1.0
        self.tgt_embed = nn.Embedding(vocab_size, d, padding_idx=pad_id)
        self.src_embed = self.tgt_embed if cfg.share_embeddings else nn.Embedding(vocab_size, d, padding_idx=pad_id)
        table = POSITION_TABLES[cfg.positions](cfg.max_positions, d)
        self.register_buffer("positions", table, persistent=False)
        # logits = h · Eᵀ + b with output_bias (Marian's final_logits_bias); the paper's output layer has no b.
        self.output_bias = nn.Parameter(torch.zeros(vocab_size)) if cfg.output_bias else None
        self.dropout = fast_paths.Dropout(cfg.dropout)  # = nn.Dropout(cfg.dropout)
        self.encoder_layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.layers_enc))
        self.decoder_layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.layers_dec))
        # Pre-norm leaves the residual stream unnormalised, so each stack ends with a LayerNorm.
        pre = cfg.norm == "pre"
        self.encoder_norm = LayerNorm(d) if pre else nn.Identity()
        self.decoder_norm = LayerNorm(d) if pre else nn.Identity()
        # The output projection as a module of its own, once `make_output_projection_a_module` made it one.
        self.output_proj: nn.Module | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections with zero biases, N(0, d^-1/2) embeddings with a zero pad row (fairseq), a
        zero output bias."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        if self.output_bias is not None:
            nn.init.zeros_(self.output_bias)
        for embed in {id(self.src_embed): self.src_embed, id(self.tgt_embed): self.tgt_embed}.values():
            nn.init.normal_(embed.weight, mean=0.0, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                embed.weight[self.pad_id].zero_()

    # ---- pieces shared by training and inference

    def check_length(self, length: int, what: str) -> None:
        if length > self.cfg.max_positions:
            raise SequenceTooLongError(
                f"A {what} sequence of {length} tokens is longer than the model's max_positions "
                f"({self.cfg.max_positions}): shorten or split it, or train with a larger model.max_positions."
            )

    def embed(self, table: nn.Embedding, tokens: Tensor, start: int = 0) -> Tensor:
        """Scaled embeddings plus positions, summed in float32 (the table stays float32 in half-precision
        inference), then in the embeddings' own precision."""
        positions = self.positions[start : start + tokens.shape[1]]
        return self.dropout((table(tokens).float() * self.embed_scale + positions).to(table.weight.dtype))

    def _check_eval_mode(self) -> None:
        """Attention weights are those of the model that translates: dropout would change them."""
        if self.training:
            raise ValueError("attention weights are kept in eval mode only: dropout would change them")

    # ---- the teacher-forced pass: training, and the attention of a given pair

    def encode(self, src: Tensor, src_pad: Tensor | None, attention: AttentionWeights | None = None) -> Tensor:
        """(B, S) token ids → (B, S, D) encoder output ("memory")."""
        self.check_length(src.shape[1], "source")
        if attention is not None:
            self._check_eval_mode()
        x = self.embed(self.src_embed, src)
        for layer in self.encoder_layers:
            x = layer(x, src_pad, attention)
        return self.encoder_norm(x)

    def forward(self, src: Tensor, src_pad: Tensor | None, tgt_in: Tensor, tgt_positions: Tensor | None = None,
                attention: AttentionWeights | None = None) -> Tensor:
        """Teacher forcing: (B, S) source and (B, T) shifted target → (B, T, D) final decoder states, which the
        output layer turns into logits (`output_logits`, the Annotated Transformer's generator).

        Training's loss applies the output layer itself, a chunk of target tokens at a time, fused with the loss
        (`mtx.train.loss`): the (tokens, V) logits are a batch's largest tensor by far. So it asks, with
        `tgt_positions`, the (N,) indices of the positions that have a target token in the flattened (B·T)
        target (`Batch.tgt_positions`), for those N positions alone: (N, D). Batches bucketed by source length
        still hold target padding, whose projection, loss terms and backward would only be thrown away, and
        indices computed with the batch, rather than a boolean mask here, keep the GPU from waiting for the
        mask's count.

        With `attention` (eval mode only), every attention sub-layer's weights are appended to it.
        """
        self.check_length(tgt_in.shape[1], "target")
        memory = self.encode(src, src_pad, attention)
        x = self.embed(self.tgt_embed, tgt_in)
        for layer in self.decoder_layers:
            x = layer(x, memory, src_pad, attention)
        x = self.decoder_norm(x)
        if tgt_positions is not None:
            x = x.flatten(0, 1).index_select(0, tgt_positions)
        return x

    def cross_attention_weights(self, memory: Tensor, src_pad: Tensor | None, tgt_in: Tensor, layer: int) -> Tensor:
        """The (B, H, T, S) cross-attention weights of decoder layer `layer` (0-based) for the encoder output
        `memory` (B, S, D) of sources padded as `src_pad` and the target inputs `tgt_in` (B, T): what aligning
        the hypotheses of a search needs, which has encoded their sources already. Only what the weights depend
        on is computed: the layers below, then this layer up to its cross-attention (eval mode only)."""
        self.check_length(tgt_in.shape[1], "target")
        self._check_eval_mode()
        x = self.embed(self.tgt_embed, tgt_in)
        for below in self.decoder_layers[:layer]:
            x = below(x, memory, src_pad)
        return self.decoder_layers[layer].cross_attention_weights(x, memory, src_pad)

    # ---- the output layer §3.4

    @property
    def output_weight(self) -> Tensor:
        """The (V, D) output matrix E of logits = h · Eᵀ: the target embedding matrix itself (§3.4)."""
        return self.tgt_embed.weight

    def output_logits(self, h: Tensor) -> Tensor:
        """(..., D) decoder states → (..., V) logits = h · Eᵀ, plus the output bias b where the model has one."""
        if self.output_proj is not None:
            return self.output_proj(h)
        # = F.linear(h, self.output_weight, self.output_bias)
        return fast_paths.tied_projection(h, self.output_weight, self.output_bias)

    def make_output_projection_a_module(self) -> None:
        """Give the output projection a module of its own: an nn.Linear (D → V) whose weight is E itself, not a
        copy, and whose bias is the output bias itself (none where the model has none). Conversions that apply
        to modules then reach it too, and give it a copy of E in their own format while the embedding lookups
        keep reading E: int8 (`mtx translate --dtype int8`, mtx.model.int8) an int8 copy, the CPU's float32
        inference layout (`fast_paths.store_weights_transposed`) a transposed one; both keep the bias."""
        projection = nn.Linear(self.cfg.d_model, self.vocab_size, bias=False, device="meta")
        projection.weight, projection.bias = self.output_weight, self.output_bias
        self.output_proj = projection

    # ---- inference

    def init_state(self, memory: Tensor, src_pad: Tensor | None, max_len: int,
                   attention_layer: int | None = None) -> DecoderState:
        """An empty cache for up to `max_len` target positions, with the cross-attention K/V projected once;
        with `attention_layer`, each step also leaves that layer's cross-attention weights in the state."""
        self.check_length(max_len, "target")
        batch, d = memory.shape[0], self.cfg.d_model
        heads = self.cfg.heads
        cross = torch.stack([torch.stack(layer.cross_attn.project_kv(memory)) for layer in self.decoder_layers])
        self_kv = memory.new_empty(len(self.decoder_layers), 2, batch, heads, max_len, d // heads)
        return DecoderState(self_kv, cross, key_padding_mask(src_pad), step=0, attention_layer=attention_layer)

    def state_bytes(self, rows: int, sentences: int, source_len: int, max_len: int) -> int:
        """The bytes `init_state` and the search's reorders take for `sentences` sentences of up to `source_len`
        tokens decoded as `rows` rows (their beams or samples) for up to `max_len` positions: every row's
        self-attention cache, the one row a sentence that it grows from (`DecoderState.reorder` copies it while
        both exist), and every sentence's cross-attention cache (never copied for its rows). What a search checks
        before it allocates."""
        per_position = self.tgt_embed.weight.element_size() * len(self.decoder_layers) * 2 * self.cfg.d_model
        return per_position * ((rows + sentences) * max_len + sentences * source_len)

    def decode_step(self, prev: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """Feed one token per row, (N,), at position `state.step` → (N, V) float32 log-probabilities."""
        hidden, state = self.decode_hidden(prev, state)
        logits = self.output_logits(hidden).float()
        # In place: the (N, V) logits are the step's largest tensor, and a fresh one costs its page faults again.
        return torch.log_softmax(logits, dim=-1, out=logits), state

    def decode_hidden(self, prev: Tensor, state: DecoderState) -> tuple[Tensor, DecoderState]:
        """`decode_step` up to the output layer: (N, D) final decoder states, for an output layer over fewer
        tokens than the vocabulary (mtx.decode.shortlist)."""
        if state.step >= state.max_len:
            raise SequenceTooLongError(f"The decoder state holds {state.max_len} positions; all are used.")
        if state.slots is not None:  # decode the rows in the order of their caches (DecoderState.slots)
            prev = prev.new_empty(prev.shape).index_copy_(0, state.slots, prev)
        x = self.embed(self.tgt_embed, prev.unsqueeze(1), start=state.step)
        for i, layer in enumerate(self.decoder_layers):
            x = layer.step(x, i, state)
        state.step += 1
        hidden = self.decoder_norm(x).squeeze(1)
        if state.slots is not None:  # back in the search's order
            hidden = hidden[state.slots]
            state.attention = None if state.attention is None else state.attention[state.slots]
        return hidden, state


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters, each shared matrix counted once (as the paper's 65M / 213M are)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def count_parameters_for(cfg: ModelConfig, vocab_size: int) -> int:
    """The parameter count of a recipe's model, built on the meta device: exact, and no memory is used."""
    with torch.device("meta"):
        return count_parameters(Transformer(cfg, vocab_size))
