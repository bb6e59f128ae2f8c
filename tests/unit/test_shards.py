"""mtx.decode.shards: how a file is cut into shards, and how a shard's partial output is kept or refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtx.decode.shards import Shard, ShardOutput
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
    first = ShardOutput(out, {"shard": "1/2", "beam": 4})
    written, sink = first.resume()
    assert written == 0 and first.partial.read_bytes() == b"" and json.loads(first.about.read_text())["beam"] == 4
    sink.write(b"eins\nzwei\ndr")  # interrupted in the middle of a line
    sink.close()
    written, sink = ShardOutput(out, {"shard": "1/2", "beam": 4}).resume()
    sink.write(b"drei\n")
    sink.close()
    assert written == 2 and first.partial.read_bytes() == b"eins\nzwei\ndrei\n"
    first.finish()
    assert out.read_bytes() == b"eins\nzwei\ndrei\n" and not first.partial.exists() and not first.about.exists()


def test_a_partial_output_of_another_translation_is_refused_and_left_as_it_is(tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    written, sink = ShardOutput(out, {"shard": "1/2", "beam": 4, "models": ["a.pt"]}).resume()
    sink.write(b"eins\n")
    sink.close()
    with pytest.raises(MtxError, match=r"written by another translation \(it differs in: beam\)"):
        ShardOutput(out, {"shard": "1/2", "beam": 5, "models": ["a.pt"]}).resume()
    assert (tmp_path / "out.de.partial").read_bytes() == b"eins\n"


def test_a_partial_output_without_its_description_is_started_again(tmp_path: Path) -> None:
    out = tmp_path / "out.de"
    (tmp_path / "out.de.partial").write_bytes(b"from who knows what\n")
    written, sink = ShardOutput(out, {"shard": "1/1"}).resume()
    sink.close()
    assert written == 0 and (tmp_path / "out.de.partial").read_bytes() == b""
