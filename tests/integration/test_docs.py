"""The documentation site: it builds strictly from a checkout, its references are generated from the code and name
everything there is, nothing of the old README is lost, the commands of its Get started page run, and it works
in a real browser with no network.

The site is built once per session by `mkdocs build --strict` (docs/hooks.py generates the references and draws
the diagrams), which needs the docs extra, mtx[serve] (the HTTP reference is the server's own OpenAPI document)
and Graphviz's dot; without them these tests skip, as CI installs all three (.ci/run, `make install-extras`).
"""

from __future__ import annotations

import dataclasses
import html
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import CHROMIUM, Browser, chromium, png_pixels
from support import docs_hooks as hooks

ROOT = Path(__file__).resolve().parents[2]
README_LINES = 200

# The headings of the README before the site existed (1,166 lines at 7c2bba1): each is a heading of the site.
OLD_README_HEADINGS = [
    "mtx", "Set-up: two commands", "A tour", "Recipes: one YAML file per run", "mtx prepare: data",
    "mtx train: one CPU, one GPU, many GPUs on many nodes", "mtx average",
    "mtx export: to Hugging Face and CTranslate2", "mtx translate", "Serving: mtx serve",
    "mtx inspect: what every head saw", "mtx score", "mtx report: how runs went", "The model", "Beyond the paper",
    "Several corpora, tagged and weighted", "Fine-tuning", "Back-translation, end to end",
    "EMA: a moving average of the weights", "Subword vocabularies: styles and BPE-dropout",
    "Which defaults, measured", "Errors", "Speed", "Development", "Where things are",
]

