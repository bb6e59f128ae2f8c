"""MkDocs hooks: the pages and pictures of the site that are generated from the code at build time, so that they
cannot drift from it.

    reference/cli.md       every `mtx` command, its help and its options, read off the Typer application
    reference/recipe.md    every recipe key with its type, range, default and help (what `mtx config --keys` lists)
    reference/http.md      `mtx serve`'s HTTP API, from the OpenAPI document of the server's own application
    reference/openapi.json that document, to download
    diagrams/NAME.svg      each docs/diagrams/NAME.dot drawn by Graphviz's `dot` (Debian's graphviz package)

A page may also hold `<!-- mtx: demo-commands -->`, replaced by the commands `make demo` runs as the Makefile
spells them (the one place they are kept; tests/integration/test_docs.py runs them), and `<!-- mtx: model-presets -->`,
replaced by the table of the model presets (mtx.config.model.PRESETS), and `<!-- mtx: ct2-capabilities -->`,
replaced by what CTranslate2 does with each request field or why the `ct2` engine refuses it
(mtx.decode.ct2_capabilities.CAPABILITIES), and `<!-- mtx: extras -->`, replaced by the optional extras of
pyproject.toml, each with the comment above it (why it exists) and what it installs. The footer of every page
names mtx's version (mtx.__version__). The generators are plain functions of the code, so the tests call
them directly.
"""

from __future__ import annotations

import dataclasses
import html
import inspect
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from mtx.config.keys import LIST_ITEM, KeyHelp, all_keys

ROOT = Path(__file__).resolve().parent.parent
DIAGRAMS = ROOT / "docs" / "diagrams"
DEMO_COMMANDS = "<!-- mtx: demo-commands -->"
MODEL_PRESETS = "<!-- mtx: model-presets -->"
CT2_CAPABILITIES = "<!-- mtx: ct2-capabilities -->"
EXTRAS = "<!-- mtx: extras -->"


# ----------------------------------------------------------------------------------------------- the command line


def cli_reference() -> str:
    """One section per command, in the order `mtx --help` lists them: its usage, its help, then each argument and
    option as `mtx COMMAND --help` words it (defaults and ranges included), each its own entry with an anchor
    (`cli.md#mtx-translate--beam`), so that the site's search finds an option as a section of its own."""
    import typer.main

    from mtx.cli import app

    group = typer.main.get_command(app)
    root = group.make_context("mtx", [], resilient_parsing=True)
    parts = ["# Command line\n",
             "Every command of `mtx`, generated from the command line itself: what `mtx COMMAND --help` prints. "
             "Global options come before the command: `mtx --debug translate ...` shows tracebacks instead of "
             "one-paragraph errors.\n", "## Global options {#global-options}\n",
             _entries("mtx", group.get_params(root), root),
             "## Commands {#commands}\n", "| command | what it does |\n|---|---|"]
    commands = list(group.commands.items())
    parts += [f"| [`mtx {name}`](#mtx-{name}) | {_cell(command.get_short_help_str(limit=120))} |"
              for name, command in commands]
    for name, command in commands:
        ctx = command.make_context(name, [], parent=root, resilient_parsing=True)
        usage = " ".join(["mtx", name, *command.collect_usage_pieces(ctx)])
        parts += [f"\n## mtx {name} {{#mtx-{name}}}\n", f"```text\n{usage}\n```\n", _paragraphs(command.help or ""),
                  _entries(f"mtx-{name}", command.get_params(ctx), ctx)]
    return "\n".join(parts) + "\n"


def _entries(prefix: str, params: list[Any], ctx: Any) -> str:
    """Each parameter with help as a level-4 heading (its options and metavar) and its help as a paragraph; the
    anchor is the command's and the parameter's longest option (`mtx-translate--beam`, `mtx-config-recipe`)."""
    parts = []
    for param in params:
        record = param.get_help_record(ctx)
        if record is None:
            continue
        opts, help_ = record
        name = max(param.opts, key=len) if param.opts else param.name
        parts.append(_entry(opts, f"{prefix}{'' if name.startswith('-') else '-'}{name}", help_))
    return "\n".join(parts) + "\n"


def _entry(title: str, anchor: str, help_: str, facts: str = "") -> str:
    """A reference's entry (a command's option, a recipe key, an HTTP field): a level-4 heading of its name with its
    own anchor, which the site's search finds as a section of its own; its type and default (`facts`, HTML) on a
    line under it; then its help."""
    line = f'<p class="mtx-facts">{facts}</p>\n' if facts else ""
    return f"#### `{title}` {{#{anchor}}}\n\n{line}{_paragraphs(help_)}"


