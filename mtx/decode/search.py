"""Greedy, beam and sampling search over any model that decodes one token at a time (`IncrementalDecoder`).

Each decodes a whole batch at once. Beam search keeps `beam` open hypotheses per sentence as rows of one
(sentences × beam) batch, so every step is a handful of tensor operations whatever the batch size; Python only
touches the hypotheses that end (to set them aside) and the sentences that finish (to drop them from the batch).
Sampling draws each token from the model's distribution (mtx.decode.sampling), reproducibly per input line.

Every search takes two values built once from the decoding options: `Constraints`, what each sentence must
honour (its length limits, its target prefix, which the translation then starts with, no repeated n-grams), and
`LengthPenalty`, what its hypotheses' log-probabilities are divided by. Only what is a search's own (the beam,
the n-best, sampling's draws) is passed to it besides.

Conventions shared with the trainer: decoding starts from BOS; a hypothesis ends with EOS, which is not part of
its tokens but whose log-probability counts in its score (as in fairseq). A sentence may produce at most
`max_len[i]` tokens before EOS; at that length EOS is forced. PAD and BOS are never produced.

A search never runs out of candidates. The constraints can together forbid every token of a hypothesis: the
length floor bans EOS, no repeated n-grams bans what was said, and a shortlist left few tokens to say anything
else. Then EOS stays allowed, at the model's own log-probability: the length floor gives way, as it gives way to
the length cap. The n-gram ban never reaches a target prefix's token, so inside its prefix a hypothesis always
has that token. Greedy, beam and sampling search, over a model, a shortlist or an ensemble, all constrain their
steps with `Constraints.constrain`, so the rule is one for all of them.

Scores are length-normalised (`LengthPenalty`): score = log P(Y | X) / lp(|Y|), with |Y| counting EOS and
    gnmt:    lp(|Y|) = ((5 + |Y|) / 6) ** α    (Wu et al., 2016; what the Transformer paper used, α = 0.6)
    fairseq: lp(|Y|) = |Y| ** α
Both are 1 for α = 0, which makes the score the plain log-probability.
"""

from __future__ import annotations

import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from mtx.config.decode import DecodeConfig, LengthPenaltyStyle
from mtx.decode.sampling import draw, filtered, uniforms
from mtx.tokenizer import BOS, EOS, PAD

CacheT = TypeVar("CacheT", bound="DecoderCache")


class DecoderCache(Protocol):
    """What a decoder remembers between steps, as search sees it: a value it can only reorder.

    It holds N rows, one per hypothesis being extended, grouped by sentence: the B sentences in order, N / B
    consecutive rows each (a sentence's beams). It is owned by one search: `decode_step` may write into it and
    `reorder` may recycle its memory, so after either call only the state it returns is valid.
    mtx.model.decoder_state.DecoderState is one, without naming this protocol.
    """

    # Optionally, `attention`: (N, S), each row's cross-attention over the source at the last step, of the layer
    # that aligns (None, or absent: not asked for). Search carries it along each hypothesis (`Hypothesis.attention`).
    # Optionally, `columns`: (C,) the sorted token ids that the columns of `decode_step`'s log-probabilities stand
    # for, the same at every step (None, or absent: the whole vocabulary, column = token id). A decoder that
    # scores fewer tokens than the vocabulary (mtx.decode.shortlist) says which, and search maps between the two.
    # They hold PAD, BOS and EOS, the three lowest ids, so those are columns 0, 1 and 2, as in the vocabulary.

    def reorder(self: CacheT, rows: Tensor, sentences: Tensor | None = None) -> CacheT:
        """Keep the rows `rows` (R,), in that order, and the sentences `sentences` (None: all of them, as they
        are), each at most once. `rows` must leave each kept sentence the same number of consecutive rows of
        its own, in the order of `sentences`. Search grows each sentence's one row into its beams (each row
        repeated K times), moves rows among the beams of a sentence, and drops the sentences that are complete.
        """
        ...


