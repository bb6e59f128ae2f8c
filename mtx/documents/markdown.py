"""Markdown read into `Marked` (mtx.documents.markup): the prose to translate, and the markup around it as the
source wrote it, so that a translation is written back as Markdown of the same structure.

markdown-it-py parses the fragment as CommonMark, with GFM strikethrough and tables. Its tokens say what the
markup is but not where: block tokens carry line ranges, inline tokens nothing, and link destinations come out
percent-encoded. So its rules are followed, not re-implemented:

- after each block rule that makes inline content (paragraph, headings, table cells), where each piece of that
  content lies in the source is noted: `getLines` cut again with the block state at hand (blockquote markers and
  indentation left out; a tab partly used by the indentation gives spaces that are in no source);
- after each inline rule that makes markup, the span of content it consumed is noted on its tokens: a code span,
  a link's `[` and its `](dest "title")`, each emphasis delimiter. Pairing is known only once all rules have run;
  then each delimiter run is given wholly to the pairs it made (unpaired delimiters of a run included: CommonMark
  pairs by the lengths of runs, so a run is written back as long as it was).

The rest of the source is text (content no markup covers, backslash escapes and character references decoded,
whitespace as written) or block markup: list markers, `>`, `#`, fences and whole code blocks, reference
definitions, blank lines, each run of it one point, verbatim. Spans: `*`, `_`, `**`, `__`, `~~` and links; points:
code spans, images, autolinks, inline HTML, hard breaks. A continuation line's prefix (`> `, indentation) takes the
newline before it and leaves its last space to the text, so that the line is still broken there when the
translation rewraps the words. `breaks` are the edges of blocks and hard breaks: a sentence ends there although the
text has no space (the newlines are in the points).

The text is written back through `MarkdownEscape`: ASCII punctuation that could make markup where it stands is
backslash-escaped, and no more, so that the translation stays readable.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, cached_property
from typing import Any, NamedTuple

from markdown_it import MarkdownIt
from markdown_it.rules_block.state_block import StateBlock
from markdown_it.rules_inline.state_inline import StateInline
from markdown_it.token import Token

from mtx.documents.markup import MAX_DEPTH, MAX_ELEMENTS, Element, Marked, check_elements
from mtx.errors import MtxError

_NOTE = "mtx"  # the key of this module's notes in a markdown-it Token's meta
_BLOCK_RULES = {"paragraph", "heading", "lheading", "table"}
_INLINE_RULES = {"newline", "escape", "backticks", "strikethrough", "emphasis", "link", "image", "autolink",
                 "html_inline", "entity"}


class _Piece(NamedTuple):
    """Content `at`..`at + length` of an inline token is the source's `source`..`source + source_length`: the same
    characters, or (length 1, source_length 2) a table cell's `|` that the source wrote `\\|`."""

    at: int
    source: int
    length: int
    source_length: int


class _Segment(NamedTuple):
    """Source `start`..`end` as one thing: `kind` "text" (as written), "special" (an escape or a reference, whose
    `text` is what it stands for), "open" or "close" (a span's markup), "point", or "break" (a hard break)."""

    start: int
    end: int
    kind: str
    text: str = ""


# -- where the inline content lies in the source (block rules) -----------------------------------------------------


def _line_pieces(state: StateBlock, begin: int, end: int, content: str) -> list[_Piece]:
    """Where `content`, markdown-it's trimmed `getLines(begin, end, blkIndent)`, lies: each line cut as getLines
    cuts it. The trimmed content starts at its first occurrence in the untrimmed (what is trimmed is whitespace,
    which content does not start with)."""
    pieces, at, lines = [], 0, []
    for line in range(begin, end):
        first = start = state.bMarks[line]
        last = state.eMarks[line] + 1 if line + 1 < end else state.eMarks[line]
        indent = 0
        while first < last and indent < state.blkIndent:
            if state.src[first] == "\t":
                indent += 4 - (indent + state.bsCount[line]) % 4
            elif state.src[first] != " " and first - start >= state.tShift[line]:
                break
            else:
                indent += 1
            first += 1
        virtual = max(indent - state.blkIndent, 0)  # what a tab gave beyond the indent
        pieces.append(_Piece(at + virtual, first, last - first, last - first))
        lines.append(" " * virtual + state.src[first:last])
        at += virtual + last - first
    lead, kept = "".join(lines).find(content), []
    for at, source, size, _ in pieces:  # cut to content, lead..lead + len(content)
        first, last = max(at, lead), min(at + size, lead + len(content))
        if first < last:
            kept.append(_Piece(first - lead, source + first - at, last - first, last - first))
    return kept


