"""`mtx inspect`: head statistics on hand-made maps; labels; the terminal heatmaps, the --json object and the HTML
page of a tiny copy-task model trained here, whose cross-attention is diagonal; the page drawn by a headless
Chromium where one is installed."""

from __future__ import annotations

import io
import json
import math
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from rich.cells import cell_len
from rich.console import Console
from support import CHROMIUM, chromium, copy_task, png_pixels, words_of
from typer.testing import CliRunner

from mtx.analysis.attention_terminal import column_blocks, fitted, print_heatmaps
from mtx.analysis.head_stats import head_statistics, is_punctuation
from mtx.analysis.inspection import CONTINUATION, Inspection, View, inspect_sentence, readable_labels, select_views
from mtx.checkpoint import make_checkpoint, save_checkpoint
from mtx.cli import app
from mtx.config.recipe import DecodeConfig
from mtx.decode.facts import ModelFacts
from mtx.decode.torch_engine import engine_of_model
from mtx.errors import MtxError
from mtx.tokenizer import EOS

# ------------------------------------------------------------------------------ statistics on hand-made maps


def no_keys(width: int) -> torch.Tensor:
    return torch.zeros(width, dtype=torch.bool)


def test_previous_token_head_and_uniform_head() -> None:
    """A one-hot previous-token head: previous 1, entropy 0. Uniform rows over n keys: entropy log₂ n bits,
    and 1/n on any one key. The layer's average comes after its heads, as head None."""
    n = 5
    previous = torch.zeros(n, n)
    previous[0, 0] = 1.0
    previous[torch.arange(1, n), torch.arange(n - 1)] = 1.0
    uniform = torch.full((n, n), 1.0 / n)
    [prev, flat, mean] = head_statistics("encoder", torch.stack([previous, uniform])[None], no_keys(n), no_keys(n))
    assert (prev.head, flat.head, mean.head) == (0, 1, None)
    assert prev.previous == 1.0 and prev.entropy_bits == 0.0
    assert prev.same == pytest.approx(1 / n)  # only the first row, which has no previous key, attends itself
    assert flat.entropy_bits == pytest.approx(math.log2(n))
    assert flat.previous == pytest.approx(1 / n) and flat.same == pytest.approx(1 / n)
    assert mean.previous == pytest.approx((1 + 1 / n) / 2)


def test_causal_rows_count_only_the_keys_they_may_attend() -> None:
    """Uniform causal rows: row i spreads over its i + 1 keys, so its entropy is log₂(i + 1) bits; the masked
    keys hold 0 and add nothing."""
    n = 4
    weights = torch.ones(n, n).tril()
    weights /= weights.sum(dim=1, keepdim=True)
    [head, _] = head_statistics("decoder", weights[None, None], no_keys(n), no_keys(n))
    assert head.entropy_bits == pytest.approx(sum(math.log2(i + 1) for i in range(n)) / n)
    assert head.same == pytest.approx(sum(1 / (i + 1) for i in range(n)) / n)


def test_boundary_and_punctuation_shares_on_a_rectangular_map() -> None:
    """Cross-attention: 3 target rows over 4 source keys ("a", ",", "b", </s>). Its diagonal is the same
    position; the shares on the keys marked are the row means."""
    weights = torch.tensor([[0.5, 0.0, 0.0, 0.5], [0.0, 1.0, 0.0, 0.0], [0.2, 0.2, 0.2, 0.4]])
    boundary, punctuation = torch.tensor([False, False, False, True]), torch.tensor([False, True, False, False])
    [head, _] = head_statistics("cross", weights[None, None], boundary, punctuation)
    assert head.boundary == pytest.approx(0.3)
    assert head.punctuation == pytest.approx(0.4)
    assert head.same == pytest.approx((0.5 + 1.0 + 0.2) / 3)
    assert head.previous == pytest.approx((0.0 + 0.2) / 2)


def test_punctuation() -> None:
    assert all(map(is_punctuation, [".", " ,", "?!", "«", "…", "—"]))
    assert not any(map(is_punctuation, ["", " ", "a.", "3", "+", "€"]))


def test_labels_fit_their_terminal_cells() -> None:
    """Right-aligned in exactly the cells given, a CJK character counting two, cut with "…" when wider."""
    assert fitted("ab", 4) == "  ab"
    assert fitted("漢字", 5) == " 漢字"
    assert cell_len(fitted("漢字漢字漢字", 8)) == 8 and fitted("漢字漢字漢字", 8).endswith("…")
    assert fitted("treehouses", 8) == "treehou…"


