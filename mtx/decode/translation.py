"""What an engine takes and returns: a sentence as token ids (`Source`), its n-best `Translation`s, a given
translation's score (`Scored`), and what a run did (`TranslationStats`). Plain values, with no torch: a decoding
worker pickles them back to the process that asked, and the writers of mtx.decode.output read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

# A sentence as an engine takes it: its token ids as the model reads them (its target tag included, EOS not), or
# None for a sentence that is empty once normalised, which gets no translation (`ModelFacts.encode`).
Source = list[int] | None
Alignment = list[tuple[int, int]]  # (source word, target word) links, in target word order (mtx.decode.alignment)


@dataclass
class TranslationStats:
    """What a run did, for the summary line on standard error."""

    sentences: int = 0
    output_tokens: int = 0
    truncated: int = 0  # sources cut to the model's max_positions
    too_long_to_score: int = 0  # lines whose source or given translation the model cannot hold whole (scoring)
    seconds: float = 0.0  # spent translating, not waiting for input

    def summary(self) -> str:
        rate = 1.0 / self.seconds if self.seconds > 0 else 0.0
        return (f"{self.sentences:,} sentences, {self.output_tokens:,} tokens in {self.seconds:.1f} s "
                f"({self.sentences * rate:,.1f} sentences/s, {self.output_tokens * rate:,.0f} tokens/s)")

    def add(self, other: TranslationStats) -> None:
        """Count `other`'s work in this one (a worker's, on the way back)."""
        self.sentences += other.sentences
        self.output_tokens += other.output_tokens
        self.truncated += other.truncated
        self.too_long_to_score += other.too_long_to_score
        self.seconds += other.seconds


class Translation(NamedTuple):
    """One hypothesis of a sentence's n-best list: its text, and what the search knew of it."""

    text: str
    score: float
    tokens: Sequence[int] = ()  # its token ids, EOS excluded
    token_log_probs: Sequence[float] = ()  # each token's log-probability, EOS last (`mtx.decode.search.Hypothesis`)
    alignment: Alignment | None = None  # its word alignment, when the request asked for one
    doubts: Sequence[str] = ()  # why it deserves a human look (mtx.decode.doubts), when the request asked


class TooLongToScore(NamedTuple):
    """A given translation that an engine could not score: its source or itself is longer than the model's
    positions (EOS included), so the model cannot read the pair whole. It has no score rather than the score of a
    cut pair, which would be the score of another text; what is known of it is its text and tokens."""

    text: str  # the translation as normalised
    tokens: Sequence[int]  # its token ids, EOS excluded


Scored = Translation | TooLongToScore | None  # a line's given translation, scored (None: an empty source line)