def _paragraphs(text: str) -> str:
    """A docstring's paragraphs as HTML: help text is not Markdown (it holds `*`, `<TAB>`, `|`), but its code spans
    are shown as code."""
    blocks = [" ".join(line.strip() for line in block.splitlines()) for block in inspect.cleandoc(text).split("\n\n")]
    return "\n".join(f"<p>{_inline(block)}</p>" for block in blocks if block) + "\n"


def _inline(text: str) -> str:
    """Plain text as HTML, escaped, its `code spans` as <code> (inside HTML, Markdown would leave the backticks)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _cell(text: str) -> str:
    return _inline(text).replace("|", "&#124;")


# ----------------------------------------------------------------------------------------------- the recipe keys


def recipe_reference() -> str:
    """Every recipe key, one section per recipe section, each key a level-4 heading with its own anchor
    (`recipe.md#train.max_tokens`), so that the site's search finds a key as a section of its own."""

    parts = ["# Recipe keys\n",
             "Every key a recipe may hold, generated from the recipe's dataclasses (`mtx/config/`): the same list "
             "as `mtx config --keys`, which with a recipe also shows that recipe's own values. Any key can be set "
             "on the command line with `--set KEY=VALUE`, typed as YAML types it. Keys under `data.sources[i]` "
             "belong to each item of the list `data.sources`.\n"]
    sections: dict[str, tuple[str, list[KeyHelp]]] = {"": ("The keys at the top of a recipe.", [])}
    for key in all_keys():  # depth first: a section's own keys may follow its subsections'
        if key.section:
            sections[key.key] = (key.help, [])
        else:
            parent = key.key.rsplit(".", 1)[0] if "." in key.key else ""
            sections[parent.removesuffix(LIST_ITEM)][1].append(key)  # data.sources[i].tag is data.sources's
    for name, (help_, keys) in sections.items():
        level = "##" if "." not in name else "###"
        parts.append(f"{level} {name or 'The run'} {{#{_anchor(name) or 'run'}}}\n\n{_paragraphs(help_)}")
        parts += [_key_entry(key) for key in keys]
    return "\n".join(parts)


def _anchor(key: str) -> str:
    """A key's anchor on the page: its dotted name, a list's items without their [i] (data.sources.tag)."""
    return html.escape(key.replace(LIST_ITEM, ""))


def _key_entry(key: KeyHelp) -> str:
    kind = key.type + ("" if key.range is None else f", {key.range}")
    default = "required" if key.default is None else f"default <code>{html.escape(key.default)}</code>"
    return _entry(key.key, _anchor(key.key), key.help, f"{html.escape(kind)} · {default}")


# ----------------------------------------------------------------------------------------------- the HTTP API


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document of `mtx serve`'s application with the command's default limits, before a model is
    loaded (the rules only a model can state, such as its decoder layers, are added by a running server's
    /openapi.json)."""
    from mtx.serve.app import create_app
    from mtx.serve.command import serve
    from mtx.serve.service import Limits, TranslationService

    default = {name: p.default for name, p in inspect.signature(serve).parameters.items()}
    limits = Limits(**{f.name: default[f.name] for f in dataclasses.fields(Limits)})
    service = TranslationService([], engine=default["engine"], device="cpu", dtype="fp32", threads=1,
                                 batch_tokens=default["batch_tokens"],
                                 max_wait=default["max_wait_ms"] / 1000, max_queue=default["max_queue"], limits=limits)
    return create_app(service, on_failed_load=lambda: None).openapi()


def http_reference(document: dict[str, Any]) -> str:
    """The paths of the document, each with its request's fields and its answers; the limits quoted are the
    defaults of `mtx serve`'s flags."""
    schemas = document["components"]["schemas"]
    parts = ["# HTTP API\n",
             f"`mtx serve` answers over HTTP ({_inline(document['info']['description'])}) This page is "
             "generated from the server's own OpenAPI document, with `mtx serve`'s default limits "
             "(`--max-sentences`, `--max-chars`, `--max-beam`); a running server publishes its document, with its "
             "own limits and the loaded model's rules, at `/openapi.json` and shows it at `/docs`. "
             "[This document as JSON](openapi.json). Every answer that is not a translation is "
             '`{"error": message}`, with `"field"` naming the request field at fault where there is one.\n']
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            anchor = f"{method}-{path.strip('/').replace('/', '-')}"
            parts.append(f"## {method.upper()} {path} {{#{anchor}}}\n")
            parts.append(_paragraphs(operation.get("description") or operation.get("summary", "")))
            body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body is not None:
                parts += ["### Request body\n", _paragraphs(body.get("description", "")),
                          _fields(body, schemas, anchor)]
            parts.append("### Answers\n")
            for status, answer in operation["responses"].items():
                schema = next(iter(answer.get("content", {}).values()), {}).get("schema", {})
                name = _ref_name(schema)
                shape = f" — `{name}`" if name else ""
                parts.append(f"- **{status}** {_inline(answer.get('description', ''))}{shape}")
            parts.append("")
    parts.append("## Schemas {#schemas}\n")
    for name, schema in schemas.items():
        if name in ("HTTPValidationError", "ValidationError"):
            continue  # FastAPI's own, never sent: this server answers 400 with {"error", "field"}
        parts += [f"### {name} {{#schema-{name.lower()}}}\n", _paragraphs(schema.get("description", "")),
                  _fields(schema, schemas, name.lower())]
    return "\n".join(parts) + "\n"