def test_column_blocks_fit_the_room() -> None:
    assert column_blocks([3, 3, 3], 100) == [range(0, 3)]
    assert column_blocks([3, 3, 3], 8) == [range(0, 2), range(2, 3)]
    assert column_blocks([9, 3], 4) == [range(0, 1), range(1, 2)]  # a column wider than the room stands alone


# ------------------------------------------------------------------------------------- a trained copy model


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """test_translate's copy-task model, its checkpoint (greedy, outputs up to the input length + 5), and
    held-out sentences."""
    model, tokenizer, held_out = copy_task(20)
    checkpoint = tmp_path_factory.mktemp("inspect") / "copy.pt"
    recipe = {"decode": {"beam": 1, "max_len_a": 1.0, "max_len_b": 5}}
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), recipe, 250), checkpoint)
    engine = engine_of_model(model, ModelFacts.read([checkpoint]))
    return dict(model=model, tokenizer=tokenizer, held_out=held_out, checkpoint=checkpoint, engine=engine)


@pytest.fixture(scope="module")
def inspected(trained: dict) -> Inspection:
    return inspect_sentence(trained["engine"], DecodeConfig(beam=1), trained["held_out"][0])


def test_labels_spell_the_words_as_written(trained: dict) -> None:
    """Word starts as written, continuations after ·, a character split over byte tokens shown whole once (then
    … for its later bytes), a space that no merge joined to its word as ␣."""
    tokenizer = trained["tokenizer"]
    for text in ["green cats, bluest rivers!", "Grüße 🙂 漢字 tree"]:
        labels = readable_labels(tokenizer, [*tokenizer.encode(text), EOS])
        assert labels[-1] == "</s>"
        assert words_of(labels) == text
        assert not any("Ġ" in label for label in labels)
    assert "␣" in readable_labels(tokenizer, tokenizer.encode("Grüße"))
    labels = readable_labels(tokenizer, tokenizer.encode("treehouse"))
    assert len(labels) > 1 and labels[0] == "tree" and all(label.startswith(CONTINUATION) for label in labels[1:])


def test_maps_cover_every_token_and_rows_are_distributions(inspected: Inspection, trained: dict) -> None:
    source = trained["held_out"][0]
    assert inspected.translation == source  # the model copies
    tokens = len(trained["tokenizer"].encode(source))
    n = tokens + 1  # with </s> (source) and with the EOS step (target)
    assert inspected.maps["encoder"].shape == (2, 4, n, n)
    assert inspected.maps["decoder"].shape == (1, 4, n, n)
    assert inspected.maps["cross"].shape == (1, 4, n, n)
    assert inspected.predicted_labels[-1] == "</s>" and inspected.read_labels[0] == "<s>"
    assert inspected.predicted_labels[:-1] == inspected.read_labels[1:] == inspected.source_labels[:-1]
    for weights in inspected.maps.values():
        torch.testing.assert_close(weights.sum(dim=-1), torch.ones(weights.shape[:-1]))
    assert inspected.maps["decoder"].triu(diagonal=1).abs().max() == 0.0


def test_copy_models_cross_attention_is_diagonal(inspected: Inspection) -> None:
    """Predicting target token t, a copy model looks at source token t: in the heads' average each row's
    largest weight is within one position of the diagonal, and so is most of the attention of every row but the
    EOS step's; the "same" statistic of the average is most of it too (a uniform map would give 1/n)."""
    mean = View("cross", 0, None).weights(inspected)
    positions = torch.arange(mean.shape[0])
    assert ((mean.argmax(dim=1) - positions).abs() <= 1).all()
    band = (positions[:, None] - positions[None, :]).abs() <= 1
    assert ((mean * band).sum(dim=1)[:-1] > 0.75).all()
    assert View("cross", 0, None).statistics(inspected).same > 0.5


def test_statistics_agree_with_the_maps(inspected: Inspection) -> None:
    """Recomputed by hand for every head of every kind: entropy in bits and the diagonal shares."""
    assert len(inspected.statistics) == (2 + 1 + 1) * 5  # layers × (4 heads + their average)
    for stats in inspected.statistics:
        weights = View(stats.kind, stats.layer, stats.head).weights(inspected).tolist()
        entropy = sum(-sum(p * math.log2(p) for p in row if p > 0) for row in weights) / len(weights)
        assert stats.entropy_bits == pytest.approx(entropy, abs=1e-4)
        assert stats.same == pytest.approx(sum(row[i] for i, row in enumerate(weights)) / len(weights), abs=1e-5)
        previous = [row[i - 1] for i, row in enumerate(weights) if i > 0]
        assert stats.previous == pytest.approx(sum(previous) / len(previous), abs=1e-5)
        boundary = [row[-1] if stats.kind != "decoder" else row[0] for row in weights]
        assert stats.boundary == pytest.approx(sum(boundary) / len(boundary), abs=1e-5)


