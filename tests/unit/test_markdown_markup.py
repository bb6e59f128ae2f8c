"""Markdown read into `Marked` (mtx.documents.markdown): the text to translate, the markup as written around it,
and the checks that writing it back keeps the markup.

`reassemble` is the identity projection: every element written back at its own place around the escaped text.
Read and reassembled, a fragment must render to the same markup (`same_structure`); and it is the fragment itself,
byte for byte, unless its text holds characters that `escape` writes otherwise than the source did: literal
markup characters the source left unescaped (an unpaired `*`, a `[` that opens no link, `|`, which is always
written `&#124;`), an escape or a reference the source did not need (`\\a`), and CRLF line endings (read as LF).
"""

from __future__ import annotations

import pickle
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtx.documents.markdown import read_markdown, same_structure, structure
from mtx.documents.markup import MAX_DEPTH, MAX_ELEMENTS, Element, Marked, check_elements
from mtx.errors import MtxError

# Characters of the text that `escape` may write otherwise than the source did (see the module's docstring).
RESPELLED = set("\\`*_[]~<>&|!#")


def escaped(marked: Marked, text: str) -> str:
    """`text` written as `project` writes it: each word through `escape`, the whitespace between as it is."""
    return "".join(part if part.isspace() else marked.escape(part) for part in re.split(r"(\s+)", text) if part)


def reassemble(marked: Marked) -> str:
    """Each element at its own place: text before it (escaped), its open, its children over its span, its close.
    (Per position, that is: closes of the spans ending there, innermost first, then opens and points in source
    order; written as a walk of the tree so that an empty span's open comes before its close.)"""
    children: dict[int | None, list[int]] = {}
    for i, element in enumerate(marked.elements):
        children.setdefault(element.parent, []).append(i)
    out: list[str] = []

    def write(parent: int | None, start: int, end: int) -> None:
        for i in children.get(parent, []):
            element = marked.elements[i]
            out.append(escaped(marked, marked.text[start:element.start]) + element.open)
            write(i, element.start, element.end)
            out.append(element.close)
            start = element.end
        out.append(escaped(marked, marked.text[start:end]))

    write(None, 0, len(marked.text))
    return "".join(out)


def span(start: int, end: int, open_: str, close: str, parent: int | None = None) -> Element:
    return Element(start, end, open_, close, parent)


def point(at: int, raw: str, parent: int | None = None) -> Element:
    return Element(at, at, raw, "", parent, point=True)


# -- what is text, what is markup -----------------------------------------------------------------------------------


def test_strong_is_a_span_over_its_words() -> None:
    marked = read_markdown("Hello **big** world")
    assert marked.text == "Hello big world"
    assert marked.elements == (span(6, 9, "**", "**"),)
    assert marked.breaks == frozenset()
    assert reassemble(marked) == "Hello **big** world"
    assert pickle.loads(pickle.dumps(marked)) == marked == read_markdown("Hello **big** world")  # plain data


def test_nested_emphasis_and_strikethrough_keep_their_delimiters() -> None:
    marked = read_markdown("***x*** and ~~gone~~ _it_")
    assert marked.text == "x and gone it"
    assert marked.elements == (span(0, 1, "*", "*"), span(0, 1, "**", "**", 0), span(6, 10, "~~", "~~"),
                               span(11, 13, "_", "_"))


def test_a_links_destination_and_title_are_kept_as_written() -> None:
    source = ('See [Zürich](https://de.wikipedia.org/wiki/Z%C3%BCrich "Die Stadt ü") and '
              "[the *notes*](<über uns/a%20b.md> 'T').")
    marked = read_markdown(source)
    assert marked.text == "See Zürich and the notes."
    assert marked.elements == (span(4, 10, "[", '](https://de.wikipedia.org/wiki/Z%C3%BCrich "Die Stadt ü")'),
                               span(15, 24, "[", "](<über uns/a%20b.md> 'T')"), span(19, 24, "*", "*", 1))
    assert reassemble(marked) == source


def test_reference_links_close_with_their_label_and_the_definition_is_a_point() -> None:
    source = "[Text][ref] and [ref].\n\n[ref]: https://example.org 'Title'"
    marked = read_markdown(source)
    assert marked.text == "Text and ref."
    assert marked.elements == (span(0, 4, "[", "][ref]"), span(9, 12, "[", "]"),
                               point(13, "\n\n[ref]: https://example.org 'Title'"))
    assert reassemble(marked) == source


def test_code_spans_images_autolinks_and_html_are_points() -> None:
    source = "Run `pip install *x*` or see ![the logo](logo.png) at <https://example.org/ü>, <b>now</b>."
    marked = read_markdown(source)
    assert marked.text == "Run  or see  at , now."
    assert marked.elements == (point(4, "`pip install *x*`"), point(12, "![the logo](logo.png)"),
                               point(16, "<https://example.org/ü>"), point(18, "<b>"), point(21, "</b>"))
    assert reassemble(marked) == source