class IncrementalDecoder(Protocol[CacheT]):
    """What search needs of a model: encode a batch once, then extend every row by one token per call.

    Named for incremental decoding (fairseq's term): each call feeds one token and reuses the cache of the
    prefix rather than recomputing it. mtx.model.transformer.Transformer is one, without naming this protocol,
    and so is the scripted model of the unit tests.
    """

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        """src: (B, S) token ids, src_pad: (B, S) True at padding → the encoder output, which search only hands
        to `init_state`."""
        ...

    def init_state(self, memory: Tensor, src_pad: Tensor, max_len: int) -> CacheT:
        """A cache of one row per sentence, with room for `max_len` calls of `decode_step`."""
        ...

    def decode_step(self, prev: Tensor, state: CacheT) -> tuple[Tensor, CacheT]:
        """Feed each row's previous token, prev: (N,) → (N, V) float32 log-probabilities of each row's next
        token (or (N, C), over the state's `columns`), a tensor search may change in place, and the state
        advanced by one position. Search's early stop relies on them being log-probabilities (never above 0)."""
        ...


def token_columns(state: DecoderCache) -> Tensor | None:
    """The token ids of the columns of a decoder's log-probabilities (the state's `columns`); None: every token,
    in order."""
    return getattr(state, "columns", None)


def column_of(tokens: Tensor, columns: Tensor | None) -> Tensor:
    """The columns that hold `tokens` (each one among the `columns`, as a shortlist's forced tokens are)."""
    return tokens if columns is None else torch.searchsorted(columns, tokens.contiguous())


