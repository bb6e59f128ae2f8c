"""What a recipe's comments state is true: the files and modules they name exist, the model's shape and parameter
count are what `mtx config` resolves and prints for that recipe, and the BLEU the demo's header promises is the
gate `make demo` applies.

Comments are where a reader learns what a recipe does before running it, and nothing else reads them: a folder
moved or a preset changed leaves them wrong without a test. The shipped recipes (recipes/) and the walkthroughs'
(examples/) are read; what a comment states is found by the patterns below, each tested on a made-up header.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
from support import docs_hooks, snippet
from typer.testing import CliRunner

from mtx.cli import app

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
ALL_RECIPES = RECIPES + sorted((ROOT / "examples").rglob("*.yaml"))

# The folders and files at the top of the repository a comment may name (runs/ is what a run writes, not ours).
TOP = sorted(p.name for p in ROOT.iterdir()
             if not p.name.startswith(".") and p.name not in ("runs", "site") and not p.name.endswith(".egg-info"))


def comments(text: str) -> str:
    """The comments of a YAML file, one line each (a key's trailing comment included)."""
    return "\n".join(m.group(1) for m in re.finditer(r"(?:^|\s)#(.*)$", text, flags=re.M))


def paths_named(text: str) -> list[str]:
    """The repository paths a comment names: under a top-level folder (docs/guides/wmt14.md, mtx/data/demo/,
    bench/README.md), or a bare file name (run.sh, marian_teacher.py), which is the recipe's neighbour."""
    top = "|".join(re.escape(name) for name in TOP)
    under = re.findall(rf"(?<![\w./$-])((?:{top})/[\w./-]*[\w/])", text)
    bare = re.findall(r"(?<![\w./$-])([\w-]+\.(?:py|sh|md|yaml))\b(?![\w/])", text)
    return under + bare


def modules_named(text: str) -> list[str]:
    """The modules a comment runs: python -m mtx.data.demo."""
    return re.findall(r"python3? -m ([\w.]+)", text)


def parameters_stated(text: str) -> list[str]:
    """The parameter counts a comment states, as written: "about 1.2M parameters" → "1.2M"."""
    return re.findall(r"(\d+(?:\.\d+)?[MK]) parameters", text)


def written_as(count: int, stated: str) -> str:
    """A count rounded as `stated` writes it: 1,181,696 as "1.2M", 63,082,496 as "63M"."""
    number, unit = stated[:-1], stated[-1]
    decimals = len(number.partition(".")[2])
    return f"{count / {'M': 1e6, 'K': 1e3}[unit]:.{decimals}f}{unit}"


def shapes_stated(text: str) -> list[dict[str, float]]:
    """The model shapes a comment states: "2+2 layers, d_model 128, d_ff 512, 4 heads, dropout 0.1"."""
    shapes = []
    for line in text.splitlines():
        layers = re.search(r"(\d+)\+(\d+) layers", line)
        if layers is None:
            continue
        shape: dict[str, float] = {"layers_enc": int(layers.group(1)), "layers_dec": int(layers.group(2))}
        for field, pattern in (("d_model", r"d_model (\d+)"), ("d_ff", r"d_ff (\d+)"), ("heads", r"(\d+) heads"),
                               ("dropout", r"dropout ([\d.]+)")):
            if found := re.search(pattern, line):
                shape[field] = float(found.group(1))
        shapes.append(shape)
    return shapes


def bleu_promised(text: str) -> list[float]:
    """The test BLEU a header promises ("BLEU of at least 89", "BLEU above 80") and the gate its commands apply
    (`mtx score ... --min-bleu 89`)."""
    promised = re.findall(r"BLEU (?:of at least|at least|above|over|of)\s+(\d+(?:\.\d+)?)", text)
    gates = re.findall(r"--min-bleu\s+(\d+(?:\.\d+)?)", text)
    return [float(value) for value in promised + gates]


def demo_gate() -> float:
    """The BLEU below which `make demo` fails: the --min-bleu of the Makefile's demo target (its commands as the
    site's generator reads them, docs/hooks.py)."""
    (gate,) = re.findall(r"--min-bleu\s+(\d+(?:\.\d+)?)", "\n".join(docs_hooks().demo_commands()))
    return float(gate)


def mtx_config(recipe: Path) -> tuple[str, int]:
    """What `mtx config RECIPE` prints, and the parameter count on its last line (# params: 1,181,696 ...)."""
    result = CliRunner().invoke(app, ["config", str(recipe)])
    assert result.exit_code == 0, result.output
    last = result.output.strip().splitlines()[-1]
    count = re.match(r"# params: ([\d,]+)", last)
    assert count is not None, last
    return result.output, int(count.group(1).replace(",", ""))


# ----------------------------------------------------------------------------------------------- the recipes


@pytest.mark.parametrize("recipe", ALL_RECIPES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_a_recipe_names_exists(recipe: Path) -> None:
    text = comments(recipe.read_text(encoding="utf-8"))
    gone = [p for p in paths_named(text) if not (ROOT / p).exists() and not (recipe.parent / p).exists()]
    gone += [m for m in modules_named(text) if importlib.util.find_spec(m) is None]
    assert not gone, f"{recipe.relative_to(ROOT)} names what is not there: {gone}"


@pytest.mark.parametrize("recipe", [r for r in ALL_RECIPES if parameters_stated(comments(r.read_text("utf-8")))
                                    or shapes_stated(comments(r.read_text("utf-8")))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_model_a_recipe_states_is_what_mtx_config_resolves(recipe: Path) -> None:
    """The count is `mtx config`'s, at the recipe's vocabulary size (data.bpe.vocab_size, as it prints)."""
    import yaml

    text = comments(recipe.read_text(encoding="utf-8"))
    printed, count = mtx_config(recipe)
    for stated in parameters_stated(text):
        assert written_as(count, stated) == stated, f"{recipe.name}: {stated} parameters, mtx config: {count:,}"
    model = yaml.safe_load(printed)["model"]
    for shape in shapes_stated(text):
        assert {field: model[field] for field in shape} == shape, recipe.name


def test_the_demo_promises_the_bleu_make_demo_gates_on() -> None:
    text = comments((ROOT / "recipes" / "demo.yaml").read_text(encoding="utf-8"))
    assert bleu_promised(text), "the demo's header says what BLEU to expect"
    assert set(bleu_promised(text)) == {demo_gate()}


def test_the_shipped_recipes_state_their_parameters() -> None:
    """Each shipped recipe says how big its model is, so the test above has something to check."""
    for recipe in RECIPES:
        assert parameters_stated(comments(recipe.read_text(encoding="utf-8"))), recipe.name


# The pages that quote the demo's gate and `mtx config`'s counts for a newcomer.
FIRST_PAGES = [ROOT / "README.md", ROOT / "docs" / "index.md", ROOT / "docs" / "get-started.md"]


def test_the_first_pages_quote_mtx_config_and_the_demo_gate() -> None:
    """README and Get started quote what `mtx config` prints for a shipped recipe ("# params: 63,082,496
    (vocabulary 37,000)", "1.2M parameters") and `make demo`'s gate ("--min-bleu 89", "below BLEU 89")."""
    printed = {recipe.name: mtx_config(recipe) for recipe in RECIPES}
    last_lines = {output.strip().splitlines()[-1] for output, _ in printed.values()}
    quoted_lines = quoted_counts = gates = 0
    for page in FIRST_PAGES:
        text = page.read_text(encoding="utf-8")
        for line in re.findall(r"# params: [\d,]+ \(vocabulary [\d,]+\)", text):
            assert line in last_lines, f"{page.name}: {line}"
            quoted_lines += 1
        for stated in parameters_stated(text):
            assert stated in {written_as(count, stated) for _, count in printed.values()}, f"{page.name}: {stated}"
            quoted_counts += 1
        for gate in re.findall(r"(?:--min-bleu|below BLEU)\s+(\d+(?:\.\d+)?)", text):
            assert float(gate) == demo_gate(), f"{page.name}: {gate}"
            gates += 1
    assert quoted_lines and quoted_counts and gates


def with_includes(text: str) -> str:
    """A page with each `--8<-- "bench/README.md:NAME"` line replaced by that section of the notebook, as the site
    shows it (pymdownx.snippets)."""
    return re.sub(r'^--8<-- "(bench/README\.md:[a-z0-9_-]+)"$', lambda match: snippet(match.group(1)), text,
                  flags=re.M)


def test_the_readme_quotes_get_starteds_dated_times() -> None:
    """The README's measured times are Get started's, with the same date: one record, quoted, not a second one.
    Get started includes them from bench/README.md's sections, so those are read as the site shows them."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    page = " ".join(with_includes((ROOT / "docs" / "get-started.md").read_text(encoding="utf-8")).split())
    times = re.findall(r"\d+ min \d+ s", readme)
    assert times
    for time in times:
        assert time in page, time
    for date in re.findall(r"\d{4}-\d{2}-\d{2}", readme):
        assert date in page, date


# ----------------------------------------------------------------------------------------------- the patterns

OLD_DEMO_HEADER = """\
# The built-in demo: English→German on mtx's offline generated corpus (mtx/demo/), small enough to run
# model must learn to reorder and inflect, not to copy. Expect a test BLEU above 80 (docs/get-started.md).
# run.sh writes the corpus as files first: python -m mtx.data.demo runs/kd-corpus --pairs 20000
#   mtx score -r runs/demo/data/test.de -i runs/demo/test.hyp
model:
  preset: tiny          # 2+2 layers, d_model 128, d_ff 512, 4 heads: about 1.1M parameters
"""


def test_the_patterns_catch_the_old_demo_header() -> None:
    """The demo's header before these tests: a folder that had moved, a parameter count off by 0.1M, and a BLEU
    promise below the gate."""
    text = comments(OLD_DEMO_HEADER)
    assert paths_named(text) == ["mtx/demo/", "docs/get-started.md", "run.sh"]
    assert not (ROOT / "mtx/demo").exists() and (ROOT / "mtx/data/demo").exists()
    assert modules_named(text) == ["mtx.data.demo"]
    assert parameters_stated(text) == ["1.1M"] and written_as(1_181_696, "1.1M") == "1.2M"
    assert shapes_stated(text) == [{"layers_enc": 2, "layers_dec": 2, "d_model": 128, "d_ff": 512, "heads": 4}]
    assert bleu_promised(text) == [80.0] and demo_gate() == 89
    assert comments("name: demo\nrun_dir: runs/#1\n") == ""  # a # inside a value is no comment


def test_counts_are_compared_as_they_are_written() -> None:
    assert written_as(63_082_496, "63M") == "63M" and written_as(209_125_376, "214M") == "209M"
    assert written_as(1_181_696, "1182K") == "1182K" and written_as(1_181_696, "1.18M") == "1.18M"
