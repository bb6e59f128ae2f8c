"""What a model allows a translation: its vocabulary, its positions and its decoder layers, and from them and the
decoding options the most tokens an output may have.

Two users need these and must agree: the translator, which decodes with the models themselves, and `mtx serve`'s
request checks, which run in a process that holds no weights (the torch engine's workers hold them). So the limits
are read either from the models or from the checkpoints' metadata (`ModelLimits.of_checkpoints`: the resolved
model config and vocabulary size every checkpoint stores), and `output_limit` is one function of them, so the
server counts a request's tokens exactly as the translator's batches will.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mtx.config.decode import DecodeConfig
from mtx.config.model import ModelConfig
from mtx.errors import MtxError


@dataclass(frozen=True)
class ModelLimits:
    """The limits of one model, or of an ensemble searched as one: its vocabulary (which every member shares),
    the fewest positions of any member (every member reads the same source and extends the same hypotheses), and
    the decoder layers of the first member, the one that aligns."""

    vocab_size: int
    max_positions: int
    decoder_layers: int

    @classmethod
    def of_configs(cls, configs: Sequence[tuple[ModelConfig, int]]) -> ModelLimits:
        """The limits of the models (config, vocabulary size) searched as one; an ensemble whose vocabularies
        differ is refused, as their token ids could not mean the same subwords."""
        vocabularies = [vocab_size for _, vocab_size in configs]
        if any(size != vocabularies[0] for size in vocabularies):
            raise MtxError("The models of an ensemble must share a vocabulary, but their sizes are "
                           f"{', '.join(f'{size:,}' for size in vocabularies)}.")
        return cls(vocab_size=vocabularies[0], max_positions=min(cfg.max_positions for cfg, _ in configs),
                   decoder_layers=configs[0][0].layers_dec)

    @classmethod
    def of_checkpoints(cls, checkpoints: Sequence[dict[str, Any]]) -> ModelLimits:
        """From the checkpoints' metadata alone: what a process that checks requests without the weights reads."""
        from mtx.checkpoint import model_config_of

        return cls.of_configs([(model_config_of(checkpoint), checkpoint["vocab_size"]) for checkpoint in checkpoints])

    def output_limit(self, decode: DecodeConfig, source_tokens: int) -> int:
        """The most tokens before EOS for a source of `source_tokens` (EOS not counted): floor(max_len_a · n +
        max_len_b), never more than the positions leave after EOS. Any a and b the checks allow give a limit: past
        the positions (a · n infinite in floating point, b beyond float's range) the positions decide, without the
        arithmetic that would overflow."""
        cap = self.max_positions - 1
        if decode.max_len_b >= cap:
            return cap
        limit = decode.max_len_a * source_tokens + decode.max_len_b
        return cap if limit >= cap else math.floor(limit)