def token_of(column: Tensor, columns: Tensor | None) -> Tensor:
    """The tokens that the columns `column` stand for."""
    return column if columns is None else columns[column]


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation: its tokens (EOS excluded), its length-normalised log-probability, and the
    log-probability of each of its tokens as the search chose it, EOS last (so one more than `tokens`): they
    sum to the unnormalised log-probability, and show where a translation was unsure."""

    tokens: list[int]
    score: float
    token_log_probs: list[float]
    attention: Tensor | None = None  # (tokens, S): the aligning layer's attention of the step that chose each token


@dataclass(frozen=True)
class LengthPenalty:
    """lp(|Y|), the divisor of a hypothesis' log-probability (the module docstring has both formulas), as one
    value: built once from the decoding options and handed to whatever scores a hypothesis (the searches,
    forced scoring, `mtx inspect`), so that they all divide by the same lp and their scores can be compared.

    Non-decreasing in |Y| for α ≥ 0, which the early stop of beam search relies on. The defaults are no penalty
    at all (α = 0: the score is the plain log-probability) and the paper's style; a recipe's or a user's choice
    comes from their options through `of_config`.
    """

    alpha: float = 0.0
    style: LengthPenaltyStyle = "gnmt"

    def __post_init__(self) -> None:
        # Refused when built rather than at the first hypothesis that ends, deep inside a search.
        if self.style not in typing.get_args(LengthPenaltyStyle):
            raise ValueError(f"unknown length penalty style {self.style!r}")

    @classmethod
    def of_config(cls, decode: DecodeConfig) -> LengthPenalty:
        """The length penalty `decode` asks for (its `lenpen` and `lenpen_style`)."""
        return cls(decode.lenpen, decode.lenpen_style)

    def __call__(self, length: Tensor | float) -> Tensor | float:
        """lp(length), elementwise for a tensor of lengths."""
        if self.style == "gnmt":
            return ((5.0 + length) / 6.0) ** float(self.alpha)
        return length ** float(self.alpha)


@dataclass(frozen=True)
class Constraints:
    """What each row of a search's batch must honour, and `constrain` enforces at every step: at most `max_len`
    tokens before EOS, at least `min_len` (the length cap wins), no n-gram of `no_repeat_ngram` tokens twice
    (0: allowed), and its target `prefix` first.

    One value rather than four arguments because a search changes the shape of its batch as it goes: it grows
    each sentence into its beams or samples and drops the sentences that are done, and the per-row fields must
    follow the rows exactly. The operations that move them are here, so they move together or not at all.

    max_len: (N,) the most tokens each row may produce before EOS; prefix: (N, P) each row's target prefix, PAD
    after its end (None: no row has one), which fits the row's max_len.
    """

    max_len: Tensor
    min_len: int = 0
    prefix: Tensor | None = None
    no_repeat_ngram: int = 0

    @classmethod
    def of_config(cls, decode: DecodeConfig, max_len: Tensor, prefix: Tensor | None = None) -> Constraints:
        """The constraints `decode` asks for (its `min_len` and `no_repeat_ngram`), with each sentence's output
        limit `max_len` (B,) and target prefix (B, P), which come from the sentences rather than the options."""
        return cls(max_len, decode.min_len, prefix, decode.no_repeat_ngram)

    @property
    def steps(self) -> int:
        """The most steps a search of these rows takes: the longest output, then its EOS. It reads a value of
        `max_len`, a CPU-GPU sync point where that is on a GPU, so searches ask before moving it to their device."""
        return int(self.max_len.max()) + 1

    def to(self, device: torch.device) -> Constraints:
        """The same constraints, their tensors on `device` (that of the search's log-probabilities)."""
        return self._map(lambda t: t.to(device))

    def select(self, rows: Tensor) -> Constraints:
        """The constraints of the rows `rows` (R,) only, in that order: those of the sentences that go on."""
        return self._map(lambda t: t[rows])

    def repeat_interleave(self, times: int) -> Constraints:
        """Each row's constraints repeated `times` times in a row, for the beams or samples it grows into."""
        return self._map(lambda t: t.repeat_interleave(times, dim=0))

    def _map(self, change: Callable[[Tensor], Tensor]) -> Constraints:
        """The same constraints, `change` applied to each per-row tensor."""
        prefix = None if self.prefix is None else change(self.prefix)
        return replace(self, max_len=change(self.max_len), prefix=prefix)

    def constrain(self, log_probs: Tensor, step: int, history: Tensor, columns: Tensor | None = None) -> Tensor:
        """Forbid what may not come next, in place, and return `log_probs`: PAD and BOS always, EOS before
        `min_len` tokens, anything but EOS once a row has `max_len` tokens (the length cap wins over `min_len`),
        a token that would repeat an n-gram of the row's `history` with `no_repeat_ngram` n > 0, and anything but
        the prefix's token while a row is inside its target prefix (a prefix is the user's: it may repeat).

        A row is never left without a token (the module docstring's rule): where these bans forbid every token,
        which only the ban of EOS before `min_len` can complete, EOS stays allowed at the model's own
        log-probability. The length floor gives way, as it does to the length cap.

        log_probs: (N, V) for the token at position `step`, i.e. after `step` tokens, or (N, C) over the token ids
        `columns` (`token_columns`), which hold the prefix's tokens, and PAD, BOS and EOS at their own ids;
        history: (N, ≥ step) the rows' tokens so far, then anything (only the first `step` columns are read).
        """
        forced = None  # inside a prefix: the rows, the prefix token's column and the model's log-probability of it
        if self.prefix is not None and step < self.prefix.shape[1]:
            token = self.prefix[:, step]
            inside = token != PAD
            if bool(inside.any()):
                column = column_of(token[inside], columns).unsqueeze(1)
                forced = inside, column, log_probs[inside].gather(1, column)  # read before the n-gram ban
        if self.no_repeat_ngram and step >= self.no_repeat_ngram:
            ban_repeated_ngrams(log_probs, history[:, :step], self.no_repeat_ngram, columns)
        if forced is not None:
            inside, column, keep = forced
            log_probs[inside] = torch.full_like(log_probs[inside], -torch.inf).scatter_(1, column, keep)
        log_probs[:, PAD] = -torch.inf
        log_probs[:, BOS] = -torch.inf
        at_limit = self.max_len <= step
        if step < self.min_len:
            eos = log_probs[:, EOS].clone()
            log_probs[:, EOS].masked_fill_(~at_limit, -torch.inf)
            # Without EOS a row may have nothing left (no repeated n-grams over a shortlist of few tokens).
            nothing_left = log_probs.amax(dim=1) == -torch.inf
            log_probs[:, EOS] = torch.where(nothing_left, eos, log_probs[:, EOS])
        if bool(at_limit.any()):
            not_eos = torch.ones(log_probs.shape[1], dtype=torch.bool, device=log_probs.device)
            not_eos[EOS] = False
            log_probs.masked_fill_(at_limit.unsqueeze(1) & not_eos, -torch.inf)
        return log_probs


def ban_repeated_ngrams(log_probs: Tensor, history: Tensor, n: int, columns: Tensor | None = None) -> None:
    """Set to -inf, in place, each token that would complete an n-gram the row already holds (fairseq's and
    CTranslate2's no_repeat_ngram_size): wherever the row's last n - 1 tokens occurred before, the token that
    followed them then is banned now. history: (N, T) with T ≥ n; `columns`: as `Constraints.constrain`'s (a
    banned token was produced before, so it is among them)."""
    windows = history.unfold(1, n, 1)  # (N, T - n + 1, n): every n-gram so far
    recent = history[:, history.shape[1] - n + 1 :].unsqueeze(1)  # (N, 1, n - 1): what a new n-gram starts with
    matches = (windows[:, :, : n - 1] == recent).all(dim=2)  # (N, T - n + 1)
    rows, where = matches.nonzero(as_tuple=True)
    log_probs[rows, column_of(windows[rows, where, n - 1], columns)] = -torch.inf


def _start(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, steps: int) -> CacheT:
    """Encode the batch and make a decoder state with room for `steps` steps (`Constraints.steps`)."""
    memory = model.encode(src, src_pad)
    return model.init_state(memory, src_pad, max_len=steps)


@dataclass(frozen=True)
class Sampling:
    """How `sample_search` draws (mtx.decode.sampling): the seed, and the filters of each step's distribution.
    `lines` (B,) is each sentence's index in the input, which its draws depend on rather than on its batch."""

    seed: int
    lines: Tensor
    temperature: float = 1.0
    topk: int = 0  # 0: every token
    topp: float = 1.0  # 1: no nucleus filter


@torch.inference_mode()
def greedy_search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, constraints: Constraints,
                  penalty: LengthPenalty) -> list[list[Hypothesis]]:
    """The most probable token at every step; a sentence leaves the batch as soon as it produces EOS.

    src, src_pad: (B, S); constraints: each sentence's (B rows), whose prefix its translation starts with.
    Returns for each sentence a one-element n-best list, scored as beam search scores it.
    """
    found = _decode_one_path_per_row(model, src, src_pad, constraints, penalty,
                                     lambda scores, rows, step: scores.max(dim=-1)[1])
    return [[hypothesis] for hypothesis in found]