def test_a_given_target_is_scored_as_the_search_scores_it(trained: dict, inspected: Inspection) -> None:
    """The model's own translation given as the target gets the search's score and the same maps; another
    target gets a worse score."""
    engine, source = trained["engine"], trained["held_out"][0]
    forced = inspect_sentence(engine, DecodeConfig(beam=1), source, target=inspected.translation)
    assert forced.forced and not inspected.forced
    assert forced.score == pytest.approx(inspected.score, abs=1e-4)
    torch.testing.assert_close(forced.maps["cross"], inspected.maps["cross"])
    other = inspect_sentence(engine, DecodeConfig(beam=1), source, target="red red red")
    assert other.score < inspected.score - 1.0


def test_view_selection(inspected: Inspection) -> None:
    assert [(v.kind, v.layer, v.head) for v in select_views(inspected, "cross", None, "all")] == [
        ("cross", 0, 0), ("cross", 0, 1), ("cross", 0, 2), ("cross", 0, 3), ("cross", 0, None)]
    assert len(select_views(inspected, "all", None, "mean")) == 2 + 1 + 1
    assert [(v.kind, v.layer, v.head) for v in select_views(inspected, "encoder", 1, "2")] == [("encoder", 1, 2)]


# ------------------------------------------------------------------------------------------------ terminal


def cells_of(line: str, row_width: int) -> list[str]:
    return line[row_width:].split()


def test_terminal_heatmap_has_a_line_per_row_and_a_cell_per_column(inspected: Inspection) -> None:
    """Every row label once with a cell per column (percentages summing to about 100), under a header of the
    column labels; a narrow terminal gets the columns in blocks, each line within its width."""
    rows, columns = inspected.labels("cross")
    for width in (200, 24):
        console = Console(file=io.StringIO(), width=width, color_system=None)
        print_heatmaps(console, inspected, [View("cross", 0, None)])
        lines = console.file.getvalue().splitlines()
        assert " ".join(lines[:2]).startswith("cross-attention · layer") and "heads averaged" in console.file.getvalue()
        assert all(len(line) <= width for line in lines)
        row_width = max(map(len, rows))
        grid = [line for line in lines if line[:row_width].strip() in rows and line[row_width:row_width + 1] == " "]
        blocks = len(grid) // len(rows)
        assert (blocks == 1) == (width == 200)
        assert [line[:row_width].strip() for line in grid] == rows * blocks
        for row in range(len(rows)):
            cells = [cell for block in range(blocks) for cell in cells_of(grid[block * len(rows) + row], row_width)]
            assert len(cells) == len(columns)
            assert abs(sum(int(c) for c in cells if c != "·") - 100) <= len(columns)
        headers = [line for line in lines if line.startswith(" " * row_width) and line.strip()]
        assert " ".join(headers).split() == columns


def test_decoder_heatmap_leaves_later_positions_blank(inspected: Inspection) -> None:
    console = Console(file=io.StringIO(), width=200, color_system=None)
    print_heatmaps(console, inspected, [View("decoder", 0, 1)])
    rows, _ = inspected.labels("decoder")
    row_width = max(map(len, rows))
    grid = [line for line in console.file.getvalue().splitlines() if line[:row_width].strip() in rows]
    assert [len(cells_of(line, row_width)) for line in grid] == list(range(1, len(rows) + 1))


def inspect_cli(args: list[str]):
    result = CliRunner().invoke(app, ["inspect", *args])
    if result.exception is not None and not isinstance(result.exception, MtxError | SystemExit):
        raise result.exception
    return result


def test_cli_prints_translation_heatmaps_and_statistics(trained: dict) -> None:
    sentence = trained["held_out"][1]
    result = inspect_cli(["-m", str(trained["checkpoint"]), sentence, "--kind", "encoder", "--layer", "1"])
    assert result.exit_code == 0, result.output
    assert f"translation  {sentence}" in result.stdout
    titles = [line for line in result.stdout.splitlines() if line.startswith("encoder self-attention · layer")]
    assert titles == [f"encoder self-attention · layer 1 · head {h}" for h in range(4)] + [
        "encoder self-attention · layer 1 · heads averaged"]
    assert "Per-head statistics" in result.stdout and "cross-attention" not in result.stdout


