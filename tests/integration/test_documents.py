"""Documents through `mtx translate` and `mtx serve` (mtx.documents), on the copy-task model: paragraphs cut into
sentences and joined back, HTML and Markdown markup carried through its alignments, and the refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import Server, translate_cli

from mtx.documents.html import is_well_formed
from mtx.errors import MtxError

pytest.importorskip("sentencex", reason="--split-sentences needs the extra mtx[documents]")


def translated(copy_model: dict, tmp_path: Path, lines: list[str], *flags: str) -> list[str]:
    source = tmp_path / "in.txt"
    source.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    result, out = translate_cli(["-m", str(copy_model["checkpoint"]), "-i", str(source), *flags])
    assert result.exit_code == 0, result.output
    return out


def test_split_sentences_translates_each_sentence_and_keeps_what_is_between(copy_model: dict, tmp_path: Path) -> None:
    a, b, c = (f"{sentence}." for sentence in copy_model["held_out"][:3])
    one_by_one = translated(copy_model, tmp_path, [a, b, c])
    paragraphs = translated(copy_model, tmp_path, [f"  {a}  {b} {c} ", "", a], "--split-sentences")
    assert paragraphs == [f"  {one_by_one[0]}  {one_by_one[1]} {one_by_one[2]} ", "", one_by_one[0]]


def test_html_markup_goes_back_around_the_copied_words(copy_model: dict, tmp_path: Path) -> None:
    w = copy_model["held_out"][0].split() + copy_model["held_out"][1].split()
    lines = [f'<p>{w[0]} <b>{w[1]}</b> <a href="x?a=1&amp;b=2" title="a > b">{w[2]} {w[3]}</a><br/> {w[4]}</p>',
             f"{w[0]} <!-- note --> <code>{w[1]}</code> {w[2]} <i>{w[3]}",
             "<b></b>", ""]
    out = translated(copy_model, tmp_path, lines, "--markup", "html")
    assert out[0] == lines[0]
    assert out[1] == f"{w[0]} <!-- note --> <code>{w[1]}</code> {w[2]} <i>{w[3]}</i>"
    assert out[2:] == ["<b></b>", ""]
    assert all(is_well_formed(line) for line in out)


def test_markdown_markup_goes_back_around_the_copied_words(copy_model: dict, tmp_path: Path) -> None:
    w = copy_model["held_out"][0].split() + copy_model["held_out"][1].split()
    line = f'- {w[0]} **{w[1]}** [{w[2]}](https://example.org/ü%20x "title") `{w[3]}` {w[4]}'
    assert translated(copy_model, tmp_path, [line], "--markup", "markdown") == [line]


def test_jsonl_gives_the_document_and_each_sentence(copy_model: dict, tmp_path: Path) -> None:
    a, b = (f"{sentence}." for sentence in copy_model["held_out"][:2])
    (line,) = translated(copy_model, tmp_path, [f"<b>{a}</b> {b}"], "--markup", "html", "--split-sentences",
                         "--format", "jsonl")
    record = json.loads(line)
    assert record.keys() == {"text", "flags", "sentences"}
    assert [s["source"] for s in record["sentences"]] == [a, b]
    assert record["text"] == f"<b>{record['sentences'][0]['text']}</b> {record['sentences'][1]['text']}"


@pytest.mark.parametrize(("flags", "refused"), [
    (["--markup", "html", "--nbest", "2"], "--nbest 2 does not go with --markup html"),
    (["--split-sentences", "--alignment"], "--alignment does not go with --split-sentences"),
    (["--markup", "xml"], "--markup 'xml' is not one of none, html, markdown"),
])
def test_what_does_not_go_with_documents_is_refused(copy_model: dict, flags: list[str], refused: str) -> None:
    result, _ = translate_cli(["-m", str(copy_model["checkpoint"]), "-i", str(copy_model["input"]), *flags])
    assert result.exit_code != 0 and isinstance(result.exception, MtxError)
    assert refused in str(result.exception)


def test_a_prefix_does_not_go_with_documents(copy_model: dict) -> None:
    result, _ = translate_cli(["-m", str(copy_model["checkpoint"]), "-i", str(copy_model["input"]),
                               "--prefix", str(copy_model["input"]), "--split-sentences"])
    assert "--prefix does not go with --split-sentences" in str(result.exception)


def test_markup_nested_too_deep_is_refused_with_its_line(copy_model: dict, tmp_path: Path) -> None:
    source = tmp_path / "deep.html"
    source.write_text("red <b>cat</b>\n" + "<b>" * 10_000 + "red" + "</b>" * 10_000 + "\n", encoding="utf-8")
    result, _ = translate_cli(["-m", str(copy_model["checkpoint"]), "-i", str(source), "--markup", "html"])
    assert isinstance(result.exception, MtxError) and str(result.exception).startswith("line 2: ")


def test_the_ct2_engine_places_markup_as_the_torch_engine_does(copy_model: dict, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2", reason="the ct2 engine needs the extra mtx[ct2]")
    w = copy_model["held_out"][2].split()
    lines = [f"<p>{w[0]} <b>{' '.join(w[1:])}</b></p>", f"*{w[0]}* {' '.join(w[1:])}"]
    for markup, line in zip(("html", "markdown"), lines, strict=True):
        torch_out = translated(copy_model, tmp_path, [line], "--markup", markup)
        assert translated(copy_model, tmp_path, [line], "--markup", markup, "--engine", "ct2") == torch_out == [line]


def test_the_server_takes_documents_per_request(copy_model: dict, tmp_path: Path) -> None:
    pytest.importorskip("fastapi", reason="mtx serve needs the extra mtx[serve]")
    a, b = (f"{sentence}." for sentence in copy_model["held_out"][:2])
    server = Server(copy_model["checkpoint"], tmp_path / "serve.log")
    try:
        status, _, answer = server.translate({"text": [f"<i>{a}</i>\n\n{b}"], "markup": "html",
                                              "split_sentences": True})
        assert status == 200, answer
        (document,) = answer["translations"]
        first, second = (s["text"] for s in document["sentences"])
        assert document["text"] == f"<i>{first}</i>\n\n{second}"
        status, _, answer = server.translate({"text": ["<b></b>", ""], "markup": "html"})  # no sentence at all
        assert status == 200 and [d["text"] for d in answer["translations"]] == ["<b></b>", ""], answer
        status, _, answer = server.translate({"text": [a], "markup": "markdown", "nbest": 2})
        assert status == 400 and answer["field"] == "nbest"
        status, _, answer = server.translate({"text": [a, "<b>" * 300 + a], "markup": "html"})
        assert status == 400 and answer["field"] == "text[1]"
    finally:
        server.stop()


def test_a_server_without_the_segmenter_names_the_field_and_the_extra(copy_model: dict,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("fastapi", reason="mtx serve needs the extra mtx[serve]")
    import sys

    from mtx.serve.service import Limits, RequestError, TranslationService

    service = TranslationService([copy_model["checkpoint"]], engine="torch", device="cpu", dtype="auto", threads=1,
                                 batch_tokens=4096, max_wait=0.005, max_queue=64, limits=Limits(8, 1000, 4, 30.0))
    service.load()
    try:
        monkeypatch.setitem(sys.modules, "sentencex", None)  # what a server without mtx[documents] imports
        with pytest.raises(RequestError) as refused:
            service.job(["One. Two."], {"split_sentences": True})
        assert (refused.value.status, refused.value.field) == (400, "split_sentences")
        assert "mtx[documents]" in str(refused.value)
        assert service.job(["<b>One.</b>"], {"markup": "html"}).documents  # markup alone needs no segmenter
    finally:
        service.drain()