needs_site = pytest.mark.skipif(
    importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("fastapi") is None
    or shutil.which("dot") is None,
    reason="the site needs the docs and serve extras (make install-extras) and Graphviz's dot (apt-get install "
    "graphviz)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as `make docs` builds it: strictly, so a broken link or anchor, a page missing from the
    navigation or a failing generator fails here."""
    out = tmp_path_factory.mktemp("site")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert result.returncode == 0, result.stderr[-5000:]
    return out


def headings(page: str) -> list[str]:
    """The text of a built page's h1–h6, tags and the permalink sign removed."""
    found = re.findall(r"<h([1-6])[^>]*>(.*?)</h\1>", page, flags=re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", text)).replace("¶", "").strip() for _, text in found]


@needs_site
def test_every_heading_of_the_old_readme_is_a_heading_of_the_site(site: Path) -> None:
    in_site = {h for page in site.rglob("*.html") for h in headings(page.read_text(encoding="utf-8"))}
    missing = [h for h in OLD_README_HEADINGS if h not in in_site]
    assert not missing, f"README headings with no page: {missing}"


def test_the_readme_is_short_and_links_into_the_site() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_LINES
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 10
    for link in links:
        assert (ROOT / link).is_file(), link
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]

    def pages(entry) -> list[str]:
        if isinstance(entry, str):
            return [entry]
        if isinstance(entry, list):
            return [p for item in entry for p in pages(item)]
        return [p for value in entry.values() for p in pages(value)]

    generated = {"reference/cli.md", "reference/recipe.md", "reference/http.md"}
    for page in pages(nav):
        assert page in generated or (ROOT / "docs" / page).is_file(), page
    assert "make demo" in readme and "make test" in readme


@needs_site
def test_the_recipe_reference_names_every_key_with_its_default(site: Path) -> None:
    from mtx.config.keys import LIST_ITEM, all_keys

    page = (site / "reference" / "recipe.html").read_text(encoding="utf-8")
    for key in all_keys():
        anchor = key.key.replace(LIST_ITEM, "")
        assert f'id="{anchor}"' in page, key.key
    entry = re.search(r'<h4 id="train.update_tokens">(.*?)(?=<h[1-4])', page, flags=re.S).group(1)
    (update_tokens,) = [k for k in all_keys() if k.key == "train.update_tokens"]
    text = " ".join(html.unescape(re.sub(r"<[^>]+>", "", entry)).split())
    assert update_tokens.help.replace("`", "") in text and update_tokens.default in text
    assert "`" not in html.unescape(re.sub(r"<code>.*?</code>|<pre.*?</pre>", "", page, flags=re.S)), \
        "a code span left as raw backticks"


@needs_site
@pytest.mark.parametrize("page", ["reference/http.html", "reference/cli.html"])
def test_the_references_show_code_spans_as_code(site: Path, page: str) -> None:
    text = (site / page).read_text(encoding="utf-8")
    assert "`" not in html.unescape(re.sub(r"<code>.*?</code>|<pre.*?</pre>", "", text, flags=re.S))


@needs_site
def test_the_cli_reference_holds_every_command_and_option(site: Path) -> None:
    import typer.main

    from mtx.cli import app

    page = html.unescape((site / "reference" / "cli.html").read_text(encoding="utf-8"))
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert f'id="mtx-{name}"' in page, name
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("-"):
                    assert opt in page, f"mtx {name} {opt}"
    assert "Must be in [0, 10]. [default: the recipe's, 1.0]" in page  # --lenpen's help, made from its field


@needs_site
def test_the_decoding_guide_says_what_the_ct2_engine_does_with_every_request_field(site: Path) -> None:
    """The guide's table is CTranslate2's capability table as the code holds it: a row per field of a request,
    each refusing row with its reason, so a new option or a new refusal is on the page without an edit."""
    from mtx.config.decode import flag_name
    from mtx.decode.request import Request

    guide = (ROOT / "docs" / "guides" / "decoding.md").read_text(encoding="utf-8")
    assert hooks().CT2_CAPABILITIES in guide
    page = html.unescape((site / "guides" / "decoding.html").read_text(encoding="utf-8"))
    table = re.search(r"<table>\s*<thead>\s*<tr>\s*<th>option</th>\s*<th>what CTranslate2 does with it</th>"
                      r".*?</table>", page, flags=re.S).group(0)
    cells = re.findall(r"<tr>\s*<td><code>(--[a-z-]+)</code></td>\s*<td>(.*?)</td>\s*<td>(.*?)</td>", table,
                       flags=re.S)
    assert sorted(flag for flag, _, _ in cells) == sorted(flag_name(f.name) for f in dataclasses.fields(Request))
    refused = {flag: why for flag, _, why in cells if why.strip()}
    assert {"--lenpen-style", "--sampling", "--shortlist", "--alignment-layer"} <= set(refused)
    assert "fairseq" in refused["--lenpen-style"]


@needs_site
def test_the_http_reference_is_the_servers_own_document(site: Path) -> None:
    from mtx.decode.request import PER_PROCESS, Request

    page = html.unescape((site / "reference" / "http.html").read_text(encoding="utf-8"))
    document = json.loads((site / "reference" / "openapi.json").read_text(encoding="utf-8"))
    assert set(document["paths"]) == {"/translate", "/health", "/metrics"}
    for anchor in ("post-translate", "get-health", "get-metrics"):
        assert f'id="{anchor}"' in page
    for field in dataclasses.fields(Request):  # a request's fields, but those the server fixes for every request
        assert (f"<code>{field.name}</code>" in page) == (field.name not in PER_PROCESS), field.name
    assert "at most 256 (--max-sentences)" in page  # the serve command's default limit


def test_the_generated_pages_follow_the_code_they_are_made_from(tmp_path: Path) -> None:
    """Made at build time from the code, so nothing to keep current by hand: a key, an option or a demo command
    added to the code is on the page. The Makefile's demo target is the one place the demo's commands are."""
    generators = hooks()
    commands = generators.demo_commands()
    assert commands[0] == "mtx prepare recipes/demo.yaml" and commands[1] == "mtx train recipes/demo.yaml"
    assert all(c.startswith("mtx ") and "$(" not in c for c in commands)
    makefile = tmp_path / "Makefile"
    makefile.write_text("DEMO := runs/x\ndemo: install\n\t$(BIN)/mtx prepare a.yaml\n\t@echo hi\n"
                        "\t$(BIN)/mtx score -r $(DEMO)/ref -i $(DEMO)/hyp\n\nother:\n\t$(BIN)/mtx no\n")
    assert generators.demo_commands(makefile) == ["mtx prepare a.yaml", "mtx score -r runs/x/ref -i runs/x/hyp"]
    reference = generators.recipe_reference()
    assert "#### `decode.lenpen` {#decode.lenpen}" in reference
    assert "#### `data.sources[i].tag` {#data.sources.tag}" in reference
    assert "## The run {#run}" in reference
    from mtx.config.model import PRESETS

    presets = generators.presets_table().splitlines()[2:]
    assert [row.split(" | ")[0].removeprefix("| ") for row in presets] == list(PRESETS)
    assert presets[2].startswith("| base | 6+6 | 512 | 2048 | 8 | 0.1 |")
    assert generators.MODEL_PRESETS in (ROOT / "docs" / "guides" / "recipes.md").read_text(encoding="utf-8")


def get_started_commands() -> list[str]:
    """Every shell command shown on the Get started page, the demo's as the build inserts them."""
    page = (ROOT / "docs" / "get-started.md").read_text(encoding="utf-8")
    page = page.replace(hooks().DEMO_COMMANDS, "```bash\n" + "\n".join(hooks().demo_commands()) + "\n```")
    blocks = re.findall(r"```bash\n(.*?)```", page, flags=re.S)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line and not line.startswith("#")]


