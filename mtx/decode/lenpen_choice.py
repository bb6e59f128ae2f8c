"""Choosing the length penalty's α for one model on held-out text: one beam search, every α rescored.

Why per model: the α that translates best depends on how far a model has trained. bench/quality.py's small models
run short with fairseq's α 1 after 2,000 updates and reach the reference length with α 1.5, which overshoots
after 800 updates (bench/README.md). No one value serves both, so people tune
fairseq's `--lenpen` on a dev set; `mtx average --tune-lenpen` does it and stores the choice in the checkpoint.

Why one search is enough: beam search ranks the hypotheses it extends by their log-probability alone, and the
penalty only scores those that end (mtx.decode.search). A sentence is done once `beam` hypotheses have ended, so
which ones end does not depend on α, and a search with any α picks, of these, the one of highest
log P(Y|X) / lp(|Y|) (its early stop never changes the result). So one search that keeps every hypothesis that
ends (a torch engine opened with `every_ending`: up to 2 · beam - 1, more than an n-best list of `beam` holds)
gives, rescored, exactly the translations of a search with each α.

The α is the one of highest corpus BLEU (sacreBLEU's, as validation scores) in the recipe's penalty style, of
`ALPHAS`, the α the model had, and, while the best is the largest tried, the next tenths (GNMT's penalty grows
more slowly with the length than fairseq's, so its best α can be larger); of equal BLEU, the one nearest the α
the model had.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mtx.config.decode import MAX_LENPEN, DecodeConfig
from mtx.decode.request import Request
from mtx.decode.search import LengthPenalty
from mtx.decode.torch_engine import TorchEngine
from mtx.decode.translation import Translation, TranslationStats
from mtx.errors import MtxError
from mtx.score.metrics import corpus_bleu_and_ratio

ALPHAS = tuple(step / 10 for step in range(21))  # 0, 0.1, ..., 2: the range people tune (DecodeConfig.lenpen)
CHUNK = 1000  # sentences translated between two reports of progress: enough for batches of similar lengths


@dataclass(frozen=True)
class PenaltyScore:
    """The valid BLEU and length ratio of translating with one α."""

    alpha: float
    bleu: float
    length_ratio: float


@dataclass(frozen=True)
class LenpenChoice:
    """What choosing α found: each α's valid scores, the α the model had, and the one chosen."""

    style: str
    sentences: int
    beam: int
    before: float
    chosen: float
    scores: tuple[PenaltyScore, ...]

    def to_dict(self) -> dict[str, Any]:
        """As a checkpoint stores it (`lenpen_choice`): plain values only, which `weights_only` loading reads."""
        return {**dataclasses.asdict(self), "scores": [dataclasses.asdict(s) for s in self.scores]}

    def table(self) -> str:
        """The scores as lines for a terminal, the chosen α and the model's own marked."""
        lines = ["   α    BLEU   length ratio"]
        for s in self.scores:
            mark = " ← chosen" if s.alpha == self.chosen else " (before)" if s.alpha == self.before else ""
            lines.append(f"{s.alpha:4.1f}  {s.bleu:6.2f}  {s.length_ratio:6.3f}{mark}")
        return "\n".join(lines)


def check_searchable(decode: DecodeConfig, where: str) -> None:
    """Refuse decoding options under which α changes nothing: greedy search and sampling pick each token without
    the penalty, so there is nothing to choose. `where` names what holds the options."""
    if decode.sampling:
        raise MtxError(f"{where} samples (decode.sampling), and a sample does not depend on the length penalty: "
                       "there is no α to choose. Choose it for a model that searches (decode.beam ≥ 2).")
    if decode.beam < 2:
        raise MtxError(f"{where} searches greedily (decode.beam = {decode.beam}), whose output does not depend on "
                       "the length penalty: there is no α to choose. Set decode.beam to 2 or more in the recipe.")


def choose_lenpen(engine: TorchEngine, sources: Sequence[str], refs: Sequence[str], decode: DecodeConfig,
                  alphas: Sequence[float] = ALPHAS, progress: Callable[[TranslationStats], None] | None = None,
                  chunk: int = CHUNK) -> LenpenChoice:
    """The α of `alphas` and decode.lenpen (in decode.lenpen_style) under which the model of `engine` (a torch
    engine opened with `every_ending`) translates `sources` closest to `refs` by BLEU, searching as `decode` asks
    (its beam and length limits) over the whole vocabulary. `sources` are lines as the model reads them (a
    prepared data folder's valid split, target tags included). `progress` is told the translation's statistics
    after each `chunk` sentences."""
    return choose_among(endings(engine, sources, decode, progress, chunk), refs, decode, alphas)


def endings(engine: TorchEngine, sources: Sequence[str], decode: DecodeConfig,
            progress: Callable[[TranslationStats], None] | None = None, chunk: int = CHUNK
            ) -> list[list[Translation]]:
    """Every hypothesis that ends in one beam search of each of `sources` (see choose_lenpen): what each α's
    translation is chosen from."""
    if not sources:
        raise MtxError("There are no valid sentences to choose the length penalty on.")
    if not engine.every_ending:
        raise ValueError("choose_lenpen needs an engine opened with every_ending: its n-best lists are too short")
    check_searchable(decode, "The model's recipe")
    searching = Request(**dataclasses.asdict(dataclasses.replace(decode, nbest=1, shortlist=0)))
    nbests: list[list[Translation]] = []
    for start in range(0, len(sources), chunk):
        lines = list(sources[start : start + chunk])
        nbests += engine.translate(engine.facts.encode(lines), searching, range(start, start + len(lines)))
        if progress is not None:
            progress(engine.stats)
    return nbests


def choose_among(nbests: Sequence[Sequence[Translation]], refs: Sequence[str], decode: DecodeConfig,
                 alphas: Sequence[float] = ALPHAS) -> LenpenChoice:
    """The α of highest corpus BLEU against `refs` when each sentence's translation is the best of its `nbests`
    (`endings`) under it: `alphas`, decode.lenpen, and the next tenths while the best is the largest tried."""
    scores: dict[float, PenaltyScore] = {}
    trying = [*alphas, decode.lenpen]
    while trying:
        for alpha in trying:
            hyps = best_under(nbests, LengthPenalty(alpha, decode.lenpen_style))
            scores[alpha] = PenaltyScore(alpha, *corpus_bleu_and_ratio(hyps, list(refs)))
        best = max(scores.values(), key=lambda s: (s.bleu, -abs(s.alpha - decode.lenpen)))
        trying = further_alphas(max(scores)) if best.alpha == max(scores) else []
    return LenpenChoice(decode.lenpen_style, len(nbests), decode.beam, decode.lenpen, best.alpha,
                        tuple(scores[alpha] for alpha in sorted(scores)))


def further_alphas(largest: float) -> list[float]:
    """The next α to try when the best so far is the largest tried: ten more tenths, within MAX_LENPEN."""
    return [alpha for step in range(1, 11) if (alpha := round(largest + step / 10, 1)) <= MAX_LENPEN]


def best_under(nbests: Sequence[Sequence[Translation]], penalty: LengthPenalty) -> list[str]:
    """Each sentence's translation of highest log P(Y|X) / lp(|Y|) among its n-best (|Y| counts EOS, as the
    search's does); "" for a sentence with none (an empty line)."""
    best = []
    for nbest in nbests:
        scored = [(sum(t.token_log_probs) / penalty(len(t.tokens) + 1.0), -rank, t.text)
                  for rank, t in enumerate(nbest)]
        best.append(max(scored)[2] if scored else "")
    return best
