"""Validation during training: the valid loss, BLEU and length ratio of the model being trained, shared among the
ranks.

The valid loss needs a forward pass per batch; BLEU needs the valid sources decoded, which takes far longer,
so whether to stop (a stop signal, as the trainer's `stop_requested` tells) is asked between batches and
between chunks of sentences, and a validation cut short records nothing: a pre-emption gives seconds, and the
checkpoint comes first. The criterion and, where a test scripts it, the valid BLEU are handed in
(mtx.train.components.Hooks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import NamedTuple

import torch
from torch import Tensor

from mtx.config.recipe import Recipe
from mtx.data.batching import collate
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer
from mtx.train import distributed
from mtx.train.run_data import ValidSet

VALID_CHUNK = 200  # valid sentences decoded between two looks at `stop_requested`

# BLEU and length ratio, and (optionally) each language pair's; None: a stop signal cut it short
ValidBleu = Callable[[], "tuple[float, float] | tuple[float, float, dict[str, tuple[float, float]]] | None"]


class ValidScores(NamedTuple):
    """One validation: per-token loss and nll, and the valid decode's BLEU and length ratio (output tokens ÷
    reference tokens, as sacreBLEU counts them: below 1, outputs run short); for a model of several language
    pairs, each pair's BLEU and length ratio too, by pair (en-de)."""

    loss: float
    nll: float
    bleu: float
    length_ratio: float
    pairs: dict[str, tuple[float, float]] = {}  # noqa: RUF012 (a NamedTuple's default, never mutated)


class Validator:
    """Scores the model on the valid set, each rank taking every world-th batch and sentence."""

    def __init__(self, valid: ValidSet, recipe: Recipe, ctx: distributed.Context, model: Transformer,
                 tokenizer: Tokenizer, stop_requested: Callable[[], bool],
                 autocast: Callable[[], AbstractContextManager], loss: Callable[..., tuple[Tensor, Tensor, Tensor]],
                 bleu: ValidBleu | None = None) -> None:
        """`loss`: the training's criterion (mtx.train.loss.batch_loss); `bleu`: what scores the valid set,
        decoding it (`decoded_bleu`) unless given."""
        self.recipe, self.cfg, self.ctx = recipe, recipe.train, ctx
        self.valid, self.model, self.tokenizer, self.autocast = valid, model, tokenizer, autocast
        self.stop_requested, self.loss = stop_requested, loss
        self.bleu = bleu or self.decoded_bleu

    def run(self) -> ValidScores | None:
        """The valid scores; None if a stop signal cut the validation short."""
        self.model.eval()
        try:
            valid = self._valid_loss()
            decoded = self.bleu() if valid is not None else None
        finally:
            self.model.train()
        if valid is None or decoded is None:
            return None
        return ValidScores(*valid, *decoded)

    def _valid_loss(self) -> tuple[float, float] | None:
        """Per-token label-smoothed loss and nll over the valid split, its batches shared among the ranks;
        None if a rank was signalled to stop."""
        sums = torch.zeros(3, dtype=torch.float64, device=self.ctx.device)
        with torch.no_grad(), self.autocast():
            for indices in self.valid.batches[self.ctx.rank :: self.ctx.world]:
                if self.stop_requested():
                    break
                batch = collate(self.valid.split, indices).to(self.ctx.device)
                sums += torch.stack(self.loss(self.model, batch, self.cfg.label_smoothing)).double()
        stopped = torch.tensor([self.stop_requested()], dtype=torch.float64)
        loss_sum, nll_sum, n_tokens, signalled = distributed.all_reduce_sum(torch.cat([sums.cpu(), stopped])).tolist()
        return None if signalled else (loss_sum / n_tokens, nll_sum / n_tokens)

    def decoded_bleu(self) -> tuple[float, float, dict[str, tuple[float, float]]] | None:
        """BLEU and length ratio of decoding the valid sources, scored as `mtx score` does, overall and for each
        language pair of a model of several (`ValidSet.pairs`); each rank decodes every world-th, `VALID_CHUNK`
        at a time between looks at the stop signals. None if a rank was signalled to stop."""
        from mtx.decode.translator import translate_sentences
        from mtx.score.metrics import corpus_bleu_and_ratio

        rank, world = self.ctx.rank, self.ctx.world
        decode = dataclasses.replace(self.recipe.decode, beam=self.cfg.valid_beam, sampling=False, topk=None, topp=1.0,
                                     temperature=1.0)  # valid BLEU measures the search, never a draw
        mine, hyps = self.valid.sources[rank::world], []
        for start in range(0, len(mine), VALID_CHUNK):
            if self.stop_requested():
                break
            with self.autocast():  # decoded in the training's precision, as fast as its forward passes
                hyps += translate_sentences(self.model, self.tokenizer, mine[start : start + VALID_CHUNK], decode)
        shards = distributed.all_gather_objects((hyps, self.stop_requested()))
        if any(stopped for _, stopped in shards):
            return None
        hyps, refs = [shards[i % world][0][i // world] for i in range(len(self.valid.sources))], self.valid.refs
        by_pair = {}
        for pair in dict.fromkeys(self.valid.pairs):
            lines = [i for i, each in enumerate(self.valid.pairs) if each == pair]
            by_pair[pair] = corpus_bleu_and_ratio([hyps[i] for i in lines], [refs[i] for i in lines])
        return (*corpus_bleu_and_ratio(hyps, refs), by_pair)
