"""What `mtx translate` writes for each input line: text (the best translation, or the n-best list with scores),
optionally followed by its word alignment, or one JSON object.

With `--alignment`, each translation is followed by " ||| " and its word alignment in Pharaoh format (the
convention of Moses' and Marian's tools): "source-target" word indices, 0-based, one link per target word
(mtx.decode.alignment). An empty input line then gives " ||| ", so that every output line splits into the same two
fields; with `--nbest`, where each hypothesis carries its own alignment, it still gives an empty line, as it
has no hypotheses.

With `--format jsonl`, each output line is instead one JSON object (`json_line`): what a pipeline wants to read
without parsing tabs and separators, with the subword tokens and their log-probabilities besides the text.
"""

from __future__ import annotations

import json

from mtx.decode.alignment import pharaoh
from mtx.decode.translator import Translation
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
              with_flags: bool = False) -> str:
    """`json_object` as one line of JSON."""
    return json.dumps(json_object(nbest, tokenizer, with_nbest, with_alignment, with_flags), ensure_ascii=False)


def json_object(nbest: list[Translation], tokenizer: Tokenizer, with_nbest: bool, with_alignment: bool,
                with_flags: bool = False) -> dict[str, object]:
    """One input line's translation as one JSON object: the best hypothesis' fields, and (for --nbest > 1) the
    n-best list, best first, as "nbest"; `with_flags`, the best one's flags (mtx.decode.flags) as "flags". An
    empty input line has no hypothesis: an empty text, a null score, no tokens, no flags."""
    if nbest:
        line = json_fields(nbest[0], tokenizer, with_alignment)
    else:
        line = {"text": "", "score": None, "tokens": [], "token_log_probs": []}
        if with_alignment:
            line["alignment"] = []
    if with_flags:
        line["flags"] = list(nbest[0].flags) if nbest else []
    if with_nbest:
        line["nbest"] = [json_fields(translation, tokenizer, with_alignment) for translation in nbest]
    return line
