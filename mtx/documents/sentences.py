"""Paragraphs cut into sentences, and the sentences' places in them, so that the translations join back.

A sentence-level model translates a paragraph of several sentences badly: trained on single sentences, it stops
after the first one or two (bench/README.md, "Documents"). So a paragraph is cut into its sentences, they are
translated as any other sentences, and the translations are put back where the sentences were, with the
whitespace between them as the source had it.

The cutting is sentencex's (Wikimedia's segmenter, MIT, a Rust wheel with no model to download): rules for
about 300 languages, with each language's abbreviations, and lossless (its pieces concatenate to the input), which
is what putting the whitespace back needs. It was measured against pysbd on the real-data corpus
(bench/documents.py, bench/README.md). It is the extra `mtx[documents]`: only `--split-sentences` needs it.
"""

from __future__ import annotations

from collections.abc import Iterable

from mtx.errors import MtxError

Span = tuple[int, int]  # characters [start, end) of a text


def segmenter_missing() -> str | None:
    """Why sentences cannot be split here (the extra is not installed), or None."""
    try:
        import sentencex  # noqa: F401
    except ImportError:
        return ("splitting sentences needs sentencex, the extra mtx[documents]: pip install 'mtx[documents]'")
    return None


def sentence_spans(text: str, language: str, breaks: Iterable[int] = (), split: bool = True) -> list[Span]:
    """The sentences of `text` as character spans, in order, without the whitespace around them: cut at
    `breaks` (where a block of markup ends), and, with `split`, where sentencex finds a sentence ends in
    `language` (an ISO code; a language it has no rules for gets its default rules). A block with no visible
    character gives no span."""
    blocks, start = [], 0
    for end in sorted({b for b in breaks if 0 < b < len(text)}):
        blocks.append((start, end))
        start = end
    blocks.append((start, len(text)))
    spans: list[Span] = []
    for start, end in blocks:
        pieces = _pieces(text[start:end], language) if split else [text[start:end]]
        for piece in pieces:
            stripped = piece.strip()
            if stripped:
                spans.append((start + piece.index(stripped), start + piece.index(stripped) + len(stripped)))
            start += len(piece)
    return spans


def _pieces(text: str, language: str) -> list[str]:
    """sentencex's sentences of `text`, whitespace included, concatenating to `text`."""
    if (missing := segmenter_missing()) is not None:
        raise MtxError(f"--split-sentences: {missing}.")
    from sentencex import segment

    pieces = [piece for piece in segment(language, text) if piece]
    if "".join(pieces) != text:  # never seen; a segmenter that loses characters must not lose the user's text
        return [text]
    return pieces