def test_json_holds_the_translation_and_the_selected_statistics(trained: dict) -> None:
    sentence = trained["held_out"][2]
    result = inspect_cli(["-m", str(trained["checkpoint"]), sentence, "--json", "--kind", "cross"])
    assert result.exit_code == 0
    summary = json.loads(result.stdout)
    assert summary["translation"] == sentence and summary["source"] == sentence
    assert [(s["kind"], s["layer"], s["head"]) for s in summary["statistics"]] == [
        ("cross", 0, 0), ("cross", 0, 1), ("cross", 0, 2), ("cross", 0, 3), ("cross", 0, None)]
    assert summary["labels"]["cross"]["rows"][-1] == "</s>"


@pytest.mark.parametrize(("args", "message"), [
    (["-m", "missing.pt", "a b"], "Checkpoint missing.pt does not exist"),
    (["   "], "The sentence is empty"),
    ([" ".join(["green tree"] * 40)], "more than the 63 (and </s>) that the model's max_positions allows"),
    (["red cat", "--target", " ".join(["blue"] * 80)], "The target has"),
    (["red cat", "--kind", "self"], "--kind 'self' is not one of encoder, decoder, cross, all"),
    (["red cat", "--head", "first"], "--head 'first' is not all, mean or a head's number"),
    (["red cat", "--head", "4"], "--head 4 is not a head of this model, whose heads are numbered 0 to 3"),
    (["red cat", "--layer", "1"], "--layer 1 is not a layer of the decoder self-attention"),
])
def test_user_errors(trained: dict, args: list[str], message: str) -> None:
    if args[0] != "-m":
        args = ["-m", str(trained["checkpoint"]), *args]
    result = inspect_cli(args)
    assert result.exit_code == 1
    assert message in str(result.exception)


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(app, ["inspect", "--help"])
    assert result.exit_code == 0
    assert "Example: mtx inspect -m" in result.stdout and "--kind" in result.stdout


# ---------------------------------------------------------------------------------------------------- page


class PageParser(HTMLParser):
    """The page's title and the text of its JSON data element."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: str | None = None
        self.title, self.data, self.scripts = "", "", 0

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.scripts += tag == "script"
        self.inside = "data" if dict(attrs).get("id") == "attention-data" else tag

    def handle_endtag(self, tag: str) -> None:
        self.inside = None

    def handle_data(self, data: str) -> None:
        if self.inside == "title":
            self.title += data
        elif self.inside == "data":
            self.data += data


def write_page(trained: dict, folder: Path, sentence: str, *extra: str) -> tuple[Path, dict]:
    path = folder / "attention.html"
    result = inspect_cli(["-m", str(trained["checkpoint"]), sentence, "-o", str(path), *extra])
    assert result.exit_code == 0, result.output
    parser = PageParser()
    parser.feed(path.read_text(encoding="utf-8"))
    return path, json.loads(parser.data)


def test_page_data_holds_every_map_labels_and_statistics(trained: dict, tmp_path: Path) -> None:
    sentence = trained["held_out"][3]
    _, data = write_page(trained, tmp_path, sentence)
    assert data["translation"] == sentence
    kinds = {kind["name"]: kind for kind in data["kinds"]}
    assert list(kinds) == ["encoder", "decoder", "cross"]
    n = len(trained["tokenizer"].encode(sentence)) + 1
    for name, layers in (("encoder", 2), ("decoder", 1), ("cross", 1)):
        kind = kinds[name]
        assert (kind["layers"], kind["heads"]) == (layers, 4)
        assert len(kind["rows"]) == len(kind["columns"]) == n
        assert [len(kind["weights"]), len(kind["weights"][0]), len(kind["weights"][0][0])] == [layers, 4, n]
        for layer in range(layers):
            for rows in [*kind["weights"][layer], kind["mean"][layer]]:
                assert all(len(row) == n and abs(sum(row) - 1) < 1e-3 for row in rows)
    assert kinds["cross"]["rows"][-1] == "</s>" and kinds["decoder"]["columns"][0] == "<s>"
    assert kinds["decoder"]["causal"] and not kinds["cross"]["causal"]
    for stats in data["statistics"]:
        kind = kinds[stats["kind"]]
        rows = kind["mean"][stats["layer"]] if stats["head"] is None else kind["weights"][stats["layer"]][stats["head"]]
        assert stats["same"] == pytest.approx(sum(row[i] for i, row in enumerate(rows)) / n, abs=1e-3)
    assert len(data["statistics"]) == 4 * 5


def test_page_shows_markup_in_the_sentence_as_text(trained: dict, tmp_path: Path) -> None:
    """A sentence holding </script>, <b> and & ends no element early: one data element and one script, the
    title and the data's source as written."""
    sentence = 'red </script><b>cat</b> & "dog"'
    path, data = write_page(trained, tmp_path, sentence)
    text = path.read_text(encoding="utf-8")
    parser = PageParser()
    parser.feed(text)
    assert parser.scripts == 2 and text.count("</script>") == 2
    assert parser.title == f"mtx inspect: {sentence}"
    assert data["source"] == sentence
    assert "<b>cat" not in text


