"""The package's shape: the folder tree is the architecture, so it is held to it.

- no import circle anywhere, counting every import (at the top, inside functions, under TYPE_CHECKING);
- a lower stage never imports a higher one (model never imports data; decode never imports train);
- at most 14 modules at the top level, none over 600 lines;
- every command in its stage's command.py, and the command modules light enough for `mtx --help`;
- each package's docstring is the map of its modules, naming all of them.
"""

from __future__ import annotations

import ast
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

PACKAGE = ROOT / "mtx"

# The stages, lowest first: a module may import modules of its own stage and of lower ones only. The top level's
# shared modules come first; the command line sits above everything: cli.py, every stage's command.py (which
# may tie several stages together: `mtx config` counts the model's parameters).
LAYERS: list[set[str]] = [
    {"mtx", "mtx.errors", "mtx.files"},
    {"mtx.config", "mtx.subword", "mtx.tokenizer", "mtx.spm_tokenizer", "mtx.devices"},
    {"mtx.score", "mtx.data"},
    {"mtx.model"},
    {"mtx.checkpoint"},
    {"mtx.decode"},
    {"mtx.documents"},
    {"mtx.train"},
    {"mtx.analysis", "mtx.export", "mtx.importing", "mtx.report", "mtx.serve"},
    {"mtx.cli", "mtx.__main__"},
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The mtx modules that `name` imports anywhere in its file: `from mtx.a import b` counts mtx.a.b if that is
    a module, else mtx.a; `from mtx import x` likewise."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "mtx")
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mtx":
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in known else node.module)
    return {module for module in found if module in known and module != name}


def import_graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imported_modules(name, path, known) for name, path in found.items()}


def layer_of(module: str) -> int:
    """The layer of the longest prefix of `module` that LAYERS names; a command module's is the command line's."""
    if module.endswith(".command"):
        return len(LAYERS) - 1
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        for index, layer in enumerate(LAYERS):
            if prefix in layer:
                return index
    raise AssertionError(f"{module} is in no layer of tests/unit/test_layout.py: add its package to LAYERS")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of the graph as a list of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for child in sorted(graph[node]):
            if state.get(child) == 1:
                return path[path.index(child):] + [child]
            if child not in state and (cycle := visit(child)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_cycle_finder_finds_cycles() -> None:
    """The check below can fail: a circle through three modules, and none in a diamond."""
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"d"}, "c": {"d"}, "d": set()}) is None
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and graph["mtx.train.trainer"], "the import graph was not read"
    assert find_cycle(graph) is None, " → ".join(find_cycle(graph) or [])


def test_no_stage_imports_a_later_one() -> None:
    wrong = [f"{module} imports {imported}" for module, imports in import_graph().items() for imported in imports
             if layer_of(imported) > layer_of(module)]
    assert not wrong, "\n".join(wrong)


def test_reading_and_preparing_a_recipe_never_import_training() -> None:
    """The command modules sit above every stage, but the stages before training do not lean on it: `mtx config`
    and `mtx prepare` read a run's recipe, a fine-tuning one's parent included, with mtx.config.run_recipe, and
    no module of mtx.config or mtx.data, their command modules included, imports mtx.train."""
    wrong = [f"{module} imports {imported}" for module, imports in import_graph().items() for imported in imports
             if module.startswith(("mtx.config", "mtx.data")) and imported.startswith("mtx.train")]
    assert not wrong, "\n".join(wrong)


def test_the_top_level_is_small_and_no_module_is_long() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 14, top
    long = {name: lines for name, path in modules().items()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, long


def mapped_names(docstring: str) -> set[str]:
    """The names a package docstring's map lists: the first word of each line indented by four spaces, a
    subpackage with its slash (`demo/`)."""
    return {line.split()[0] for line in docstring.splitlines()
            if line.startswith("    ") and not line.startswith("     ") and line.strip()}


def package_members(init: Path) -> set[str]:
    folder = init.parent
    return ({path.stem for path in folder.glob("*.py") if path.stem not in ("__init__", "__main__")}
            | {f"{sub.name}/" for sub in folder.iterdir() if (sub / "__init__.py").is_file()})


def test_the_map_finds_what_a_docstring_lists() -> None:
    doc = "A package.\n\n    one     the first\n            its second line\n    sub/    a subpackage\nprose\n"
    assert mapped_names(doc) == {"one", "sub/"}


@pytest.mark.parametrize("init", [PACKAGE / "__init__.py", *sorted(PACKAGE.glob("*/__init__.py"))],
                         ids=lambda init: init.parent.name)
def test_each_package_docstring_is_its_module_map(init: Path) -> None:
    """The package's docstring is the one map of its modules (the docs link to these): it names every module
    and subpackage, and nothing that is not there. The __init__ holds nothing else: no code to find there."""
    tree = ast.parse(init.read_text(encoding="utf-8"))
    docstring = ast.get_docstring(tree, clean=False) or ""
    version = [node for node in tree.body if isinstance(node, ast.Assign) and init == PACKAGE / "__init__.py"
               and [target.id for target in node.targets if isinstance(target, ast.Name)] == ["__version__"]]
    code = [node for node in tree.body if not isinstance(node, ast.Expr) and node not in version]
    assert not code, f"{init} holds code: move it to a module of its own"
    listed, present = mapped_names(docstring), package_members(init)
    assert listed == present, (f"{init.relative_to(ROOT)}: not in its map: {sorted(present - listed)}; "
                               f"in its map but not in the package: {sorted(listed - present)}")


@pytest.mark.parametrize(("command", "home"), [
    ("config", "mtx.config.command"), ("prepare", "mtx.data.command"), ("train", "mtx.train.command"),
    ("average", "mtx.train.command"), ("translate", "mtx.decode.command"), ("score", "mtx.score.command"),
    ("inspect", "mtx.analysis.command"), ("export", "mtx.export.command"), ("report", "mtx.report.command"),
])
def test_each_command_lives_in_its_stages_command_module(command: str, home: str) -> None:
    from typer.main import get_command

    from mtx.cli import app

    registered = get_command(app).commands[command].callback
    assert registered.__module__ == home and registered.__name__ == command


def test_the_command_modules_import_no_torch() -> None:
    """cli.py imports every command module to build `mtx --help`: they must stay light."""
    code = ("import sys, mtx.cli; heavy = sorted(m for m in ('torch', 'datasets', 'numpy', 'tokenizers') "
            "if m in sys.modules); print(','.join(heavy))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert result.stdout.strip() == ""


@pytest.mark.parametrize("init", [PACKAGE / "__init__.py", *sorted(PACKAGE.glob("*/__init__.py"))],
                         ids=lambda init: init.parent.name)
def test_each_module_map_renders_as_written(init: Path) -> None:
    """The API page (mkdocstrings) renders a docstring as Markdown after `inspect.cleandoc`: the map's lines must
    keep their four spaces there, a code block laid out as written, not a paragraph that runs them together."""
    docstring = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")), clean=False) or ""
    cleaned = inspect.cleandoc(docstring)
    for name in mapped_names(docstring):
        assert re.search(rf"^    {re.escape(name)}\s", cleaned, flags=re.M), f"{init}: {name} loses its indent"
