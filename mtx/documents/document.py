"""A line of input (or a request's string) as a document: its sentences translated, joined back as it was.

`read_document` takes a line apart: with markup (`--markup html|markdown`), the markup comes out first
(mtx.documents.html, mtx.documents.markdown) and the text left is cut; with `--split-sentences`, the text is cut
into its sentences (mtx.documents.sentences); block edges of markup always cut it. Each piece is translated as
any sentence is, by whichever engine (`translate_documents`), batched with every other line's pieces.
`write_document` puts the translations back in the places of their sources, with the whitespace between them as
the source had it, and, with markup, the markup around the target words aligned to the words it wrapped
(mtx.documents.markup.project). One line in, one line out, as for sentences.

With markup, the engine is asked for word alignments (both engines give them, from the cross-attention of the
default aligning layer), and each sentence is handed to it as its words joined by single spaces, so that the
alignment's source words are exactly the words whose markup is known.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mtx.documents.markup import Marked, Span, Target, project
from mtx.documents.sentences import sentence_spans
from mtx.errors import MtxError
from mtx.subword import normalize_text

if TYPE_CHECKING:
    from mtx.decode.engine import Engine
    from mtx.decode.facts import ModelFacts
    from mtx.decode.request import Markup, Request
    from mtx.decode.translation import Translation
    from mtx.tokenizer import Tokenizer

@dataclass(frozen=True)
class Document:
    """A line taken apart: `text` (the line, or its text once the markup is out: `marked`), its `sentences` as
    spans of `text`, and, with markup, each sentence's words as spans of `text`."""

    text: str
    sentences: list[Span]
    marked: Marked | None = None
    words: list[list[Span]] = dataclasses.field(default_factory=list)

    def sources(self) -> list[str]:
        """What the engine translates, one string per sentence."""
        if self.marked is None:
            return [self.text[start:end] for start, end in self.sentences]
        return [" ".join(self.text[start:end] for start, end in words) for words in self.words]


def read_document(line: str, markup: Markup, split: bool, language: str) -> Document:
    """`line` taken apart into the sentences to translate (MtxError for markup that cannot be projected)."""
    if markup == "none":
        return Document(line, sentence_spans(line, language, split=split))
    if markup == "html":
        from mtx.documents.html import read_html as read
    else:
        from mtx.documents.markdown import read_markdown as read
    marked = read(line)
    sentences = sentence_spans(marked.text, language, marked.breaks, split=split)
    words = [_words(marked.text, start, end) for start, end in sentences]
    kept = [(span, w) for span, w in zip(sentences, words, strict=True) if w]
    return Document(marked.text, [span for span, _ in kept], marked, [w for _, w in kept])


def _words(text: str, start: int, end: int) -> list[Span]:
    """The words of text[start:end] as `normalize_text` separates them (whitespace between; a word of control
    characters alone is no word), so that they are the words an alignment counts."""
    words, begun = [], None
    for i in range(start, end + 1):
        if i < end and not text[i].isspace():
            begun = i if begun is None else begun
        elif begun is not None:
            if normalize_text(text[begun:i]):
                words.append((begun, i))
            begun = None
    return words


def write_document(document: Document, translations: Sequence[Translation | None]) -> str:
    """The document with each sentence replaced by its translation (None: a sentence that gave none), the text
    between sentences kept, and the markup projected through the translations' word alignments."""
    texts = ["" if t is None else t.text for t in translations]
    if document.marked is None:
        out, at = [], 0
        for (start, end), text in zip(document.sentences, texts, strict=True):
            out += [document.text[at:start], text]
            at = end
        return "".join([*out, document.text[at:]])
    words: list[str] = []
    separators: list[str] = []
    links: list[int | None] = []
    gap, at, offset = "", 0, 0
    for (start, end), source_words, translation in zip(document.sentences, document.words, translations,
                                                       strict=True):
        gap += document.text[at:start]
        target = [] if translation is None else translation.text.split()
        aligned = dict((t, s) for s, t in (translation.alignment or [])) if translation is not None else {}
        for t, word in enumerate(target):
            separators.append(gap)
            words.append(word)
            links.append(offset + aligned[t] if t in aligned else None)
            gap = " "
        gap = "" if target else gap
        at, offset = end, offset + len(source_words)
    separators.append(gap + document.text[at:])
    spans = [span for sentence in document.words for span in sentence]
    return project(document.marked, spans, Target(words, separators, links))