@torch.inference_mode()
def sample_search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, constraints: Constraints,
                  penalty: LengthPenalty, *, samples: int, sampling: Sampling) -> list[list[Hypothesis]]:
    """`samples` translations of each sentence, each token drawn from the model's distribution as `sampling`
    filters it, by draws that depend on (seed, line, sample, step) alone (mtx.decode.sampling). Each is scored
    as beam search would score it, by the model's own log-probabilities; best first.

    Each sample is decoded as a sentence of its own (the source and its constraints repeated `samples` times):
    samples end at different steps, and the decoder's cache keeps a sentence's rows together.
    """
    lines = sampling.lines.to(src.device).repeat_interleave(samples)
    copy = torch.arange(samples, device=src.device).repeat(src.shape[0])

    def pick(scores: Tensor, rows: Tensor, step: int) -> Tensor:
        u = uniforms(sampling.seed, lines[rows], copy[rows], step)
        return draw(filtered(scores, sampling.temperature, sampling.topk, sampling.topp), u)

    found = _decode_one_path_per_row(model, src.repeat_interleave(samples, dim=0),
                                     src_pad.repeat_interleave(samples, dim=0), constraints.repeat_interleave(samples),
                                     penalty, pick)
    return [sorted(found[i : i + samples], key=lambda h: -h.score) for i in range(0, len(found), samples)]


