"""Ensemble decoding: several models searched as one, their next-token distributions averaged at every step.

Models trained apart (other seeds, other shapes) make partly independent errors, so the average of their
predictions is better than any one of them, at the cost of running each. `Ensemble` is an
`mtx.decode.search.IncrementalDecoder` made of others: each step it runs every member's `decode_step` and combines
the members' distributions with `average_distributions`, so beam search, its length penalty and its early stop
work on an ensemble unchanged.

The members must share a tokenizer, since they score the same token ids; they may differ in everything else
(layers, width, heads, norm placement). `load_models` loads the checkpoints of an ensemble and refuses a
tokenizer mismatch by naming the files; `read_metadata` reads what they say of themselves without the weights.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from mtx.checkpoint import load_checkpoint, load_model
from mtx.decode.search import DecoderCache, IncrementalDecoder, token_columns
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer


def average_distributions(log_probs: Sequence[Tensor]) -> Tensor:
    """The log of the mean of the members' probabilities: log (1/M) Σ_m P_m(y | prefix, X), from M (N, V)
    log-probability tensors.

    This is fairseq's ensemble rule (a mixture of the members' distributions). Marian instead sums the members'
    log-probabilities with weights, a product of experts left unnormalised. The mixture is a distribution as
    it stands: the scores, the n-best lists and the per-token log-probabilities of an ensemble remain
    log-probabilities, comparable with a single model's, and a member that is sure of a token cannot be
    vetoed by one that gives it almost no probability. Rounding can put the log of a probability of one a
    hair above 0, which the search's early stop must never see, so the result is clamped at 0.

    The sum is accumulated one member at a time with `torch.logaddexp`, elementwise, rather than by
    `torch.logsumexp` over the members' stacked tensors, which copies them into one and reduces across them.
    """
    if len(log_probs) == 1:
        return log_probs[0]
    return functools.reduce(torch.logaddexp, log_probs).sub_(math.log(len(log_probs))).clamp_(max=0.0)


@dataclass
class EnsembleState:
    """The members' own decoder states, in the members' order, reordered together."""

    states: list[DecoderCache]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> EnsembleState:
        return EnsembleState([state.reorder(rows, sentences) for state in self.states])

    @property
    def attention(self) -> Tensor | None:
        """The first member's attention, if it hands out any: the first model aligns an ensemble's output."""
        return getattr(self.states[0], "attention", None)

    @property
    def columns(self) -> Tensor | None:
        """The tokens the members' log-probabilities are over (`token_columns`): the first's, as they must agree
        (members searched over one batch's shortlists share them)."""
        return token_columns(self.states[0])


class Ensemble:
    """Models that decode as one: an `mtx.decode.search.IncrementalDecoder` whose members are any others (mtx
    Transformers, or a Transformer wrapped by mtx.decode.alignment.AligningDecoder).

    Search encodes a batch once and hands the result straight to `init_state`. The members' encoder outputs
    differ (each its own encoder, perhaps its own width), so the ensemble's `encode` passes the source on as
    it is, and `init_state` encodes it with every member. The ensemble holds no state of its own, so threads
    may decode several batches with it at once, as mtx.decode.translator.Translator does.
    """

    def __init__(self, members: Sequence[IncrementalDecoder]) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one member")
        self.members = list(members)

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return src

    def init_state(self, memory: Tensor, src_pad: Tensor, max_len: int) -> EnsembleState:
        """`memory` is the source (see the class); each member encodes it and makes its own cache."""
        return EnsembleState([member.init_state(member.encode(memory, src_pad), src_pad, max_len)
                              for member in self.members])

    def decode_step(self, prev: Tensor, state: EnsembleState) -> tuple[Tensor, EnsembleState]:
        steps = [member.decode_step(prev, own) for member, own in zip(self.members, state.states, strict=True)]
        log_probs, states = zip(*steps, strict=True)
        return average_distributions(log_probs), EnsembleState(list(states))


def load_models(paths: Sequence[Path]) -> tuple[list[Transformer], Tokenizer, list[dict]]:
    """The models of the checkpoints `paths` on the CPU, in eval mode, their shared tokenizer (`shared_tokenizer`),
    and each checkpoint's metadata (its dict without the weights; the first's recipe sets the decoding defaults)."""
    if not paths:
        raise MtxError("No checkpoint given: pass at least one -m CKPT.pt.")
    models, tokenizers, metadata = [], [], []
    for path in paths:
        model, tokenizer, checkpoint = load_model(path, "cpu")
        models.append(model)
        tokenizers.append(tokenizer)
        metadata.append(without_weights(checkpoint))
    return models, shared_tokenizer(paths, tokenizers), metadata


def read_metadata(paths: Sequence[Path]) -> tuple[Tokenizer, list[dict]]:
    """What `load_models` returns but the models: for a process that checks requests and decodes nothing (`mtx
    serve`'s). The weights are mapped from the files (`load_checkpoint`'s mmap) and dropped unread, so they never
    take this process's memory."""
    if not paths:
        raise MtxError("No checkpoint given: pass at least one -m CKPT.pt.")
    metadata = [without_weights(load_checkpoint(path, mmap=True, weights=False)) for path in paths]
    return shared_tokenizer(paths, [Tokenizer.from_str(checkpoint["tokenizer"]) for checkpoint in metadata]), metadata


def shared_tokenizer(paths: Sequence[Path], tokenizers: Sequence[Tokenizer]) -> Tokenizer:
    """The one tokenizer of the checkpoints `paths` (`tokenizers`, theirs in order). Refuses checkpoints whose
    tokenizers differ, naming the first file and the odd one: their token ids mean different subwords, so
    averaging their distributions would mix unrelated tokens."""
    first = tokenizers[0]
    for path, own in zip(paths, tokenizers, strict=True):
        if own.sha256 != first.sha256:
            raise MtxError(f"{paths[0]} and {path} have different tokenizers (vocabularies of "
                           f"{first.vocab_size:,} and {own.vocab_size:,} tokens), so they cannot be ensembled: "
                           "ensemble models trained on the same prepared data/ (the same tokenizer.json).")
    return first


def without_weights(checkpoint: dict) -> dict:
    """A checkpoint's metadata: everything but its tensors of weights and training state (`WEIGHTS`)."""
    return {k: v for k, v in checkpoint.items() if k not in WEIGHTS}


WEIGHTS = ("model", "ema", "train_state")  # what a checkpoint's metadata leaves out
