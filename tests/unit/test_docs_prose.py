"""The guides read with ease: no page of docs/guides/ has a median sentence over 25 words or a paragraph over 120
(issue 61's measure). Prose is what a reader reads as sentences: code blocks, tables, HTML, headings, snippet
includes and generated markers are left out; a list item is a paragraph of its own, an admonition's body too.
`python tests/unit/test_docs_prose.py docs/guides/*.md` prints each page's figures and its longest paragraph."""

from __future__ import annotations

import re
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
MEDIAN_WORDS = 25
PARAGRAPH_WORDS = 120

# A sentence ends at . ! or ? (a closing quote, bracket or emphasis may follow) before a space and what can start
# one; "e.g." and "i.e." do not end one.
SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<=[.!?])[\"')\]*_]*\s+(?=[A-Z`\"'(\[*_0-9])")
LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
LIST_ITEM = re.compile(r"^\s*(?:[-*+]|\d+[.)])\s+")
ADMONITION = re.compile(r"^\s*(?:!!!|\?\?\?\+?)\s*\w+")


def paragraphs(markdown: str) -> list[str]:
    """The page's prose paragraphs, each as one line of text."""
    found: list[str] = []
    current: list[str] = []
    fence = ""

    def close() -> None:
        if current:
            found.append(" ".join(current))
            current.clear()

    for line in markdown.splitlines():
        stripped = line.strip()
        if fence:
            if stripped.startswith(fence):
                fence = ""
            continue
        if stripped.startswith(("```", "~~~")):
            close()
            fence = stripped[:3]
            continue
        if (not stripped or stripped.startswith(("#", "|", "<", "--8<--", "{%")) or ADMONITION.match(line)
                or stripped == "---"):
            close()
            continue
        if LIST_ITEM.match(line):
            close()
            stripped = LIST_ITEM.sub("", line).strip()
        current.append(stripped)
    close()
    return found


def sentences(paragraph: str) -> list[str]:
    return [s for s in SENTENCE_END.split(paragraph) if s.strip()]


def words(text: str) -> int:
    return len(LINK.sub(r"\1", text).split())


def measure(page: Path) -> tuple[float, int, str]:
    """The page's median sentence length, its longest paragraph's length and that paragraph, in words."""
    found = paragraphs(page.read_text(encoding="utf-8"))
    lengths = [words(s) for p in found for s in sentences(p)]
    longest = max(found, key=words, default="")
    return (statistics.median(lengths) if lengths else 0.0), words(longest), longest


def test_the_measure_counts_sentences_and_paragraphs_as_a_reader_does() -> None:
    page = ("# Title\n\nOne two three. Four five, e.g. six; seven! [Eight](x.md) nine?\n\n```bash\nmtx a b c\n```\n\n"
            "| a | b |\n|---|---|\n\n- Item one. Item two\n  goes on.\n- Item three.\n\n!!! note\n    Inside.\n")
    found = paragraphs(page)
    assert found == ["One two three. Four five, e.g. six; seven! [Eight](x.md) nine?", "Item one. Item two goes on.",
                     "Item three.", "Inside."]
    assert [words(s) for s in sentences(found[0])] == [3, 5, 2]
    assert [words(s) for s in sentences(found[1])] == [2, 4]


@pytest.mark.parametrize("page", GUIDES, ids=[p.stem for p in GUIDES])
def test_a_guide_has_short_sentences_and_paragraphs(page: Path) -> None:
    median, longest, paragraph = measure(page)
    assert median <= MEDIAN_WORDS, f"{page.name}: median sentence {median} words (at most {MEDIAN_WORDS})"
    assert longest <= PARAGRAPH_WORDS, f"{page.name}: a paragraph of {longest} words: {paragraph[:200]}..."


if __name__ == "__main__":
    for name in sys.argv[1:] or [str(p) for p in GUIDES]:
        median, longest, paragraph = measure(Path(name))
        print(f"{Path(name).name:28} median {median:5.1f}  longest paragraph {longest:4d}  {paragraph[:90]}")