def _decode_one_path_per_row(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor,
                             constraints: Constraints, penalty: LengthPenalty,
                             pick: Callable[[Tensor, Tensor, int], Tensor]) -> list[Hypothesis]:
    """One translation per row of the batch, `pick(log_probs, rows, step)` choosing each open row's next token
    from its constrained log-probabilities (`rows`: the open rows' indices in the batch). A row leaves the
    batch as soon as it produces EOS, and its constraints with it."""
    batch, device, steps = src.shape[0], src.device, constraints.steps
    state = _start(model, src, src_pad, steps)
    rows = torch.arange(batch, device=device)  # which row of the input each open row decodes
    constraints = constraints.to(device)
    tokens = src.new_zeros(batch, steps)
    token_log_probs = torch.zeros(tokens.shape, device=device)
    log_prob = torch.zeros(batch, device=device)
    prev = src.new_full((batch,), BOS)
    attention = None  # (rows, positions, S) when the decoder hands out attention (see DecoderCache)
    results: list[Hypothesis | None] = [None] * batch
    for step in range(steps):
        log_probs, state = model.decode_step(prev, state)
        if (row_attention := getattr(state, "attention", None)) is not None:
            if attention is None:
                attention = row_attention.new_zeros(batch, steps, row_attention.shape[1])
            attention[:, step] = row_attention
        columns = token_columns(state)
        scores = constraints.constrain(log_probs, step, tokens, columns)
        column = pick(scores, rows, step)
        chosen = scores.gather(1, column.unsqueeze(1)).squeeze(1)
        prev = token_of(column, columns)
        log_prob += chosen
        tokens[:, step], token_log_probs[:, step] = prev, chosen
        ended = prev == EOS
        if not bool(ended.any()):
            continue
        ended_scores = log_prob[ended] / penalty(step + 1.0)
        ended_tokens, ended_log_probs = tokens[ended, :step].tolist(), token_log_probs[ended, : step + 1].tolist()
        ended_attention = [None] * len(ended_tokens) if attention is None else attention[ended, :step]
        for i, row_tokens, score, row_log_probs, row_attention in zip(
                rows[ended].tolist(), ended_tokens, ended_scores.tolist(), ended_log_probs, ended_attention,
                strict=True):
            results[i] = Hypothesis(row_tokens, score, row_log_probs, row_attention)
        keep = (~ended).nonzero().squeeze(1)
        if keep.numel() == 0:
            break
        state = state.reorder(keep, keep)
        rows, tokens, token_log_probs, log_prob, prev = (
            t[keep] for t in (rows, tokens, token_log_probs, log_prob, prev)
        )
        constraints = constraints.select(keep)
        attention = None if attention is None else attention[keep]
    return results


def row_topk(values: Tensor, k: int, block: int = 64) -> tuple[Tensor, Tensor]:
    """`values.topk(k, dim=1)` for rows far longer than k: each row's k largest values, largest first, and
    their columns. On a CPU, `topk` copies and partially sorts each whole row; this reads each row once and
    sorts only k blocks of it (bench/README.md has the timings). A GPU's `topk` is a radix select that reads
    each row once, so there it is left to work alone.

    A row's k largest values lie in the k blocks of `block` consecutive columns whose maxima are largest: a
    value outside them is at most the k-th largest block maximum, and each of those k blocks holds a value at
    least that large. So the block maxima are taken (a fast reduction), the k best blocks of each row kept,
    and the top k found among their k · block values and the columns after the last whole block. The values
    are exactly `topk`'s; among equal values the columns may differ, as `topk` leaves that order open too.
    """
    rows, columns = values.shape
    blocks = columns // block
    if blocks <= 4 * k or values.device.type != "cpu":  # too few blocks to leave many out, or a GPU
        return values.topk(k, dim=1)
    maxima = values[:, : blocks * block].unflatten(1, (blocks, block)).amax(dim=2)  # (rows, blocks)
    starts = maxima.topk(k, dim=1).indices * block  # (rows, k): the first column of each block kept
    kept = (starts.unsqueeze(2) + torch.arange(block, device=values.device)).flatten(1)  # (rows, k · block)
    after_blocks = torch.arange(blocks * block, columns, device=values.device).expand(rows, -1)
    candidates = torch.cat([kept, after_blocks], dim=1)
    top, position = values.gather(1, candidates).topk(k, dim=1)
    return top, candidates.gather(1, position)