def _heading_pieces(state: StateBlock, line: int, content: str) -> list[_Piece]:
    """An ATX heading's text: after its `#`s, trimmed (its closing `#`s are left after it)."""
    start = state.bMarks[line] + state.tShift[line]
    while start < state.eMarks[line] and state.src[start] == "#":
        start += 1
    at = state.src.find(content, start, state.eMarks[line])
    return [_Piece(0, at, len(content), len(content))] if content and at >= 0 else []


def _cell_pieces(state: StateBlock, line: int, cursor: int, content: str) -> tuple[list[_Piece], int]:
    """A table cell's text, found from `cursor` on in its row: each `|` in it was written `\\|` (markdown-it
    splits cells at the others). Its pieces, and where the next cell's search starts."""
    at = state.src.find(content.replace("|", "\\|"), cursor, state.eMarks[line])
    if not content or at < 0:
        return [], cursor
    pieces, written = [], 0
    for i, part in enumerate(content.split("|")):
        if i:
            pieces.append(_Piece(written, at, 1, 2))
            written, at = written + 1, at + 2
        if part:
            pieces.append(_Piece(written, at, len(part), len(part)))
            written, at = written + len(part), at + len(part)
    return pieces, at


def _matches(pieces: list[_Piece], content: str, src: str) -> bool:
    """Whether `pieces` truly say where the characters of `content` are (all but spaces that are in no source)."""
    found = 0
    for at, source, length, source_length in pieces:
        spelled = content[at:at + length]
        if source_length != length:
            spelled = spelled.replace("|", "\\|")
        if at < found or content[found:at].strip(" ") or src[source:source + source_length] != spelled:
            return False
        found = at + length
    return not content[found:].strip(" ")


def _locate(name: str, state: StateBlock, tokens: Sequence[Token]) -> None:
    """Note on each inline token a block rule made where its content lies: `_Piece`s, or None where they were not
    found (that block is then written back verbatim, untranslated; markdown-it versions may cut differently)."""
    row, cursor = -1, 0
    for token in tokens:
        if token.type != "inline" or token.map is None:
            continue
        first, last = token.map
        if name == "table":
            if first != row:
                row, cursor = first, state.bMarks[first] + state.tShift[first]
            pieces, cursor = _cell_pieces(state, first, cursor, token.content)
        elif name == "heading":
            pieces = _heading_pieces(state, first, token.content)
        else:
            pieces = _line_pieces(state, first, last, token.content)
        token.meta[_NOTE] = pieces if _matches(pieces, token.content, state.src) else None


def _located(name: str, rule: Callable[[StateBlock, int, int, bool], bool]
             ) -> Callable[[StateBlock, int, int, bool], bool]:
    def rule_then_locate(state: StateBlock, start: int, end: int, silent: bool) -> bool:
        count = len(state.tokens)
        found = rule(state, start, end, silent)
        if found and not silent:
            _locate(name, state, state.tokens[count:])
        return found

    return rule_then_locate


# -- what each inline rule consumed (inline rules) -----------------------------------------------------------------


def _note(name: str, state: StateInline, new: list[Token], start: int, pending: int) -> None:
    """Note on the tokens an inline rule just made (after the text pending before it, if any) the content it
    consumed, `start`..`state.pos`: (kind, start, end), and for a delimiter its run's start."""
    end, last = state.pos, new[-1]
    if name in ("emphasis", "strikethrough"):  # one token per delimiter (`~~` one of two characters), last made
        for token in reversed(new):
            if end <= start:
                break
            token.meta[_NOTE] = ("delimiter", end - len(token.content), end, start)
            end -= len(token.content)
    elif name == "link":
        label_end = state.md.helpers.parseLinkLabel(state, start, True)  # as the rule found it (cached: cheap)
        (new[1] if new[0].type == "text" else new[0]).meta[_NOTE] = ("open", start, start + 1)
        last.meta[_NOTE] = ("close", label_end, end)
    elif name == "autolink":  # link_open, text, link_close: one point
        for token in new[-3:]:
            token.meta[_NOTE] = ("skip", start, end)
        new[-3].meta[_NOTE] = ("point", start, end)
    elif last.type == "hardbreak":  # from the spaces the newline rule cut from the pending text, or a backslash
        cut = pending - (len(new[0].content) if len(new) > 1 else 0)
        last.meta[_NOTE] = ("break", start - cut if name == "newline" else start, end)
    elif last.type == "text_special":
        last.meta[_NOTE] = ("special", start, end)
    elif last.type in ("code_inline", "image", "html_inline"):
        last.meta[_NOTE] = ("point", start, end)


