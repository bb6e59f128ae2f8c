"""The package's shape: the folder tree is the architecture, so it is held to it.

- no import circle anywhere, counting every import (at the top, inside functions, under TYPE_CHECKING);
- a lower stage never imports a higher one (model never imports data; decode never imports train);
- at most 14 modules at the top level, none over 600 lines;
- every command in its stage's command.py, and the command modules light enough for `mtx --help`.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

PACKAGE = ROOT / "mtx"

# The stages, lowest first: a module may import modules of its own stage and of lower ones only. The top level's
# shared modules come first; the command line sits above everything: cli.py, every stage's command.py (which
# may tie several stages together: `mtx config` counts the model's parameters) and `mtx.translate`, the old home
# of the translator, an alias kept for its users.
LAYERS: list[set[str]] = [
    {"mtx", "mtx.errors", "mtx.files"},
    {"mtx.config", "mtx.tokenizer", "mtx.devices"},
    {"mtx.score", "mtx.data"},
    {"mtx.model"},
    {"mtx.checkpoint"},
    {"mtx.decode"},
    {"mtx.train"},
    {"mtx.analysis", "mtx.export", "mtx.report", "mtx.serve"},
    {"mtx.translate", "mtx.cli", "mtx.__main__"},
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
    raise AssertionError(f"{module} is in no layer of tests/test_layout.py: add its package to LAYERS")


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


def test_the_top_level_is_small_and_no_module_is_long() -> None:
    top = sorted(path.name for path in PACKAGE.glob("*.py"))
    assert len(top) <= 14, top
    long = {name: lines for name, path in modules().items()
            if (lines := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert not long, long


def test_every_stage_is_a_package_with_its_map() -> None:
    """Each subpackage's __init__ says what its modules hold (and nothing else: no code to find there)."""
    for init in PACKAGE.glob("*/__init__.py"):
        tree = ast.parse(init.read_text(encoding="utf-8"))
        assert ast.get_docstring(tree), init
        code = [node for node in tree.body if not isinstance(node, ast.Expr)]
        assert not code, f"{init} holds code: move it to a module of its own"


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


def test_the_old_home_of_the_translator_still_works_and_says_where_it_went(monkeypatch) -> None:
    """`from mtx.translate import Translator`, which users of the library may have written, gives the same
    class, with a deprecation warning that names the new module."""
    import mtx.decode.translator

    monkeypatch.delitem(sys.modules, "mtx.translate", raising=False)
    with pytest.warns(DeprecationWarning, match="mtx.decode.translator"):
        from mtx.translate import Translator, translate_sentences
    assert Translator is mtx.decode.translator.Translator
    assert translate_sentences is mtx.decode.translator.translate_sentences