def top_candidates(beam_scores: Tensor, log_probs: Tensor, beam: int) -> tuple[Tensor, Tensor, Tensor]:
    """The 2·beam best one-token extensions of each sentence's beams, best first.

    beam_scores: (B, K) log-probabilities of the open hypotheses; log_probs: (B·K, V) of their next token.
    Returns (scores, parent beam in 0..K-1, token), each (B, 2K). Twice the beam is enough for `beam` of them
    to be something other than EOS, since each parent contributes at most one EOS.

    A sentence's best 2K extensions are among the best 2K of each of its beams, so those are taken per beam
    first, by `row_topk`'s blocks, and the sentence's best are picked from its K · 2K survivors. That is
    faster than `topk` over all K · V extensions of each sentence (the beam scores added to every one of them)
    or over each beam's row; bench/README.md has the timings.
    """
    sentences = beam_scores.shape[0]
    per_beam = min(2 * beam, log_probs.shape[1])
    beam_best, beam_tokens = row_topk(log_probs, per_beam)  # (B·K, per_beam)
    scores = (beam_scores.reshape(-1, 1) + beam_best).view(sentences, -1)  # (B, K · per_beam)
    scores, flat = scores.topk(min(2 * beam, scores.shape[1]), dim=1)
    token = beam_tokens.view(sentences, -1).gather(1, flat)
    return scores, torch.div(flat, per_beam, rounding_mode="floor"), token


def first_open(token: Tensor, beam: int) -> Tensor:
    """Positions of the first `beam` candidates that are not EOS (they continue), in score order: (B, K)."""
    is_eos = (token == EOS).to(torch.int8)
    return is_eos.sort(dim=1, stable=True).indices[:, :beam]


class Finished:
    """The hypotheses one sentence has set aside, best first, at most `nbest` of them kept."""

    def __init__(self, nbest: int) -> None:
        self.nbest = nbest
        self.best: list[Hypothesis] = []

    def add(self, hypothesis: Hypothesis) -> None:
        self.best.append(hypothesis)
        self.best.sort(key=lambda h: -h.score)  # stable: of equal scores, the one that ended first wins
        del self.best[self.nbest :]

    @property
    def worst_kept(self) -> float:
        """The score a new hypothesis must beat to enter the n-best: -inf until there are `nbest` of them."""
        return self.best[-1].score if len(self.best) == self.nbest else -float("inf")


@dataclass(frozen=True)
class Endings:
    """The hypotheses that end at one step of beam search, M of them, all as long as the step: each is an EOS
    among the first K candidates of an open sentence. Ordered by open sentence, each sentence's best first."""

    sentence: Tensor  # (M,) the input sentence each one translates
    tokens: Tensor  # (M, step) its tokens, EOS excluded: those of the open row it extends
    prefix_log_probs: Tensor  # (M, step) the log-probability of the open row after each of its tokens
    log_prob: Tensor  # (M,) its log-probability, EOS included
    attention: Tensor | None = None  # (M, step, S) the open row's attention at each of its tokens, if carried

    @classmethod
    def among(cls, ends: Tensor, scores: Tensor, parent_row: Tensor, prefixes: Tensor, prefix_log_probs: Tensor,
              sentence: Tensor, attention: Tensor | None = None) -> Endings:
        """The candidates that `ends` (B, K) marks among the first K of scores, parent_row (B, 2K); prefixes and
        prefix_log_probs: (B·K, step) the tokens of the open rows so far and their log-probabilities after
        each; sentence: (B,) the input index of each open sentence; attention: (B·K, step, S) or None."""
        who, rank = ends.nonzero(as_tuple=True)
        parents = parent_row[who, rank]
        return cls(sentence[who], prefixes[parents], prefix_log_probs[parents], scores[who, rank],
                   None if attention is None else attention[parents])

    def token_log_probs(self) -> Tensor:
        """(M, step + 1) each token's own log-probability, EOS last: the steps of the running sums."""
        running = torch.cat([self.prefix_log_probs, self.log_prob.unsqueeze(1)], dim=1)
        return running.diff(dim=1, prepend=running.new_zeros(len(running), 1))


