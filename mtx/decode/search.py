"""Greedy, beam and sampling search over any model that decodes one token at a time (`IncrementalDecoder`).

Each decodes a whole batch at once. Beam search keeps `beam` open hypotheses per sentence as rows of one
(sentences × beam) batch, so every step is a handful of tensor operations whatever the batch size; Python only
touches the hypotheses that end (to set them aside) and the sentences that finish (to drop them from the batch).
Sampling draws each token from the model's distribution (mtx.decode.sampling), reproducibly per input line. Any
of them can be given a target prefix per sentence, which the translation then starts with.

Conventions shared with the trainer: decoding starts from BOS; a hypothesis ends with EOS, which is not part of
its tokens but whose log-probability counts in its score (as in fairseq). A sentence may produce at most
`max_len[i]` tokens before EOS; at that length EOS is forced. PAD and BOS are never produced.

Scores are length-normalised: score = log P(Y | X) / lp(|Y|), with |Y| counting EOS and
    gnmt:    lp(|Y|) = ((5 + |Y|) / 6) ** α    (Wu et al., 2016; what the Transformer paper used, α = 0.6)
    fairseq: lp(|Y|) = |Y| ** α
Both are 1 for α = 0, which makes the score the plain log-probability.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch
from torch import Tensor

from mtx.config.decode import LengthPenaltyStyle
from mtx.decode.sampling import draw, filtered, uniforms
from mtx.tokenizer import BOS, EOS, PAD

CacheT = TypeVar("CacheT", bound="DecoderCache")


class DecoderCache(Protocol):
    """What a decoder remembers between steps, as search sees it: a value it can only reorder.

    It holds N rows, one per hypothesis being extended, grouped by sentence: the B sentences in order, N / B
    consecutive rows each (a sentence's beams). It is owned by one search: `decode_step` may write into it and
    `reorder` may recycle its memory, so after either call only the state it returns is valid.
    mtx.model.transformer.DecoderState is one, without naming this protocol.
    """

    # Optionally, `attention`: (N, S), each row's cross-attention over the source at the last step, of the layer
    # that aligns (None, or absent: not asked for). Search carries it along each hypothesis (`Hypothesis.attention`).

    def reorder(self: CacheT, rows: Tensor, sentences: Tensor | None = None) -> CacheT:
        """Keep the rows `rows` (R,), in that order, and the sentences `sentences` (None: all of them, as they
        are). `rows` must leave each kept sentence the same number of consecutive rows, in the order of
        `sentences`. Search grows each sentence's one row into its beams (each row repeated K times), moves
        rows among the beams of a sentence, and drops the sentences that are complete.
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
        token, a tensor search may change in place, and the state advanced by one position. Search's early stop
        relies on them being log-probabilities (never above 0)."""
        ...


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation: its tokens (EOS excluded), its length-normalised log-probability, and the
    log-probability of each of its tokens as the search chose it, EOS last (so one more than `tokens`): they
    sum to the unnormalised log-probability, and show where a translation was unsure."""

    tokens: list[int]
    score: float
    token_log_probs: list[float]
    attention: Tensor | None = None  # (tokens, S): the aligning layer's attention of the step that chose each token


def length_penalty(length: Tensor | float, alpha: float, style: LengthPenaltyStyle) -> Tensor | float:
    """lp(|Y|), the divisor of a hypothesis' log-probability; non-decreasing in |Y| for α ≥ 0."""
    if style == "gnmt":
        return ((5.0 + length) / 6.0) ** float(alpha)
    if style == "fairseq":
        return length ** float(alpha)
    raise ValueError(f"unknown length penalty style {style!r}")


def constrain(log_probs: Tensor, step: int, min_len: int, max_len: Tensor, forced: Tensor | None = None,
              history: Tensor | None = None, no_repeat_ngram: int = 0) -> Tensor:
    """Forbid what may not come next, in place: PAD and BOS always, EOS before `min_len` tokens, anything
    but EOS once a row has `max_len` tokens (the length cap wins over `min_len`), a token that would repeat an
    n-gram of the row's `history` (its tokens so far, (N, step)) with `no_repeat_ngram` n > 0, and anything but
    the prefix's token while a row is inside its target prefix (a prefix is the user's: it may repeat).

    log_probs: (N, V) for the token at position `step`, i.e. after `step` tokens; max_len: (N,) per row;
    forced: (N, P) each row's prefix, PAD after its end (None: no prefixes). A prefix fits its row's max_len.
    """
    if no_repeat_ngram and history is not None and step >= no_repeat_ngram:
        ban_repeated_ngrams(log_probs, history[:, :step], no_repeat_ngram)
    if forced is not None and step < forced.shape[1]:
        token = forced[:, step]
        inside = token != PAD
        if bool(inside.any()):
            keep = log_probs[inside].gather(1, token[inside].unsqueeze(1))
            log_probs[inside] = torch.full_like(log_probs[inside], -torch.inf).scatter_(1, token[inside].unsqueeze(1),
                                                                                        keep)
    at_limit = max_len <= step
    if step < min_len:
        log_probs[:, EOS].masked_fill_(~at_limit, -torch.inf)
    if bool(at_limit.any()):
        not_eos = torch.ones(log_probs.shape[1], dtype=torch.bool, device=log_probs.device)
        not_eos[EOS] = False
        log_probs.masked_fill_(at_limit.unsqueeze(1) & not_eos, -torch.inf)
    log_probs[:, PAD] = -torch.inf
    log_probs[:, BOS] = -torch.inf
    return log_probs


def ban_repeated_ngrams(log_probs: Tensor, history: Tensor, n: int) -> None:
    """Set to -inf, in place, each token that would complete an n-gram the row already holds (fairseq's and
    CTranslate2's no_repeat_ngram_size): wherever the row's last n - 1 tokens occurred before, the token that
    followed them then is banned now. history: (N, T) with T ≥ n."""
    windows = history.unfold(1, n, 1)  # (N, T - n + 1, n): every n-gram so far
    recent = history[:, history.shape[1] - n + 1 :].unsqueeze(1)  # (N, 1, n - 1): what a new n-gram starts with
    matches = (windows[:, :, : n - 1] == recent).all(dim=2)  # (N, T - n + 1)
    rows, where = matches.nonzero(as_tuple=True)
    log_probs[rows, windows[rows, where, n - 1]] = -torch.inf


def _start(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, max_len: Tensor) -> CacheT:
    """Encode the batch and make a decoder state with room for the longest output plus its EOS."""
    memory = model.encode(src, src_pad)
    return model.init_state(memory, src_pad, max_len=int(max_len.max()) + 1)


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
def greedy_search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, max_len: Tensor, *, min_len: int = 0,
                  lenpen: float = 0.0, lenpen_style: LengthPenaltyStyle = "gnmt", prefix: Tensor | None = None,
                  no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
    """The most probable token at every step; a sentence leaves the batch as soon as it produces EOS.

    src, src_pad: (B, S); max_len: (B,) the most tokens each sentence may produce before EOS; prefix: (B, P)
    each sentence's target prefix, PAD after it (None: none), which its translation starts with.
    Returns for each sentence a one-element n-best list, scored as beam search scores it.
    """
    found = _one_path_each(model, src, src_pad, max_len, lambda scores, rows, step: scores.max(dim=-1)[1],
                           min_len=min_len, lenpen=lenpen, lenpen_style=lenpen_style, prefix=prefix,
                           no_repeat_ngram=no_repeat_ngram)
    return [[hypothesis] for hypothesis in found]


@torch.inference_mode()
def sample_search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, max_len: Tensor, *, samples: int,
                  sampling: Sampling, min_len: int = 0, lenpen: float = 0.0, lenpen_style: LengthPenaltyStyle = "gnmt",
                  prefix: Tensor | None = None, no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
    """`samples` translations of each sentence, each token drawn from the model's distribution as `sampling`
    filters it, by draws that depend on (seed, line, sample, step) alone (mtx.decode.sampling). Each is scored
    as beam search would score it, by the model's own log-probabilities; best first.

    Each sample is decoded as a sentence of its own (the source repeated `samples` times): samples end at
    different steps, and the decoder's cache keeps a sentence's rows together.
    """
    lines = sampling.lines.to(src.device).repeat_interleave(samples)
    copy = torch.arange(samples, device=src.device).repeat(src.shape[0])

    def pick(scores: Tensor, rows: Tensor, step: int) -> Tensor:
        u = uniforms(sampling.seed, lines[rows], copy[rows], step)
        return draw(filtered(scores, sampling.temperature, sampling.topk, sampling.topp), u)

    def repeat(t: Tensor | None) -> Tensor | None:
        return None if t is None else t.repeat_interleave(samples, dim=0)

    found = _one_path_each(model, repeat(src), repeat(src_pad), repeat(max_len), pick, min_len=min_len,
                           lenpen=lenpen, lenpen_style=lenpen_style, prefix=repeat(prefix),
                           no_repeat_ngram=no_repeat_ngram)
    return [sorted(found[i : i + samples], key=lambda h: -h.score) for i in range(0, len(found), samples)]


def _one_path_each(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, max_len: Tensor,
                   pick: Callable[[Tensor, Tensor, int], Tensor], *, min_len: int, lenpen: float,
                   lenpen_style: LengthPenaltyStyle, prefix: Tensor | None, no_repeat_ngram: int) -> list[Hypothesis]:
    """One translation per sentence, `pick(log_probs, rows, step)` choosing each open sentence's next token from
    its constrained log-probabilities (`rows`: the open sentences' indices in the batch). A sentence leaves the
    batch as soon as it produces EOS."""
    batch, device = src.shape[0], src.device
    state = _start(model, src, src_pad, max_len)
    rows = torch.arange(batch, device=device)  # which input sentence each row decodes
    row_max_len = max_len.to(device)
    forced = None if prefix is None else prefix.to(device)
    tokens = src.new_zeros(batch, int(max_len.max()) + 1)
    token_log_probs = torch.zeros(tokens.shape, device=device)
    log_prob = torch.zeros(batch, device=device)
    prev = src.new_full((batch,), BOS)
    attention = None  # (rows, positions, S) when the decoder hands out attention (see DecoderCache)
    results: list[Hypothesis | None] = [None] * batch
    for step in range(tokens.shape[1]):
        log_probs, state = model.decode_step(prev, state)
        if (row_attention := getattr(state, "attention", None)) is not None:
            if attention is None:
                attention = row_attention.new_zeros(batch, tokens.shape[1], row_attention.shape[1])
            attention[:, step] = row_attention
        scores = constrain(log_probs, step, min_len, row_max_len, forced, tokens, no_repeat_ngram)
        prev = pick(scores, rows, step)
        chosen = scores.gather(1, prev.unsqueeze(1)).squeeze(1)
        log_prob += chosen
        tokens[:, step], token_log_probs[:, step] = prev, chosen
        ended = prev == EOS
        if not bool(ended.any()):
            continue
        ended_scores = log_prob[ended] / length_penalty(step + 1.0, lenpen, lenpen_style)
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
        rows, row_max_len, tokens, token_log_probs, log_prob, prev = (
            t[keep] for t in (rows, row_max_len, tokens, token_log_probs, log_prob, prev)
        )
        forced = None if forced is None else forced[keep]
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


@torch.inference_mode()
def beam_search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, max_len: Tensor, *, beam: int,
                lenpen: float, lenpen_style: LengthPenaltyStyle = "gnmt", min_len: int = 0,
                nbest: int = 1, prefix: Tensor | None = None, no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
    """Beam search as fairseq and Sockeye do it, plus an early stop that never changes the result.

    Each step extends every open hypothesis by every token and takes the 2K best of each sentence. An EOS
    among the first K ends that hypothesis: it is scored (log-probability / lp) and set aside. The first K that
    are not EOS are the sentence's new open beams. A sentence is complete when K hypotheses have ended (with
    K = 1 this is greedy search), when its open beams reach `max_len` (EOS is then forced), or as soon as no
    open beam can still beat the n-th best finished hypothesis. That last test is exact: log-probabilities
    only fall as a hypothesis grows and lp only rises, so an open beam of log-probability s can end with a
    score of at most s / lp(max_len + 1). A complete sentence leaves the batch, so the work follows the
    sentences still being decoded.

    src, src_pad: (B, S); max_len: (B,) the most tokens each sentence may produce before EOS; prefix: (B, P)
    each sentence's target prefix, PAD after it (None: none): while a sentence is inside it, its one open
    beam can only extend by the prefix's token, so the search goes on from the prefix as from BOS.
    Returns for each sentence its `nbest` best hypotheses, best first.
    """
    if not 1 <= nbest <= beam:
        raise ValueError(f"nbest ({nbest}) must be between 1 and the beam size ({beam})")
    batch, device = src.shape[0], src.device
    # Every beam of a sentence starts as the same empty hypothesis, so the first step is computed once per
    # sentence and then copied to its beams (the state's rows; the sentence's cross-attention cache is shared).
    state = _start(model, src, src_pad, max_len)
    log_probs, state = model.decode_step(src.new_full((batch,), BOS), state)
    to_beams = torch.arange(batch, device=device).repeat_interleave(beam)
    row_attention = getattr(state, "attention", None)  # (rows, S) when the decoder hands out attention
    row_attention = None if row_attention is None else row_attention[to_beams]
    log_probs, state = log_probs[to_beams], state.reorder(to_beams)
    sentence = torch.arange(batch, device=device)  # which input sentence each open sentence is
    max_len = max_len.to(device)
    prefix = None if prefix is None else prefix.to(device)
    # Only the first of a sentence's identical beams may extend, or the first step would fill the beam with K
    # copies of the same best token.
    beam_scores = torch.full((batch, beam), -torch.inf, device=device)
    beam_scores[:, 0] = 0.0
    tokens = src.new_zeros(batch * beam, int(max_len.max()) + 1)
    running_log_probs = torch.zeros(tokens.shape, device=device)  # each open row's log-probability after each token
    # Each open row's attention at each of its steps, carried and reordered with it, as fairseq carries it.
    attention = None if row_attention is None else row_attention.new_zeros(*tokens.shape, row_attention.shape[1])
    finished = [Finished(nbest) for _ in range(batch)]
    # Kept in step with `finished`, so the completeness test of every step is a tensor comparison rather than a
    # loop over the sentences: how many hypotheses each open sentence has ended, and each input sentence's
    # `Finished.worst_kept`.
    ended_count = torch.zeros(batch, dtype=torch.long, device=device)
    worst_kept = torch.full((batch,), -torch.inf, device=device)
    for step in range(tokens.shape[1]):
        if step > 0:
            log_probs, state = model.decode_step(tokens[:, step - 1], state)
            row_attention = getattr(state, "attention", None)
        if attention is not None:
            attention[:, step] = row_attention
        forced = None if prefix is None else prefix.repeat_interleave(beam, dim=0)
        constrain(log_probs, step, min_len, max_len.repeat_interleave(beam), forced, tokens, no_repeat_ngram)
        scores, parent, token = top_candidates(beam_scores, log_probs, beam)
        parent_row = parent + torch.arange(0, len(sentence) * beam, beam, device=device).unsqueeze(1)

        ends = (token[:, :beam] == EOS) & scores[:, :beam].isfinite()
        if bool(ends.any()):
            endings = Endings.among(ends, scores, parent_row, tokens[:, :step], running_log_probs[:, :step], sentence,
                                    None if attention is None else attention[:, :step])
            set_aside(finished, worst_kept, endings, length_penalty(step + 1.0, lenpen, lenpen_style))
            ended_count += ends.sum(dim=1)

        chosen = first_open(token, beam)
        beam_scores, parent_row, token = (t.gather(1, chosen) for t in (scores, parent_row, token))
        best_possible = beam_scores[:, 0] / length_penalty(max_len + 1, lenpen, lenpen_style)
        complete = (ended_count >= beam) | (worst_kept[sentence] >= best_possible)

        if bool(complete.all()):
            break
        keep = None  # the sentences that go on, when some leave
        if bool(complete.any()):
            keep = (~complete).nonzero().squeeze(1)
            sentence, max_len, ended_count, beam_scores, parent_row, token = (
                t[keep] for t in (sentence, max_len, ended_count, beam_scores, parent_row, token)
            )
            prefix = None if prefix is None else prefix[keep]
        rows = parent_row.flatten()
        state = state.reorder(rows, keep)
        tokens, running_log_probs = tokens[rows], running_log_probs[rows]
        attention = None if attention is None else attention[rows]
        tokens[:, step], running_log_probs[:, step] = token.flatten(), beam_scores.flatten()
    return [f.best for f in finished]


def search(model: IncrementalDecoder[CacheT], src: Tensor, src_pad: Tensor, max_len: Tensor, *, beam: int,
           lenpen: float, lenpen_style: LengthPenaltyStyle = "gnmt", min_len: int = 0, nbest: int = 1,
           prefix: Tensor | None = None, sampling: Sampling | None = None,
           no_repeat_ngram: int = 0) -> list[list[Hypothesis]]:
    """`nbest` samples with `sampling`; else greedy search for beam 1 (the same result as beam search, without
    the beam bookkeeping), beam search otherwise. Each translation starts with its sentence's `prefix`."""
    if sampling is not None:
        return sample_search(model, src, src_pad, max_len, samples=nbest, sampling=sampling, min_len=min_len,
                             lenpen=lenpen, lenpen_style=lenpen_style, prefix=prefix, no_repeat_ngram=no_repeat_ngram)
    if beam == 1:
        return greedy_search(model, src, src_pad, max_len, min_len=min_len, lenpen=lenpen, lenpen_style=lenpen_style,
                             prefix=prefix, no_repeat_ngram=no_repeat_ngram)
    return beam_search(model, src, src_pad, max_len, beam=beam, lenpen=lenpen, lenpen_style=lenpen_style,
                       min_len=min_len, nbest=nbest, prefix=prefix, no_repeat_ngram=no_repeat_ngram)