def test_block_prefixes_are_points_at_the_start_of_their_line() -> None:
    assert read_markdown("# Title").elements == (point(0, "# "),)
    assert read_markdown("# Title").text == "Title"
    marked = read_markdown("- one\n- two\n  > 1. three")
    assert marked.text == "onetwothree"
    assert marked.elements == (point(0, "- "), point(3, "\n- "), point(6, "\n  > 1. "))
    assert marked.breaks == {3, 6}


def test_a_fenced_code_block_is_one_verbatim_point_and_none_of_its_text() -> None:
    source = "Intro:\n\n```python\nx = *1*  # a *comment*\n```\n\nOutro."
    marked = read_markdown(source)
    assert marked.text == "Intro:Outro."
    assert marked.elements == (point(6, "\n\n```python\nx = *1*  # a *comment*\n```\n\n"),)
    assert marked.breaks == {6}
    assert reassemble(marked) == source


def test_paragraphs_are_broken_apart_without_a_space_in_the_text() -> None:
    marked = read_markdown("One.\n\nTwo.")
    assert (marked.text, marked.elements, marked.breaks) == ("One.Two.", (point(4, "\n\n"),), {4})


def test_a_soft_break_is_text_and_a_hard_break_a_point_that_breaks() -> None:
    assert read_markdown("roses are\nred").text == "roses are\nred"
    marked = read_markdown("> roses are\n> red  \n> violets\\\nblue")
    assert marked.text == "roses are redvioletsblue"  # the newline went with the next line's `>`, its space stayed
    assert marked.elements == (point(0, "> "), point(9, "\n>"), point(13, "  \n"), point(13, "> "),
                               point(20, "\\\n"))
    assert marked.breaks == {13, 20}
    assert reassemble(marked) == "> roses are\n> red  \n> violets\\\nblue"


def test_escapes_and_references_are_decoded_and_written_back_as_the_source_did() -> None:
    source = "\\*not emphasis\\* &copy; 2024 &amp; AT&amp;T"
    marked = read_markdown(source)
    assert marked.text == "*not emphasis* © 2024 & AT&T"
    assert marked.elements == ()
    assert marked.escape(marked.text) == source
    assert marked.escape("© & ©") == "&copy; &amp; &copy;"
    assert read_markdown("AT&T").escape("AT&T") == "AT&T"


def test_table_cells_are_blocks_and_a_pipe_in_one_is_written_as_a_reference() -> None:
    source = "| a | b\\|c |\n|---|:-:|\n| 1 | **2** |"
    marked = read_markdown(source)
    assert marked.text == "ab|c12"
    assert marked.breaks == {1, 4, 5}
    assert reassemble(marked) == "| a | b&#124;c |\n|---|:-:|\n| 1 | **2** |"
    assert same_structure(source, reassemble(marked))


def test_line_endings_are_read_as_commonmark_reads_them() -> None:
    marked = read_markdown("a\r\nb\0")
    assert marked.text == "a\nb\ufffd"


@pytest.mark.parametrize(("text", "written"), [
    ("Hello, world. 3.5 - x # y! a < b, AT&T, snake_case, C:\\Users", None),
    ("a*b", "a\\*b"), ("a * b", None), ("_x_", "\\_x\\_"), ("`x`", "\\`x\\`"), ("[x]", "\\[x\\]"), ("~", "\\~"),
    ("<b>", "\\<b>"), ("&amp;", "\\&amp;"), ("a\\*", "a\\\\\\*"), ("|", "&#124;"),
    ("1. x", "1\\. x"), ("# x", "\\# x"), ("a\n- b", "a\n\\- b"), ("> q", "\\> q"), ("a\n---", "a\n\\---"),
    ("a\n   2) b", "a\n   2\\) b"), ("a\n===", "a\n\\==="),
])
def test_escape_is_minimal_but_keeps_text_from_becoming_markup(text: str, written: str | None) -> None:
    escape = read_markdown("").escape
    assert escape(text) == (written or text)
    marked = read_markdown(escape(text))
    assert (marked.text, marked.elements) == (text, ())


def test_escape_leaves_a_lone_word_that_could_start_a_block_unless_the_source_escaped_one() -> None:
    """`project` escapes word by word, and a word does not know whether it starts a line: `1990.` ends many more
    sentences than it starts blocks."""
    words = ["1990.", "-", "#", "+", "---", "Wow!", "C:\\"]
    plain = read_markdown("Plain text.").escape
    assert [plain(word) for word in words] == words
    careful = read_markdown("1\\. \\- \\# \\+ Wow\\! C:\\\\").escape
    assert [careful(word) for word in words] == ["1990\\.", "\\-", "\\#", "\\+", "\\---", "Wow\\!", "C:\\\\"]
    assert plain(">") == "\\>"  # a quote needs no space after it


def test_structure_is_the_markup_without_the_text() -> None:
    assert same_structure("Hello **big** [world](x)", "Hallo **große** [Welt](x)")
    assert not same_structure("Hello **big** [world](x)", "Hallo **große** [Welt](y)")
    assert not same_structure("Hello **big** world", "Hallo *große* Welt")
    assert not same_structure("`a`", "`b`")
    assert same_structure("one\ntwo", "eins zwei")
    assert "hardbreak br" in structure("a  \nb")


