"""`mtx translate --shard K/N` as a pre-empted, requeued job meets it: a finished shard done at once, and refused
when asked again with something else; one process at a time on a shard; a damaged description refused."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support import translate_cli


def shard_command(copying: dict, out: Path, *flags: str) -> list[str]:
    return ["-m", str(copying["checkpoint"]), "-i", str(copying["source"]), "-o", str(out), "--shard", "1/2", *flags]


def test_a_finished_shard_is_done_for_the_same_command_and_refused_for_another(copying: dict,
                                                                               tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    result, _ = translate_cli(shard_command(copying, out))
    assert result.exit_code == 0, result.output
    made = out.read_bytes()
    assert json.loads((tmp_path / "out.de.json").read_text())["shard"] == "1/2"  # what made it, kept beside it
    result, _ = translate_cli(shard_command(copying, out))  # a requeue: done at once, before any model loads
    assert result.exit_code == 0 and "out.de is complete, made by this same translation" in result.stderr
    assert str(copying["checkpoint"]) not in result.stderr  # no checkpoint was loaded (each loaded one is logged)
    result, _ = translate_cli(shard_command(copying, out, "--beam", "2"))  # another teacher's options
    assert result.exit_code == 1
    assert "out.de was made by another translation (it differs in: request.beam 4 → 2)" in str(result.exception)
    assert out.read_bytes() == made


def test_a_finished_shard_that_does_not_say_what_made_it_is_refused(copying: dict, tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    out.write_text("done before\n", encoding="utf-8")
    result, _ = translate_cli(shard_command(copying, out))
    assert result.exit_code == 1 and "out.de.json, which says what made it, does not" in str(result.exception)
    assert out.read_text(encoding="utf-8") == "done before\n"


HOLDER = """
import sys
from pathlib import Path
from mtx.decode.shards import ShardOutput
with ShardOutput(Path(sys.argv[1]), {}):
    print("locked", flush=True)
    sys.stdin.read()
"""


def test_a_shard_that_another_process_is_writing_is_refused_and_left_as_it_is(copying: dict,
                                                                             tmp_path: Path) -> None:
    """The same shard started twice (a requeue while the first still runs): the second refuses, naming the first,
    and nothing the first wrote changes."""
    out = tmp_path / "out.de"
    result, _ = translate_cli(shard_command(copying, out))  # to have a description to write a partial with
    assert result.exit_code == 0
    out.rename(tmp_path / "out.de.partial")
    (tmp_path / "out.de.json").rename(tmp_path / "out.de.partial.json")
    written = (tmp_path / "out.de.partial").read_bytes()
    first = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "locked"
        result, _ = translate_cli(shard_command(copying, out))
        assert result.exit_code == 1
        assert "out.de.partial is being written by another process (host " in str(result.exception)
        assert f"pid {first.pid}" in str(result.exception)
    finally:
        first.stdin.close()
        first.wait(timeout=20)
    assert (tmp_path / "out.de.partial").read_bytes() == written and not out.exists()
    result, _ = translate_cli(shard_command(copying, out))  # the first gone: the shard goes on and finishes
    assert result.exit_code == 0 and out.read_bytes() == written


@pytest.mark.parametrize("damage", [b"", b"[]", b'{"shard": "1/2", "inp'])
def test_a_damaged_partial_description_is_refused_naming_it(copying: dict, tmp_path: Path, damage: bytes) -> None:
    out = tmp_path / "out.de"
    (tmp_path / "out.de.partial").write_text("a line\n", encoding="utf-8")
    (tmp_path / "out.de.partial.json").write_bytes(damage)
    result, _ = translate_cli(shard_command(copying, out))
    assert result.exit_code == 1, result.output
    assert f"{tmp_path / 'out.de.partial.json'} is damaged" in str(result.exception)
    assert "delete it and out.de.partial to start this shard over" in str(result.exception)
    assert (tmp_path / "out.de.partial").read_text(encoding="utf-8") == "a line\n"
