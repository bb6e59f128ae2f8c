"""Markup taken out of a text and put back around the words of its translation, through word alignments.

A marked-up fragment (HTML: mtx.documents.html; Markdown: mtx.documents.markdown) is read into `Marked`: the text a
model translates, with the markup taken out and character references decoded, and the markup as `Element`s,
spans over that text, like stand-off annotation. An element that wraps words (`<b>`, `**`, a link) is a span; one
that holds no words (a void tag such as `<br>`, a comment, an image, and text that must not be translated: code,
`<script>`, `translate="no"`) is a point, written back verbatim.

Putting it back (`project`) follows what Bergamot's HTML mode does for Marian (Kenneth Heafield's html.cpp): each
target word takes the elements of the source word it is aligned to. Here the projection is made well-formed by
construction rather than by repair:

- an element's target span is one contiguous run of target words, so each element is written once: never split,
  never duplicated. The run is the one where the words aligned to its source words most outnumber those aligned
  elsewhere (`_run`), which leaves out a stray link that the hull of every link would stretch the span to;
- elements are placed top down, each span clipped to its parent's, and a sibling that overlaps an earlier one
  (by target position) starts after it, so spans nest;
- an element none of whose words has an aligned target word (or whose words all went to earlier siblings), and
  every point, is placed at a gap: after the target words aligned to the source word before it (at the start if
  there is none), inside its parent and outside its siblings' spans. An element that wrapped words there takes
  the nearest free target word (at most two words from its gap), or the edge word of a sibling's span of
  several beside it: empty markup shows nothing, and Markdown has no empty emphasis. Otherwise it stays empty.
  Nothing is dropped; the order of such elements is the source's.

The output has the source's elements, each exactly once, with their markup as written, properly nested.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from mtx.errors import MtxError

MAX_DEPTH = 256  # elements open inside each other: deeper markup is refused, not projected
MAX_ELEMENTS = 10_000  # elements in one fragment
# What a target word aligned outside an element costs a run of its words, against 1 for each aligned inside: the
# value of bench/documents.py's projections onto references (bench/README.md, "Documents").
OUTSIDE = 0.5


@dataclass(frozen=True)
class Element:
    """One piece of the source's markup, written back verbatim.

    `start`, `end`: the characters of `Marked.text` it wraps (start == end for a point, or an empty span).
    `open`, `close`: its markup as the source wrote it ("<a href='x'>" and "</a>"; "**" and "**"; "[" and
    "](x)"); a point's `open` is its whole verbatim text and its `close` is "". `parent`: the index of the
    element it sits in (None: at the top). Elements are listed in source order, a parent before its children.
    """

    start: int
    end: int
    open: str
    close: str
    parent: int | None = None
    point: bool = False


@dataclass(frozen=True)
class Marked:
    """A fragment with its markup taken out: `text` to translate (whitespace as written), its `elements`, and
    `breaks`: positions of `text` where a word ends although no whitespace is there (the edge of a block element,
    `<p>…</p><p>…</p>`), which also end a sentence. `escape` writes a translation's text in the format (HTML
    escapes & < > and spells a character as the source did, `&copy;`; Markdown escapes its punctuation)."""

    text: str
    elements: tuple[Element, ...]
    escape: Callable[[str], str]
    breaks: frozenset[int] = frozenset()


def check_elements(elements: Sequence[Element], text_length: int) -> None:
    """Refuse what a parser must never hand over, and markup too deep or too large to project: spans outside
    the text or outside their parent, parents after children, more than `MAX_DEPTH` levels."""
    if len(elements) > MAX_ELEMENTS:
        raise MtxError(f"The markup has {len(elements):,} elements; at most {MAX_ELEMENTS:,} are projected.")
    depth: list[int] = []
    for i, element in enumerate(elements):
        parent = element.parent
        if not 0 <= element.start <= element.end <= text_length:
            raise ValueError(f"element {i} spans {element.start}..{element.end} of a text of {text_length}")
        if parent is not None and not (0 <= parent < i and elements[parent].start <= element.start
                                       and element.end <= elements[parent].end and not elements[parent].point):
            raise ValueError(f"element {i} is not inside its parent {parent}")
        depth.append(1 if parent is None else depth[parent] + 1)
        if depth[-1] > MAX_DEPTH:
            raise MtxError(f"The markup nests elements {MAX_DEPTH + 1} deep or more; at most {MAX_DEPTH} levels are "
                           "projected.")


Span = tuple[int, int]  # characters [start, end) of Marked.text


@dataclass(frozen=True)
class Target:
    """A translation as `project` places markup in it: its words; `separators`, the whitespace before each word
    and after the last (len(words) + 1: the source's leading whitespace, one space between the words of a
    sentence, the source's whitespace between sentences, the trailing whitespace); and `links`, each target
    word's source word (an index into the source words), None for a word aligned to none."""

    words: Sequence[str]
    separators: Sequence[str]
    links: Sequence[int | None]


@dataclass
class _Placed:
    """Where an element goes among the target words: a span of words [first, last], or a gap (before word
    `gap`; len(words) is after the last)."""

    first: int = 0
    last: int = -1
    gap: int | None = None


def project(marked: Marked, source_words: Sequence[Span], target: Target) -> str:
    """The translation with the source's markup put back around the aligned words (see the module's docstring):
    each element of `marked` exactly once, properly nested, its markup as the source wrote it; the words written
    through `marked.escape`. `source_words`: the characters of each source word, in order."""
    placed = _place(marked, source_words, _Links.of(len(source_words), target.links), len(target.words))
    return _write(marked, placed, target)


@dataclass(frozen=True)
class _Links:
    """The alignment as placing reads it: the target words aligned to each source word, in order; for each source
    word, the last target word aligned to it or to a word before it; and how many target words before each
    position are aligned at all."""

    targets: list[list[int]]
    reach: list[int | None]
    aligned_before: list[int]

    @classmethod
    def of(cls, count: int, links: Sequence[int | None]) -> _Links:
        targets: list[list[int]] = [[] for _ in range(count)]
        aligned_before = [0]
        for t, s in enumerate(links):
            aligned = s is not None and 0 <= s < count
            if aligned:
                targets[s].append(t)
            aligned_before.append(aligned_before[-1] + aligned)
        reach: list[int | None] = []
        for mine in targets:
            reach.append(mine[-1] if mine else (reach[-1] if reach else None))
        return cls(targets, reach, aligned_before)


def _place(marked: Marked, words: Sequence[Span], links: _Links, length: int) -> list[_Placed]:
    """Each element's place: its hull of aligned target words, clipped to its parent's and past its earlier
    siblings'; or a gap, for an element left with no words (a point among them)."""
    placed = [_Placed() for _ in marked.elements]
    starts = [start for start, _ in words]
    ends = [end for _, end in words]
    root = _Placed(0, length - 1) if length else _Placed(gap=0)
    for parent, kids in _children(marked.elements).items():
        outer = root if parent is None else placed[parent]
        spans: list[int] = []
        for i in kids:
            element = marked.elements[i]
            hull = None if element.point or outer.gap is not None else _run(element, starts, ends, links)
            if hull is not None and max(hull[0], outer.first) <= min(hull[1], outer.last):
                placed[i] = _Placed(max(hull[0], outer.first), min(hull[1], outer.last))
                spans.append(i)
        spans.sort(key=lambda i: (placed[i].first, i))
        nested, end = _Siblings(), -1
        for i in spans:  # a sibling starts after the ones before it end: spans nest
            placed[i].first = max(placed[i].first, end + 1)
            if placed[i].first <= placed[i].last:
                nested.add(placed[i])
                end = placed[i].last
        taken = {id(span) for span in nested.spans}
        for i in kids:
            if id(placed[i]) in taken:
                continue
            element = marked.elements[i]
            before = bisect.bisect_right(ends, element.start) - 1
            gap = _gap(links.reach[before] if before >= 0 else None, outer, nested)
            word = None if element.point or not marked.text[element.start:element.end].strip() else _free_word(
                gap, outer, nested)
            placed[i] = _Placed(gap=gap) if word is None else _Placed(word, word)
            if word is not None:
                nested.add(placed[i])
    return placed


class _Siblings:
    """Siblings' spans, disjoint, in order, with their first words beside them to search: an element left with no
    words looks for its place among them, and each one placed joins them (one list built per look would make a
    line of many such elements quadratic)."""

    def __init__(self) -> None:
        self.spans: list[_Placed] = []
        self.firsts: list[int] = []

    def add(self, span: _Placed) -> None:
        at = bisect.bisect_left(self.firsts, span.first)
        self.spans.insert(at, span)
        self.firsts.insert(at, span.first)

    def holding(self, word: int) -> int:
        """The index of the last span starting at or before `word` (-1: none); it holds `word` if it reaches it."""
        return bisect.bisect_right(self.firsts, word) - 1

    def give_up(self, index: int, word: int) -> None:
        """Take `word`, an edge of the span at `index` of several words, from it."""
        span = self.spans[index]
        if word == span.first:
            span.first = self.firsts[index] = word + 1
        else:
            span.last = word - 1


def _free_word(gap: int, outer: _Placed, siblings: _Siblings) -> int | None:
    """For an element that wrapped words but was left with none (none aligned, or all taken by earlier siblings):
    the nearest target word to its gap (after it, before it, then one further each way) that its parent holds and
    no sibling does; failing that, the word after or before the gap at the edge of a sibling's span of several,
    which gives it up. Markup that wraps nothing shows nothing (and Markdown cannot write empty emphasis), so one
    word is the better guess."""
    candidates = [word for word in (gap, gap - 1, gap + 1, gap - 2) if outer.first <= word <= outer.last]
    holders = [siblings.holding(word) for word in candidates]
    for word, holder in zip(candidates, holders, strict=True):
        if holder < 0 or siblings.spans[holder].last < word:
            return word
    for word, holder in zip(candidates[:2], holders, strict=False):
        span = siblings.spans[holder]
        if span.first < span.last and word in (span.first, span.last):
            siblings.give_up(holder, word)
            return word
    return None


def _children(elements: Sequence[Element]) -> dict[int | None, list[int]]:
    """Each element's children in source order, the top's under None, parents listed before their children."""
    children: dict[int | None, list[int]] = {None: []}
    for i, element in enumerate(elements):
        children.setdefault(element.parent, []).append(i)
    return children


def _run(element: Element, starts: list[int], ends: list[int], links: _Links) -> tuple[int, int] | None:
    """The element's target words: of the runs of target words from one aligned to its source words to another,
    the one where those words outnumber most the words aligned elsewhere, these counting `OUTSIDE` each (Kadane's
    maximum-sum run, over the aligned positions only); None where no target word is aligned to the words it
    touches. A stray link far from the rest is left out, where the hull of every link would take all between."""
    low = bisect.bisect_right(ends, element.start)  # the first word ending after the element starts
    high = bisect.bisect_left(starts, element.end)  # past the last word starting before it ends
    inside = sorted(t for targets in links.targets[low:high] for t in targets)
    if not inside:
        return None
    before = links.aligned_before
    best, run = None, (inside[0], inside[0])
    opened, opened_at = None, 0  # the best start so far: its value, its index in `inside`
    for j, t in enumerate(inside):
        value = OUTSIDE * before[t] - (1 + OUTSIDE) * j  # the run's value is end's term + start's
        if opened is None or value > opened:
            opened, opened_at = value, j
        total = (1 + OUTSIDE) * (j + 1) - OUTSIDE * before[t + 1] + opened
        if best is None or total > best:
            best, run = total, (inside[opened_at], t)
    return run


def _gap(reached: int | None, outer: _Placed, siblings: _Siblings) -> int:
    """Where an element with no words of its own goes: after `reached`, the last target word aligned to a source
    word before it (at its parent's start if none is), inside its parent, outside its siblings' spans."""
    if outer.gap is not None:
        return outer.gap
    gap = min(max(outer.first if reached is None else reached + 1, outer.first), outer.last + 1)
    inside = bisect.bisect_left(siblings.firsts, gap) - 1  # the last span starting before the gap
    if inside >= 0 and gap <= siblings.spans[inside].last:
        gap = siblings.spans[inside].last + 1
    return gap


class _Markup(NamedTuple):
    """Markup waiting for the next word: its text, whether it goes before the gap's separator (as the source had
    it: no whitespace before it there), the space it wants after it, and whether it closes an element."""

    text: str
    first: bool
    after: str = ""
    close: bool = False


def _write(marked: Marked, placed: list[_Placed], target: Target) -> str:
    """The words, separators and markup in order: each element's open before its first word and close after its
    last, a gap's elements between two words, and each gap's separator where the source had its whitespace."""
    children = _children(marked.elements)
    for kids in children.values():
        kids.sort(key=lambda i: (placed[i].first if placed[i].gap is None else placed[i].gap, i))
    out: list[str] = []
    pending: list[_Markup] = []  # the markup since the last word

    def flush(gap: int) -> None:
        """The markup of a gap: what goes before the separator, the separator, the rest. A point's space after
        it waits past the closes that follow it: whitespace just inside a close would unmake Markdown's."""
        before = next((k for k, markup in enumerate(pending) if not markup.first), len(pending))
        out.extend(markup.text for markup in pending[:before])
        out.append(target.separators[gap])
        owed = ""
        for markup in pending[before:]:
            if not markup.close:
                out.append(owed)
                owed = ""
            out.append(markup.text)
            owed = owed or markup.after
        out.append(owed if gap < len(target.words) else "")
        pending.clear()

    def word(t: int) -> None:
        flush(t)
        out.append(marked.escape(target.words[t]))

    def emit(kids: list[int], first: int, last: int) -> None:
        t = first
        for i in kids:
            where, element = placed[i], marked.elements[i]
            while t < (where.first if where.gap is None else where.gap):
                word(t)
                t += 1
            if element.point:  # a point between spaces in the source keeps a space after it too
                spaced = _space_before(marked.text, element.start) and _space_at(marked.text, element.start)
                pending.append(_Markup(element.open, not _space_before(marked.text, element.start),
                                       " " if spaced else ""))
                continue
            pending.append(_Markup(element.open, _space_at(marked.text, element.start)))
            if where.gap is None:
                emit(children.get(i, []), where.first, where.last)
                t = where.last + 1
            else:
                emit(children.get(i, []), where.gap, where.gap - 1)
            pending.append(_Markup(element.close, not (element.end > element.start
                                                       and _space_at(marked.text, element.end - 1)), close=True))
        while t <= last:
            word(t)
            t += 1

    emit(children[None], 0, len(target.words) - 1)
    flush(len(target.words))
    return "".join(out)


def _space_at(text: str, i: int) -> bool:
    return 0 <= i < len(text) and text[i].isspace()


def _space_before(text: str, i: int) -> bool:
    return _space_at(text, i - 1)