# ------------------------------------------------------------------------------------------ headless browser


def drawn_cells(dom: str) -> list[tuple[int, int, int] | None]:
    """The heatmap's cells in the dumped DOM, in order: each weight cell's background, None for a masked one."""
    cells = []
    for tag in re.findall(r'<td class="(?:weight|masked)"[^>]*>', dom):
        colour = re.search(r"background: rgb\((\d+), (\d+), (\d+)\)", tag)
        cells.append(None if 'class="masked"' in tag else tuple(int(c) for c in colour.groups()))
    return cells


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium or chromium-browser binary")
def test_browser_draws_the_grid_the_data_says(trained: dict, tmp_path: Path) -> None:
    """The page's script, run by Chromium, draws the chosen heatmap (from the address's fragment): a cell per
    (row, column), masked cells above the decoder's diagonal, and darker cells for larger weights."""
    path, data = write_page(trained, tmp_path, trained["held_out"][4])
    kinds = {kind["name"]: kind for kind in data["kinds"]}
    for view, weights in (("cross/0/mean", kinds["cross"]["mean"][0]),
                          ("decoder/0/2", kinds["decoder"]["weights"][0][2])):
        dom = chromium("--dump-dom", f"{path.as_uri()}#{view}", folder=tmp_path).stdout.decode()
        cells = drawn_cells(dom)
        n = len(weights)
        assert len(cells) == n * n
        flat = [w for row in weights for w in row]
        drawn = [(w, sum(rgb)) for w, rgb in zip(flat, cells, strict=True) if rgb is not None]
        assert len(drawn) == (n * (n + 1) // 2 if view.startswith("decoder") else n * n)
        brightness = [b for _, b in sorted(drawn)]
        assert brightness == sorted(brightness, reverse=True) and brightness[0] > brightness[-1]
        assert dom.count('class="column"') == n and dom.count('class="row"') == n


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium or chromium-browser binary")
def test_browser_screenshot_shows_the_heatmaps_colours(trained: dict, tmp_path: Path) -> None:
    """In the picture itself, each colour of the drawn cells covers about as many pixels as its cells do
    (22 × 22 each): the heatmap is on screen, in the colours of its data."""
    path, _ = write_page(trained, tmp_path, trained["held_out"][5])
    dom = chromium("--dump-dom", f"{path.as_uri()}#cross/0/mean", folder=tmp_path).stdout.decode()
    colours: dict[tuple[int, int, int], int] = {}
    for rgb in drawn_cells(dom):
        colours[rgb] = colours.get(rgb, 0) + 1
    shot = tmp_path / "shot.png"
    chromium(f"--screenshot={shot}", "--window-size=640,480", f"{path.as_uri()}#cross/0/mean", folder=tmp_path)
    width, height, rows = png_pixels(shot.read_bytes())
    step = len(rows[0]) // width
    seen: dict[tuple[int, int, int], int] = {}
    for row in rows:
        for x in range(0, len(row), step):
            rgb = (row[x], row[x + 1], row[x + 2])
            if rgb in colours:
                seen[rgb] = seen.get(rgb, 0) + 1
    dark = [rgb for rgb in colours if sum(rgb) < 600]  # far from the page's white and the text's greys
    assert len(dark) >= 3
    for rgb in dark:
        assert 0.9 * colours[rgb] * 22 * 22 <= seen.get(rgb, 0) <= 1.1 * colours[rgb] * 22 * 22 + 50, rgb
