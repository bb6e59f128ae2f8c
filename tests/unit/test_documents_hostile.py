"""Hostile markup through the whole document path (read, translate, write back), with a translation that reverses
every sentence: a clear refusal or a well-formed output with every tag exactly once, never a traceback."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtx.decode.translation import Translation
from mtx.documents.document import read_document, write_document
from mtx.documents.html import is_well_formed, read_html, start_tags
from mtx.documents.markdown import structure
from mtx.errors import MtxError

HOSTILE_HTML = [
    "<b>unclosed <i>tags", "stray </b> end </i> tags", "<b><i>crossed</b></i> tags",
    '<a title="x > y" href="/a?b=1&amp;c=2">attributes with a ></a> here', "one <!-- a comment --> two",
    "<!-- unterminated comment", "<script>if (a < b) { x('</b>'); }</script> after", "<style>b { x: 1 }</style> y",
    "&amp; &lt;b&gt; &copy; &bogus; &#x110000; &#65; text", "שלום <b>עולם</b> \u202bmixed\u202c text",
    "<p>One.</p><p>Two <br> three.</p>", "<", "a < b and c > d", "<b", "", "<b></b>", "<br/><hr/><img src=x>",
    "<![CDATA[ a > b ]]> after", "<p translate=\"no\">keep <b>this</b></p> translate this", "x\x00y \x1b z",
    "<b>" * 200 + "deep" + "</b>" * 200, "<i>a</i>" * 2000,
]
HOSTILE_MARKDOWN = [
    "**unclosed strong", "[no end", "`unbalanced backticks", "*" * 1000, "[" * 1000 + "x", "<b>html</b> in *md*",
    "&copy; &bogus; text", "שלום **עולם** \u202bmixed\u202c", "# Title **strong**\n\n- item [link](x \"t\")",
    "```\ncode **not** markup\n```\nafter", "", "\\*escaped\\*", "![img](x) and ![](y)",
]


def reversed_translation(source: str) -> Translation:
    """A sentence's words in reverse order, each aligned to its source word."""
    words = source.split()
    return Translation(" ".join(reversed(words)), 0.0, alignment=[(len(words) - 1 - t, t) for t in range(len(words))])


def through(line: str, markup: str) -> str:
    document = read_document(line, markup, split=True, language="en")
    return write_document(document, [reversed_translation(source) for source in document.sources()])


@pytest.mark.parametrize("line", HOSTILE_HTML)
def test_hostile_html_is_well_formed_with_every_tag_once(line: str) -> None:
    output = through(line, "html")
    assert is_well_formed(output), output
    assert sorted(start_tags(output)) == sorted(start_tags(line)), output


@pytest.mark.parametrize("line", HOSTILE_MARKDOWN)
def test_hostile_markdown_keeps_its_markup(line: str) -> None:
    output = through(line, "markdown")
    assert sorted(structure(output)) == sorted(structure(line)), output


@pytest.mark.parametrize("line", ["<b>" * 10_000 + "x" + "</b>" * 10_000, "*" * 5000 + "x" + "*" * 5000])
def test_markup_nested_ten_thousand_deep_is_refused_clearly(line: str) -> None:
    markup = "html" if line.startswith("<") else "markdown"
    with pytest.raises(MtxError, match="deep|levels"):
        read_document(line, markup, split=False, language="en")


@given(st.lists(st.sampled_from(["word", "two", "<b>", "</b>", "<i>", "</i>", "<br>", "<!--c-->", "&amp;", " ",
                                 ". ", "<a href='x>y'>", "</a>", "<code>", "</code>", "<"]), max_size=30))
def test_any_mix_of_tags_and_text_comes_back_well_formed(pieces: list[str]) -> None:
    line = "".join(pieces)
    output = through(line, "html")
    assert is_well_formed(output), output
    assert sorted(start_tags(output)) == sorted(start_tags(line)), output
    letters = [sorted("".join(read_html(text).text.split())) for text in (output, line)]
    assert letters[0] == letters[1], output  # every word is back, in its sentence's reversed order