@dataclass(frozen=True)
class DocumentTranslation:
    """A document's translation: the whole `text`, and each sentence's source with its n-best list (one)."""

    text: str
    sentences: list[tuple[str, list[Translation]]]


def is_document(request: Request) -> bool:
    """Whether `request` reads its lines as documents (split into sentences, or marked up) rather than as one
    sentence each."""
    return request.split_sentences or request.markup != "none"


class UnreadableLine(MtxError):
    """A line whose markup cannot be read (nested too deep, too many elements): `index`, its index in the lines
    read, for the command to name the input line and the server the request's field."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


def read_documents(lines: Sequence[str], request: Request, facts: ModelFacts) -> list[Document]:
    """Each line taken apart as `request` asks, the sentences cut by the rules of the model's source language."""
    documents = []
    for index, line in enumerate(lines):
        try:
            documents.append(read_document(line, request.markup, request.split_sentences, facts.source_language))
        except MtxError as e:
            raise UnreadableLine(index, str(e)) from None
    return documents


def engine_request(request: Request) -> Request:
    """What the engine is asked for each sentence of a document: the same search, with word alignments when
    markup is to be projected."""
    return dataclasses.replace(request, alignment=request.markup != "none", split_sentences=False, markup="none")


def translate_documents(engine: Engine, facts: ModelFacts, documents: Sequence[Document], request: Request,
                        lines: Sequence[int]) -> list[DocumentTranslation]:
    """The documents' sentences translated by `engine` in one call, batched together as any sentences are, and
    each document written back (`write_document`). `lines`: each document's index in the input, which every one
    of its sentences takes for sampling's draws."""
    sources = [source for document in documents for source in document.sources()]
    indices = [line for document, line in zip(documents, lines, strict=True) for _ in document.sentences]
    nbests = engine.translate(facts.encode(sources, request.target_lang), engine_request(request), indices)
    return join_documents(documents, nbests)


def join_documents(documents: Sequence[Document], nbests: Sequence[list[Translation]]) -> list[DocumentTranslation]:
    """The documents written back from their sentences' n-best lists, given in order (`translate_documents`; the
    server's batcher)."""
    results, at = [], 0
    for document in documents:
        mine = nbests[at: at + len(document.sentences)]
        results.append(DocumentTranslation(write_document(document, [nbest[0] if nbest else None for nbest in mine]),
                                           list(zip(document.sources(), mine, strict=True))))
        at += len(mine)
    return results


def document_object(result: DocumentTranslation, tokenizer: Tokenizer) -> dict[str, Any]:
    """A document's translation as JSON: its text, the doubts of any of its sentences ("flags"), and each
    sentence's source with the fields `--format jsonl` gives a sentence ("sentences")."""
    from mtx.decode.output import json_object

    sentences = [{"source": source, **json_object(nbest, tokenizer, False, False, with_doubts=True)}
                 for source, nbest in result.sentences]
    flags = sorted({flag for sentence in sentences for flag in sentence["flags"]})
    return {"text": result.text, "flags": flags, "sentences": sentences}


@dataclass(frozen=True)
class DocumentWriter:
    """`mtx translate`'s writer of documents: each line's translation as text, or (jsonl) `document_object`."""

    tokenizer: Tokenizer
    jsonl: bool

    def line(self, result: DocumentTranslation) -> str:
        import json

        if not self.jsonl:
            return result.text
        return json.dumps(document_object(result, self.tokenizer), ensure_ascii=False)
