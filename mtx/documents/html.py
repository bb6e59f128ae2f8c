"""HTML fragments read into `Marked` (mtx.documents.markup): the text to translate, and the markup as elements over it.

The standard library's `html.parser.HTMLParser` finds the tokens: it is tolerant (no input is refused) and says
where each token starts (`getpos`). A token's markup is cut from the fragment itself, from its start to the next
token's, never rebuilt from the parsed names and attributes, so that what is written back is what was read, byte
for byte: quotes, case, spacing, a `>` inside an attribute's value. Character references are decoded in the text
and their spellings kept, so that a translation spells `©` as the source did (`&copy;`).

HTMLParser builds no tree, and fragments from the web need not nest, so a stack of open elements repairs them,
as browsers do in the simple cases (tag names compared case-insensitively):

- an end tag closes the element it names and, before it, every element opened inside that one and still open,
  with a made-up end tag (`</name>`, the name as its start tag wrote it);
- an end tag that names no open element is dropped;
- the elements still open at the end are closed there, with made-up end tags.

Points, written back verbatim where the projection puts them: void elements (`<br>`, `<img>`), self-closing tags
(`<x/>`), comments, declarations, processing instructions, and the elements whose content is not text to translate
(`OPAQUE`, and any element marked translate="no"): each is one point from its start tag to its end tag, with what
it holds, repaired the same way inside. The edges of block elements (`BLOCKS`: `<p>One.</p><p>Two.</p>`) are
breaks, where a word ends although the text has no space.

Nothing is lost at the end of the input, where HTMLParser holds back what is unfinished (a tag without its `>`, a
comment without `-->`, a script without `</script>`): a comment is closed there (`-->` appended, as a browser
reads it to the end) and is a point; anything else is text (written escaped: `<b` comes back as `&lt;b`).

Two of HTMLParser's quirks are worked around without touching its internals: it reads no further than `&#`
that starts no number (`Q&#A <b>`: the rest would be held back as unfinished), and it raises AssertionError on
`<![` followed by a name its marked sections do not know. It is fed a copy of the fragment in which such a `#` or
`[` is replaced, which it reads as HTML does (text; a bogus comment); the markup is still cut from the original.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from html.parser import HTMLParser
from typing import NamedTuple

from mtx.documents.markup import MAX_DEPTH, MAX_ELEMENTS, Element, Marked, check_elements
from mtx.errors import MtxError

VOID = frozenset({"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
                  "track", "wbr"})
# Never translated: code, and the elements HTML reads as raw text (no markup inside), which newer HTMLParsers read
# so too: they are points on every Python version.
OPAQUE = frozenset({"script", "style", "pre", "code", "textarea", "kbd", "samp", "var", "xmp", "iframe", "noembed",
                    "noframes"})
RAW_TEXT = frozenset(HTMLParser.CDATA_CONTENT_ELEMENTS)  # where HTMLParser sees no markup and no references
# Where a word ends although the text has no space: the edges of these elements.
BLOCKS = frozenset({"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "table",
                    "thead", "tbody", "tfoot", "tr", "td", "th", "caption", "blockquote", "section", "article",
                    "header", "footer", "nav", "aside", "main", "figure", "figcaption", "address", "details",
                    "summary", "form", "fieldset", "legend", "option", "br", "hr", "pre"})
# What HTMLParser misreads, found in the copy of the fragment it is fed: `<![` followed by a name its marked
# sections do not know (it raises AssertionError), and `&#` that starts no number (it reads no further).
_UNKNOWN_SECTION = re.compile(r"<!\[(?!(?:temp|cdata|ignore|include|rcdata|if|else|endif)(?![-_.a-zA-Z0-9]))",
                              re.IGNORECASE)
_NOT_A_NUMBER = re.compile("&#(?![0-9]|[xX][0-9a-fA-F])")


@dataclass(frozen=True)
class HtmlEscape:
    """How translated text is written in HTML: a character the source spelled as a character reference ending in
    `;` is spelled the same (the first spelling seen), so that `&copy;` or `&nbsp;` survive translation; else `&`,
    `<` and `>` are escaped and the rest is written as is."""

    spellings: tuple[tuple[str, str], ...] = ()

    @cached_property
    def table(self) -> dict[int, str]:
        return {ord("&"): "&amp;", ord("<"): "&lt;", ord(">"): "&gt;",
                **{ord(character): spelling for character, spelling in self.spellings}}

    def __call__(self, text: str) -> str:
        return text.translate(self.table)


_ESCAPE = HtmlEscape()  # text written inside an untranslated element


class _Token(NamedTuple):
    """One of HTMLParser's tokens: its kind ("data", "ref", "start", "empty" for `<x/>`, "end", "markup" for a
    comment or declaration), where it starts in the fragment, its length (None: up to the next token), and for a
    tag its lower-case name and attributes."""

    kind: str
    offset: int
    length: int | None
    name: str = ""
    attrs: tuple[tuple[str, str | None], ...] = ()


class _Tokenizer(HTMLParser):
    """HTMLParser handing each token of `fragment` to `sink`, placed by its offset in the fragment."""

    def __init__(self, fragment: str, sink: Callable[[_Token], None]) -> None:
        super().__init__(convert_charrefs=False)
        self._source = fragment
        self._sink = sink
        self._line_starts = [0, *(match.end() for match in re.finditer("\n", fragment))]

    def tokenize(self) -> int:
        """Feed the whole fragment; return the offset where HTMLParser stopped: what follows is unfinished. It is
        fed a copy of the same length in which the `<![` and `&#` it misreads are `<!x` (a bogus comment) and `&!`
        (text), as HTML reads them; the markup of each token is cut from the fragment itself."""
        self.feed(_NOT_A_NUMBER.sub("&!", _UNKNOWN_SECTION.sub("<!x", self._source)))
        return self._position()

    def _position(self) -> int:
        """Where the token being handled starts in the fragment (`getpos` counts lines and columns)."""
        line, column = self.getpos()
        return self._line_starts[line - 1] + column

    def _emit(self, kind: str, length: int | None, name: str = "",
              attrs: list[tuple[str, str | None]] | None = None) -> None:
        self._sink(_Token(kind, self._position(), length, name, tuple(attrs or ())))

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._emit("start", len(self.get_starttag_text() or ""), tag, attrs)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self._emit("empty", len(self.get_starttag_text() or ""), tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        self._emit("end", None, tag)

    def handle_data(self, data: str) -> None:
        self._emit("data", len(data))

    def handle_entityref(self, name: str) -> None:
        self._emit_reference(1 + len(name))

    def handle_charref(self, name: str) -> None:
        self._emit_reference(2 + len(name))

    def _emit_reference(self, length: int) -> None:
        """`&name` or `&#number`, with its `;` if it has one."""
        self._emit("ref", length + self._source.startswith(";", self._position() + length))

    def handle_comment(self, data: str) -> None:
        self._emit("markup", None)

    def handle_decl(self, decl: str) -> None:
        self._emit("markup", None)

    def handle_pi(self, data: str) -> None:
        self._emit("markup", None)

    def unknown_decl(self, data: str) -> None:
        self._emit("markup", None)


def _written_name(start_tag: str, name: str) -> str:
    """The element's name as its start tag wrote it (`<DIV class=x>`: DIV), for the end tags made up for it."""
    written = start_tag[1:1 + len(name)]
    return written if written.lower() == name else name


