"""Markup projected onto a translation (mtx.documents.markup.project): every element exactly once, nested as in
the source, the translation's words all there in order, whatever the alignment; and where it is the identity, the
source itself."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtx.documents.markup import MAX_DEPTH, MAX_ELEMENTS, Element, Marked, Target, check_elements, project
from mtx.errors import MtxError

MARK = re.compile(r"<(/?)(e|p)(\d+)>")


def plain(text: str) -> str:
    return text


@st.composite
def documents(draw: st.DrawFn) -> tuple[Marked, list[tuple[int, int]]]:
    """Words "w0 w1 ..." and a random tree of elements over them: spans over runs of words (some empty), and points
    between words; each element's markup names it (<e3>…</e3>, <p5>)."""
    count = draw(st.integers(0, 8))
    words = [f"w{i}" for i in range(count)]
    text = " ".join(words)
    spans, at = [], 0
    for word in words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    elements: list[Element] = []

    def grow(parent: int | None, first: int, last: int, depth: int) -> None:  # words first..last-1 are free
        at = first
        while at <= last and depth < 4 and draw(st.booleans()):
            kind = draw(st.sampled_from(["span", "point", "empty"]))
            position = spans[at][0] if at < last else spans[last - 1][1] if last else 0  # in the parent
            if kind == "span" and at < last:
                end = draw(st.integers(at + 1, last))
                index = len(elements)
                elements.append(Element(spans[at][0], spans[end - 1][1], f"<e{index}>", f"</e{index}>", parent))
                grow(index, at, end, depth + 1)
                at = end
            else:
                index = len(elements)
                point = kind == "point"
                elements.append(Element(position, position, f"<{'p' if point else 'e'}{index}>",
                                        "" if point else f"</e{index}>", parent, point))
            at += draw(st.integers(0, 1))

    grow(None, 0, count, 0)
    return Marked(text, tuple(elements), plain), spans


def check(output: str, marked: Marked, words: list[str]) -> None:
    """Each element once, inside its own parent; the words in order, each once."""
    stack: list[int] = []
    seen: dict[int, int | None] = {}
    for closing, kind, number in MARK.findall(output):
        index = int(number)
        if closing:
            assert stack and stack.pop() == index, output
            continue
        assert index not in seen, output
        seen[index] = stack[-1] if stack else None
        if kind == "e":
            stack.append(index)
    assert not stack, output
    assert seen == {i: e.parent for i, e in enumerate(marked.elements)}, output
    assert MARK.sub(" ", output).split() == words, output


@given(documents(), st.data())
def test_any_alignment_gives_every_element_once_nested_as_in_the_source(document, data) -> None:
    marked, spans = document
    check_elements(marked.elements, len(marked.text))
    length = data.draw(st.integers(0, 9))
    links = data.draw(st.lists(st.one_of(st.none(), st.integers(0, max(len(spans) - 1, 0))),
                               min_size=length, max_size=length))
    words = [f"t{i}" for i in range(length)]
    output = project(marked, spans, Target(words, ["", *[" "] * max(length - 1, 0), ""][: length + 1]
                                           if length else [""], links))
    check(output, marked, words)


@given(documents())
def test_the_identity_alignment_gives_back_the_source(document) -> None:
    marked, spans = document
    words = marked.text.split()
    separators = ["", *[" "] * (len(words) - 1), ""] if words else [""]
    output = project(marked, spans, Target(words, separators, list(range(len(words)))))
    check(output, marked, words)
    assert MARK.sub("", output).split() == words


def test_a_reordered_translation_carries_the_tag_to_its_word() -> None:
    text = "the red house"
    marked = Marked(text, (Element(4, 7, "<b>", "</b>"),), plain)
    spans = [(0, 3), (4, 7), (8, 13)]
    assert project(marked, spans, Target(["das", "Haus", "rot"], ["", " ", " ", ""], [0, 2, 1])) == \
        "das Haus <b>rot</b>"


def test_a_point_follows_the_word_before_it_and_keeps_its_spacing() -> None:
    text = "one two"
    marked = Marked(text, (Element(3, 3, "<br>", "", None, True),), plain)
    spans = [(0, 3), (4, 7)]
    assert project(marked, spans, Target(["zwei", "eins"], ["", " ", ""], [1, 0])) == "zwei eins<br>"


def test_an_element_of_no_aligned_word_takes_the_free_word_at_its_place() -> None:
    text = "a b c"
    marked = Marked(text, (Element(2, 3, "<i>", "</i>"),), plain)
    spans = [(0, 1), (2, 3), (4, 5)]
    assert project(marked, spans, Target(["x", "y"], ["", " ", ""], [0, 2])) == "x <i>y</i>"


def test_an_element_left_no_free_word_is_kept_empty_where_its_source_was() -> None:
    text = "a b c"
    marked = Marked(text, (Element(2, 3, "<i>", "</i>"), Element(4, 5, "<u>", "</u>")), plain)
    spans = [(0, 1), (2, 3), (4, 5)]
    assert project(marked, spans, Target(["x"], ["", ""], [2])) == "<i></i><u>x</u>"


def test_a_line_of_the_most_elements_that_take_free_words_is_placed_at_once() -> None:
    """Every other word unaligned, each wrapped in its own element: each such element looks among its placed
    siblings for a free word and joins them. Placed by bisecting their kept first words, the line of MAX_ELEMENTS
    takes well under a second (a list of firsts built per look took seconds: quadratic)."""
    import time

    count = MAX_ELEMENTS
    words = [f"w{i}" for i in range(count)]
    spans, at = [], 0
    for word in words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    marked = Marked(" ".join(words), tuple(Element(s, e, "<b>", "</b>") for s, e in spans), plain)
    target = Target(words, ["", *[" "] * (count - 1), ""], [None if t % 2 else t for t in range(count)])
    started = time.perf_counter()
    written = project(marked, spans, target)
    assert time.perf_counter() - started < 2
    assert written == " ".join(f"<b>{word}</b>" for word in words)


def test_markup_nested_too_deep_is_refused() -> None:
    elements = tuple(Element(0, 1, "<b>", "</b>", None if i == 0 else i - 1) for i in range(MAX_DEPTH + 1))
    with pytest.raises(MtxError, match="deep"):
        check_elements(elements, 1)


def test_a_stray_link_far_from_the_rest_is_left_out_of_the_span() -> None:
    text = "a b c d"
    marked = Marked(text, (Element(0, 1, "<b>", "</b>"),), plain)
    spans = [(0, 1), (2, 3), (4, 5), (6, 7)]
    target = Target(["A", "B", "C", "D", "a2"], ["", " ", " ", " ", " ", ""], [0, 1, 2, 3, 0])
    assert project(marked, spans, target) == "<b>A</b> B C D a2"  # the hull would take all five
    near = Target(["A", "B", "a2"], ["", " ", " ", ""], [0, 1, 0])
    assert project(marked, spans, near) == "<b>A B a2</b>"  # two of three aligned inside: worth the one between


def test_a_point_at_the_end_of_a_span_keeps_its_space_outside_the_close() -> None:
    text = "Insert  the name of x"  # **Insert ![icon](i.png) the name** of x
    marked = Marked(text, (Element(0, 16, "**", "**"), Element(7, 7, "![icon](i.png)", "", 0, True)), plain)
    spans = [(0, 6), (8, 11), (12, 16), (17, 19), (20, 21)]
    target = Target(["A", "B", "C", "D"], ["", " ", " ", " ", ""], [1, 2, 0, 3])
    assert project(marked, spans, target) == "**A B C ![icon](i.png)** D"  # not "… ![icon](i.png) **D"