def set_aside(finished: list[Finished], worst_kept: Tensor, endings: Endings, lp: Tensor | float) -> None:
    """Score the endings (log-probability / lp), file them under their sentences and refresh those sentences'
    entries of `worst_kept` (one per input sentence), the tensor mirror of `Finished.worst_kept` that the
    completeness test reads."""
    scores = (endings.log_prob / lp).tolist()
    attention = [None] * len(scores) if endings.attention is None else endings.attention
    for i, tokens, score, token_log_probs, rows in zip(endings.sentence.tolist(), endings.tokens.tolist(), scores,
                                                       endings.token_log_probs().tolist(), attention, strict=True):
        finished[i].add(Hypothesis(tokens, score, token_log_probs, rows))
    touched = endings.sentence.unique()
    worst_kept[touched] = torch.tensor([finished[i].worst_kept for i in touched.tolist()], device=worst_kept.device)


def _first_step_into_beams(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, steps: int,
                           beam: int) -> tuple[Tensor, CacheT, Tensor | None]:
    """Start a beam search: encode the batch, take the first step and grow each sentence into its `beam` rows.

    Every beam of a sentence starts as the same empty hypothesis, so the first step is computed once per
    sentence and then copied to its beams (the state's rows; the sentence's cross-attention cache is shared).
    Returns the first token's log-probabilities (B·K, V), the state of B·K rows with room for `steps` steps, and
    each row's attention over the source (B·K, S) when the decoder hands it out (None otherwise).
    """
    state = _start(model, src, src_pad, steps)
    log_probs, state = model.decode_step(src.new_full((src.shape[0],), BOS), state)
    to_beams = torch.arange(src.shape[0], device=src.device).repeat_interleave(beam)
    row_attention = getattr(state, "attention", None)
    return log_probs[to_beams], state.reorder(to_beams), None if row_attention is None else row_attention[to_beams]


def most_endings(beam: int) -> int:
    """The most hypotheses of one sentence that beam search sets aside: at most beam - 1 end before the step
    that completes it (beam ending completes it), and at most beam at that step (an EOS among its first beam
    candidates each)."""
    return 2 * beam - 1