def _closing(names: list[tuple[str, str]]) -> str:
    """The made-up end tags of elements still open, `names` (lower-case, as written) outermost first."""
    return "".join(f"</{written}>" for _, written in reversed(names))


@dataclass
class _Open:
    """An element whose end tag has not been read: its slot among the elements, names (lower-case, as written),
    start in the text, start tag and parent's slot."""

    name: str
    written: str
    index: int
    start: int
    open: str
    parent: int | None


@dataclass
class _Opaque:
    """A point being gathered from an untranslated element: its slot, name, parent's slot, the markup read so far,
    and the elements open inside it (names lower-case and as written), the untranslated element first."""

    index: int
    name: str
    parent: int | None
    raw: list[str]
    inside: list[tuple[str, str]] = field(default_factory=list)


class _Reader:
    """The state of reading one fragment: the text so far, the elements (a slot each, in the order of their start
    tags, filled when they close), the stack of open elements, and the point being gathered inside an untranslated
    element. Each token is handled when the next one arrives, which ends the markup it takes."""

    def __init__(self, fragment: str) -> None:
        self.fragment = fragment
        self.text: list[str] = []
        self.length = 0
        self.slots: list[Element | None] = []
        self.stack: list[_Open] = []
        self.opaque: _Opaque | None = None
        self.breaks: set[int] = set()
        self.spellings: dict[str, str] = {}
        self.pending: _Token | None = None

    def take(self, token: _Token) -> None:
        if self.pending is not None:
            self.handle(self.pending, token.offset)
        self.pending = token

    def finish(self, stop: int) -> Marked:
        """Handle the last token, the unfinished rest from `stop`, and close what is still open."""
        if self.pending is not None:
            self.handle(self.pending, stop)
        rest = self.fragment[stop:]
        if self.opaque is not None:
            self.close_opaque(self.opaque, rest)
        elif rest.startswith("<!--"):
            self.point(rest + "-->", "", stop)
        elif rest:
            self.add_text(html.unescape(rest))
        while self.stack:
            self.close(None)
        elements = tuple(element for element in self.slots if element is not None)
        check_elements(elements, self.length)
        return Marked("".join(self.text), elements, HtmlEscape(tuple(self.spellings.items())),
                      frozenset(edge for edge in self.breaks if 0 < edge < self.length))

    def handle(self, token: _Token, next_offset: int) -> None:
        """One token, whose markup runs to `next_offset` unless its length is known; what lies between (markup
        HTMLParser skipped, such as `</>`) is a point of its own."""
        end = next_offset if token.length is None else min(token.offset + token.length, next_offset)
        raw = self.fragment[token.offset:end]
        if self.opaque is not None:
            self.inside_opaque(self.opaque, token, raw)
        elif token.kind == "data":
            self.add_text(raw)
        elif token.kind == "ref":
            decoded = html.unescape(raw)
            if len(decoded) == 1 and raw.endswith(";"):
                self.spellings.setdefault(decoded, raw)
            self.add_text(decoded)
        elif token.kind == "start":
            self.start(token, raw)
        elif token.kind == "end":
            self.end(token.name, raw)
        else:
            self.point(raw, token.name, token.offset)
        if end < next_offset:
            skipped = self.fragment[end:next_offset]
            if self.opaque is not None:
                self.opaque.raw.append(skipped)
            else:
                self.point(skipped, "", end)

    def add_text(self, text: str) -> None:
        self.text.append(text)
        self.length += len(text)

    def reserve(self, depth: int, offset: int) -> int:
        """A slot for the next element, at `depth`, refused past `MAX_ELEMENTS` elements: as soon as it is read,
        so that hostile markup costs little."""
        if len(self.slots) >= MAX_ELEMENTS:
            raise MtxError(f"The HTML has more than {MAX_ELEMENTS:,} elements ({self.where(offset)}); at most "
                           f"{MAX_ELEMENTS:,} are translated.")
        self.check_depth(depth, offset)
        self.slots.append(None)
        return len(self.slots) - 1

    def check_depth(self, depth: int, offset: int) -> None:
        """Refuse an element `depth` levels deep past `MAX_DEPTH`, as soon as it is read: 10,000 nested tags
        cost no more than 257."""
        if depth > MAX_DEPTH:
            raise MtxError(f"The HTML nests elements more than {MAX_DEPTH} deep ({self.where(offset)}); at most "
                           f"{MAX_DEPTH} levels are translated.")

    def where(self, offset: int) -> str:
        """`offset` as a person finds it in the fragment: line and column, from 1."""
        line, column = self.fragment.count("\n", 0, offset) + 1, offset - self.fragment.rfind("\n", 0, offset)
        return f"line {line}, column {column}"

    def parent(self) -> int | None:
        return self.stack[-1].index if self.stack else None

    def point(self, raw: str, name: str, offset: int) -> None:
        index = self.reserve(len(self.stack) + 1, offset)
        self.slots[index] = Element(self.length, self.length, raw, "", self.parent(), point=True)
        if name in BLOCKS:
            self.breaks.add(self.length)

    def start(self, token: _Token, raw: str) -> None:
        """A start tag: a point if void, the start of a point if untranslated, else an element opened."""
        if token.name in VOID:
            self.point(raw, token.name, token.offset)
            return
        index = self.reserve(len(self.stack) + 1, token.offset)
        names = (token.name, _written_name(raw, token.name))
        if token.name in OPAQUE or any(key == "translate" and (value or "").lower() == "no"
                                       for key, value in token.attrs):
            self.opaque = _Opaque(index, token.name, self.parent(), [raw], [names])
            return
        self.stack.append(_Open(*names, index, self.length, raw, self.parent()))
        if token.name in BLOCKS:
            self.breaks.add(self.length)

    def end(self, name: str, raw: str) -> None:
        """An end tag: it closes the innermost open element of its name and those opened inside it; if none is
        open, it is dropped."""
        for depth in range(len(self.stack) - 1, -1, -1):
            if self.stack[depth].name == name:
                while len(self.stack) > depth + 1:
                    self.close(None)
                self.close(raw)
                return

    def close(self, raw: str | None) -> None:
        """Close the innermost open element, with its end tag `raw` as written, or with a made-up one."""
        element = self.stack.pop()
        self.slots[element.index] = Element(element.start, self.length, element.open,
                                            f"</{element.written}>" if raw is None else raw, element.parent)
        if element.name in BLOCKS:
            self.breaks.add(self.length)

    def inside_opaque(self, opaque: _Opaque, token: _Token, raw: str) -> None:
        """A token inside an untranslated element: its markup joins the point, repaired as outside (an end tag
        closes what was opened inside what it closes; a stray one is dropped, and a lone `<` or `&` before it
        escaped, which would otherwise make markup of what follows: `<</i>/` is not `</`)."""
        if token.kind == "start" and token.name not in VOID:
            opaque.inside.append((token.name, _written_name(raw, token.name)))
            self.check_depth(len(self.stack) + len(opaque.inside), token.offset)
        elif token.kind == "end":
            names = [name for name, _ in opaque.inside]
            if token.name not in names:
                if opaque.raw[-1].endswith(("<", "&")):
                    opaque.raw[-1] = opaque.raw[-1][:-1] + _ESCAPE(opaque.raw[-1][-1])
                return
            depth = len(names) - 1 - names[::-1].index(token.name)
            opaque.raw.append(_closing(opaque.inside[depth + 1:]))
            del opaque.inside[depth:]
        opaque.raw.append(raw)
        if not opaque.inside:
            self.end_opaque(opaque)

    def close_opaque(self, opaque: _Opaque, rest: str) -> None:
        """The end of the input inside an untranslated element: its unfinished `rest` joins the point (closed if
        a comment, verbatim in raw text, escaped elsewhere), and what is open in it is closed."""
        if rest.startswith("<!--"):
            rest += "-->"
        elif opaque.inside[-1][0] not in RAW_TEXT:
            rest = _ESCAPE(html.unescape(rest))
        opaque.raw += [rest, _closing(opaque.inside)]
        opaque.inside.clear()
        self.end_opaque(opaque)

    def end_opaque(self, opaque: _Opaque) -> None:
        self.slots[opaque.index] = Element(self.length, self.length, "".join(opaque.raw), "", opaque.parent,
                                           point=True)
        if opaque.name in BLOCKS:
            self.breaks.add(self.length)
        self.opaque = None


