"""`mtx report`: two tiny runs trained here (validation BLEU scripted, a fake clock of 5 minutes per update, so
that milestones are reached and the curves span hours), and metrics logs written by hand (one from before mtx
logged the clock); the report's figures, the page's tables, its charts drawn by a headless Chromium where one
is installed, the terminal summary, and clear errors."""

from __future__ import annotations

import base64
import dataclasses
import io
import json
import re
import shutil
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch
from rich.console import Console
from support import CHROMIUM, FakeClock, base_recipe, chromium, png_pixels, scripted_bleu, write_recipe
from typer.testing import CliRunner

from mtx.checkpoint import load_model
from mtx.cli import app
from mtx.config.loading import load_recipe
from mtx.data.prepare import prepare
from mtx.errors import MtxError
from mtx.model.transformer import count_parameters
from mtx.report.charts import CURVES, draw_curve, time_unit
from mtx.report.command import parse_levels, report_runs
from mtx.report.page import page
from mtx.report.run_folder import read_run
from mtx.report.summary import RunSummary, bleu_levels, recipe_rows, time_to_bleu
from mtx.report.terminal import sparkline
from mtx.train.trainer import train

SCORE_CARD = {"bleu": 41.5, "chrf": 63.25, "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
              "signatures": {"bleu": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
                             "chrf": "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"},
              "n_sentences": 20}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run "a" (lr 3e-3, 24 updates, valid BLEU 12, 25, 31) and run "b" (lr 1e-3, 16 updates, valid BLEU 15, 22),
    both validating every 8 updates with BLEU milestones at 20 and 30; run a has a score card."""
    root = tmp_path_factory.mktemp("report")
    torch.set_num_threads(1)
    folders = {}
    clock = FakeClock(per_update=300.0)
    for name, lr, steps, bleu in (("a", 3e-3, 24, [12.0, 25.0, 31.0]), ("b", 1e-3, 16, [15.0, 22.0])):
        raw = base_recipe(root / name, train_pairs=300, valid_pairs=20)
        raw["train"].update(lr=lr, max_steps=steps, validate_every=8, log_every=4, save_every=8,
                            bleu_milestones=[20, 30])
        path = write_recipe(root / name, raw)
        prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
        train(load_recipe(path), hooks=dataclasses.replace(clock.hooks, valid_bleu=scripted_bleu(bleu)))
        folders[name] = load_recipe(path).run_path
    (folders["a"] / "score.test.json").write_text(json.dumps(SCORE_CARD), encoding="utf-8")
    return folders


def write_log(folder: Path, events: list[dict]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    return folder


@pytest.fixture
def clockless(tmp_path: Path) -> Path:
    """A run logged before mtx recorded the clock: no seconds, no tokens, no milestone lines, no checkpoint."""
    return write_log(tmp_path / "old", [
        {"event": "train", "step": 50, "epoch": 1, "loss": 7.0, "lr": 5e-4, "tokens_per_s": 6000.0},
        {"event": "train", "step": 100, "epoch": 1, "loss": 5.5, "lr": 1e-3, "tokens_per_s": 7000.0},
        {"event": "valid", "step": 100, "valid_loss": 4.0, "valid_bleu": 21.5},
        {"event": "train", "step": 150, "epoch": 1, "loss": 4.5, "lr": 9e-4, "tokens_per_s": 8000.0},
        {"event": "valid", "step": 150, "valid_loss": 3.5, "valid_bleu": 27.25},
        {"event": "valid", "step": 200, "valid_loss": 3.4, "valid_bleu": 27.25}])


# ------------------------------------------------------------------------------------------- the figures


def test_a_run_folder_is_read_whole(runs: dict[str, Path]) -> None:
    run = read_run(runs["a"])
    assert [line["step"] for line in run.train] == [4, 8, 12, 16, 20, 24]
    assert [(line["step"], line["valid_bleu"]) for line in run.valid] == [(8, 12.0), (16, 25.0), (24, 31.0)]
    assert run.logs_clock and run.tensorboard is None
    assert run.manifest["splits"]["train"]["pairs"] == 300
    assert run.checkpoint.path.name == "last.pt" and run.checkpoint.recipe["train"]["lr"] == 3e-3
    assert run.checkpoint.parameters == count_parameters(load_model(run.checkpoint.path)[0])
    assert run.checkpoint.train_seconds == pytest.approx(24 * 300, abs=60)
    assert run.scores == {"score.test.json": SCORE_CARD}


def test_time_to_bleu_is_the_trainers_milestone_or_the_first_valid_line_that_reached_it(runs: dict[str, Path],
                                                                                        clockless: Path) -> None:
    a, b, old = read_run(runs["a"]), read_run(runs["b"]), read_run(clockless)
    assert bleu_levels([a, b], None) == [20, 30] and bleu_levels([old], None) == []
    assert bleu_levels([a], [27, 25, 27]) == [25, 27]
    reached = time_to_bleu(a, 30)
    assert reached.recorded and (reached.step, reached.valid_bleu) == (24, 31.0)
    assert reached.seconds == pytest.approx(24 * 300, abs=60) and reached.gpu_seconds == reached.seconds
    assert reached.tokens == next(line["tokens"] for line in a.valid if line["step"] == 24) > 0
    assert time_to_bleu(b, 20).step == 16 and time_to_bleu(b, 30) is None
    found = time_to_bleu(a, 10)  # no milestone line: the first valid line that reached it
    assert not found.recorded and (found.step, found.valid_bleu) == (8, 12.0) and found.seconds is not None
    old_found = time_to_bleu(old, 27)
    assert (old_found.step, old_found.seconds, old_found.tokens) == (150, None, None)


def test_the_summary_of_a_run(runs: dict[str, Path], clockless: Path) -> None:
    summary = RunSummary.of(read_run(runs["a"]))
    assert summary.steps == 24 and summary.best["step"] == 24 and summary.best["valid_bleu"] == 31.0
    assert summary.seconds == pytest.approx(24 * 300, abs=60) and summary.gpu_seconds == summary.seconds
    old = RunSummary.of(read_run(clockless))
    assert (old.steps, old.seconds, old.gpu_seconds, old.parameters) == (200, None, None, None)
    assert old.best["step"] == 150  # the first of two equal bests
    assert (old.train_loss, old.valid_loss, old.tokens_per_s) == (4.5, 3.4, 7000.0)
    cells = old.cells()
    assert cells["training time"] == "–" and cells["best valid BLEU"] == "27.25" and cells["at step"] == "150"


def test_recipe_rows_are_the_whole_recipe_of_one_run_and_the_differences_of_several(runs: dict[str, Path],
                                                                                   clockless: Path) -> None:
    a, b, old = read_run(runs["a"]), read_run(runs["b"]), read_run(clockless)
    whole = dict(recipe_rows([a]))
    assert whole["train.lr"] == ["0.003"] and whole["model.d_model"] == ["32"] and whole["name"] == ["reverse"]
    assert whole["train.bleu_milestones"] == ["[20.0, 30.0]"]
    differences = dict(recipe_rows([a, b, old]))
    assert differences["train.lr"] == ["0.003", "0.001", "?"] and differences["train.max_steps"] == ["24", "16", "?"]
    assert "model.d_model" not in differences and "name" not in differences
    assert set(differences) == {"train.lr", "train.max_steps", "run_dir", "data.source.files.train",
                                "data.source.files.valid"}


def test_sparkline_spans_the_blocks_and_averages_a_long_series() -> None:
    assert sparkline(list(range(8))) == "▁▂▃▄▅▆▇█"
    assert sparkline([5.0, 5.0]) == "▁▁" and sparkline([]) == ""
    assert sparkline([0.0] * 50 + [1.0] * 50, width=4) == "▁▁██"
    assert len(sparkline([float(i % 7) for i in range(1000)])) == 40


def test_the_clock_axis_is_in_hours_for_a_long_run_and_minutes_or_seconds_for_a_short_one() -> None:
    assert time_unit(119) == (1.0, "seconds") and time_unit(120) == (60.0, "minutes")
    assert time_unit(7199) == (60.0, "minutes") and time_unit(7200) == (3600.0, "hours")


def test_levels_are_parsed_or_refused() -> None:
    assert parse_levels("20,25.5, 27") == [20.0, 25.5, 27.0]
    for bad in ("", "20,x", "0", "101"):
        with pytest.raises(MtxError, match="give BLEU levels in"):
            parse_levels(bad)


# ------------------------------------------------------------------------------------------------ the page


class Tables(HTMLParser):
    """Every table of a page by id, as rows of cell texts (its heading row first), and the images' sources."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.images: list[dict[str, str]] = []
        self.current: str | None = None
        self.tags: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list) -> None:
        self.tags.append(tag)
        if tag == "table":
            self.current = dict(attrs)["id"]
            self.tables[self.current] = []
        elif tag == "tr" and self.current:
            self.tables[self.current].append([])
        elif tag in ("td", "th") and self.current:
            self.tables[self.current][-1].append("")
        elif tag == "img":
            self.images.append(dict(attrs))

    def handle_endtag(self, tag: str) -> None:
        if tag == "table":
            self.current = None

    def handle_data(self, data: str) -> None:
        if self.current and self.tables[self.current] and self.tables[self.current][-1]:
            self.tables[self.current][-1][-1] += data

    def by_first_column(self, table_id: str) -> dict[str, list[str]]:
        return {row[0]: row[1:] for row in self.tables[table_id][1:]}


