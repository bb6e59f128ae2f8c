"""mtx.errors: the user errors' helpers, and the one check that an optional extra is installed."""

from __future__ import annotations

import sys

import pytest

from mtx.errors import MtxError, first_line, require_extra


def test_an_extra_that_is_installed_passes() -> None:
    require_extra("dev", ["json", "pytest"], "this test")


def test_a_missing_extra_is_named_with_what_needs_it_and_what_works_without(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    monkeypatch.setitem(sys.modules, "no_such_module_here", None)
    with pytest.raises(MtxError) as refused:
        require_extra("report", ["json", "matplotlib", "no_such_module_here"], "mtx report -o",
                      otherwise="Without -o it prints.")
    assert str(refused.value) == ("mtx report -o needs matplotlib and no_such_module_here, not installed here: "
                                  "pip install 'mtx[report]'. Without -o it prints.")


def test_first_line_quotes_one_line_of_a_message_or_the_type() -> None:
    assert first_line(RuntimeError("CUDA error\nmore detail")) == "CUDA error"
    assert first_line(ValueError()) == "ValueError"
    assert first_line(RuntimeError("x" * 500), width=10) == "x" * 10