def read_html(fragment: str) -> Marked:
    """Read an HTML fragment into its text (references decoded, whitespace as written) and its markup, elements
    over that text with their tags as written, repaired to nest (see the module's docstring), for a translation
    to carry them through its word alignments. Refused (MtxError) past `MAX_DEPTH` levels or `MAX_ELEMENTS`
    elements; anything else is read."""
    reader = _Reader(fragment)
    stop = _Tokenizer(fragment, reader.take).tokenize()
    return reader.finish(stop)


def problems(fragment: str) -> list[str]:
    """What keeps `fragment` from being well-formed: a start tag never closed (void elements and `<x/>` need
    no end tag), an end tag that closes no open element or not the innermost one, markup left unfinished at the
    end. Comments, declarations and script or style content do not count. The check of a translation's output."""
    found: list[str] = []
    stack: list[tuple[str, int]] = []

    def take(token: _Token) -> None:
        if token.kind == "start" and token.name not in VOID:
            stack.append((token.name, token.offset))
        elif token.kind == "end" and stack and stack[-1][0] == token.name:
            stack.pop()
        elif token.kind == "end":
            names = [name for name, _ in stack]
            innermost = f"<{stack[-1][0]}> opened at {stack[-1][1]} is open" if stack else "nothing is open"
            found.append(f"</{token.name}> at {token.offset}: {innermost}")
            if token.name in names:
                del stack[len(names) - 1 - names[::-1].index(token.name):]

    stop = _Tokenizer(fragment, take).tokenize()
    if fragment.startswith("<", stop):
        found.append(f"unfinished markup at {stop}: {fragment[stop:stop + 20]!r}")
    found += [f"<{name}> opened at {offset} is never closed" for name, offset in stack]
    return found


def is_well_formed(fragment: str) -> bool:
    """Whether every element of `fragment` is closed, in nested order, and no end tag is stray (`problems`)."""
    return not problems(fragment)


def start_tags(fragment: str) -> list[str]:
    """The markup `read_html` keeps of `fragment`, in source order: each element's start tag and each point's
    whole text. A translation carries every element exactly once, so its output's `start_tags` are the source's
    (as a multiset: the order may change)."""
    return [element.open for element in read_html(fragment).elements]