def _noted(name: str, rule: Callable[[StateInline, bool], bool]) -> Callable[[StateInline, bool], bool]:
    def rule_then_note(state: StateInline, silent: bool) -> bool:
        start, count = state.pos, len(state.tokens)
        pending = len(state.pending) if name == "newline" and not silent else 0
        found = rule(state, silent)
        if found and not silent and len(state.tokens) > count:
            _note(name, state, state.tokens[count:], start, pending)
        return found

    return rule_then_note


def _extents(state: StateInline) -> None:
    """(After emphasis and strikethrough are paired, before text is joined.) Each paired delimiter's extent: `**`
    takes the delimiter before an opener's or after a closer's; a run's unpaired delimiters go to the pair beside
    them (the one before, else the one after)."""
    runs: dict[int, list[Token]] = {}
    for token in state.tokens:
        found = token.meta.get(_NOTE)
        if found and found[0] == "delimiter":
            runs.setdefault(found[3], []).append(token)
    for run in runs.values():
        run.sort(key=lambda token: token.meta[_NOTE][1])  # strikethrough moves a lone `~` after its run's closer
        extent = []
        for token in run:
            start, end = token.meta[_NOTE][1:3]
            if token.nesting:
                extent.append([end - len(token.markup), end, token] if token.nesting > 0 else
                              [start, start + len(token.markup), token])
        if extent:
            extent[0][0], extent[-1][1] = run[0].meta[_NOTE][1], run[-1].meta[_NOTE][2]
            for before, after in zip(extent, extent[1:], strict=False):
                before[1] = after[0]
            for start, end, token in extent:
                token.meta[_NOTE] = ("open" if token.nesting > 0 else "close", start, end)


@cache
def _parser() -> MarkdownIt:
    """CommonMark with strikethrough and tables, its rules followed by the notes of where things are; text_join
    is off, so that escapes and references stay tokens of their own."""
    md = MarkdownIt("commonmark").enable(["strikethrough", "table"]).disable("text_join")
    for ruler, follow, names in ((md.block.ruler, _located, _BLOCK_RULES), (md.inline.ruler, _noted, _INLINE_RULES)):
        for rule in ruler.__rules__:  # each replaced in place, keeping the chains (alt) it belongs to
            if rule.name in names:
                ruler.at(rule.name, follow(rule.name, rule.fn), {"alt": rule.alt})
    md.inline.ruler2.before("fragments_join", "mtx_extents", _extents)
    return md


# -- segments of the source, in order ------------------------------------------------------------------------------


def _source_range(pieces: list[_Piece], starts: list[int], first: int, last: int) -> tuple[int, int]:
    """The source span of content `first`..`last`: from the first of its characters in the source to after the
    last (a hard break's end may be in spaces that are in no source)."""
    i = bisect_right(starts, first) - 1
    if i < 0 or first >= starts[i] + pieces[i].length:
        i += 1
    j = bisect_right(starts, last - 1) - 1
    start, end = pieces[i], pieces[j]
    return (start.source + (max(first - start.at, 0) if start.length == start.source_length else 0),
            end.source + (min(last - end.at, end.length) if end.length == end.source_length else 2))


def _text_segments(pieces: list[_Piece], starts: list[int], first: int, last: int) -> Iterator[_Segment]:
    """Content `first`..`last`, which no markup covers: the source's characters, as written."""
    for at, source, length, source_length in pieces[max(bisect_right(starts, first) - 1, 0):]:
        if at >= last:
            break
        start, end = max(at, first), min(at + length, last)
        if start < end:
            yield (_Segment(source, source + 2, "special", "|") if source_length != length else
                   _Segment(source + start - at, source + end - at, "text"))


def _block_segments(token: Token) -> list[_Segment]:
    """One inline token's segments, in source offsets ([] where its content was not found in the source)."""
    pieces: list[_Piece] | None = token.meta.get(_NOTE)
    if not pieces:
        return []
    starts = [piece.at for piece in pieces]
    notes = sorted((found[1], found[2], found[0], child.content) for child in token.children or ()
                   if (found := child.meta.get(_NOTE)) and found[0] not in ("skip", "delimiter"))
    segments, cursor = [], 0
    for start, end, kind, text in notes:
        segments += _text_segments(pieces, starts, cursor, start)
        segments.append(_Segment(*_source_range(pieces, starts, start, end), kind, text))
        cursor = end
    return segments + list(_text_segments(pieces, starts, cursor, len(token.content)))


