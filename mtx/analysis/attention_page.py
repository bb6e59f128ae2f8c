"""The attention of every layer and head as one self-contained HTML page (`mtx inspect -o attention.html`).

The page needs nothing beyond itself (no network, no external script, font or style sheet), so it can be
mailed, attached to an issue or opened offline. Its data is one JSON object (`page_data`) in a
<script type="application/json"> element; an inline script draws from it a picker of kind, layer and head, the
chosen heatmap as a table of cells with the token labels (each cell's tooltip gives its weight), and the table
of per-head statistics, whose rows also pick a heatmap. The view shown is kept in the address's fragment
(#cross/4/mean: kind, layer, head or "mean"), so a link can point at one heatmap.

Text from the sentence only ever reaches the page as escaped HTML or inside the JSON with "<", ">" and "&"
escaped, so a sentence holding "</script>" or "<b>" is shown as written and cannot end an element early; the
script sets labels with textContent, never as HTML.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from mtx.analysis.inspection import KINDS, TITLES, Inspection, View
from mtx.files import atomic_write_text

DECIMALS = 4  # of the weights in the page's data


def rounded(values: object) -> object:
    """Nested lists of floats, each rounded to DECIMALS places (which JSON then writes in as few digits)."""
    if isinstance(values, list):
        return [rounded(value) for value in values]
    return round(values, DECIMALS)


def page_data(inspection: Inspection) -> dict[str, object]:
    """What the page draws: the sentence and its translation, and for each kind its labels, the weights of
    every layer and head ([layer][head][row][column]) and of each layer's heads averaged ([layer][row][column]);
    then the statistics of every head and average (head null)."""
    kinds = []
    for kind in KINDS:
        maps = inspection.maps[kind]
        rows, columns = inspection.labels(kind)
        kinds.append({"name": kind, "title": TITLES[kind], "rows": rows, "columns": columns,
                      "causal": kind == "decoder", "layers": maps.shape[0], "heads": maps.shape[1],
                      "weights": rounded(maps.tolist()),
                      "mean": rounded([View(kind, layer, None).weights(inspection).tolist()
                                       for layer in range(maps.shape[0])])})
    return {"source": inspection.source, "translation": inspection.translation, "score": inspection.score,
            "forced": inspection.forced, "kinds": kinds, "statistics": [s.as_dict() for s in inspection.statistics]}


def script_json(data: object) -> str:
    """JSON that can stand inside a <script> element: no "<" (so no "</script>"), ">" or "&" in it."""
    text = json.dumps(data, ensure_ascii=False)
    return text.replace("&", "\\u0026").replace("<", "\\u003c").replace(">", "\\u003e")


STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #111; background: #fff; }
h1 { font-size: 20px; margin: 0 0 8px; }
.pair p { margin: 2px 0; }
.pair .what { color: #555; display: inline-block; width: 110px; }
#picker { margin: 16px 0 8px; }
#picker label { margin-right: 16px; }
#summary { color: #333; margin: 4px 0 12px; }
#heatmap { border-collapse: separate; border-spacing: 1px; }
#heatmap th { font-weight: normal; font-size: 12px; white-space: nowrap; padding: 0 4px; }
#heatmap th.column { writing-mode: vertical-rl; transform: rotate(180deg); text-align: left; padding: 4px 0; }
#heatmap th.row { text-align: right; }
#heatmap td { width: 22px; height: 22px; padding: 0; }
#heatmap td.masked { background: #f2f2f2; }
#statistics { border-collapse: collapse; margin-top: 24px; }
#statistics th, #statistics td { padding: 2px 10px; text-align: right; border-bottom: 1px solid #ddd; }
#statistics th:first-child, #statistics td:first-child { text-align: left; }
#statistics tbody tr { cursor: pointer; }
#statistics tr.chosen { background: #fde9a8; }
.note { color: #555; font-size: 12px; }
"""

