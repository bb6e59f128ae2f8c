"""`mtx.documents.html`: an HTML fragment read into its text and its markup, written back exactly as it was when
the elements stay where they were, and hostile markup either refused or read into elements that nest."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtx.documents.html import is_well_formed, problems, read_html, start_tags
from mtx.documents.markup import MAX_DEPTH, MAX_ELEMENTS, Element, Marked
from mtx.errors import MtxError


def reassemble(marked: Marked) -> str:
    """The identity projection: each element written back around the characters it wraps in the source's own
    text, escaped. At each position, the elements that start there, in source order, each after closing what is
    open and is not its parent; then the elements that end there are closed; then the character."""
    elements = marked.elements
    starting: dict[int, list[int]] = {}
    for index, element in enumerate(elements):
        starting.setdefault(element.start, []).append(index)
    out: list[str] = []
    stack: list[int] = []
    for position in range(len(marked.text) + 1):
        for index in starting.get(position, []):
            while stack and stack[-1] != elements[index].parent:
                out.append(elements[stack.pop()].close)
            out.append(elements[index].open)
            if not elements[index].point:
                stack.append(index)
        while stack and elements[stack[-1]].end == position:
            out.append(elements[stack.pop()].close)
        out.append(marked.escape(marked.text[position:position + 1]))
    return "".join(out)


def test_the_text_and_the_elements_of_a_paragraph() -> None:
    marked = read_html("<p>Hello <b>big</b> world</p>")
    assert marked.text == "Hello big world"
    assert marked.elements == (Element(0, 15, "<p>", "</p>"), Element(6, 9, "<b>", "</b>", parent=0))
    assert marked.text[6:9] == "big" and marked.breaks == frozenset()


def test_a_link_keeps_its_tags_byte_for_byte() -> None:
    link = "<A HREF='/x?a=1&amp;b=2'  title=\"a > b\"\n data-x=y >the link</a >"
    marked = read_html(f"See {link}.")
    assert marked.text == "See the link."
    assert marked.elements == (Element(4, 12, link[:link.index(">the") + 1], "</a >"),)
    assert reassemble(marked) == f"See {link}."


def test_offsets_count_across_lines() -> None:
    fragment = "one\r\n<b\n class='x'>two\nlines</b>\n<i>three</i>"
    marked = read_html(fragment)
    assert marked.text == "one\r\ntwo\nlines\nthree"
    assert [marked.text[e.start:e.end] for e in marked.elements] == ["two\nlines", "three"]
    assert marked.elements[0].open == "<b\n class='x'>"
    assert reassemble(marked) == fragment


def test_an_untranslated_element_is_one_point_with_what_it_holds() -> None:
    fragment = 'Buy <span translate="No">Acme <b>Pro</b></span> now, <code>x < y</code>.'
    marked = read_html(fragment)
    assert marked.text == "Buy  now, ."
    assert [(e.start, e.open, e.point) for e in marked.elements] == [
        (4, '<span translate="No">Acme <b>Pro</b></span>', True), (10, "<code>x < y</code>", True)]
    assert reassemble(marked) == fragment


def test_void_elements_comments_and_self_closing_tags_are_points() -> None:
    fragment = "a<br>b<img src=x>c<br/><!-- note --><x-icon name='i' /><!DOCTYPE html>d"
    marked = read_html(fragment)
    assert marked.text == "abcd"
    assert [(e.start, e.end, e.open, e.close, e.point) for e in marked.elements] == [
        (1, 1, "<br>", "", True), (2, 2, "<img src=x>", "", True), (3, 3, "<br/>", "", True),
        (3, 3, "<!-- note -->", "", True), (3, 3, "<x-icon name='i' />", "", True),
        (3, 3, "<!DOCTYPE html>", "", True)]
    assert marked.breaks == {1, 3}


def test_block_edges_are_breaks() -> None:
    marked = read_html("<p>One.</p><p>Two.</p>")
    assert marked.text == "One.Two." and marked.breaks == {4}
    assert read_html("<ul><li>a</li><li>b</li></ul>c<b>d</b>e").breaks == {1, 2}


def test_escape_spells_characters_as_the_source_did() -> None:
    marked = read_html("&copy; 2024&nbsp;Acme &amp; Co &#x263A; &lt;b&gt; &#65")
    assert marked.text == "© 2024\xa0Acme & Co ☺ <b> A"
    assert marked.escape("© x\xa0y & <i> ☺ A") == "&copy; x&nbsp;y &amp; &lt;i&gt; &#x263A; A"
    assert read_html("plain").escape("a < b & c > d ©") == "a &lt; b &amp; c &gt; d ©"


def test_invalid_references_are_text_as_written() -> None:
    marked = read_html("&bogus; &#x110000; &amp b &#z; <b>x</b>")
    assert marked.text == "&bogus; \ufffd & b &#z; x"
    assert marked.elements == (Element(19, 20, "<b>", "</b>"),)
    assert is_well_formed(reassemble(marked))
    unnumbered = read_html("Q&#A <b>x</b>")  # HTMLParser alone reads no further than `&#`
    assert unnumbered.text == "Q&#A x" and unnumbered.elements == (Element(5, 6, "<b>", "</b>"),)


def test_repairs_make_the_elements_nest() -> None:
    assert read_html("<b><i>x</b>y</i>z").elements == (Element(0, 1, "<b>", "</b>"),
                                                        Element(0, 1, "<i>", "</i>", parent=0))
    assert read_html("a</b>c</>d").elements == (Element(2, 2, "</>", "", point=True),)
    assert read_html("<DIV class=x><Em>open").elements == (Element(0, 4, "<DIV class=x>", "</DIV>"),
                                                           Element(0, 4, "<Em>", "</Em>", parent=0))
    code = read_html("<code><b>x</code>y")
    assert code.elements == (Element(0, 0, "<code><b>x</b></code>", "", point=True),)
    stray = read_html("<code>a<</i>/b</code>")  # without `</i>`, `<` and `/b` would make an end tag
    assert stray.elements == (Element(0, 0, "<code>a&lt;/b</code>", "", point=True),)


@pytest.mark.parametrize(("fragment", "text", "points"), [
    ("x<b", "x<b", []),
    ("x <b class='a>b", "x <b class='a>b", []),
    ("x&amp", "x&", []),
    ("x<!-- unterminated", "x", ["<!-- unterminated-->"]),
    ("x<script>if (a < b) {", "x", ["<script>if (a < b) {</script>"]),
    ("<pre>keep <b", "", ["<pre>keep &lt;b</pre>"]),
])
def test_what_the_parser_holds_back_at_the_end_is_kept(fragment: str, text: str, points: list[str]) -> None:
    marked = read_html(fragment)
    assert marked.text == text and [e.open for e in marked.elements if e.point] == points
    assert is_well_formed(reassemble(marked))


def test_nesting_too_deep_is_refused_at_once() -> None:
    began = time.perf_counter()
    with pytest.raises(MtxError, match=f"more than {MAX_DEPTH} deep \\(line 2, column 771\\)"):
        read_html("x\n  " + "<b>" * 10_000 + "x")
    with pytest.raises(MtxError, match="deep"):
        read_html("<code>" + "<i>" * 10_000 + "</code>")
    assert time.perf_counter() - began < 0.5
    assert len(read_html("<b>" * MAX_DEPTH + "x").elements) == MAX_DEPTH


def test_too_many_elements_are_refused() -> None:
    assert len(read_html("<b>x</b> " * MAX_ELEMENTS).elements) == MAX_ELEMENTS
    with pytest.raises(MtxError, match="elements"):
        read_html("<br>" * (MAX_ELEMENTS + 1))


def test_problems_name_what_is_not_well_formed() -> None:
    assert is_well_formed("<p>a<br>b<img src=x/><x/><!-- <b> --><script>'</b>'</script></p>")
    assert problems("<b><i>x</b></i>") == ["</b> at 7: <i> opened at 3 is open", "</i> at 11: nothing is open"]
    assert problems("<b>x") == ["<b> opened at 0 is never closed"]
    assert problems("x</p>") == ["</p> at 1: nothing is open"]
    assert problems("x<b") == ["unfinished markup at 1: '<b'"]
    assert is_well_formed("a &amp b &")


def test_start_tags_are_the_markup_in_source_order() -> None:
    assert start_tags("<p class=x>a<br/>b<!--c--><code>d</code></p>") == [
        "<p class=x>", "<br/>", "<!--c-->", "<code>d</code>"]


HOSTILE = [
    "", "<", "< b", "a < b > c", "<b>", "</b>", "<b><i>", "</i></b>x", "<b><i>x</b></i>", "<p><b>x</p>y</b>",
    '<a title="x > y" href=\'>\'>t</a>', "<a title='unterminated>t</a>", "<!-- c --> <!-- unterminated",
    "<!---->", "<!--->", "<!-- a --!> b", "<script>var s = '</b>' + '<i>';</script>", "<script><b>unclosed",
    "<style>b > i {}</style", "&amp;&lt;&copy;&bogus;&#x110000;&#0;&#xD800;&", "&#", "&#x;", "&#z;<b>x</b>",
    "<p dir=rtl>שלום <b>עולם</b> \u202bمرحبا\u202c</p>", "\x00\x01<b>\x7f</b>\ufeff", "<b></b><i></i>",
    "<![CDATA[ a < b ]]>", "<![foo[ x ]]>", "<![ x", "<?php echo 1 ?>", "<!DOCTYPE html", "</>", "</ b>", "</3>",
    "<pre><script>x", "<code><!-- c", "<span translate=no><b>x</i></span>", "<br></br><img></img>",
    "<code><</pre>/b>&</i>amp;</code>", "<textarea>a <b> &amp; <title>x",
    "<b/><i />x", "<b =>x</b>", "<b a='1' a='2'>x</b>", "<" * 50, "</" * 50, "<b>" * 300,
    "<b>x</b>" * 10_000, "<p>" + "<i>x</i>" * 3000,
]


@pytest.mark.parametrize("fragment", HOSTILE, ids=range(len(HOSTILE)))
def test_hostile_markup_is_refused_or_read_into_elements_that_nest(fragment: str) -> None:
    try:
        marked = read_html(fragment)
    except MtxError:
        return
    out = reassemble(marked)
    assert is_well_formed(out), problems(out)
    assert Counter(start_tags(out)) == Counter(e.open for e in marked.elements)


NAMES = ["b", "i", "span", "a", "EM", "Strong", "p", "div"]
ATTRIBUTES = [' class="x"', " title='a > b'", ' data-q=\'say "hi"\'', ' href="/x?a=1&amp;b=2"', " hidden",
              " id=plain", '\n  lang="en"', " "]
LEAVES = ["<br>", "<br/>", "<br />", '<img src="a.png" alt="x > y">', "<hr>", "<wbr>", '<input value="1"/>', "<b/>",
          "<!-- note -->", "<!---->", "<!-- a > b -->", "&amp;", "&lt;", "&gt;", "&copy;", "&nbsp;", "&#x263A;",
          "<code>x <b>y</b></code>", '<span translate="no">Brand <i>X</i></span>',
          "<script>if (a < b) { x = '</b>'; }</script>", "<style>p > b { color: red }</style>", "<pre>\n  l\n</pre>"]
TEXT = st.text(alphabet="abz 12.,\n\t'\"éשׁ\u202b\u202c", min_size=1, max_size=8)


@st.composite
def elements(draw: st.DrawFn, children: st.SearchStrategy[str]) -> str:
    name = draw(st.sampled_from(NAMES))
    attributes = "".join(draw(st.lists(st.sampled_from(ATTRIBUTES), max_size=3)))
    end_name = draw(st.sampled_from([name, name.lower(), name.upper()]))
    return f"<{name}{attributes}>{''.join(draw(st.lists(children, max_size=3)))}</{end_name}>"


NODES = st.recursive(TEXT | st.sampled_from(LEAVES), lambda children: elements(children), max_leaves=8)
FRAGMENTS = st.builds(lambda doctype, nodes: doctype + "".join(nodes), st.sampled_from(["", "<!DOCTYPE html>"]),
                      st.lists(NODES, max_size=4))


@settings(max_examples=200, derandomize=True)
@given(FRAGMENTS)
def test_a_well_formed_fragment_is_written_back_as_it_was(fragment: str) -> None:
    assert is_well_formed(fragment), problems(fragment)
    marked = read_html(fragment)
    assert reassemble(marked) == fragment
    assert all(0 < edge < len(marked.text) for edge in marked.breaks)


PIECES = list("<>/!-&#;=\"' abp\n[]?") + ["<b>", "</b>", "<i ", "</i>", "&amp;", "&copy", "<script>", "</script>",
                                          "<!--", "-->", "<br>", "<pre>", "</pre>", "<![", "\u202b", "ש", "\x00"]


@settings(max_examples=200, derandomize=True)
@given(st.lists(st.sampled_from(PIECES), max_size=30).map("".join))
def test_any_string_is_read_into_elements_that_nest(fragment: str) -> None:
    test_hostile_markup_is_refused_or_read_into_elements_that_nest(fragment)
