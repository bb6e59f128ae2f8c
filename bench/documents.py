"""Documents on the real-data corpus: paragraphs translated whole or cut into sentences, and markup carried over.

    .venv/bin/python bench/documents.py paragraphs -m runs/quality/en-de/defaults-seed1/checkpoints/last.pt \
        --lenpen 2.2 --data runs/real_corpus/en-de
    .venv/bin/python bench/documents.py tag --data runs/real_corpus/en-de \
        --tagged bench/results/documents-tagged-en-de.jsonl
    .venv/bin/python bench/documents.py markup -m runs/quality/en-de/defaults-seed1/checkpoints/last.pt \
        --lenpen 2.2 --data runs/real_corpus/en-de --tagged bench/results/documents-tagged-en-de.jsonl

`paragraphs` translates three sets whole (one string to the model, as `mtx translate` does without
--split-sentences) and cut into sentences (`--split-sentences`, by sentencex and, for comparison, by pysbd), and
scores each against its references: the test split's lines (sentencex cuts 296 of en-de's 2,000, help texts of
several sentences), the lines of it that sentencex cuts, and paragraphs of 2 to 5 consecutive test lines joined
by a space (their references joined alike). It also counts, on the joined paragraphs, how many of the joins
each segmenter finds (the joins are sentence ends by construction) and how many cuts it makes inside a line.
Every distinct string is translated once, and each way is assembled from those translations
(mtx.documents.document.write_document).

`tag` tags 500 test sentences: an HTML element around a span of 1 to 3 source words whose reference words an
eflomal alignment of the test set, trained with the corpus' training pairs, finds as a consistent phrase; a
second element in one sentence of four and an image in one of five. eflomal samples with no seed to set, so the
tagged sentences are kept in bench/results, and `markup` reads them: it translates them with --markup html (and
the same spans as Markdown), and reports: outputs well-formed with every tag exactly once (must be all), the
BLEU of the outputs with their tags stripped against that of the untagged sentences, and the tag placement: on
the reference itself (the model's alignment of the reference, forced as a target prefix) the exact match,
precision and recall of the tagged words against the eflomal span; on the free translations, the bag-of-words
precision and recall of the tagged words against the reference span's words. One JSON line per measure on
stdout.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from common import emit, emit_skip
from sacrebleu.metrics import BLEU, CHRF

from mtx.decode.engine import Engine, cpu_instructions
from mtx.decode.engines import open_engine
from mtx.decode.facts import ModelFacts
from mtx.decode.request import Request
from mtx.documents.document import Document, write_document
from mtx.documents.sentences import sentence_spans

LONG = 25  # words: issue 36's long sources, which ran to 0.57 of the reference length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["paragraphs", "tag", "markup", "place"])
    parser.add_argument("-m", "--model", type=Path, help="the checkpoint (paragraphs, markup)")
    parser.add_argument("--data", type=Path, help="the corpus folder: test.SRC, test.TGT, train.* (not for place)")
    parser.add_argument("--src", default="en", help="tag: the source language")
    parser.add_argument("--tagged", type=Path, help="tag: where to write the tagged sentences; markup: them")
    parser.add_argument("--lenpen", type=float, help="α [default: the checkpoint's]")
    parser.add_argument("--engine", default="torch", choices=["torch", "ct2"])
    parser.add_argument("--sentences", type=int, default=500, help="tag: how many")
    parser.add_argument("--threads", type=int, default=2, help="the engine's CPU threads")
    parser.add_argument("--elements", type=int, default=8000, help="place: the elements of the line")
    parser.add_argument("--repeats", type=int, default=3, help="place: timed runs")
    args = parser.parse_args()
    if args.what == "place":
        placement(args.elements, args.repeats)
        return
    if args.data is None:
        parser.error(f"{args.what} needs --data")
    if args.what == "tag":
        tgt = target_language(args.data, args.src)
        sources, refs = (read_lines(args.data / f"test.{lang}") for lang in (args.src, tgt))
        tagged = tag_sentences(sources, refs, eflomal_links(args.data, args.src, tgt, sources, refs), args.sentences)
        args.tagged.write_text("".join(json.dumps(dataclasses.asdict(t), ensure_ascii=False) + "\n"
                                       for t in tagged), encoding="utf-8")
        return
    facts = ModelFacts.read([args.model])
    options = {"engine": args.engine, **({} if args.lenpen is None else {"lenpen": args.lenpen})}
    request = Request.of(facts, options)
    engine = open_engine(args.engine, [args.model], device="cpu", dtype="fp32", threads=args.threads,
                         batch_tokens=4096, log=lambda _: None)
    src, tgt = facts.source_language, target_language(args.data, facts.source_language)
    sources, refs = (read_lines(args.data / f"test.{lang}") for lang in (src, tgt))
    common = {"model": str(args.model), "pair": f"{src}-{tgt}", "engine": args.engine, "lenpen": request.lenpen,
              "cpu": cpu_instructions()}
    try:
        if args.what == "paragraphs":
            measure = paragraphs(engine, facts, request, sources, refs, src)
        else:
            tagged = [Tagged(**json.loads(line)) for line in read_lines(args.tagged)]
            measure = markup(engine, facts, request, refs, tagged)
        for record in measure:
            print(json.dumps({"name": f"documents.{args.what}", **common, **record}), flush=True)
    finally:
        engine.close()


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def target_language(data: Path, source: str) -> str:
    """The corpus' other language: the suffix of its test file that is not the source's."""
    (found,) = [p.suffix[1:] for p in data.glob("test.*") if p.suffix[1:] != source]
    return found


Segmenter = Callable[[str], list[tuple[int, int]]]


def segmenters(language: str) -> dict[str, Segmenter]:
    """How a line is cut: whole (one sentence), by sentencex (mtx's), by pysbd (its spans, stripped) where pysbd,
    the peer it is compared with and no dependency of mtx, is installed (`pip install pysbd`)."""
    cut: dict[str, Segmenter] = {"whole": lambda line: sentence_spans(line, language, split=False),
                                 "sentencex": lambda line: sentence_spans(line, language)}
    try:
        import pysbd
    except ImportError:
        emit_skip("documents.paragraphs.pysbd", "pysbd is not installed: pip install pysbd")
        return cut

    splitter = pysbd.Segmenter(language=language if language in pysbd.languages.LANGUAGE_CODES else "en",
                               clean=False, char_span=True)

    def by_pysbd(line: str) -> list[tuple[int, int]]:
        spans = []
        for span in splitter.segment(line):
            stripped = span.sent.strip()
            if stripped:
                start = span.start + span.sent.index(stripped)
                spans.append((start, start + len(stripped)))
        return spans

    return {**cut, "pysbd": by_pysbd}


def paragraphs(engine: Engine, facts: ModelFacts, request: Request, sources: list[str], refs: list[str],
               language: str) -> list[dict]:
    """The records of `paragraphs` (see the module's docstring)."""
    rng = random.Random(0)
    joined_sources, joined_refs, joins, at = [], [], [], 0
    while at < len(sources):
        size = rng.randint(2, 5)
        joined_sources.append(" ".join(sources[at: at + size]))
        joined_refs.append(" ".join(refs[at: at + size]))
        joins.append({len(" ".join(sources[at: at + k])) + 1 for k in range(1, min(size, len(sources) - at))})
        at += size
    cut = segmenters(language)
    timed: dict[str, float] = {}
    documents: dict[str, dict[str, list[Document]]] = {}
    for name, segment in cut.items():
        started = time.perf_counter()
        documents[name] = {"test": [Document(line, segment(line)) for line in sources],
                           "joined": [Document(line, segment(line)) for line in joined_sources]}
        timed[name] = time.perf_counter() - started
    every = sorted({s for sets in documents.values() for docs in sets.values() for d in docs for s in d.sources()})
    started = time.perf_counter()
    translated = dict(zip(every, translate(engine, facts, request, every), strict=True))
    seconds = time.perf_counter() - started
    several = [i for i, d in enumerate(documents["sentencex"]["test"]) if len(d.sentences) > 1]
    long = [i for i, line in enumerate(sources) if len(line.split()) > LONG]
    records = [{"set": "timing", "strings": len(every), "translate_seconds": round(seconds, 1),
                **{f"{name}_seconds": round(t, 3) for name, t in timed.items()}}]
    for set_name, lines, references in (("test", None, refs), ("test, lines sentencex cuts", several, refs),
                                        (f"test, sources over {LONG} words", long, refs),
                                        ("joined paragraphs of 2-5 lines", None, joined_refs)):
        key = "joined" if set_name.startswith("joined") else "test"
        for name in cut:
            outs = [write_document(d, [translated.get(s) for s in d.sources()]) for d in documents[name][key]]
            chosen = range(len(outs)) if lines is None else lines
            if not chosen:  # a small set may have no line that is cut or long: no score, rather than sacrebleu's error
                records.append({"set": set_name, "lines": 0, "way": name})
                continue
            hyps, ref = [outs[i] for i in chosen], [references[i] for i in chosen]
            bleu = BLEU().corpus_score(hyps, [ref])
            records.append({"set": set_name, "lines": len(hyps), "way": name, "bleu": round(bleu.score, 2),
                            "chrf": round(CHRF().corpus_score(hyps, [ref]).score, 2),
                            "ratio": round(bleu.sys_len / bleu.ref_len, 3)})
    for name in sorted(cut.keys() - {"whole"}):
        cuts = [{start for start, _ in d.sentences[1:]} for d in documents[name]["joined"]]
        found = sum(len(c & j) for c, j in zip(cuts, joins, strict=True))
        records.append({"set": "joins found", "way": name, "joins": sum(map(len, joins)), "found": found,
                        "cuts_inside_lines": sum(len(c - j) for c, j in zip(cuts, joins, strict=True))})
    return records


def placement(count: int, repeats: int) -> None:
    """`place`: a line of `count` elements, each around one word, read (`read_html`) and placed (`project`) on a
    translation whose every other word is aligned to none, so that each of those elements looks among its placed
    siblings for a free word: how placing scales with the elements of a line (at most MAX_ELEMENTS)."""
    from mtx.documents.html import read_html
    from mtx.documents.markup import Target, project

    words = [f"w{i}" for i in range(count)]
    line = " ".join(f"<b>{word}</b>" for word in words)
    spans, at = [], 0
    for word in words:
        spans.append((at, at + len(word)))
        at += len(word) + 1
    target = Target(words, ["", *[" "] * (count - 1), ""], [None if t % 2 else t for t in range(count)])
    read, placed = [], []
    for _ in range(repeats):
        started = time.perf_counter()
        marked = read_html(line)
        read.append(time.perf_counter() - started)
        started = time.perf_counter()
        project(marked, spans, target)
        placed.append(time.perf_counter() - started)
    config = {"elements": count, "cpu": cpu_instructions()}
    emit("documents.place.read", config, read, "s")
    emit("documents.place.project", config, placed, "s")


TAGS = ['<b>', '<a href="https://example.org/?a=1&amp;b=2" title="x > y">', '<em class="term">']
VOID = '<img src="icon.png" alt="">'


def markup(engine: Engine, facts: ModelFacts, request: Request, refs: list[str], tagged: list[Tagged]
           ) -> list[dict]:
    """The records of `markup` (see the module's docstring)."""
    from mtx.documents.document import engine_request, read_documents, translate_documents
    from mtx.documents.html import is_well_formed, read_html, start_tags
    from mtx.documents.markdown import same_structure, structure

    records = []
    html_request = dataclasses.replace(request, markup="html")
    lines = [t.html for t in tagged]
    started = time.perf_counter()
    outputs = [d.text for d in translate_documents(engine, facts, read_documents(lines, html_request, facts),
                                                   html_request, range(len(lines)))]
    seconds = time.perf_counter() - started
    plain = translate(engine, facts, request, [t.plain for t in tagged])
    refs_of = [[refs[t.line] for t in tagged]]
    exact = [is_well_formed(out) and sorted(start_tags(out)) == sorted(start_tags(line))
             for out, line in zip(outputs, lines, strict=True)]
    stripped = [read_html(out).text for out in outputs]
    records.append({"set": "html", "sentences": len(lines), "elements": sum(len(t.gold) for t in tagged),
                    "well_formed_every_tag_once": sum(exact), "seconds": round(seconds, 1),
                    "bleu_tagged": round(BLEU().corpus_score(stripped, refs_of).score, 2),
                    "bleu_untagged": round(BLEU().corpus_score([o.text if o else "" for o in plain], refs_of).score,
                                           2),
                    **placement_on_translations(outputs, tagged, refs)})
    md_request = dataclasses.replace(request, markup="markdown")
    md_lines = [t.markdown for t in tagged]
    md_outputs = [d.text for d in translate_documents(engine, facts, read_documents(md_lines, md_request, facts),
                                                      md_request, range(len(md_lines)))]
    pairs = list(zip(md_lines, md_outputs, strict=True))
    records.append({"set": "markdown", "sentences": len(md_lines),
                    "every_markup_once": sum(sorted(structure(line)) == sorted(structure(out)) for line, out in pairs),
                    "in_source_order": sum(same_structure(line, out) for line, out in pairs)})
    forced = dataclasses.replace(engine_request(html_request), beam=1)
    records.append({"set": "html, projected onto the reference", **placement_on_references(
        engine, facts, forced, tagged, refs)})
    return records


@dataclasses.dataclass(frozen=True)
class Tagged:
    """A test sentence (`line`: its index) with elements around spans of its words: as HTML and Markdown, and
    without markup; `gold`: each element's opening tag and the reference words [first, end) of its span (from the
    eflomal alignment)."""

    line: int
    html: str
    markdown: str
    plain: str
    gold: list[tuple[str, tuple[int, int]]]


def tagged_sentence(line: int, words: list[str], spans: list[tuple[int, int]], gold: list[tuple[int, int]],
                    void_after: int | None) -> Tagged:
    """The sentence's words with `spans` (in source order) wrapped: the k-th in TAGS[k] as HTML, in `**` (even k)
    or a link (odd k) as Markdown; an image after word `void_after`."""
    import html

    opens = {start: k for k, (start, _) in enumerate(spans)}
    closes = {end: k for k, (_, end) in enumerate(spans)}
    html_words, md_words = [], []
    for i, word in enumerate(words):
        escaped, md = html.escape(word, quote=False), markdown_escape(word)
        if i in opens:
            escaped, md = TAGS[opens[i]] + escaped, ("**" if opens[i] % 2 == 0 else "[") + md
        if i + 1 in closes:
            k = closes[i + 1]
            escaped += f"</{TAGS[k][1:].split()[0].rstrip('>')}>"
            md += "**" if k % 2 == 0 else '](https://example.org/a_(b) "t")'
        if void_after == i:
            escaped, md = escaped + " " + VOID, md + " ![icon](i.png)"
        html_words.append(escaped)
        md_words.append(md)
    return Tagged(line, " ".join(html_words), " ".join(md_words), " ".join(words),
                  [(TAGS[k], span) for k, span in enumerate(gold)])


def markdown_escape(word: str) -> str:
    return "".join(f"\\{c}" if c in "\\`*_[]<>~&!#" else c for c in word)


def eflomal_links(data: Path, src: str, tgt: str, sources: list[str], refs: list[str]) -> list[set[tuple[int, int]]]:
    """The test pairs' word links, the intersection of eflomal's two directions, aligned with the corpus' training
    pairs (lowercased words as mtx counts them)."""
    import tempfile

    import eflomal

    from mtx.subword import normalize_text

    def words(lines: list[str]) -> list[str]:
        return [" ".join(normalize_text(line).lower().split()) for line in lines]

    train_src = (data / f"train.{src}").read_text(encoding="utf-8").splitlines()
    train_tgt = (data / f"train.{tgt}").read_text(encoding="utf-8").splitlines()
    with tempfile.TemporaryDirectory() as folder:
        forward, reverse = Path(folder) / "fwd", Path(folder) / "rev"
        eflomal.Aligner().align(words(train_src + sources), words(train_tgt + refs), links_filename_fwd=str(forward),
                                links_filename_rev=str(reverse))
        fwd, rev = (path.read_text().splitlines()[len(train_src):] for path in (forward, reverse))
    return [parse_links(f) & parse_links(r) for f, r in zip(fwd, rev, strict=True)]


def parse_links(line: str) -> set[tuple[int, int]]:
    return {(int(s), int(t)) for s, t in (link.split("-") for link in line.split())}


def consistent_span(links: set[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """The reference words [first, last + 1) aligned to source words [start, end), if they form a consistent
    phrase pair (no word outside the span aligned inside its hull, as phrase extraction requires)."""
    targets = [t for s, t in links if start <= s < end]
    if not targets:
        return None
    first, last = min(targets), max(targets)
    if any(first <= t <= last and not start <= s < end for s, t in links):
        return None
    return first, last + 1


def tag_sentences(sources: list[str], refs: list[str], links: list[set[tuple[int, int]]], count: int
                  ) -> list[Tagged]:
    """`count` test sentences of 4 to 40 words, each with an element around a span of 1 to 3 words of consistent
    alignment; one in four with a second, disjoint one; one in five with a void element."""
    from mtx.subword import normalize_text

    rng = random.Random(0)
    order = list(range(len(sources)))
    rng.shuffle(order)
    tagged: list[Tagged] = []
    for line in order:
        words = normalize_text(sources[line]).split()
        if not 4 <= len(words) <= 40 or not normalize_text(refs[line]):
            continue
        candidates = [(s, s + n) for n in (1, 2, 3) for s in range(len(words) - n + 1)]
        rng.shuffle(candidates)
        spans, gold = [], []
        for start, end in candidates:
            found = consistent_span(links[line], start, end)
            if found is not None and all(end <= a or start >= b for a, b in spans):
                spans.append((start, end))
                gold.append(found)
                if len(spans) == (2 if len(tagged) % 4 == 0 else 1):
                    break
        if not spans:
            continue
        order_of = sorted(range(len(spans)), key=lambda k: spans[k][0])  # elements numbered in source order
        tagged.append(tagged_sentence(line, words, [spans[k] for k in order_of], [gold[k] for k in order_of],
                                      rng.randrange(len(words)) if len(tagged) % 5 == 0 else None))
        if len(tagged) == count:
            break
    return tagged


def tagged_words(output: str) -> dict[str, list[int]]:
    """Each element's opening tag in an HTML output, and the indices of the output's words it wraps."""
    from mtx.documents.html import read_html

    marked = read_html(output)
    spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", marked.text)]
    return {e.open: [i for i, (a, b) in enumerate(spans) if a < e.end and b > e.start]
            for e in marked.elements if not e.point}


def placement_on_translations(outputs: list[str], tagged: list[Tagged], refs: list[str]) -> dict:
    """Bag-of-words precision and recall of the words each element wraps in the free translations, against the
    reference words of its gold span."""
    from collections import Counter

    from mtx.documents.html import read_html
    from mtx.subword import normalize_text

    overlap = predicted = wanted = 0
    for output, t in zip(outputs, tagged, strict=True):
        words = read_html(output).text.split()
        inside = tagged_words(output)
        ref_words = normalize_text(refs[t.line]).split()
        for tag, (first, end) in t.gold:
            mine = Counter(words[i].lower() for i in inside.get(tag, []))
            gold = Counter(w.lower() for w in ref_words[first:end])
            overlap += sum((mine & gold).values())
            predicted += sum(mine.values())
            wanted += sum(gold.values())
    return {"translation_precision": round(overlap / max(predicted, 1), 3),
            "translation_recall": round(overlap / max(wanted, 1), 3)}


def placement_on_references(engine: Engine, facts: ModelFacts, request: Request, tagged: list[Tagged],
                            refs: list[str]) -> dict:
    """The tags projected onto each reference (forced as the target prefix, aligned by the model) against the gold
    spans: exact match, and precision and recall of the wrapped words."""
    from mtx.documents.html import read_html
    from mtx.documents.markup import Target, project
    from mtx.subword import normalize_text

    lines = [t.html for t in tagged]
    prefixes = [normalize_text(refs[t.line]) for t in tagged]
    outs = translate(engine, facts, request, [" ".join(read_html(line).text.split()) for line in lines], prefixes)
    exact = overlap = predicted = wanted = elements = 0
    for t, line, prefix, out in zip(tagged, lines, prefixes, outs, strict=True):
        ref_words = prefix.split()
        if out is None or out.text.split()[: len(ref_words)] != ref_words:
            continue
        links = dict((b, a) for a, b in out.alignment or [])
        marked = read_html(line)
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", marked.text)]
        projected = project(marked, spans, Target(ref_words, ["", *[" "] * (len(ref_words) - 1), ""],
                                                  [links.get(i) for i in range(len(ref_words))]))
        inside = tagged_words(projected)
        for tag, (first, end) in t.gold:
            mine, gold = set(inside.get(tag, [])), set(range(first, end))
            elements += 1
            exact += mine == gold
            overlap += len(mine & gold)
            predicted += len(mine)
            wanted += len(gold)
    return {"elements": elements, "exact": round(exact / max(elements, 1), 3),
            "precision": round(overlap / max(predicted, 1), 3), "recall": round(overlap / max(wanted, 1), 3)}


class Output:
    """A translation's text and alignment as `write_document` reads them."""

    def __init__(self, text: str, alignment: list[tuple[int, int]] | None = None) -> None:
        self.text, self.alignment = text, alignment


def translate(engine: Engine, facts: ModelFacts, request: Request, strings: Sequence[str],
              prefixes: Sequence[str] | None = None) -> list[Output | None]:
    """Each string's best translation (None for an empty one), in windows as `mtx translate` reads them."""
    outputs: list[Output | None] = []
    for at in range(0, len(strings), 2000):
        window = list(strings[at: at + 2000])
        nbests = engine.translate(facts.encode(window, request.target_lang), request, range(at, at + len(window)),
                                  None if prefixes is None else list(prefixes[at: at + 2000]))
        outputs += [Output(n[0].text, n[0].alignment) if n else None for n in nbests]
    return outputs


if __name__ == "__main__":
    main()