def test_the_pages_tables_hold_the_runs(runs: dict[str, Path], clockless: Path) -> None:
    """Built without charts, so that this runs whatever is installed: the runs, time to BLEU, the score card,
    the recipe's differences, the model's size, the data counts and every validation, escaped; no script, no
    address outside the page."""
    a, b, old = read_run(runs["a"]), read_run(runs["b"]), read_run(clockless)
    text = page([a, b, old], [], [20, 30])
    parsed = Tables(text)
    summary = parsed.by_first_column("summary")
    assert summary[str(runs["a"])][:1] == ["24"] and summary[str(clockless)][1] == "–"
    assert summary[str(runs["a"])][4] == "31.00" and summary[str(runs["a"])][5] == "24"
    milestones = [row for row in parsed.tables["time-to-bleu"][1:]]
    assert [row[:4] for row in milestones] == [
        [str(runs["a"]), "20", "16", "25.00"], [str(runs["a"]), "30", "24", "31.00"],
        [str(runs["b"]), "20", "16", "22.00"], [str(runs["b"]), "30", "not reached", ""],
        [str(clockless), "20", "100", "21.50"], [str(clockless), "30", "not reached", ""]]
    assert milestones[0][4] == "1 h 20 min" and milestones[0][7] == "milestone line"
    assert milestones[4][4:8] == ["not recorded", "not recorded", "not recorded", "valid lines"]
    assert parsed.tables["scores"][1:] == [
        [str(runs["a"]), "score.test.json", "bleu", "41.50", "20", SCORE_CARD["signatures"]["bleu"]],
        [str(runs["a"]), "score.test.json", "chrf", "63.25", "20", SCORE_CARD["signatures"]["chrf"]]]
    recipe = parsed.by_first_column("recipe")
    assert recipe["train.lr"] == ["0.003", "0.001", "?"]
    assert parsed.by_first_column("model")[str(runs["a"])][0] == f"{a.checkpoint.parameters:,}"
    data = parsed.by_first_column("data")
    assert data["train pairs"] == ["300", "300"] and data["training pairs kept"] == [
        f"{a.manifest['filter']['kept']:,}", f"{b.manifest['filter']['kept']:,}"]
    assert "dropped: duplicate" in data
    assert [row[4] for row in parsed.tables["valid-0"][1:]] == ["12.00", "25.00", "31.00"]
    assert [row[5] for row in parsed.tables["valid-0"][1:]] == ["0.600", "1.250", "1.550"]  # the length ratios
    assert f"{clockless}: metrics.jsonl has no training clock" in text
    assert "<script" not in text and "<link" not in text and not re.search(r"(src|href)=\"(?!data:)", text)