@pytest.mark.slow
def test_every_command_of_the_get_started_page_runs(tmp_path: Path) -> None:
    """The page's `make` targets exist (`make -n`: `make test` is this suite, `make demo` is the commands below),
    and its mtx commands run as shown from a directory laid out as the repository is, with a demo recipe cut to
    60 updates of 1,024 tokens so that the test takes a minute: every command exits 0 but the BLEU gate, which
    must refuse the undertrained model (it is what makes `make demo` fail when the model did not learn)."""
    commands = get_started_commands()
    assert "make demo" in commands and "make test" in commands
    for target in [c.split()[1] for c in commands if c.startswith("make ")]:
        subprocess.run(["make", "-n", target], cwd=ROOT, check=True, capture_output=True, timeout=60)
    demo = yaml.safe_load((ROOT / "recipes" / "demo.yaml").read_text(encoding="utf-8"))
    demo["data"]["source"]["demo"] = {"pairs": 3000, "valid": 40, "test": 40}
    demo["train"].update(max_tokens=1024, max_steps=60, save_every=10, validate_every=60, valid_max_sentences=20,
                         log_every=10, warmup=20, bleu_milestones=[])
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "demo.yaml").write_text(yaml.safe_dump(demo), encoding="utf-8")
    for name in ("wmt14_en_de_base.yaml",):
        shutil.copy(ROOT / "recipes" / name, tmp_path / "recipes" / name)
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    ran = []
    for command in commands:
        if command.startswith("make "):
            continue
        words = command.split()
        assert words[0] == "mtx", command
        if words[1] == "report" and importlib.util.find_spec("matplotlib") is None:
            continue  # mtx[report]: make demo installs it
        result = subprocess.run([sys.executable, "-m", "mtx", *words[1:]], cwd=tmp_path, capture_output=True,
                                text=True, timeout=600, env=env)
        if "--min-bleu" in words:
            assert result.returncode == 1 and "below" in result.stderr.lower(), result.stderr
        else:
            assert result.returncode == 0, f"{command}:\n{result.stderr[-2000:]}"
        ran.append(words[1])
    assert {"prepare", "train", "average", "translate", "score", "config"} <= set(ran)
    assert (tmp_path / "runs" / "demo" / "test.hyp").stat().st_size > 0


# ------------------------------------------------------------------------------------------------- in a browser


