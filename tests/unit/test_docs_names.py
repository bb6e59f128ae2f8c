"""Nothing hand-copied goes stale: every `mtx COMMAND --flag` and every recipe key that the documentation names
exists.

Where names are read: the site's pages (docs/, with the files their `--8<--` snippets include), README.md, the
shipped recipes (recipes/) and the walkthroughs (examples/: recipes, scripts, READMEs, Python). The names are
checked against the code itself: the commands and their options against the Typer application (`mtx.cli.app`,
global options such as `--debug` before the command), the recipe keys against `mtx.config.keys.all_keys()` (what
`mtx config --keys` lists; an item of a list is written `data.sources[i].tag` or `data.sources[0].tag`).

What counts as a name:

- a command: `mtx`, `.venv/bin/mtx`, `python -m mtx` or a script's `"$mtx"`, then the command and every option
  up to the end of the shell command (`|`, `&&`, `;`, a `#` comment; a trailing `\\` continues it), in a code
  block or code span of a page, in a script, or in a recipe's comments; `--set KEY=VALUE` names the key KEY;
- a recipe key: a code span that is a dotted key and nothing else, optionally with its value (`train.max_tokens`,
  `decode.lenpen_style: gnmt`, `train.max_steps=200`); a dotted key in a recipe's or a script's comments
  ("(data.bpe.from)"); every key of a ```yaml block of a page that is a recipe or a part of one.

File names that look like keys (`train.en`, `model.pt`, `data.md`) are not keys. The extraction is tested on
made-up text below, with a misspelt flag and a misspelt key that must be caught.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import yaml
from support import snippet

from mtx.config.keys import LIST_ITEM, all_keys

ROOT = Path(__file__).resolve().parents[2]

# Names a page shows on purpose although they do not exist: (page, name) → why.
NOT_REAL = {
    ("docs/contributing/index.md", "decode.max_unk"): "the worked example of adding a decoding option",
    ("docs/contributing/index.md", "translate --max-unk"): "the worked example of adding a decoding option",
    ("docs/reference/errors.md", "train.max_token"): "the misspelt key whose message the page shows",
    ("docs/explanations/model.md", "model.output_weight"): "the Transformer module's attribute, not a recipe key",
}

# A dotted name whose last part is one of these is a file (train.en, model.pt, data.md), not a recipe key.
FILE_SUFFIXES = {"en", "de", "fr", "md", "py", "sh", "pt", "jsonl", "json", "tsv", "lock", "yaml", "yml", "log",
                 "txt", "safetensors", "hyp", "html", "svg", "csv", "bin", "npy", "idx", "spm"}


# ----------------------------------------------------------------------------------------------- what exists


@cache
def cli_options() -> dict[str, set[str]]:
    """Each command's options, both spellings of a flag pair (--tune-lenpen / --no-tune-lenpen) and --help; the
    key "" holds the global options, which come before the command."""
    import click
    import typer.main

    from mtx.cli import app

    group = typer.main.get_command(app)

    def options(command: click.Command) -> set[str]:
        params = command.get_params(click.Context(command))
        return {opt for p in params for opt in (*p.opts, *p.secondary_opts) if opt.startswith("-")}

    return {"": options(group), **{name: options(command) for name, command in group.commands.items()}}


@cache
def recipe_keys() -> frozenset[str]:
    return frozenset(k.key for k in all_keys())


@cache
def section_keys() -> frozenset[str]:
    return frozenset(k.key for k in all_keys() if k.section)


def top_sections() -> str:
    """The top-level sections a dotted key starts with (data, model, train, decode), as a regex alternative."""
    return "|".join(sorted({k.split(".")[0] for k in recipe_keys() if "." in k}))


def normal_key(name: str) -> str:
    """data.sources[0].tag → data.sources[i].tag."""
    return re.sub(r"\[(?:\d+|i)\]", LIST_ITEM, name)


def is_file_name(name: str) -> bool:
    return name.rsplit(".", 1)[-1] in FILE_SUFFIXES


# ----------------------------------------------------------------------------------------------- what is named


@dataclass(frozen=True)
class Name:
    """A name found in a file: a command's option ("translate --beam"), a command ("mtx evaluate"), or a recipe
    key ("train.max_tokens"), with the line it is on."""

    kind: str  # "option", "command" or "key"
    name: str
    line: int


def _tokens(text: str) -> list[str]:
    return re.findall(r"\"(?:[^\"\\]|\\.)*\"|'[^']*'|\S+", text)


_MTX = re.compile(r"""(?:^|[/=("'])\$?\{?mtx\}?["']?$""", re.IGNORECASE)
_COMMAND_POSITION = {"$", "-m", "&&", "||", "|", ";", "(", "$(", "srun", "exec", "time", "then", "do"}
_END = {"|", "||", "&&", ";", "&", ")"}


def commands_in(text: str, line: int = 1, strict: bool = True) -> list[Name]:
    """The options (and unknown commands) of every mtx command in shell-like text. strict: the text is code, so a
    word after `mtx` that is no command is named as one; else (prose in a comment) only the options of known
    commands are read, and an unknown command only where `mtx` opens the text."""
    found: list[Name] = []
    for tokens in _logical_lines(text, line):
        i = 0
        while i < len(tokens):
            token, _ = tokens[i]
            at_start = i == 0 or tokens[i - 1][0] in _COMMAND_POSITION or tokens[i - 1][0] == "#"
            if token.startswith("#"):  # a comment: prose to the end of the line
                strict = False
            if _MTX.search(token):
                i, names = _one_command(tokens, i + 1, strict or at_start)
                found += names
            else:
                i += 1
    return found


def _logical_lines(text: str, line: int) -> list[list[tuple[str, int]]]:
    """The tokens of each line with their line numbers, a line that ends in `\\` continued by the next."""
    logical: list[list[tuple[str, int]]] = [[]]
    for number, row in enumerate(text.split("\n"), start=line):
        tokens = _tokens(row)
        continued = bool(tokens) and tokens[-1] == "\\"
        logical[-1] += [(t, number) for t in (tokens[:-1] if continued else tokens)]
        if not continued:
            logical.append([])
    return [tokens for tokens in logical if tokens]


def _one_command(tokens: list[tuple[str, int]], i: int, strict: bool) -> tuple[int, list[Name]]:
    options = cli_options()
    names: list[Name] = []
    command = ""
    while i < len(tokens):
        raw, line = tokens[i]
        token = raw.strip("\"'")
        if token in _END or token.startswith("#"):
            return i, names
        flag = re.match(r"--?[A-Za-z][\w-]*", token)
        if flag is None:
            if command:  # an argument of the command
                i += 1
                if token.endswith((";", "|")):
                    return i, names
                continue
            if re.fullmatch(r"[a-z][a-z_-]*", token) and token in options:
                command = token
            elif re.fullmatch(r"[a-z][a-z_-]*", token) and strict:
                names.append(Name("command", f"mtx {token}", line))
                return i + 1, names
            else:  # a placeholder (COMMAND, ...) or prose: nothing more is read
                return i + 1, names
            i += 1
            continue
        opt = flag.group(0).rstrip("-")
        if command or strict:
            names.append(Name("option", f"{command} {opt}".strip(), line))
        if command and opt == "--set":
            value = token.split("=", 1)[1] if token.startswith("--set=") else (
                tokens[i + 1][0].strip("\"'") if i + 1 < len(tokens) else "")
            key = value.split("=", 1)[0]
            if "=" in value and re.fullmatch(r"[a-z_][\w.\[\]]*", key):
                names.append(Name("key", key, line))
        i += 1
    return i, names


def keys_in_prose(text: str, line: int = 1) -> list[Name]:
    """The dotted recipe keys in prose (a recipe's or a script's comments): data.bpe.from, train.tune_lenpen."""
    pattern = re.compile(rf"(?<![\w./$\-\[])(?:{top_sections()})(?:\.[a-z_]\w*|\[(?:\d+|i)\])+(?![\w/(])")
    return [Name("key", m.group(0), line + text.count("\n", 0, m.start())) for m in pattern.finditer(text)
            if not is_file_name(m.group(0))]


def key_of_span(span: str) -> str | None:
    """The key a code span names, if the span is a key and nothing else, or a key and its value."""
    match = re.fullmatch(rf"((?:{top_sections()})(?:\.[a-z_]\w*|\[(?:\d+|i)\])+)(?:\s*[:=].*)?", span.strip(),
                         flags=re.S)
    if match is None or is_file_name(match.group(1)):
        return None
    return match.group(1)


def keys_in_yaml(text: str, line: int = 1) -> list[Name]:
    """Every key of a ```yaml block that is a recipe or a part of one: from the top (train: ...) or under one
    section (filter: {...} of data); a block that is no mapping, or names no recipe key at its top, is not a
    recipe."""
    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return []
    if not isinstance(node, yaml.MappingNode):
        return []
    top = {k.value for k, _ in node.value if isinstance(k, yaml.ScalarNode)}
    roots = [""] + sorted(section_keys())
    if not any(normal_key(f"{root}.{name}" if root else name) in recipe_keys() for root in roots for name in top):
        return []
    # The section the block is written under: the one under which most of its keys exist (all, if it is right).
    named = [[Name("key", path, n) for path, n in _paths(node, line, root)] for root in roots]
    return max(named, key=lambda names: sum(normal_key(name.name) in recipe_keys() for name in names))


def _paths(node: yaml.MappingNode, line: int, prefix: str):
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        path = f"{prefix}.{key.value}" if prefix else key.value
        yield path, line + key.start_mark.line
        if normal_key(path) not in section_keys():
            continue
        if isinstance(value, yaml.MappingNode):
            yield from _paths(value, line, path)
        if isinstance(value, yaml.SequenceNode):
            for item in value.value:
                if isinstance(item, yaml.MappingNode):
                    yield from _paths(item, line, path + LIST_ITEM)


def names_in_markdown(text: str) -> list[Name]:
    """The names in a Markdown page: its code blocks (commands; keys of yaml blocks), its code spans (commands,
    keys), the files its snippets include as if they were written in it."""
    found: list[Name] = []
    lines = text.split("\n")
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"(\s*)(`{3,}|~{3,})\s*([\w+-]*)", lines[i])
        include = re.match(r"\s*--8<--\s+\"([^\"]+)\"\s*$", lines[i])
        if include:
            found += [Name(n.kind, n.name, i + 1) for n in names_in_markdown(snippet(include.group(1)))]
            i += 1
            continue
        if fence is None:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        indent, mark, language = fence.groups()
        body, start = [], i + 1
        i += 1
        while i < len(lines) and not re.match(rf"\s*{mark[0]}{{{len(mark)},}}\s*$", lines[i]):
            body.append(lines[i][len(indent):] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        block = "\n".join(body)
        if re.match(r"\s*--8<--", block):  # a recipe shown whole: the block is the file
            block = snippet(re.search(r"\"([^\"]+)\"", block).group(1))
        found += commands_in(block, start + 1)
        if language in ("yaml", "yml"):
            found += keys_in_yaml(block, start + 1)
    found += names_in_spans(prose)
    return found


def names_in_spans(prose: list[tuple[int, str]]) -> list[Name]:
    """The names in the code spans of the prose lines (a span may run over a line break)."""
    found: list[Name] = []
    text = "\n".join(line for _, line in prose)
    numbers = [n for n, _ in prose]
    for match in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", text, flags=re.S):
        span, line = match.group(2).replace("\n", " "), numbers[text.count("\n", 0, match.start())]
        found += commands_in(span, line)
        key = key_of_span(span)
        if key is not None:
            found.append(Name("key", key, line))
    return found


def names_in_script(text: str) -> list[Name]:
    """The names in a recipe or a script: the commands of its code, and the commands and keys of its comments."""
    found: list[Name] = []
    code = []
    for number, line in enumerate(text.split("\n"), start=1):
        parts = re.split(r"(?:^|(?<=\s))#", line, maxsplit=1)
        code.append(parts[0])
        if len(parts) == 2:
            note = parts[1].lstrip("#")
            found += commands_in(note, number, strict=False) + keys_in_prose(note, number)
    return commands_in("\n".join(code)) + found


def names_in_python(text: str) -> list[Name]:
    """The names in a Python file: the commands and keys in its code spans (docstrings) and its comments."""
    found = names_in_spans(list(enumerate(text.split("\n"), start=1)))
    for number, line in enumerate(text.split("\n"), start=1):
        if "#" in line:
            note = line.split("#", 1)[1]
            found += commands_in(note, number, strict=False) + keys_in_prose(note, number)
    return found


def names_in(path: Path) -> list[Name]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        return names_in_markdown(text)
    if path.suffix == ".py":
        return names_in_python(text)
    return names_in_script(text)


def missing(name: Name) -> bool:
    if name.kind == "key":
        return normal_key(name.name) not in recipe_keys()
    if name.kind == "command":
        return True
    command, _, option = name.name.rpartition(" ")
    return command not in cli_options() or option not in cli_options()[command]


def documented_files() -> list[Path]:
    examples = [p for p in sorted((ROOT / "examples").rglob("*")) if p.suffix in (".yaml", ".yml", ".sh", ".md", ".py")]
    return [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md", *sorted((ROOT / "recipes").glob("*.yaml")),
            *examples]


# ----------------------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("path", documented_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_option_and_recipe_key_named_exists(path: Path) -> None:
    relative = path.relative_to(ROOT).as_posix()
    wrong = [f"{relative}:{n.line}: {n.kind} {n.name}" for n in names_in(path)
             if missing(n) and (relative, n.name) not in NOT_REAL]
    assert not wrong, "named but not in mtx:\n" + "\n".join(wrong)


def test_the_documentation_names_commands_options_and_keys_at_all() -> None:
    """A reader that found nothing would pass: the pages between them name every command and many keys."""
    names = [n for path in documented_files() for n in names_in(path)]
    commands = {n.name.split()[0] for n in names if n.kind == "option" and not n.name.startswith("-")}
    assert set(cli_options()) - {""} <= commands, set(cli_options()) - commands
    assert len({n.name for n in names if n.kind == "option"}) > 50
    assert len({n.name for n in names if n.kind == "key"}) > 60


def test_not_real_names_are_still_on_their_page() -> None:
    for (page, name), _why in NOT_REAL.items():
        assert name in {n.name for n in names_in(ROOT / page)}, (page, name)


FAKE_PAGE = """\
# A page

Run `mtx translate -m model.pt --beem 5` and `mtx --debug translate --beam 5`, or
`mtx score -r ref.de
-i hyp.de --min-blue 30`. Set `train.max_tokns: 4096` or `decode.lenpen_style: gnmt`; the files `train.en`
and `model.pt` are files, and `mtx` alone is the program.

```bash
mtx prepare recipe.yaml --set train.max_stepz=200 --set data.sources[0].tag='<bt>'
.venv/bin/mtx average --dir runs/x/checkpoints \\
    --lats 5 -o average.pt | grep --colour avg   # --not-a-flag: a comment
mtx evaluate recipe.yaml
mtx COMMAND --help
torchrun --nproc-per-node 8 -m mtx train recipe.yaml --restart
```

```yaml
train:
  max_tokens: 4096
  warmpu: 100
data:
  sources:
    - files: {train: [a.en, a.de]}
      tga: <bt>
```

```yaml
filter: {numbers: true, max_word_len: 50}
```

```yaml
filter: {numbers: true, max_wrod_len: 50}
```
"""


def test_the_reader_catches_a_misspelt_flag_key_and_command() -> None:
    names = names_in_markdown(FAKE_PAGE)
    wrong = {n.name for n in names if missing(n)}
    assert wrong == {"translate --beem", "score --min-blue", "train.max_tokns", "train.max_stepz", "average --lats",
                     "mtx evaluate", "train.warmpu", "data.sources[i].tga", "data.filter.max_wrod_len"}
    found = {n.name for n in names}
    assert {"--debug", "translate --beam", "translate -m", "score -i", "decode.lenpen_style", "data.sources[0].tag",
            "prepare --set", "average -o", "train --restart", "train.max_tokens", "data.filter.numbers",
            "data.filter.max_word_len", "data.sources[i].files"} <= found
    assert not found & {"train.en", "model.pt", "average --colour", "average --not-a-flag",
                        "--nproc-per-node", "COMMAND --help"}
    by_name = {n.name: n.line for n in names}
    assert (by_name["translate --beem"], by_name["score --min-blue"], by_name["average --lats"]) == (3, 4, 11)


def test_the_reader_reads_a_recipes_comments_and_a_scripts_commands() -> None:
    recipe = ("# Run:\n#   mtx averge --dir runs/x/checkpoints\n"
              "#   mtx translate -m x --beam 4   # --last 5: the paper's\n"
              "train:\n  keep_best: 5   # and the best 5: mtx average --dir tries both (train.keep_bets)\n"
              "# the demo corpus (python -m mtx.data.demo) writes train.en and runs/x/data.partial/; no mtx code\n")
    assert {n.name for n in names_in_script(recipe) if missing(n)} == {"mtx averge", "train.keep_bets"}
    script = 'mtx=${MTX:-mtx}\n"$mtx" translate -m m.pt \\\n  --nbets 2 -o out\nbleu=$("$mtx" score --jsn | jq .)\n'
    assert {n.name for n in names_in_script(script) if missing(n)} == {"translate --nbets", "score --jsn"}


@pytest.mark.parametrize("span", ["mtx translate --lenpen-style gnmt", "mtx average --no-tune-lenpen",
                                  "mtx config recipes/demo.yaml --set model.preset=big", "mtx --version"])
def test_real_options_and_keys_pass(span: str) -> None:
    names = commands_in(span)
    assert names and not [n for n in names if missing(n)]