# -- Marked --------------------------------------------------------------------------------------------------------


class _Builder:
    """`Marked`, built from the segments in source order; the source between them is block markup, a point."""

    def __init__(self, src: str) -> None:
        self.src, self.pos, self.length = src, 0, 0
        self.text: list[str] = []
        self.elements: list[list[Any]] = []  # [start, end, open, close, parent, point]
        self.open: list[int] = []
        self.breaks: set[int] = set()
        self.spellings: dict[str, str] = {}
        self.escaped: set[str] = set()
        self.newline = False  # whether the text just read ends a line

    def element(self, raw: str, point: bool) -> None:
        if len(self.elements) >= MAX_ELEMENTS:
            raise MtxError(f"The Markdown has more than {MAX_ELEMENTS:,} pieces of markup; at most "
                           f"{MAX_ELEMENTS:,} are carried through a translation.")
        self.elements.append([self.length, self.length, raw, "", self.open[-1] if self.open else None, point])
        if not point:
            self.open.append(len(self.elements) - 1)
            if len(self.open) > MAX_DEPTH:
                raise MtxError(f"The Markdown nests markup {MAX_DEPTH + 1} deep or more; at most {MAX_DEPTH} "
                               "levels are carried through a translation.")

    def words(self, written: str) -> None:
        self.text.append(written)
        self.length += len(written)

    def block_markup(self, raw: str, block_start: bool) -> None:
        """A run of block markup. After a soft line break, a prefix ending in a space takes the newline from the
        text and leaves that space: `a\\n> b` reads `a b` with the point `\\n>` after `a`."""
        if self.newline and not block_start and raw[-1] in " \t":
            self.text[-1], self.length = self.text[-1][:-1], self.length - 1
            self.element("\n" + raw[:-1], True)
            self.words(raw[-1])
        else:
            self.element(raw, True)

    def add(self, segment: _Segment, block_start: bool) -> None:
        if segment.start < self.pos:
            raise MtxError("This Markdown could not be read: its markup overlaps.")
        if segment.start > self.pos:
            self.block_markup(self.src[self.pos:segment.start], block_start)
        if block_start or segment.kind == "break":
            self.breaks.add(self.length)
        raw, self.pos = self.src[segment.start:segment.end], segment.end
        self.newline = segment.kind == "text" and raw.endswith("\n")
        if segment.kind == "text":
            self.words(raw)
        elif segment.kind == "special":
            if raw == "\\" + segment.text:
                self.escaped.add(segment.text)
            elif raw.startswith("&") and segment.text.strip(" \t\n"):  # not spaces: every space would be so
                self.spellings.setdefault(segment.text, raw)
            self.words(segment.text)
        elif segment.kind == "close":
            if not self.open:
                raise MtxError("This Markdown could not be read: its markup closes what it did not open.")
            closed = self.elements[self.open.pop()]
            closed[1], closed[3] = self.length, raw
        else:
            self.element(raw, segment.kind != "open")

    def marked(self) -> Marked:
        if self.pos < len(self.src):
            self.element(self.src[self.pos:], True)
        if self.open:
            raise MtxError("This Markdown could not be read: its markup opens what it does not close.")
        elements = tuple(Element(*element) for element in self.elements)
        check_elements(elements, self.length)
        escape = MarkdownEscape(tuple(self.spellings.items()), frozenset(self.escaped))
        return Marked("".join(self.text), elements, escape, frozenset(b for b in self.breaks if 0 < b < self.length))


def _normalized(fragment: str) -> str:
    """The fragment as CommonMark reads it: line endings `\\n`, NUL U+FFFD (offsets are into this)."""
    return fragment.replace("\r\n", "\n").replace("\r", "\n").replace("\0", "\ufffd")


def read_markdown(fragment: str) -> Marked:
    """Read a Markdown fragment into its text and its markup, as written (see the module's docstring), for a
    translation to carry the markup through its word alignments. Line endings are read as `\\n` and NUL as U+FFFD,
    as CommonMark reads them; every other character of the fragment is in the text or in an element. Refused
    (MtxError) past `MAX_DEPTH` levels or `MAX_ELEMENTS` elements; anything else is read."""
    src = _normalized(fragment)
    builder = _Builder(src)
    for token in _parser().parse(src, {}):
        if token.type == "inline":
            for i, segment in enumerate(_block_segments(token)):
                builder.add(segment, i == 0)
    return builder.marked()