@torch.inference_mode()
def beam_search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, constraints: Constraints,
                penalty: LengthPenalty, *, beam: int, nbest: int = 1) -> list[list[Hypothesis]]:
    """Beam search as fairseq and Sockeye do it, plus an early stop that never changes the result.

    Each step extends every open hypothesis by every token and takes the 2K best of each sentence. An EOS
    among the first K ends that hypothesis: it is scored (log-probability / lp) and set aside. The first K that
    are not EOS are the sentence's new open beams. A sentence is complete when K hypotheses have ended (with
    K = 1 this is greedy search), when its open beams reach `max_len` (EOS is then forced), or as soon as no
    open beam can still beat the n-th best finished hypothesis. That last test is exact: log-probabilities
    only fall as a hypothesis grows and lp only rises, so an open beam of log-probability s can end with a
    score of at most s / lp(max_len + 1). A complete sentence leaves the batch, so the work follows the
    sentences still being decoded.

    src, src_pad: (B, S); constraints: each sentence's (B rows), shared by its beams. While a sentence is inside
    its target prefix its one open beam can only extend by the prefix's token, so the search goes on from the
    prefix as from BOS. Returns for each sentence its `nbest` best hypotheses, best first. An `nbest` above
    `beam`, up to `most_endings(beam)`, returns every hypothesis that ended, which the penalty did not choose
    among: what choosing the penalty rescores (mtx.decode.lenpen_choice).
    """
    if not 1 <= nbest <= most_endings(beam):
        raise ValueError(f"nbest ({nbest}) must be between 1 and 2 · beam - 1 ({most_endings(beam)})")
    batch, device, steps = src.shape[0], src.device, constraints.steps
    log_probs, state, row_attention = _first_step_into_beams(model, src, src_pad, steps, beam)
    sentence = torch.arange(batch, device=device)  # which input sentence each open sentence is
    constraints = constraints.to(device)
    # Only the first of a sentence's identical beams may extend, or the first step would fill the beam with K
    # copies of the same best token.
    beam_scores = torch.full((batch, beam), -torch.inf, device=device)
    beam_scores[:, 0] = 0.0
    tokens = src.new_zeros(batch * beam, steps)
    running_log_probs = torch.zeros(tokens.shape, device=device)  # each open row's log-probability after each token
    # Each open row's attention at each of its steps, carried and reordered with it, as fairseq carries it.
    attention = None if row_attention is None else row_attention.new_zeros(*tokens.shape, row_attention.shape[1])
    finished = [Finished(nbest) for _ in range(batch)]
    # Kept in step with `finished`, so the completeness test of every step is a tensor comparison rather than a
    # loop over the sentences: how many hypotheses each open sentence has ended, and each input sentence's
    # `Finished.worst_kept`.
    ended_count = torch.zeros(batch, dtype=torch.long, device=device)
    worst_kept = torch.full((batch,), -torch.inf, device=device)
    for step in range(steps):
        if step > 0:
            log_probs, state = model.decode_step(tokens[:, step - 1], state)
            row_attention = getattr(state, "attention", None)
        if attention is not None:
            attention[:, step] = row_attention
        columns = token_columns(state)
        constraints.repeat_interleave(beam).constrain(log_probs, step, tokens, columns)
        scores, parent, column = top_candidates(beam_scores, log_probs, beam)
        token = token_of(column, columns)
        parent_row = parent + torch.arange(0, len(sentence) * beam, beam, device=device).unsqueeze(1)

        ends = (token[:, :beam] == EOS) & scores[:, :beam].isfinite()
        if bool(ends.any()):
            endings = Endings.among(ends, scores, parent_row, tokens[:, :step], running_log_probs[:, :step], sentence,
                                    None if attention is None else attention[:, :step])
            set_aside(finished, worst_kept, endings, penalty(step + 1.0))
            ended_count += ends.sum(dim=1)

        chosen = first_open(token, beam)
        beam_scores, parent_row, token = (t.gather(1, chosen) for t in (scores, parent_row, token))
        best_possible = beam_scores[:, 0] / penalty(constraints.max_len + 1)
        complete = (ended_count >= beam) | (worst_kept[sentence] >= best_possible)

        if bool(complete.all()):
            break
        keep = None  # the sentences that go on, when some leave
        if bool(complete.any()):
            keep = (~complete).nonzero().squeeze(1)
            sentence, ended_count, beam_scores, parent_row, token = (
                t[keep] for t in (sentence, ended_count, beam_scores, parent_row, token)
            )
            constraints = constraints.select(keep)
        rows = parent_row.flatten()
        state = state.reorder(rows, keep)
        tokens, running_log_probs = tokens[rows], running_log_probs[rows]
        attention = None if attention is None else attention[rows]
        tokens[:, step], running_log_probs[:, step] = token.flatten(), beam_scores.flatten()
    return [f.best for f in finished]


def search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, constraints: Constraints,
           penalty: LengthPenalty, *, beam: int, nbest: int = 1, sampling: Sampling | None = None
           ) -> list[list[Hypothesis]]:
    """`nbest` samples with `sampling`; else greedy search for beam 1 (the same result as beam search, without
    the beam bookkeeping), beam search otherwise. Each translation starts with its sentence's prefix."""
    if sampling is not None:
        return sample_search(model, src, src_pad, constraints, penalty, samples=nbest, sampling=sampling)
    if beam == 1:
        return greedy_search(model, src, src_pad, constraints, penalty)
    return beam_search(model, src, src_pad, constraints, penalty, beam=beam, nbest=nbest)
