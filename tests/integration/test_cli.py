"""The command line's contract (SPEC): exit 0 on success, 1 on a user error with its message and no traceback
unless --debug, 2 on a usage error (Typer's own); anything else propagates as the bug it is.

Most tests call `mtx.cli.main` in this process, as the `mtx` script does, so they are quick and see the
package under test; a few start `python -m mtx` to check what a user's shell really gets.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mtx import cli
from mtx.errors import MtxError, is_out_of_memory

REFERENCES = ["Der Hund bellt laut im Garten.", "Die Katze schläft auf dem Sofa."]


@dataclass
class Run:
    code: int | str | None
    out: str
    err: str


@pytest.fixture
def mtx(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`mtx(*args)` runs `mtx.cli.main` with those arguments and returns its exit code and output.

    An exception that escapes `main` (a bug, or any error under --debug) escapes this call too.
    """
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setitem(cli._state, "debug", False)

    def run(*args: str | Path) -> Run:
        monkeypatch.setattr(sys, "argv", ["mtx", *map(str, args)])
        with pytest.raises(SystemExit) as exited:
            cli.main()
        captured = capsys.readouterr()
        return Run(exited.value.code, captured.out, captured.err)

    return run


def python_mtx(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtx", *map(str, args)], capture_output=True, text=True, timeout=120)


@pytest.fixture
def texts(tmp_path: Path) -> dict[str, Path]:
    ref, hyp = tmp_path / "ref.de", tmp_path / "hyp.de"
    ref.write_text("".join(line + "\n" for line in REFERENCES), encoding="utf-8")
    hyp.write_text("".join(line + "\n" for line in REFERENCES), encoding="utf-8")
    return {"ref": ref, "hyp": hyp, "missing": tmp_path / "missing.de", "out": tmp_path / "out.pt"}


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["score", "-r", "{ref}", "-i", "{hyp}", "--bogus"], "No such option: --bogus"),
        (["score", "-i", "{hyp}"], "Missing option '-r'"),
        (["score", "-r", "{ref}", "-i", "{hyp}", "--min-bleu", "high"], "Invalid value for '--min-bleu'"),
        (["average", "{hyp}"], "Missing option '-o'"),
        (["average", "--dir", "{ref}", "--last", "0", "-o", "{out}"], "Invalid value for '--last'"),
        (["translate", "-i", "{hyp}"], "Missing option '-m'"),
        (["translate", "-m", "{out}", "--beam", "many"], "Invalid value for '--beam'"),
        (["config"], "Missing argument 'RECIPE.yaml'"),
        (["trian", "{ref}"], "No such command 'trian'"),
        (["--bogus", "score"], "No such option: --bogus"),
    ],
    ids=["unknown-option", "missing-option", "bad-number", "average-no-output", "average-last-0",
         "translate-no-model", "translate-bad-beam", "config-no-recipe", "unknown-command", "unknown-global-option"],
)
def test_usage_errors_exit_2_with_usage_and_no_traceback(mtx, texts: dict[str, Path], args: list[str],
                                                         complaint: str) -> None:
    """A mistyped command line is Typer's usage error, exit 2, so scripts can tell it from a user error (1)
    about a file or value; it is caught before the command runs, so nothing is written."""
    result = mtx(*(arg.format(**texts) for arg in args))

    assert result.code == 2, result.err
    assert "Usage: " in result.err and complaint in result.err
    assert "Traceback" not in result.err and result.out == ""
    assert not texts["out"].exists()


def test_usage_error_exit_code_reaches_the_shell(texts: dict[str, Path]) -> None:
    """What a shell sees from the real process, for a command line that imports nothing heavy."""
    unknown = python_mtx("score", "-r", texts["ref"], "--bogus")
    missing = python_mtx("average", texts["ref"])

    assert (unknown.returncode, missing.returncode) == (2, 2), unknown.stderr + missing.stderr
    assert "No such option: --bogus" in unknown.stderr and "Missing option '-o'" in missing.stderr


def test_user_error_is_one_message_and_exit_1(mtx, texts: dict[str, Path]) -> None:
    result = mtx("score", "-r", texts["missing"], "-i", texts["hyp"])

    assert result.code == 1
    assert "error:" in result.err and f"{texts['missing']} does not exist" in result.err
    assert "Traceback" not in result.err and len(result.err.strip().splitlines()) == 1


