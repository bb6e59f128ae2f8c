"""mtx.decode.shards: how a file is cut into shards, and how a shard's partial output is kept or refused."""

from __future__ import annotations

import json
import os
import tracemalloc
from pathlib import Path

import pytest

from mtx.decode.shards import BLOCK, Shard, ShardOutput, complete_lines
from mtx.errors import MtxError


@pytest.mark.parametrize("total", [0, 1, 2, 7, 30, 1001])
@pytest.mark.parametrize("count", [1, 2, 3, 8, 31])
def test_the_shards_cut_the_lines_into_contiguous_runs_of_nearly_equal_size(total: int, count: int) -> None:
    spans = [Shard(k, count).lines(total) for k in range(1, count + 1)]
    assert [i for span in spans for i in span] == list(range(total))  # in order, each line once
    sizes = [len(span) for span in spans]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize(("text", "shard"), [("3/8", Shard(3, 8)), (" 1 / 1 ", Shard(1, 1)), ("8/8", Shard(8, 8))])
def test_a_shard_is_k_of_n(text: str, shard: Shard) -> None:
    assert Shard.parse(text) == shard and str(shard) == f"{shard.index}/{shard.count}"


@pytest.mark.parametrize("text", ["0/8", "9/8", "3", "3/0", "a/b", "-1/2", "3/8/1", ""])
def test_anything_else_is_refused_with_the_form_it_must_take(text: str) -> None:
    with pytest.raises(MtxError, match=r"is not K/N with 1 ≤ K ≤ N"):
        Shard.parse(text)


