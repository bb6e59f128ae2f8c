"""The report as one self-contained HTML page (`mtx report RUN… -o report.html`).

The page needs nothing beyond itself (no network, no script, no external font or style sheet), so it can be
mailed, attached to an issue or opened offline. Each chart is an SVG image inside the page as a data: URL, each
its own document, so that the charts' internal ids never meet. Everything from the runs (folder names, recipe
values, score signatures) reaches the page escaped, so it shows as written.

Sections, in the order a reader asks: how each run went (summary), the learning curves, time to BLEU, the
score cards, the recipe (all of one run's keys, or those that differ between runs) and the model's size, the
data each run was prepared from, and every validation in a folded table.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from mtx.files import atomic_write_text
from mtx.report.charts import Chart, pair_curves
from mtx.report.run_folder import Run
from mtx.report.summary import (
    NOT_RECORDED,
    RunSummary,
    count,
    duration,
    gpu_hours,
    number,
    recipe_rows,
    time_to_bleu,
)

STYLE = """
body { font: 14px/1.45 system-ui, sans-serif; margin: 24px auto; max-width: 1100px; padding: 0 16px; color: #111;
       background: #fff; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 2px; }
table { border-collapse: collapse; margin: 4px 0 8px; }
th, td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #e4e4e4; vertical-align: top; }
th:first-child, td:first-child, .text { text-align: left; }
thead th { border-bottom: 1px solid #999; }
td.text { font-family: ui-monospace, monospace; font-size: 12px; overflow-wrap: anywhere; max-width: 520px; }
figure { margin: 12px 0 20px; }
figure img { max-width: 100%; height: auto; }
.note { color: #555; font-size: 13px; }
details { margin: 6px 0; }
"""


def page(runs: Sequence[Run], charts: Sequence[Chart], levels: Sequence[float]) -> str:
    """The whole page, as text."""
    names = ", ".join(run.label for run in runs)
    sections = [summary_section(runs), curves_section(runs, charts), time_to_bleu_section(runs, levels),
                scores_section(runs), recipe_section(runs), data_section(runs), validations_section(runs)]
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>mtx report: {html.escape(names)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>mtx report</h1>
<p class="note">{html.escape(names)}</p>
{"".join(sections)}
</body>
</html>
"""


def write_page(path: Path, runs: Sequence[Run], charts: Sequence[Chart], levels: Sequence[float]) -> None:
    """The page, written atomically to `path`."""
    text = page(runs, charts, levels)
    atomic_write_text(path, text)


def table(table_id: str, headings: Sequence[str], rows: Sequence[Sequence[Any]],
          text_columns: Collection[int] = ()) -> str:
    """An HTML table, every cell escaped; the columns numbered in `text_columns` hold code-like text (recipe
    values, signatures), set left-aligned in a monospace font."""
    def cell(tag: str, i: int, value: Any) -> str:
        css = ' class="text"' if i in text_columns else ""
        return f"<{tag}{css}>{html.escape(str(value))}</{tag}>"

    head = "".join(cell("th", i, heading) for i, heading in enumerate(headings))
    body = "".join("<tr>" + "".join(cell("td", i, value) for i, value in enumerate(row)) + "</tr>" for row in rows)
    return f'<table id="{table_id}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>\n'


def note(text: str) -> str:
    return f'<p class="note">{html.escape(text)}</p>\n'


def summary_section(runs: Sequence[Run]) -> str:
    cells = [RunSummary.of(run).cells() for run in runs]
    text = "<h2>Runs</h2>\n" + table("summary", ["run", *cells[0]], [[run.label, *row.values()]
                                                                     for run, row in zip(runs, cells, strict=True)])
    text += note("Training time: wall-clock time of training summed over resumes, as train.max_time counts it; "
                 "GPU-hours: that time × the training processes; tokens/s: the median of the train lines; –: not "
                 "in the run's files (runs logged by an mtx from before the clock was logged have no time).")
    for run in runs:
        if run.tensorboard is not None:
            text += note(f"{run.label}: TensorBoard event files in {run.tensorboard} "
                         f"(tensorboard --logdir {run.tensorboard}).")
    return text


def curves_section(runs: Sequence[Run], charts: Sequence[Chart]) -> str:
    text = "<h2>Learning curves</h2>\n"
    unclocked = [run.label for run in runs if not run.logs_clock]
    if unclocked:
        text += note(f"{', '.join(unclocked)}: metrics.jsonl has no training clock (no seconds field: written by an "
                     "mtx from before it was logged), so they are drawn against steps only.")
    for chart in charts:
        source = "data:image/svg+xml;base64," + base64.b64encode(chart.svg).decode("ascii")
        text += (f'<figure><img class="chart" src="{source}" alt="{html.escape(chart.description)}">'
                 f"<figcaption class=\"note\">{html.escape(chart.description)}</figcaption></figure>\n")
    return text if charts else text + note("No train or valid lines to draw yet.")


def time_to_bleu_section(runs: Sequence[Run], levels: Sequence[float]) -> str:
    text = "<h2>Time to BLEU</h2>\n"
    if not levels:
        return text + note("No BLEU levels to report: set train.bleu_milestones in the recipe (e.g. [20, 25, 27]) "
                           "or pass --bleu-milestones 20,25,27.")
    rows = []
    for run in runs:
        for level in levels:
            milestone = time_to_bleu(run, level)
            if milestone is None:
                rows.append([run.label, f"{level:g}", "not reached", "", "", "", "", ""])
                continue
            rows.append([run.label, f"{level:g}", f"{milestone.step:,}", f"{milestone.valid_bleu:.2f}",
                         duration(milestone.seconds), gpu_hours(milestone.gpu_seconds),
                         NOT_RECORDED if milestone.tokens is None else f"{milestone.tokens:,}",
                         "milestone line" if milestone.recorded else "valid lines"])
    return text + table("time-to-bleu", ["run", "BLEU level", "step", "valid BLEU", "training time", "GPU-hours",
                                         "target tokens", "from"], rows)


def scores_section(runs: Sequence[Run]) -> str:
    text = "<h2>Score cards</h2>\n"
    rows = []
    for run in runs:
        for name, card in run.scores.items():
            signatures = card.get("signatures") or {"bleu": card.get("signature", "")}
            for metric in ("bleu", "paper_bleu", "chrf", "ter"):
                if isinstance(card.get(metric), int | float):
                    rows.append([run.label, name, metric, f"{card[metric]:.2f}", card.get("n_sentences", ""),
                                 signatures.get(metric, "")])
    if not rows:
        return text + note("No score*.json in the run folders (e.g. mtx score -r REF -i HYP --json > "
                           "RUN/score.json).")
    return text + table("scores", ["run", "file", "metric", "score", "sentences", "signature"], rows,
                        text_columns={5})


def recipe_section(runs: Sequence[Run]) -> str:
    text = "<h2>Recipe and model</h2>\n"
    known = [run for run in runs if run.checkpoint is not None]
    text += table("model", ["run", "parameters", "checkpoint read"],
                  [[run.label, count(run.checkpoint.parameters), str(run.checkpoint.path)] for run in known])
    missing = [run.label for run in runs if run.checkpoint is None]
    if missing:
        text += note(f"{', '.join(missing)}: no checkpoint yet, so no recipe or model size.")
    rows = recipe_rows(runs)
    if len(runs) == 1:
        caption = "The full recipe of the run, as its checkpoint holds it."
    else:
        caption = "The recipe keys whose values differ between the runs." if rows else \
            "The runs' recipes do not differ."
    text += note(caption)
    if rows:
        text += table("recipe", ["key", *(run.label for run in runs)], [[key, *values] for key, values in rows],
                      text_columns=range(1, len(runs) + 1))
    return text


def data_section(runs: Sequence[Run]) -> str:
    """The manifests side by side: the source, the split sizes, then each filter's drops; a column per run."""
    text = "<h2>Data</h2>\n"
    prepared = [run for run in runs if run.manifest is not None]
    if len(prepared) < len(runs):
        text += note(f"{', '.join(run.label for run in runs if run.manifest is None)}: no data/manifest.json.")
    if not prepared:
        return text
    manifests = [run.manifest for run in prepared]
    rows = [[what, *(shown(lookup(manifest, keys)) for manifest in manifests)]
            for what, keys in manifest_rows(manifests)]
    return text + table("data", ["", *(run.label for run in prepared)], rows)


def manifest_rows(manifests: Sequence[dict[str, Any]]) -> list[tuple[str, tuple[str, ...]]]:
    """(what, the keys leading to it) for every count that some of `manifests` holds."""
    splits = dict.fromkeys(split for manifest in manifests for split in manifest.get("splits", {}))
    filters = dict.fromkeys(name for manifest in manifests for name in lookup(manifest, ("filter", "dropped")) or {})
    rows = [("source", ("source", "kind")), ("source language", ("src_lang",)), ("target language", ("tgt_lang",)),
            ("vocabulary", ("vocab_size",))]
    for split in splits:
        rows += [(f"{split} pairs", ("splits", split, "pairs")),
                 (f"{split} source tokens", ("splits", split, "src_tokens")),
                 (f"{split} target tokens", ("splits", split, "tgt_tokens"))]
    rows.append(("training pairs read", ("filter", "read")))
    rows += [(f"dropped: {name}", ("filter", "dropped", name)) for name in filters]
    rows.append(("training pairs kept", ("filter", "kept")))
    return rows


def lookup(mapping: Any, keys: Sequence[str]) -> Any:
    """mapping[keys[0]][keys[1]]…, or None where a key is missing."""
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping:
            return None
        mapping = mapping[key]
    return mapping


def shown(value: Any) -> str:
    return "–" if value is None else f"{value:,}" if isinstance(value, int) else str(value)


def validations_section(runs: Sequence[Run]) -> str:
    text = "<h2>Validations</h2>\n"
    for n, run in enumerate(runs):
        pairs = pair_curves([run])  # a model of several language pairs: a BLEU column each
        rows = [[f"{line['step']:,}", duration(line.get("seconds")), number(line.get("valid_loss"), 4),
                 number(line.get("valid_ppl"), 3), number(line.get("valid_bleu"), 2),
                 number(line.get("valid_length_ratio"), 3), count(line.get("tokens")),
                 *(number(curve.value(line), 2) for curve in pairs)]
                for line in run.valid]
        text += (f"<details><summary>{html.escape(run.label)}: {len(rows)} validations</summary>\n"
                 + table(f"valid-{n}", ["step", "training time", "valid loss", "valid ppl",
                                        "valid BLEU", "length ratio", "target tokens",
                                        *(f"BLEU {curve.pair}" for curve in pairs)], rows)
                 + "</details>\n")
    return text