@pytest.fixture(scope="module")
def served(site: Path):
    """The site on a static server at 127.0.0.1, as `python -m http.server -d site` serves it."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


OFFLINE = ("--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1", "--disable-background-networking",
           "--disable-component-update", "--no-first-run", "--disable-sync")


def page_requests(net_log: Path) -> list[str]:
    """The URLs a page asked for, from Chromium's network log: the requests with an initiator (the browser's own,
    such as its clock or its updater, have none)."""
    text = net_log.read_text(encoding="utf-8").rstrip()
    events = json.loads(text if text.endswith("}") else text.rstrip(",") + "]}")["events"]
    return [e["params"]["url"] for e in events if isinstance(e.get("params"), dict) and "url" in e["params"]
            and e["params"].get("initiator", "not an origin") != "not an origin"]


@needs_site
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium)")
@pytest.mark.parametrize("page", ["index.html", "guides/decoding.html", "reference/cli.html",
                                  "reference/http.html"])
def test_pages_render_in_a_browser_with_no_request_leaving_the_machine(served: str, page: str, tmp_path: Path
                                                                       ) -> None:
    net_log, shot = tmp_path / "net.json", tmp_path / "page.png"
    chromium(f"--log-net-log={net_log}", f"--screenshot={shot}", "--window-size=1200,900", *OFFLINE,
             f"{served}/{page}", folder=tmp_path)
    requests = page_requests(net_log)
    assert any(url.startswith(served) and url.endswith(".css") for url in requests), requests  # it loaded its own
    outside = [url for url in requests if not url.startswith((served, "data:", "blob:"))]
    assert not outside, outside
    width, height, rows = png_pixels(shot.read_bytes())
    step = len(rows[0]) // width
    dark = sum(1 for row in rows for i in range(0, len(row), step) if max(row[i:i + 3]) < 110)
    assert dark > 2000, "the page shows almost no text"
    dom = chromium("--dump-dom", *OFFLINE, f"{served}/{page}", folder=tmp_path).stdout.decode()
    assert 'class="md-nav' in dom and "md-content" in dom


def search(url: str, query: str, folder: Path) -> list[str]:
    """The links of the search results, in order, for `query` typed into the search box of the page at `url`, in
    headless Chromium with no network (the host resolver maps every name to nothing)."""
    browser = Browser(folder, *OFFLINE)
    try:
        browser.open(url)
        assert browser.wait_for("document.querySelector('[data-md-component=search-query]') !== null")
        browser.evaluate(f"""(() => {{ const box = document.querySelector('[data-md-component=search-query]');
                                      box.focus(); box.value = {json.dumps(query)};
                                      box.dispatchEvent(new KeyboardEvent('keyup', {{key: 's'}}));
                                      box.dispatchEvent(new Event('input')); }})()""")
        found = browser.wait_for("""[...document.querySelectorAll('.md-search-result__item > a')]
                                   .map(a => a.getAttribute('href')).join(' ')""")
    finally:
        browser.close()
    return found.split() if found else []


@needs_site
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium)")
@pytest.mark.parametrize("opened", ["served", "from disk"])
def test_the_search_box_finds_a_recipe_keys_entry_first_offline(served: str, site: Path, opened: str,
                                                                 tmp_path: Path) -> None:
    """Typed into the search box of the front page, lenpen_style leads first to its entry in the recipe reference:
    on a static server, and opened from disk (file://), where the search worker runs through the site's own copy
    of iframe-worker's shim."""
    url = f"{served}/index.html" if opened == "served" else (site / "index.html").as_uri()
    entries = [link for link in search(url, "lenpen_style", tmp_path) if "#" in link]  # sections, not pages
    assert entries, "the search found no section"
    assert "reference/recipe.html" in entries[0] and entries[0].endswith("#decode.lenpen_style"), entries[:5]


@needs_site
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian's chromium)")
@pytest.mark.parametrize(("query", "entry"), [("line_offset", "reference/http.html#post-translate-line_offset"),
                                              ("split-sentences", "reference/cli.html#mtx-translate--split-sentences")])
def test_the_search_box_finds_options_and_fields_as_entries(served: str, query: str, entry: str,
                                                            tmp_path: Path) -> None:
    """An HTTP field and a command's option are search sections of their own too, each with its anchor."""
    results = search(f"{served}/index.html", query, tmp_path)
    page, anchor = entry.split("#")
    assert any(page in link and link.endswith(f"#{anchor}") for link in results), results[:8]


def test_the_errors_page_quotes_messages_the_code_writes() -> None:
    """Each row of the errors page quotes how a message begins: the quote is in mtx's source, so a message
    reworded in the code fails here until the page follows."""
    page = (ROOT / "docs" / "reference" / "errors.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (?!what is wrong|---)(.+?) \| `([^`]+)` \| (.+?) \|$", page, flags=re.M)
    assert len(rows) >= 12
    source = "\n".join(path.read_text(encoding="utf-8") for path in (ROOT / "mtx").rglob("*.py"))
    missing = [quote for _, quote, _ in rows if quote not in source]
    assert not missing, f"quoted on the errors page but written nowhere in mtx/: {missing}"


def test_the_version_is_written_once_and_shown_on_the_site() -> None:
    """mtx.__version__ is the one place: pyproject reads it, `mtx --version` prints it, every page's footer and
    the changelog's newest entry name it."""
    import mtx

    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'dynamic = ["version"]' in pyproject and 'version = {attr = "mtx.__version__"}' in pyproject
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert re.search(r"^## (\S+)", changelog, flags=re.M).group(1) == mtx.__version__
    config: dict[str, object] = {}
    hooks().on_config(config)
    assert config["copyright"] == f"mtx {mtx.__version__}"


def test_the_install_page_lists_every_extra_of_pyproject() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 and later

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    table = hooks().extras_table().splitlines()[2:]
    assert [row.split(" | ")[0].removeprefix("| ").strip("`") for row in table] == list(extras)
    for row, packages in zip(table, extras.values(), strict=True):
        assert row.split(" | ")[1].strip(), row  # why the extra exists, from the comment above it
        assert all(f"`{package}`" in row for package in packages), row
    assert hooks().EXTRAS in (ROOT / "docs" / "install.md").read_text(encoding="utf-8")


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="needs the docs extra (make install-extras)")
def test_a_build_without_graphviz_stops_with_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without Graphviz's dot the build stops on the first diagram with one line naming the package, as README's
    `make docs` paragraph says (MkDocs prints a PluginError as "ERROR - message", no traceback)."""
    from mkdocs.exceptions import PluginError

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no dot on the PATH
    with pytest.raises(PluginError, match=r"needs Graphviz's dot: apt-get install graphviz"):
        hooks().draw(ROOT / "docs" / "diagrams" / "model.dot")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "apt-get install graphviz" in readme and "`make docs` stops with a message" in readme


@needs_site
def test_no_page_of_the_site_names_an_issue_number(site: Path) -> None:
    """A reader cannot look up "issue 38": the pages, and what they include (TESTING.md, the notebook's sections),
    say what was done and when instead."""
    for page in sorted(site.rglob("*.html")):
        text = html.unescape(re.sub(r"<[^>]+>", " ", page.read_text(encoding="utf-8")))
        found = re.search(r"\bissues? \d+", text, flags=re.IGNORECASE)
        assert found is None, f"{page.relative_to(site)}: {text[max(0, found.start() - 60): found.end() + 20]!r}"
