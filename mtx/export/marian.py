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

A model imported from MarianMT (mtx.importing) already has Marian's position table (model.positions: halves), so
its channels stay in place, and it goes back to Marian's own ids (`MarianIds.of_import`): its rows in Marian's
order, without the PAD row that only mtx has, decoding from Marian's start token. The model's options map onto
MarianConfig's: its activation, its output bias (final_logits_bias), its embedding scale.

Pre-norm models have no Marian counterpart and are refused; models whose source embedding is not shared
map onto Marian's separate encoder embedding (`share_encoder_decoder_embeddings=False`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

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


@dataclass(frozen=True)
class MarianIds:
    """The ids of a MarianMT twin: its vocabulary's size, its special tokens, and which of mtx's rows is each of
    its own (`rows`; None: the same ids as mtx's)."""

    size: int
    pad: int
    eos: int
    start: int  # decoder_start_token_id
    rows: Tensor | None = None

    @classmethod
    def of_mtx(cls, vocab_size: int) -> MarianIds:
        """mtx's own ids, for a model mtx trained: decoding starts from BOS."""
        return cls(vocab_size, PAD, EOS, BOS)

    @classmethod
    def of_import(cls, marian_ids: Sequence[int | None]) -> MarianIds:
        """Marian's ids again, for a model imported from MarianMT: `marian_ids` holds the Marian id of each mtx
        id (None for mtx's PAD, which Marian lacks); mtx's BOS is Marian's pad, its decoder start."""
        size = len(marian_ids) - 1
        rows = torch.empty(size, dtype=torch.long)
        rows[torch.tensor(marian_ids[1:])] = torch.arange(1, size + 1)
        return cls(size, marian_ids[BOS], marian_ids[EOS], marian_ids[BOS], rows)


def marian_config(cfg: ModelConfig, ids: MarianIds):
    """A `transformers.MarianConfig` of the same architecture as an mtx model of config `cfg`, with the ids `ids`.

    Every setting is spelled out, Marian's defaults being other than the paper's (GELU, no embedding scale): the
    activation, the √d_model embedding scale or none, the output projection tied to the target embedding,
    whether the source embedding is that same matrix, dropout on embeddings and residual branches, inside the
    feed-forward blocks and on the attention weights, and the special tokens.
    """
    from transformers import MarianConfig

    check_marian_can_express(cfg)
    return MarianConfig(
        vocab_size=ids.size, decoder_vocab_size=ids.size, d_model=cfg.d_model,
        encoder_layers=cfg.layers_enc, decoder_layers=cfg.layers_dec,
        encoder_attention_heads=cfg.heads, decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function=cfg.activation,
        dropout=cfg.dropout, attention_dropout=cfg.attn_dropout, activation_dropout=cfg.relu_dropout,
        max_position_embeddings=cfg.max_positions, scale_embedding=cfg.scale_embeddings,
        share_encoder_decoder_embeddings=cfg.share_embeddings, tie_word_embeddings=True,
        pad_token_id=ids.pad, eos_token_id=ids.eos, forced_eos_token_id=ids.eos, decoder_start_token_id=ids.start,
        **({"bos_token_id": BOS} if ids.rows is None else {}),
    )


def build_marian(cfg: ModelConfig, ids: MarianIds, attn_implementation: str = "sdpa"):
    """A MarianMTModel of the same shape as mtx's, with its own random weights."""
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(cfg, ids))
    model.config._attn_implementation = attn_implementation
    return model


def marian_from_mtx(model: Transformer, ids: MarianIds | None = None, attn_implementation: str = "sdpa"):
    """A float32 MarianMTModel that computes the same function as `model`: every weight copied across, with the
    residual stream's channels in Marian's order (see the module's docstring), the output bias, where the model
    has one, as Marian's final_logits_bias, and the vocabulary's rows in the order of `ids` (mtx's own ids for
    None)."""
    ids = ids or MarianIds.of_mtx(model.vocab_size)
    marian = build_marian(model.cfg, ids, attn_implementation)
    order = residual_order(model.cfg.d_model) if model.cfg.positions == "interleaved" else None
    with torch.no_grad():
        marian.model.decoder.embed_tokens.weight.copy_(_rows(_columns(model.tgt_embed.weight, order), ids.rows))
        marian.model.encoder.embed_tokens.weight.copy_(_rows(_columns(model.src_embed.weight, order), ids.rows))
        for role, ours, theirs in paired_modules(model, marian):
            COPIES[role](ours, theirs, order)
        marian.final_logits_bias.copy_(_rows(_output_bias(model), ids.rows).unsqueeze(0))
    _check_tied(marian, model.cfg.share_embeddings)
    return marian


