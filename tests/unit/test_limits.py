"""`ModelLimits`: what a model allows a translation, the same read from the models or from checkpoint metadata."""

import dataclasses

import pytest
from support import TINY_VOCAB, tiny_model

from mtx.checkpoint import make_checkpoint
from mtx.config.decode import DecodeConfig
from mtx.decode.limits import ModelLimits
from mtx.errors import MtxError


def test_the_limits_of_a_checkpoint_s_metadata_are_those_of_its_model() -> None:
    model = tiny_model()
    checkpoint = make_checkpoint(model, "{}", {}, step=0)
    metadata = {k: v for k, v in checkpoint.items() if k != "model"}
    assert ModelLimits.of_checkpoints([metadata]) == ModelLimits.of_configs([(model.cfg, model.vocab_size)]) == \
        ModelLimits(vocab_size=TINY_VOCAB, max_positions=64, decoder_layers=model.cfg.layers_dec)


def test_an_ensemble_is_limited_by_its_shortest_member_and_aligned_by_its_first() -> None:
    first, second = tiny_model(), tiny_model()
    shorter = dataclasses.replace(second.cfg, max_positions=32, layers_dec=1)
    limits = ModelLimits.of_configs([(first.cfg, TINY_VOCAB), (shorter, TINY_VOCAB)])
    assert (limits.max_positions, limits.decoder_layers) == (32, first.cfg.layers_dec)
    with pytest.raises(MtxError, match="must share a vocabulary"):
        ModelLimits.of_configs([(first.cfg, TINY_VOCAB), (shorter, TINY_VOCAB + 1)])


@pytest.mark.parametrize(("a", "b", "source", "expected"), [
    (1.0, 50, 5, 55),  # a · n + b
    (1.5, 1, 3, 5),  # floored
    (0.0, 3, 40, 3),
    (1.0, 50, 30, 63),  # at most the positions less EOS
    (1e308, 1, 10, 63),  # past the positions: no overflow
    (1.0, 10**400, 1, 63),
])
def test_output_limit(a: float, b: int, source: int, expected: int) -> None:
    limits = ModelLimits(vocab_size=TINY_VOCAB, max_positions=64, decoder_layers=2)
    assert limits.output_limit(DecodeConfig(max_len_a=a, max_len_b=b), source) == expected
