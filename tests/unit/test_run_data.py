"""mtx/train/run_data.py: which valid lines validation decodes."""

from __future__ import annotations

from mtx.train.run_data import spread_lines


def test_spread_lines_take_that_many_of_each_pair_evenly_over_its_lines() -> None:
    pairs = ["en-de"] * 10 + ["en-fr"] * 4
    assert spread_lines(pairs, 5) == [0, 2, 4, 6, 8, 10, 11, 12, 13]  # en-fr has fewer than 5: all of them
    assert spread_lines(pairs, None) == list(range(14))
    one_pair = spread_lines([""] * 2000, 200)
    assert len(one_pair) == 200 and one_pair[:3] == [0, 10, 20] and one_pair[-1] == 1990
    assert spread_lines([""] * 7, 3) == [0, 2, 4]
    assert spread_lines([], 5) == []