def test_debug_raises_the_user_error_instead_of_the_message(mtx, texts: dict[str, Path]) -> None:
    with pytest.raises(MtxError, match="missing.de does not exist"):
        mtx("--debug", "score", "-r", texts["missing"], "-i", texts["hyp"])


def test_debug_shows_the_traceback_of_a_user_error_in_the_shell(texts: dict[str, Path]) -> None:
    """Without --debug a user error is its message alone; with it, the traceback that led there as well."""
    plain = python_mtx("score", "-r", texts["missing"], "-i", texts["hyp"])
    debug = python_mtx("--debug", "score", "-r", texts["missing"], "-i", texts["hyp"])

    assert plain.returncode == debug.returncode == 1
    assert "Traceback" not in plain.stderr and "missing.de does not exist" in plain.stderr
    assert "Traceback (most recent call last)" in debug.stderr
    assert "mtx.errors.MtxError:" in debug.stderr and "missing.de does not exist" in debug.stderr
    assert 'mtx/score/command.py", line' in debug.stderr  # the frame that raised it


@pytest.mark.parametrize("debug", [[], ["--debug"]], ids=["plain", "debug"])
def test_an_unexpected_error_is_never_dressed_as_a_user_error(mtx, monkeypatch: pytest.MonkeyPatch,
                                                             texts: dict[str, Path], debug: list[str]) -> None:
    """A bug must surface as itself, with its traceback, with or without --debug: not as 'error: ...' and
    exit 1, which would send the user to look for a mistake of their own."""

    def broken(*args: object, **kwargs: object) -> None:
        raise ZeroDivisionError("a bug in mtx")

    monkeypatch.setattr("mtx.score.command.score_files", broken)
    with pytest.raises(ZeroDivisionError, match="a bug in mtx"):
        mtx(*debug, "score", "-r", texts["ref"], "-i", texts["hyp"])


def test_running_out_of_memory_is_a_user_error_unless_debug(mtx, monkeypatch: pytest.MonkeyPatch,
                                                            texts: dict[str, Path]) -> None:
    """Out of memory is fixed by asking for less: a message saying which knob, exit 1; --debug re-raises."""

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: not enough memory")

    monkeypatch.setattr("mtx.score.command.score_files", out_of_memory)

    result = mtx("score", "-r", texts["ref"], "-i", texts["hyp"])
    assert result.code == 1 and "Traceback" not in result.err
    assert "Out of memory ([enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator" in result.err
    assert "--batch-tokens" in result.err
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator"):
        mtx("--debug", "score", "-r", texts["ref"], "-i", texts["hyp"])


def test_python_and_numpy_memory_errors_are_out_of_memory(mtx, monkeypatch: pytest.MonkeyPatch,
                                                         texts: dict[str, Path]) -> None:
    """numpy's failed allocation is an _ArrayMemoryError, a MemoryError: out of memory as PyTorch's are, a
    message about the host's memory (data, not batches) and exit 1, never a traceback."""
    with pytest.raises(MemoryError) as numpy_error:
        np.empty(2**50, dtype=np.uint8)  # a pebibyte: more than any address space holds
    assert is_out_of_memory(numpy_error.value) and is_out_of_memory(MemoryError())
    assert not is_out_of_memory(ValueError("out of memory"))

    def out_of_memory(*args: object, **kwargs: object) -> None:
        raise numpy_error.value

    monkeypatch.setattr("mtx.score.command.score_files", out_of_memory)
    result = mtx("score", "-r", texts["ref"], "-i", texts["hyp"])
    message = " ".join(result.err.split())
    assert result.code == 1 and "Traceback" not in result.err
    assert message.startswith("error: Out of memory (Unable to allocate 1.00 PiB"), message
    assert "data.sources' weights" in message and "data.bpe.max_lines" in message


@pytest.mark.parametrize("folder", ["runs[old]", "runs[/b]", "runs:thumbs_up:"])
def test_user_error_messages_are_printed_verbatim(mtx, tmp_path: Path, texts: dict[str, Path], folder: str) -> None:
    """A message names the user's own paths and values, which may hold brackets or colons: printed as rich
    markup, `[old]` would vanish from the path, `[/b]` would crash the error handler with a traceback, and
    `:thumbs_up:` would become an emoji."""
    missing = tmp_path / folder / "ref.de"

    result = mtx("score", "-r", missing, "-i", texts["hyp"])

    assert result.code == 1, result.err
    assert f"{missing} does not exist" in result.err
    assert "Traceback" not in result.err