# -- writing translated text ---------------------------------------------------------------------------------------

_INLINE = (r"[`\[\]~]"  # could start or end markup anywhere (`|`, a table's cell, is spelled `&#124;`)
           r"|\\(?=[!-/:-@\[-`{-~\n])"  # a backslash that would escape what follows (else it is a character)
           r"|(?<!\s)\*|\*(?!\s)"  # an asterisk not between spaces (which can neither open nor close emphasis)
           r"|(?<![^\W_])_|_(?![^\W_])"  # an underscore not inside a word
           r"|<(?=\S)"  # the start of a tag or an autolink
           r"|&(?=#[0-9]{1,7};|#[xX][0-9a-fA-F]{1,6};|[A-Za-z][A-Za-z0-9]{1,31};)")  # a character reference
# What starts a block at the start of a line (after at most three spaces: more make code): a quote, a heading, a
# list item or a thematic break, a setext underline (a fence's ` and ~, and `<`, are escaped wherever they stand).
_BLOCK_START = re.compile(r"( {0,3})(>|#{1,6}(?![^ \t])|[-+*]+(?![^ \t])|\d{1,9}[.)](?![^ \t])|=+[ \t]*$)")


@dataclass(frozen=True)
class MarkdownEscape:
    """How translated text is written in Markdown, so that it renders as that text: a character the source wrote
    as a character reference is spelled the same (`©` as `&copy;`); `|` is spelled `&#124;` (safe in a table's
    cell); ASCII punctuation that could make markup where it stands is backslash-escaped, and no more, so that
    the text stays readable: `*` between spaces, `_` inside a word, `<` before a space, and `#`, `-`, `+`, `>`,
    `1.` other than at the start of a line are left as they are.

    It is applied word by word, and a word does not know whether it starts a line; so at the start of the string a
    marker alone (`-`, `#`, `1990.`) is left, and one followed by a space (`- a`) escaped, unless the source itself
    backslash-escaped that character (`1\\.`: then the source needed it, and a translation may too). So too at
    the end: `!` and `\\` are escaped there only if the source escaped them (before a link's `[`, `Wow!` would make
    an image; before `**`, `C:\\` would escape it); else what follows a word is the space after it."""

    spellings: tuple[tuple[str, str], ...] = ()
    escaped: frozenset[str] = frozenset()

    @cached_property
    def _table(self) -> dict[str, str]:
        return {"|": "&#124;", **dict(self.spellings)}

    @cached_property
    def _inline(self) -> re.Pattern[str]:
        keys = sorted(self._table, key=len, reverse=True)
        at_end = [f"{re.escape(character)}$" for character in "!\\" if character in self.escaped]
        return re.compile("|".join([re.escape(key) for key in keys] + [_INLINE] + at_end))

    def _line_start(self, line: str, first: bool) -> str:
        found = _BLOCK_START.match(line)
        if not found:
            return line
        indent, marker = found.groups()
        if first and found.end() == len(line) and marker != ">" and marker[-1] not in self.escaped:
            return line
        cut = len(indent) + (len(marker) - 1 if marker[0].isdigit() else 0)
        return f"{line[:cut]}\\{line[cut:]}"

    def __call__(self, text: str) -> str:
        text = self._inline.sub(lambda found: self._table.get(found.group(), "\\" + found.group()), text)
        return "\n".join(self._line_start(line, i == 0) for i, line in enumerate(text.split("\n")))


# -- structure -----------------------------------------------------------------------------------------------------


def structure(fragment: str) -> list[str]:
    """The markup of a fragment as markdown-it reads it, in order, without its text: each token's type and tag,
    and what of it is no prose (link and image addresses and titles, code, HTML, an image's alt text, table
    alignment). Soft line breaks are left out: a translation may break its lines elsewhere."""
    found: list[str] = []
    pending = list(reversed(_parser().parse(_normalized(fragment), {})))
    while pending:
        token = pending.pop()
        if token.type == "inline":
            pending.extend(reversed(token.children or ()))
        elif token.type not in ("text", "text_special", "softbreak"):
            verbatim = token.content if token.type in ("code_inline", "code_block", "fence", "html_inline",
                                                       "html_block", "image") else ""
            found.append(" ".join(str(part) for part in (token.type, token.tag, token.info, token.attrs, verbatim)
                                  if part))
    return found


def same_structure(source: str, output: str) -> bool:
    """Whether two fragments have the same markup in the same order, whatever their text: what a translation
    of `source` must keep."""
    return structure(source) == structure(output)