def _fields(schema: dict[str, Any], schemas: dict[str, Any], prefix: str) -> str:
    """Each field as a reference entry (`_entry`) anchored under `prefix` (`http.md#post-translate-beam`,
    `http.md#hypothesis-score`)."""
    required = set(schema.get("required", []))
    parts = []
    for name, field in schema.get("properties", {}).items():
        default = "required" if name in required else "no default" if "default" not in field else (
            f"default <code>{html.escape(json.dumps(field['default']))}</code>")
        parts.append(_entry(name, f"{prefix}-{name}", field.get("description", ""),
                            f"{html.escape(_type(field, schemas))} · {default}"))
    return "\n".join(parts) + "\n"


def _type(field: dict[str, Any], schemas: dict[str, Any]) -> str:
    """A JSON Schema in words, with its range: "integer ≥ 1, ≤ 16 or null", "array of string (at most 256)"."""
    if "$ref" in field:
        return _ref_name(field)
    if "anyOf" in field:
        return " or ".join(_type(option, schemas) for option in field["anyOf"])
    if "enum" in field:
        return "one of " + ", ".join(json.dumps(v) for v in field["enum"])
    if "const" in field:
        return json.dumps(field["const"])
    kind = field.get("type", "any")
    if kind == "array":
        words = "array of " + _type(field.get("items", {}), schemas)
        return words + (f" (at most {field['maxItems']:,} items)" if "maxItems" in field else "")
    bounds = [f"{sign} {field[key]:g}" for key, sign in (("minimum", "≥"), ("exclusiveMinimum", ">"),
                                                           ("maximum", "≤"), ("exclusiveMaximum", "<"))
              if key in field]
    if "maxLength" in field:
        bounds.append(f"of at most {field['maxLength']:,} characters")
    return kind + (" " + ", ".join(bounds) if bounds else "")


def _ref_name(schema: dict[str, Any]) -> str:
    ref = schema.get("$ref") or schema.get("items", {}).get("$ref", "")
    return ref.rsplit("/", 1)[-1]


# ----------------------------------------------------------------------------------------------- diagrams, demo


def draw(source: Path) -> str:
    """A Graphviz source drawn as SVG by Debian's `dot`; the build fails with what to install if it is missing."""
    dot = shutil.which("dot")
    if dot is None:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"Drawing {source.name} needs Graphviz's dot: apt-get install graphviz (or brew install "
                          "graphviz).")
    svg = subprocess.run([dot, "-Tsvg", str(source)], capture_output=True, text=True, check=True).stdout
    return re.sub(r"<!--.*?-->\n?", "", svg, flags=re.S)  # dot's comments carry its version: the SVG stays stable


def demo_commands(makefile: Path = ROOT / "Makefile") -> list[str]:
    """The mtx commands of the Makefile's `demo` target, as a user types them in the repository."""
    text = makefile.read_text(encoding="utf-8")
    target = re.search(r"^demo:.*\n((?:\t.*\n)+)", text, flags=re.M)
    if target is None:
        raise ValueError("the Makefile has no demo target")
    variables = dict(re.findall(r"^(\w+)\s*:?=\s*(.*?)\s*$", text, flags=re.M))
    commands = []
    for line in target.group(1).splitlines():
        line = line.strip()
        if line.startswith("$(BIN)/mtx") and ".tmp" not in line:  # the --json line writes score.json atomically
            commands.append(line.replace("$(BIN)/", "").replace("$(DEMO)", variables["DEMO"]))
    return commands


