"""What `mtx translate` writes for each input line: text (the best translation, or the n-best list with scores),
optionally followed by its word alignment, or one JSON object.

With `--alignment`, each translation is followed by " ||| " and its word alignment in Pharaoh format (the
convention of Moses' and Marian's tools): "source-target" word indices, 0-based, one link per target word
(mtx.decode.alignment). An empty input line then gives " ||| ", so that every output line splits into the same two
fields; with `--nbest`, where each hypothesis carries its own alignment, it still gives an empty line, as it
has no hypotheses.

With `--format jsonl`, each output line is instead one JSON object (`json_line`): what a pipeline wants to read
without parsing tabs and separators, with the subword tokens and their log-probabilities besides the text.

`mtx translate` chooses its writer once, from the format and the flags, rather than asking for every line:
`search_writer` gives `Text`, `NbestText` or `Jsonl`, which write the n-best list a search found;
`score_writer` gives `ScoredText` or `ScoredJsonl`, which write the score of a given translation
(`--score-reference`). Each writer's `line` turns one input line's result into its output line, without the
line break. A given translation the model could not hold whole (`TooLongToScore`) still gets its line: score
"nan" in text, null with the flag "too_long_to_score" in JSON, which `keep_best` drops first.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

from mtx.data.corpora import TOO_LONG_TO_SCORE
from mtx.decode.alignment import pharaoh
from mtx.decode.translation import TooLongToScore, Translation
from mtx.tokenizer import EOS, SPECIAL_TOKENS, Tokenizer

ALIGNMENT_SEPARATOR = " ||| "  # between a translation and its alignment, as Moses and Marian write it


def format_nbest(nbest: list[Translation], with_scores: bool, with_alignment: bool = False) -> str:
    """One output line: the best text alone, or (for --nbest > 1) score<TAB>text pairs joined by tabs; with
    alignments, each text followed by " ||| " and its alignment (an empty 1-best line: the separator alone)."""

    def shown(translation: Translation) -> str:
        if not with_alignment:
            return translation.text
        return f"{translation.text}{ALIGNMENT_SEPARATOR}{pharaoh(translation.alignment or [])}"

    if not with_scores:
        return shown(nbest[0]) if nbest else (ALIGNMENT_SEPARATOR if with_alignment else "")
    return "\t".join(f"{translation.score:.4f}\t{shown(translation)}" for translation in nbest)


def json_fields(translation: Translation, tokenizer: Tokenizer, with_alignment: bool) -> dict[str, object]:
    """A hypothesis as JSON: its text and score, its subword tokens as the text spells them (each with the space
    before it, if any) followed by "</s>" for EOS, and one log-probability per token, EOS's last; with
    alignments, its (source word, target word) links."""
    fields: dict[str, object] = {
        "text": translation.text,
        "score": translation.score,
        "tokens": [*tokenizer.pieces(translation.tokens), SPECIAL_TOKENS[EOS]],
        "token_log_probs": list(translation.token_log_probs),
    }
    if with_alignment:
        fields["alignment"] = [list(link) for link in translation.alignment or []]
    return fields


def json_line(nbest: list[Translation], tokenizer: Tokenizer, with_nbest: bool, with_alignment: bool,
              with_doubts: bool = False) -> str:
    """`json_object` as one line of JSON."""
    return json.dumps(json_object(nbest, tokenizer, with_nbest, with_alignment, with_doubts), ensure_ascii=False)


def json_object(nbest: list[Translation], tokenizer: Tokenizer, with_nbest: bool, with_alignment: bool,
                with_doubts: bool = False) -> dict[str, object]:
    """One input line's translation as one JSON object: the best hypothesis' fields, and (for --nbest > 1) the
    n-best list, best first, as "nbest"; `with_doubts`, the best one's doubts (mtx.decode.doubts) as "flags". An
    empty input line has no hypothesis: an empty text, a null score, no tokens, no doubts."""
    if nbest:
        line = json_fields(nbest[0], tokenizer, with_alignment)
    else:
        line = {"text": "", "score": None, "tokens": [], "token_log_probs": []}
        if with_alignment:
            line["alignment"] = []
    if with_doubts:
        line["flags"] = list(nbest[0].doubts) if nbest else []
    if with_nbest:
        line["nbest"] = [json_fields(translation, tokenizer, with_alignment) for translation in nbest]
    return line


OutputFormat = Literal["text", "jsonl"]


@dataclass(frozen=True)
class Text:
    """The best translation of each line (`--nbest` 1); `alignment`: followed by " ||| " and its alignment."""

    alignment: bool = False

    def line(self, nbest: list[Translation]) -> str:
        return format_nbest(nbest, False, self.alignment)


@dataclass(frozen=True)
class NbestText:
    """The n best of each line (`--nbest` N > 1), as score<TAB>text pairs joined by tabs; `alignment`: each text
    followed by " ||| " and its alignment."""

    alignment: bool = False

    def line(self, nbest: list[Translation]) -> str:
        return format_nbest(nbest, True, self.alignment)


@dataclass(frozen=True)
class Jsonl:
    """Each line's translation as one JSON object (`json_object`) with its doubts ("flags"); `nbest`: with the
    n-best list."""

    tokenizer: Tokenizer
    nbest: bool = False
    alignment: bool = False

    def line(self, nbest: list[Translation]) -> str:
        return json_line(nbest, self.tokenizer, self.nbest, self.alignment, with_doubts=True)


@dataclass(frozen=True)
class ScoredText:
    """A given translation's score: score<TAB>text, its text as normalised; an empty input line: an empty line.
    One too long to score: "nan" for its score, which a reader's float() takes, and which sorts apart from every
    score (`sort -g` puts it first)."""

    def line(self, scored: Translation | TooLongToScore | None) -> str:
        if scored is None:
            return ""
        score = "nan" if isinstance(scored, TooLongToScore) else f"{scored.score:.4f}"
        return f"{score}\t{scored.text}"


@dataclass(frozen=True)
class ScoredJsonl:
    """A given translation's score as one JSON object: the fields of `json_object`, "log_prob", log P(Y|X) itself,
    the sum of its tokens' (null for an empty input line), and "flags". Nothing was searched, so no doubts are
    flagged; a translation too long to score has the flag "too_long_to_score", its text and tokens, and null
    for its score, log_prob and token_log_probs."""

    tokenizer: Tokenizer

    def line(self, scored: Translation | TooLongToScore | None) -> str:
        if isinstance(scored, TooLongToScore):
            fields: dict[str, object] = {
                "text": scored.text, "score": None,
                "tokens": [*self.tokenizer.pieces(scored.tokens), SPECIAL_TOKENS[EOS]],
                "token_log_probs": None, "log_prob": None, "flags": [TOO_LONG_TO_SCORE]}
        else:
            fields = json_object([] if scored is None else [scored], self.tokenizer, False, False)
            fields["log_prob"] = None if scored is None else sum(scored.token_log_probs)
            fields["flags"] = []
        return json.dumps(fields, ensure_ascii=False)


SearchWriter = Text | NbestText | Jsonl
ScoreWriter = ScoredText | ScoredJsonl


def search_writer(output_format: OutputFormat, tokenizer: Tokenizer, nbest: bool, alignment: bool) -> SearchWriter:
    """The writer of a search's n-best lists in `output_format`; `nbest`: more than one translation a line."""
    if output_format == "jsonl":
        return Jsonl(tokenizer, nbest, alignment)
    return NbestText(alignment) if nbest else Text(alignment)


def score_writer(output_format: OutputFormat, tokenizer: Tokenizer) -> ScoreWriter:
    """The writer of the scores of given translations in `output_format`."""
    return ScoredJsonl(tokenizer) if output_format == "jsonl" else ScoredText()