def test_a_partial_output_keeps_its_complete_lines_and_drops_a_cut_one(tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    with ShardOutput(out, {"shard": "1/2", "beam": 4}) as first:
        written, sink = first.resume()
        assert written == 0 and first.partial.read_bytes() == b"" and json.loads(first.about.read_text())["beam"] == 4
        sink.write(b"eins\nzwei\ndr")  # interrupted in the middle of a line
        sink.close()
    with ShardOutput(out, {"shard": "1/2", "beam": 4}) as again:
        written, sink = again.resume()
        sink.write(b"drei\n")
        sink.close()
        assert written == 2 and first.partial.read_bytes() == b"eins\nzwei\ndrei\n"
        again.finish()
    assert out.read_bytes() == b"eins\nzwei\ndrei\n" and not first.partial.exists() and not first.about.exists()
    assert json.loads(first.record.read_text()) == {"shard": "1/2", "beam": 4}  # OUT.json: what made OUT
    assert not (tmp_path / "out.de.lock").exists()


def test_a_partial_output_of_another_translation_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    with ShardOutput(out, {"shard": "1/2", "decode": {"beam": 4}, "models": ["a.pt"]}) as output:
        written, sink = output.resume()
        sink.write(b"eins\n")
        sink.close()
    with (ShardOutput(out, {"shard": "1/2", "decode": {"beam": 5}, "models": ["a.pt"]}) as other,
          pytest.raises(MtxError, match=r"written by another translation \(it differs in: decode.beam 4 → 5\)")):
        other.resume()
    assert (tmp_path / "out.de.partial").read_bytes() == b"eins\n"


def test_a_partial_output_without_its_description_is_started_again(tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    (tmp_path / "out.de.partial").write_bytes(b"from who knows what\n")
    with ShardOutput(out, {"shard": "1/1"}) as output:
        written, sink = output.resume()
        sink.close()
    assert written == 0 and (tmp_path / "out.de.partial").read_bytes() == b""


def cut_partial(tmp_path: Path, lines: int) -> ShardOutput:
    """A shard's partial output of `lines` complete lines of 20 bytes and a line cut short after them."""
    output = ShardOutput(tmp_path / f"out.{lines}", {"shard": "1/1"})
    output.partial.write_bytes(b"a translated line 1\n" * lines + b"and a line cut sh")
    output.about.write_text(json.dumps(output.description), encoding="utf-8")
    return output


def test_resuming_a_million_lines_takes_the_memory_of_a_block_not_of_the_lines(tmp_path: Path) -> None:
    """Killed mid-line after 1,000,000 lines (20 MB), a shard's resume finds the last complete line from the
    file's end and counts the lines a block at a time: its peak memory is that of ten thousand lines, a block."""
    peaks = {}
    for lines in (10_000, 1_000_000):
        with cut_partial(tmp_path, lines) as output:
            tracemalloc.start()
            written, sink = output.resume()
            peaks[lines] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            sink.close()
        assert written == lines and output.partial.stat().st_size == 20 * lines  # the cut line cut off
    assert peaks[1_000_000] < 3 * BLOCK < 20_000_000 // 4  # a few blocks, far below the file's size
    assert peaks[1_000_000] < peaks[10_000] + 2 * BLOCK  # and independent of the lines written


def test_the_last_complete_line_is_found_across_blocks(tmp_path: Path) -> None:
    """The cut line longer than a block: the newline before it is found blocks away from the end."""
    path = tmp_path / "partial"
    path.write_bytes(b"one\ntwo\n" + b"x" * (2 * BLOCK + 5))
    assert complete_lines(path) == 2 and path.read_bytes() == b"one\ntwo\n"
    path.write_bytes(b"y" * (BLOCK + 1))  # no newline at all: nothing complete
    assert complete_lines(path) == 0 and path.read_bytes() == b""
    path.write_bytes(b"a\n" * BLOCK)  # nothing cut: nothing changes
    assert complete_lines(path) == BLOCK and path.stat().st_size == 2 * BLOCK


def finished(tmp_path: Path, description: dict) -> ShardOutput:
    with ShardOutput(tmp_path / "out.de", description) as output:
        _, sink = output.resume()
        sink.write(b"eins\n")
        sink.close()
        output.finish()
    return output


def test_a_finished_output_is_done_for_the_same_translation_only(tmp_path: Path) -> None:
    finished(tmp_path, {"shard": "1/2", "models": [{"path": "a.pt", "bytes": 10}], "decode": {"beam": 4}})
    with ShardOutput(tmp_path / "out.de", {"shard": "1/2", "models": [{"path": "a.pt", "bytes": 10}],
                                           "decode": {"beam": 4}}) as same:
        assert same.is_done()
    for changed, named in (({"models": [{"path": "b.pt", "bytes": 10}]}, "models"),
                           ({"decode": {"beam": 5}}, "decode.beam 4 → 5")):
        other = {"shard": "1/2", "models": [{"path": "a.pt", "bytes": 10}], "decode": {"beam": 4}, **changed}
        with ShardOutput(tmp_path / "out.de", other) as output, pytest.raises(MtxError) as refused:
            output.is_done()
        assert f"out.de was made by another translation (it differs in: {named})" in str(refused.value)
        assert "delete " in str(refused.value) and "out.de.json to translate this shard again" in str(refused.value)
    assert (tmp_path / "out.de").read_bytes() == b"eins\n"


def test_a_finished_output_that_does_not_say_what_made_it_is_refused(tmp_path: Path) -> None:
    (tmp_path / "out.de").write_bytes(b"made before outputs were described\n")
    with ShardOutput(tmp_path / "out.de", {"shard": "1/1"}) as output, pytest.raises(MtxError) as refused:
        output.is_done()
    assert "out.de.json, which says what made it, does not" in str(refused.value)
    with ShardOutput(tmp_path / "elsewhere", {"shard": "1/1"}) as output:
        assert not output.is_done()  # no OUT: not done


@pytest.mark.parametrize(("damage", "problem"), [
    (b"", "it is not JSON"), (b"[1, 2]", "it holds a JSON list, not an object"),
    (b'{"shard": "1/', "it is not JSON"), (b"\xff\xfe", "it is not JSON")])
def test_a_damaged_description_is_refused_naming_the_file_and_what_to_do(tmp_path: Path, damage: bytes,
                                                                         problem: str) -> None:
    out = tmp_path / "out.de"
    (tmp_path / "out.de.partial").write_bytes(b"eins\n")
    (tmp_path / "out.de.partial.json").write_bytes(damage)
    with ShardOutput(out, {"shard": "1/1"}) as output, pytest.raises(MtxError) as refused:
        output.resume()
    assert f"{tmp_path / 'out.de.partial.json'} is damaged: {problem}" in str(refused.value)
    assert "delete it and out.de.partial to start this shard over" in str(refused.value)
    assert (tmp_path / "out.de.partial").read_bytes() == b"eins\n"
    finished(tmp_path / "done", {"shard": "1/1"}).record.write_bytes(damage)  # a finished output's, likewise
    with ShardOutput(tmp_path / "done" / "out.de", {"shard": "1/1"}) as output, pytest.raises(MtxError) as refused:
        output.is_done()
    assert f"out.de.json is damaged: {problem}" in str(refused.value) and "translate this shard again" in str(
        refused.value)


def test_a_shard_is_written_by_one_process_at_a_time(tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    with ShardOutput(out, {"shard": "1/1"}) as first:
        _, sink = first.resume()
        sink.write(b"eins\n")
        with pytest.raises(MtxError) as refused, ShardOutput(out, {"shard": "1/1"}):
            pass
        message = str(refused.value)
        assert f"{first.partial} is being written by another process (host " in message
        assert f"pid {os.getpid()}" in message and "run this command again: it goes on from the last" in message
        sink.close()
    assert first.partial.read_bytes() == b"eins\n"
    with ShardOutput(out, {"shard": "1/1"}) as second:  # released: free again
        assert second.resume()[0] == 1


def test_a_writer_whose_lock_was_taken_over_stops_before_writing(tmp_path: Path) -> None:
    with ShardOutput(tmp_path / "out.de", {"shard": "1/1"}) as output:
        _, sink = output.resume()
        sink.write(b"eins\n")
        sink.flush()
        taker = json.loads(output.lock.path.read_text()) | {"token": "another", "pid": 1}
        output.lock.path.write_text(json.dumps(taker))  # a requeued incarnation took the lock over
        with pytest.raises(MtxError, match="has been taken over by another process"):
            sink.write(b"zwei\n")
        with pytest.raises(MtxError, match="has been taken over by another process"):
            output.finish()
        sink.close()
    assert output.partial.read_bytes() == b"eins\n" and not output.path.exists()