def presets_table() -> str:
    """The model presets as a Markdown table, from the dictionary `model.preset` reads, with each one's parameter
    count at an 8,000-token shared vocabulary (what `mtx config` prints for a recipe)."""
    from mtx.config.model import PRESETS, ModelConfig, resolve_model
    from mtx.model.transformer import count_parameters_for

    rows = ["| preset | layers (encoder + decoder) | d_model | d_ff | heads | dropout | parameters (vocabulary 8,000) "
            "|", "|---|---|---|---|---|---|---|"]
    for name, shape in PRESETS.items():
        parameters = count_parameters_for(resolve_model(ModelConfig(preset=name)), 8000)
        rows.append(f"| {name} | {shape['layers_enc']}+{shape['layers_dec']} | {shape['d_model']} | {shape['d_ff']} | "
                    f"{shape['heads']} | {shape['dropout']} | {parameters / 1e6:.1f}M |")
    return "\n".join(rows)


def capabilities_table() -> str:
    """The `ct2` engine's capability table as a Markdown table, a row per request field in the table's order: its
    flag, how CTranslate2 honours it, and the values the engine refuses and why (the docstring of the row's
    condition; the refusal itself names the field and says that `--engine torch` does it)."""
    from mtx.config.decode import flag_name
    from mtx.decode.ct2_capabilities import CAPABILITIES, Capability

    honoured = Capability.refused  # the class's default condition: a row that refuses nothing
    rows = ["| option | what CTranslate2 does with it | refused when, and why |", "|---|---|---|"]
    for name, capability in CAPABILITIES.items():
        refused = "" if capability.refused is honoured else " ".join((inspect.getdoc(capability.refused) or "").split())
        rows.append(f"| `{flag_name(name)}` | {_cell(capability.how)} | {_cell(refused)} |")
    return "\n".join(rows)


def extras_table(pyproject: Path = ROOT / "pyproject.toml") -> str:
    """pyproject.toml's optional extras as a Markdown table: each extra, what needs it (the comment above it, the
    one place that says why it exists) and the packages it installs. `dev` and `docs` are for working on mtx."""
    text = pyproject.read_text(encoding="utf-8")
    section = text.split("[project.optional-dependencies]\n", 1)[1].split("\n[", 1)[0]
    rows = ["| extra | what needs it | it installs |", "|---|---|---|"]
    comment: list[str] = []
    for entry in re.split(r"\n(?=\S)", section):  # a comment line, or an extra with its list (over lines too)
        if entry.startswith("#"):
            comment.append(entry.lstrip("# ").strip())
            continue
        name, packages = entry.split(" = ", 1)
        listed = packages.rpartition("]")[0]  # not a note after the list
        wheels = ", ".join(f"`{p}`" for p in re.findall(r'"([^"]+)"', listed))
        rows.append(f"| `{name}` | {' '.join(comment).replace('|', '&#124;')} | {wheels} |")
        comment = []
    return "\n".join(rows)


# ----------------------------------------------------------------------------------------------- MkDocs' hooks


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages and the drawn diagrams to the site."""
    from mkdocs.structure.files import File

    document = openapi_document()
    generated = {"reference/cli.md": cli_reference(), "reference/recipe.md": recipe_reference(),
                 "reference/http.md": http_reference(document),
                 "reference/openapi.json": json.dumps(document, indent=2, ensure_ascii=False) + "\n",
                 **{f"diagrams/{source.stem}.svg": draw(source) for source in sorted(DIAGRAMS.glob("*.dot"))}}
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if DEMO_COMMANDS in markdown:
        markdown = markdown.replace(DEMO_COMMANDS, "```bash\n" + "\n".join(demo_commands()) + "\n```")
    if MODEL_PRESETS in markdown:
        markdown = markdown.replace(MODEL_PRESETS, presets_table())
    if CT2_CAPABILITIES in markdown:
        markdown = markdown.replace(CT2_CAPABILITIES, capabilities_table())
    if EXTRAS in markdown:
        markdown = markdown.replace(EXTRAS, extras_table())
    return markdown


def on_config(config: Any) -> Any:
    """The version every page's footer names: the package's own (mtx.__version__)."""
    from mtx import __version__

    config["copyright"] = f"mtx {__version__}"
    return config