# -- limits and hostile input -------------------------------------------------------------------------------------


def test_markup_too_deep_or_too_large_is_refused_clearly() -> None:
    with pytest.raises(MtxError, match=f"{MAX_DEPTH + 1} deep"):
        read_markdown("*" * (2 * MAX_DEPTH + 2) + "x" + "*" * (2 * MAX_DEPTH + 2))
    with pytest.raises(MtxError, match="at most 10,000"):
        read_markdown("`a` " * (MAX_ELEMENTS + 1))


HOSTILE = [
    "", "**", "****", "**unclosed", "[no close", "[a](", "![", "`odd ``", "<", "&", "\\", "*_*_*_", "***a**b*",
    "[" * 10_000 + "a" + "]" * 10_000, "*" * 10_000, "*" * 5_000 + "a", "_a" * 2_000, "[a](" * 1_000, "![" * 1_000,
    "`a" * 2_000, ">" * 10_000 + " deep", "- " * 5_000 + "x", "~~" * 5_000 + "x",
    "<div>\n*x*\n</div>\n\n<span>*y*</span>", "<!-- *a* -->**b**<?php x ?>",
    "&#0; &#x110000; &#99999999; &copy &amp;copy; &NotEqualTilde; &#x1F600; &bogus;",
    "\u202eabc\u202c **\u05e9\u05dc\u05d5\u05dd** \u200f[\u0645\u0631\u062d\u0628\u0627](x) \u2067x\u2069",
    "".join(chr(i) for i in range(32)) + "*a*\x7f\x85\u2028", "a  \n" * 2_000, "\t- a\n\t\t- b  \n\t\t\tc",
]


@pytest.mark.parametrize("fragment", HOSTILE, ids=lambda fragment: repr(fragment[:20]))
def test_hostile_input_is_read_or_refused_quickly_and_never_breaks(fragment: str) -> None:
    started = time.perf_counter()
    read_or_refused(fragment)
    assert time.perf_counter() - started < 3  # linear: the slowest here takes well under a second


def read_or_refused(fragment: str) -> None:
    """`fragment` is refused with a message (MtxError), or read into elements that nest inside its text and
    reassemble to its structure."""
    try:
        marked = read_markdown(fragment)
    except MtxError:
        return
    check_elements(marked.elements, len(marked.text))
    assert same_structure(fragment, reassemble(marked))


# -- properties ---------------------------------------------------------------------------------------------------

WORDS = st.text(alphabet="abcxyzéüßñ世界", min_size=1, max_size=6)
LEAVES = st.one_of(
    WORDS, WORDS, WORDS,
    st.sampled_from(["`code`", "`` a ` b ``", "`x *y*`", "![alt text](pic.png)", '![ü](<a b.png> "t")',
                     "<https://example.org/ü>", "<b>", "</b>", "<br>", '<span class="x">']),
)
DESTINATIONS = st.sampled_from(["https://example.org/a", "/päth/ü", "a%20b", "<with space ü>", "http://x.y/(a)",
                                "../q?x=1&y=2", ""])
TITLES = st.sampled_from(["", ' "Title"', " 'single ü'", " (paren)"])


def nested(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        inner.map(lambda s: f"*{s}*"), inner.map(lambda s: f"**{s}**"), inner.map(lambda s: f"_{s}_"),
        inner.map(lambda s: f"__{s}__"), inner.map(lambda s: f"***{s}***"), inner.map(lambda s: f"~~{s}~~"),
        st.tuples(inner, DESTINATIONS, TITLES).map(lambda t: f"[{t[0]}]({t[1]}{t[2]})"),
        st.lists(inner, min_size=2, max_size=3).map(" ".join),
    )


PHRASES = st.recursive(LEAVES, nested, max_leaves=8)
BLOCKS = st.tuples(st.sampled_from(["", "# ", "## ", "- ", "* ", "1. ", "> ", "> - ", "  "]), PHRASES).map("".join)
FRAGMENTS = st.tuples(st.lists(BLOCKS, min_size=1, max_size=3), st.sampled_from(["\n", "\n\n", "  \n", "\n\n> "])) \
    .map(lambda t: t[1].join(t[0]))


@settings(max_examples=200, derandomize=True, deadline=None)
@given(FRAGMENTS)
def test_generated_markdown_reassembles_to_itself(fragment: str) -> None:
    marked = read_markdown(fragment)
    assert same_structure(fragment, reassemble(marked))
    if not RESPELLED & set(marked.text):
        assert reassemble(marked) == fragment


@settings(max_examples=200, derandomize=True, deadline=None)
@given(st.text(alphabet="ab *_`[]()<>!~\\&#;-\n|:\"'.1é\t=+", max_size=60))
def test_any_markdown_ish_text_keeps_its_structure(fragment: str) -> None:
    read_or_refused(fragment)