def paired_modules(model: Transformer, marian) -> Iterator[tuple[str, nn.Module, tuple[nn.Module, ...]]]:
    """Each module of `model`'s layers with its counterparts in `marian`'s, and its role towards the residual
    stream: "reads" (a projection of it; mtx's packs the counterparts' rows in order: Q, K, V), "writes" (a
    projection into it) or "norm" (a LayerNorm of it). Both directions of the mapping walk this one list:
    `marian_from_mtx` here, and mtx.importing.marian, which fills an mtx model from a MarianMT one."""
    for ours, theirs in zip(model.encoder_layers, marian.model.encoder.layers, strict=True):
        yield "reads", ours.self_attn.qkv_proj, (theirs.self_attn.q_proj, theirs.self_attn.k_proj,
                                                 theirs.self_attn.v_proj)
        yield "writes", ours.self_attn.out_proj, (theirs.self_attn.out_proj,)
        yield "norm", ours.attn_residual.norm, (theirs.self_attn_layer_norm,)
        yield "reads", ours.ffn.fc1, (theirs.fc1,)
        yield "writes", ours.ffn.fc2, (theirs.fc2,)
        yield "norm", ours.ffn_residual.norm, (theirs.final_layer_norm,)
    for ours, theirs in zip(model.decoder_layers, marian.model.decoder.layers, strict=True):
        yield "reads", ours.self_attn.qkv_proj, (theirs.self_attn.q_proj, theirs.self_attn.k_proj,
                                                 theirs.self_attn.v_proj)
        yield "writes", ours.self_attn.out_proj, (theirs.self_attn.out_proj,)
        yield "norm", ours.self_residual.norm, (theirs.self_attn_layer_norm,)
        yield "reads", ours.cross_attn.q_proj, (theirs.encoder_attn.q_proj,)
        yield "reads", ours.cross_attn.kv_proj, (theirs.encoder_attn.k_proj, theirs.encoder_attn.v_proj)
        yield "writes", ours.cross_attn.out_proj, (theirs.encoder_attn.out_proj,)
        yield "norm", ours.cross_residual.norm, (theirs.encoder_attn_layer_norm,)
        yield "reads", ours.ffn.fc1, (theirs.fc1,)
        yield "writes", ours.ffn.fc2, (theirs.fc2,)
        yield "norm", ours.ffn_residual.norm, (theirs.final_layer_norm,)


def _output_bias(model: Transformer) -> Tensor:
    return model.output_bias.detach() if model.output_bias is not None else torch.zeros(model.vocab_size)


def _columns(weight: Tensor, order: Tensor | None) -> Tensor:
    """`weight`'s columns (channels of the residual stream) in Marian's order; as they are for `order` None."""
    return weight if order is None else weight[:, order]


def _rows(weight: Tensor, order: Tensor | None) -> Tensor:
    """`weight`'s rows in the order `order` (channels, or a vocabulary's ids); as they are for `order` None."""
    return weight if order is None else weight[order]


def _copy_reading(packed: nn.Linear, targets: tuple[nn.Linear, ...], order: Tensor | None) -> None:
    """A projection that reads the residual stream (packed: its rows split into `targets`): input columns
    permuted, its outputs (attention heads, the feed-forward's hidden units) left as they are."""
    for weight, bias, target in zip(packed.weight.chunk(len(targets)), packed.bias.chunk(len(targets)), targets,
                                    strict=True):
        target.weight.copy_(_columns(weight, order))
        target.bias.copy_(bias)


def _copy_writing(source: nn.Linear, targets: tuple[nn.Linear], order: Tensor | None) -> None:
    """A projection that writes the residual stream: output rows permuted."""
    (target,) = targets
    target.weight.copy_(_rows(source.weight, order))
    target.bias.copy_(_rows(source.bias, order))


def _copy_norm(source: nn.LayerNorm, targets: tuple[nn.LayerNorm], order: Tensor | None) -> None:
    (target,) = targets
    target.weight.copy_(_rows(source.weight, order))
    target.bias.copy_(_rows(source.bias, order))


COPIES = {"reads": _copy_reading, "writes": _copy_writing, "norm": _copy_norm}


def _check_tied(marian, shared: bool) -> None:
    """The output projection must be the target embedding itself, and the source embedding too if shared: a
    transformers version that untied them would save a model that is not mtx's."""
    target = marian.model.decoder.embed_tokens.weight.data_ptr()
    tied = marian.lm_head.weight.data_ptr() == target
    if shared:
        tied = tied and marian.model.encoder.embed_tokens.weight.data_ptr() == target
    if not tied:
        raise RuntimeError("Marian's output projection and embeddings are not the shared matrix mtx's model has")