def test_page_shows_markup_in_a_folder_name_as_text(tmp_path: Path, clockless: Path) -> None:
    folder = shutil.copytree(clockless, tmp_path / "<b>x</b> & y")
    text = page([read_run(folder)], [], [])
    assert "<b>x</b>" not in text and "&lt;b&gt;x&lt;/b&gt; &amp; y" in text


def report_page(runs: list[Path], path: Path, *args: str) -> Tables:
    result = report_cli([*map(str, runs), "-o", str(path), *args])
    assert result.exit_code == 0, result.output
    return Tables(path.read_text(encoding="utf-8"))


def test_charts_are_svg_images_of_every_curve(runs: dict[str, Path], clockless: Path, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    parsed = report_page([runs["a"], runs["b"], clockless], tmp_path / "report.html")
    assert [image["alt"].split(" of ")[0] for image in parsed.images] == [
        "Train loss", "Valid loss", "Valid BLEU", "Learning rate"]
    for image in parsed.images:
        assert image["src"].startswith("data:image/svg+xml;base64,")
        svg = base64.b64decode(image["src"].split(",", 1)[1]).decode()
        assert svg.count("<path") > 20 and "<text" not in svg  # text drawn as paths: no font needed
        assert "against steps and against training time in hours" in image["alt"]
    again = draw_curve(CURVES[0], [read_run(runs["a"]), read_run(runs["b"]), read_run(clockless)], [])
    assert parsed.images[0]["src"].endswith(base64.b64encode(again.svg).decode())  # the same runs, the same bytes


def report_cli(args: list[str]):
    result = CliRunner().invoke(app, ["report", *args])
    if result.exception is not None and not isinstance(result.exception, MtxError | SystemExit):
        raise result.exception
    return result


def test_without_matplotlib_the_page_asks_for_the_extra(runs: dict[str, Path], tmp_path: Path,
                                                        monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = report_cli([str(runs["a"]), "-o", str(tmp_path / "report.html")])
    assert result.exit_code == 1 and "pip install 'mtx[report]'" in str(result.exception)
    assert not (tmp_path / "report.html").exists()
    assert report_cli([str(runs["a"])]).exit_code == 0  # the terminal summary needs rich alone


# ------------------------------------------------------------------------------------------- headless browser

# Appended to a copy of the page: each image's load state, natural size and place on the page, as JSON.
PROBE = """<pre id="probe"></pre><script>
for (const figure of document.querySelectorAll("figcaption, h1, h2, p, table, details")) figure.remove();
window.addEventListener("load", () => {
  document.getElementById("probe").textContent = JSON.stringify([...document.images].map((image) => {
    const box = image.getBoundingClientRect();
    return {complete: image.complete, width: image.naturalWidth, height: image.naturalHeight,
            box: [box.left, box.top, box.width, box.height].map(Math.round)};
  }));
});
</script>"""


def coloured_pixels(rows: list[bytes], step: int, box: list[int], rgb: tuple[int, int, int]) -> int:
    """Pixels within `box` (left, top, width, height) close to the colour `rgb`."""
    left, top, width, height = box
    found = 0
    for row in rows[top:top + height]:
        for x in range(left * step, (left + width) * step, step):
            found += sum(abs(row[x + i] - rgb[i]) for i in range(3)) < 40
    return found


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium or chromium-browser binary")
def test_browser_draws_every_chart_with_every_runs_line(runs: dict[str, Path], tmp_path: Path) -> None:
    """Chromium loads every chart image (none broken, none empty), and in the screenshot each chart holds the
    colours of both runs' lines (matplotlib's first two: blue and orange)."""
    pytest.importorskip("matplotlib")
    report_page([runs["a"], runs["b"]], tmp_path / "report.html")
    probed = tmp_path / "probed.html"
    probed.write_text((tmp_path / "report.html").read_text(encoding="utf-8").replace("</body>", PROBE + "</body>"),
                      encoding="utf-8")
    window = "--window-size=1100,1600"
    dom = chromium(window, "--dump-dom", probed.as_uri(), folder=tmp_path).stdout.decode()
    images = json.loads(re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S).group(1))
    assert len(images) == 4
    for image in images:
        assert image["complete"] and image["width"] > 300 and image["height"] > 150, image
    shot = tmp_path / "shot.png"
    chromium(window, f"--screenshot={shot}", probed.as_uri(), folder=tmp_path)
    width, height, rows = png_pixels(shot.read_bytes())
    assert max(top + box_height for _, top, _, box_height in (image["box"] for image in images)) <= height
    step = len(rows[0]) // width
    for image in images:
        for colour in ((31, 119, 180), (255, 127, 14)):
            # A run's lines in both panels cover several hundred pixels; its legend entry alone, under a hundred.
            assert coloured_pixels(rows, step, image["box"], colour) > 200, (image, colour)


# ----------------------------------------------------------------------------------------------- terminal


def test_terminal_summary_sparklines_and_milestones(runs: dict[str, Path]) -> None:
    out = io.StringIO()
    report_runs([runs["a"], runs["b"]], None, None, Console(file=out, width=120, color_system=None))
    text = out.getvalue()
    assert re.search(r"best valid BLEU\s+31\.00\s+22\.00", text) and re.search(r"at step\s+24\s+16", text)
    assert re.search(r"steps\s+24\s+16", text) and re.search(r"training time\s+2 h 00 min\s+1 h 20 min", text)
    assert "valid BLEU  ▁▆█  12.00 → 31.00  (steps 8–24)" in text
    assert re.search(r"train loss  [▁-█]{6}  ", text)
    assert "BLEU 30: step 24, 2 h 00 min, 2.00 GPU-h" in text and "BLEU 30: not reached" in text
    assert f"  mtx report {runs['a']} {runs['b']} -o report.html" in text
    assert re.search(r"parameters\s+([\d,]+)\s+\1", text) and "tokens/s" in text


# ------------------------------------------------------------------------------------------------- errors


def test_errors_name_the_folder_the_line_and_the_remedy(tmp_path: Path, clockless: Path) -> None:
    def error(*args: str) -> str:
        result = report_cli(list(args))
        assert result.exit_code == 1, result.output
        return str(result.exception)

    (tmp_path / "empty").mkdir()
    assert "empty is not a training run: it has no metrics.jsonl" in error(str(tmp_path / "empty"))
    assert "is not a folder" in error(str(tmp_path / "missing"))
    assert "given twice" in error(str(clockless), str(tmp_path / "old" / ".." / "old"))
    assert "--bleu-milestones 0,20" in error(str(clockless), "--bleu-milestones", "0,20")
    log = clockless / "metrics.jsonl"
    lines = log.read_text().splitlines()
    log.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    assert re.search(r"metrics.jsonl, line 2, is not JSON .*Remove or repair the line", error(str(clockless)))
    log.write_text("\n".join([lines[0], "", *lines[1:]]) + "\n")
    assert "metrics.jsonl, line 2, is empty" in error(str(clockless))
    log.write_text("\n".join([lines[0], "[1, 2]"]) + "\n")
    assert "line 2, is not a metrics event" in error(str(clockless))
    log.write_text("")
    assert "holds no events yet" in error(str(clockless))
    log.write_text("\n".join(lines) + '\n{"event": "train", "st')  # a last line being written is left out
    assert read_run(clockless).train[-1]["step"] == 150
    (clockless / "checkpoints").mkdir()
    (clockless / "checkpoints" / "last.pt").write_bytes(b"not a checkpoint")
    assert "last.pt cannot be read" in error(str(clockless))
    (clockless / "checkpoints" / "last.pt").unlink()
    (clockless / "score.json").write_text("{")
    assert "score.json is not valid JSON" in error(str(clockless))


def test_help_has_an_example() -> None:
    result = CliRunner().invoke(app, ["report", "--help"])
    assert result.exit_code == 0 and "Example: mtx report runs/demo -o runs/demo/report.html" in result.stdout