SCRIPT = """
"use strict";
const data = JSON.parse(document.getElementById("attention-data").textContent);
const kinds = Object.fromEntries(data.kinds.map((kind) => [kind.name, kind]));
const LIGHT = [255, 255, 255], DARK = [8, 48, 107];
const picker = {kind: document.getElementById("kind"), layer: document.getElementById("layer"),
                head: document.getElementById("head")};

function shade(weight) {
  const [r, g, b] = LIGHT.map((light, i) => Math.round(light + (DARK[i] - light) * weight));
  return `rgb(${r}, ${g}, ${b})`;
}

function element(name, text, className) {
  const made = document.createElement(name);
  if (text !== undefined) made.textContent = text;
  if (className) made.className = className;
  return made;
}

function fillOptions(select, values, chosen) {
  select.replaceChildren(...values.map(([value, text]) => {
    const option = element("option", text);
    option.value = String(value);
    return option;
  }));
  select.value = values.some(([value]) => String(value) === String(chosen)) ? String(chosen) : select.options[0].value;
}

function choose(kindName, layer, head) {
  const kind = kinds[kindName] || data.kinds[0];
  picker.kind.value = kind.name;
  fillOptions(picker.layer, [...Array(kind.layers).keys()].map((n) => [n, `layer ${n}`]), layer);
  const heads = [...Array(kind.heads).keys()].map((n) => [n, `head ${n}`]);
  fillOptions(picker.head, [...heads, ["mean", "heads averaged"]], head);
  draw();
}

function statisticsOf(kind, layer, head) {
  return data.statistics.find((s) => s.kind === kind && s.layer === layer && s.head === head);
}

function percent(share) { return `${Math.round(100 * share)}%`; }

function draw() {
  const kind = kinds[picker.kind.value], layer = Number(picker.layer.value);
  const head = picker.head.value === "mean" ? null : Number(picker.head.value);
  const weights = head === null ? kind.mean[layer] : kind.weights[layer][head];
  const table = document.getElementById("heatmap");
  const header = element("tr");
  header.append(element("th"), ...kind.columns.map((label) => element("th", label, "column")));
  const lines = kind.rows.map((rowLabel, row) => {
    const line = element("tr");
    line.append(element("th", rowLabel, "row"));
    kind.columns.forEach((columnLabel, column) => {
      const cell = element("td");
      if (kind.causal && column > row) {
        cell.className = "masked";
      } else {
        const weight = weights[row][column];
        cell.className = "weight";
        cell.style.background = shade(weight);
        cell.title = `${rowLabel} → ${columnLabel}: ${(100 * weight).toFixed(1)}%`;
      }
      line.append(cell);
    });
    return line;
  });
  table.replaceChildren(element("thead"), element("tbody"));
  table.tHead.append(header);
  table.tBodies[0].append(...lines);
  const s = statisticsOf(kind.name, layer, head);
  document.getElementById("summary").textContent =
    `${kind.title}, layer ${layer}, ${head === null ? "heads averaged" : "head " + head}: ` +
    `entropy ${s.entropy_bits.toFixed(2)} bits, previous ${percent(s.previous)}, same ${percent(s.same)}, ` +
    `boundary ${percent(s.boundary)}, punctuation ${percent(s.punctuation)}`;
  for (const tr of document.querySelectorAll("#statistics tbody tr")) {
    tr.classList.toggle("chosen", tr.dataset.view === `${kind.name}/${layer}/${head === null ? "mean" : head}`);
  }
  history.replaceState(null, "", `#${kind.name}/${layer}/${head === null ? "mean" : head}`);
}

function statisticsTable() {
  const body = document.querySelector("#statistics tbody");
  body.replaceChildren(...data.statistics.map((s) => {
    const tr = element("tr");
    const head = s.head === null ? "mean" : s.head;
    tr.dataset.view = `${s.kind}/${s.layer}/${head}`;
    tr.append(element("td", kinds[s.kind].title), element("td", String(s.layer)), element("td", String(head)),
              element("td", s.entropy_bits.toFixed(2)), element("td", percent(s.previous)),
              element("td", percent(s.same)), element("td", percent(s.boundary)),
              element("td", percent(s.punctuation)));
    tr.addEventListener("click", () => choose(s.kind, s.layer, head));
    return tr;
  }));
}

fillOptions(picker.kind, data.kinds.map((kind) => [kind.name, kind.title]), data.kinds[0].name);
picker.kind.addEventListener("change", () => choose(picker.kind.value, picker.layer.value, picker.head.value));
picker.layer.addEventListener("change", draw);
picker.head.addEventListener("change", draw);
statisticsTable();
const [kind, layer, head] = decodeURIComponent(location.hash.slice(1)).split("/");
choose(kind, layer, head);
"""


def page(inspection: Inspection) -> str:
    """The whole page, as text."""
    score = f' <span class="note">(score {inspection.score:.4f})</span>'
    label = "Target given" if inspection.forced else "Translation"
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>mtx inspect: {html.escape(inspection.source)}</title>
<style>{STYLE}</style>
</head>
<body>
<h1>Attention of every layer and head</h1>
<div class="pair">
<p><span class="what">Source</span>{html.escape(inspection.source)}</p>
<p><span class="what">{label}</span>{html.escape(inspection.translation)}{score}</p>
</div>
<div id="picker">
<label>Kind <select id="kind"></select></label>
<label>Layer <select id="layer"></select></label>
<label>Head <select id="head"></select></label>
</div>
<p id="summary"></p>
<table id="heatmap"></table>
<p class="note">Rows: the source tokens (encoder) or the token each decoder step predicts; columns: the tokens
attended. A token that continues a word is shown after ·. Hover over a cell for its weight.</p>
<table id="statistics">
<caption class="note">Per-head statistics: entropy in bits; shares of attention on the previous position, the
same position, the sentence boundary (&lt;/s&gt; of the source, &lt;s&gt; of the target) and punctuation, means
over the query rows. Click a row to show its heatmap.</caption>
<thead><tr><th>kind</th><th>layer</th><th>head</th><th>entropy (bits)</th><th>previous</th><th>same</th>
<th>boundary</th><th>punctuation</th></tr></thead>
<tbody></tbody>
</table>
<script type="application/json" id="attention-data">{script_json(page_data(inspection))}</script>
<script>{SCRIPT}</script>
</body>
</html>
"""


def write_page(path: Path, inspection: Inspection) -> None:
    """The page, written atomically to `path`."""
    text = page(inspection)
    atomic_write_text(path, text)
