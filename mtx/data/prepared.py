"""A prepared run's `data/` folder, read back for training: each split memory-mapped, its files checked first.

`mtx prepare` (mtx.data.prepare) writes, for every split and side (`src`, `tgt`), a flat array of token ids
(`{split}.{side}.tokens`, uint16 when the vocabulary fits, else uint32) and int64 offsets
(`{split}.{side}.offsets`, one more than pairs: sentence i is tokens[offsets[i]:offsets[i + 1]]), and
`manifest.json`, which records the token dtype and each split's pair and token counts. Mapping the files
instead of loading them keeps memory flat however large the corpus. Before a split is mapped its file sizes
and end offsets are checked against the manifest (a few bytes read, never a whole file), so a copy cut short
is an error that says to prepare again, not a silent run on empty sentences.
"""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from mtx.errors import MtxError

FORMAT = 1  # bump when the files' layout changes, so older data is prepared again
SIDES = ("src", "tgt")
LENGTH_CHUNK = 1 << 20  # sentences whose lengths are computed at once


class TokenSplit:
    """One prepared split, memory-mapped: sentence i's token ids without specials, one sentence at a time."""

    def __init__(self, data_dir: Path, split: str, dtype: str) -> None:
        self._tokens = {side: _memmap(data_dir / f"{split}.{side}.tokens", dtype) for side in SIDES}
        self._offsets = {side: _memmap(data_dir / f"{split}.{side}.offsets", "int64") for side in SIDES}

    def __len__(self) -> int:
        return len(self._offsets["src"]) - 1

    @cached_property
    def src_lens(self) -> np.ndarray:
        return self._lengths("src")

    @cached_property
    def tgt_lens(self) -> np.ndarray:
        return self._lengths("tgt")

    def _lengths(self, side: str) -> np.ndarray:
        """Every sentence's length, as int32, from the offsets a chunk at a time: every training rank holds
        them, and at WMT14 En-Fr's 36M pairs int64 lengths and np.diff's int64 temporaries would cost each
        rank about a gigabyte."""
        offsets = self._offsets[side]
        lengths = np.empty(len(offsets) - 1, dtype=np.int32)
        for start in range(0, len(lengths), LENGTH_CHUNK):
            end = min(start + LENGTH_CHUNK, len(lengths))
            np.subtract(offsets[start + 1 : end + 1], offsets[start:end], out=lengths[start:end], casting="unsafe")
        return lengths

    def src(self, i: int) -> np.ndarray:
        return self._sentence("src", i)

    def tgt(self, i: int) -> np.ndarray:
        return self._sentence("tgt", i)

    def block(self, side: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Sentences start..end - 1 of `side` at once, for a pass over the whole split a block at a time: their
        token ids, one flat int64 array, and end - start + 1 offsets into it (sentence i of the block is
        tokens[offsets[i]:offsets[i + 1]])."""
        offsets = np.array(self._offsets[side][start : end + 1], dtype=np.int64)
        tokens = np.array(self._tokens[side][offsets[0] : offsets[-1]], dtype=np.int64)
        return tokens, offsets - offsets[0]

    def rows(self, side: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The sentences at `indices` of `side`, as `block` gives a block's, for a pass over a sample of the split:
        only their tokens are read from the memory map."""
        starts = np.array(self._offsets[side][indices], dtype=np.int64)
        lengths = np.array(self._offsets[side][indices + 1], dtype=np.int64) - starts
        offsets = np.concatenate([[0], np.cumsum(lengths)])
        within = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
        return np.array(self._tokens[side][np.repeat(starts, lengths) + within], dtype=np.int64), offsets

    def _sentence(self, side: str, i: int) -> np.ndarray:
        if not 0 <= i < len(self):
            raise IndexError(f"sentence {i} is out of range for a split of {len(self)}")
        start, end = self._offsets[side][i], self._offsets[side][i + 1]
        return np.array(self._tokens[side][start:end], dtype=np.int64)


def _memmap(path: Path, dtype: str) -> np.ndarray:
    if path.stat().st_size == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype=dtype)
    return np.memmap(path, dtype=dtype, mode="r")


def load_manifest(data_dir: Path) -> dict[str, Any]:
    path = Path(data_dir) / "manifest.json"
    if not path.is_file():
        raise MtxError(f"no prepared data in {data_dir}: run `mtx prepare RECIPE` first.")
    return json.loads(path.read_text(encoding="utf-8"))


def load_split(data_dir: Path, split: str) -> TokenSplit:
    """A prepared split, once its files are checked against the manifest (see `check_split_files`)."""
    manifest = load_manifest(data_dir)
    if split not in manifest["splits"]:
        raise MtxError(
            f"{data_dir} has no {split} split (it has: {', '.join(manifest['splits'])}): add one to the "
            "recipe's data.source and run `mtx prepare RECIPE` again."
        )
    check_split_files(Path(data_dir), split, manifest)
    return TokenSplit(Path(data_dir), split, manifest["token_dtype"])


def check_split_files(data_dir: Path, split: str, manifest: dict[str, Any]) -> None:
    """Raise MtxError unless each side's files agree with each other and with the manifest.

    A file cut short (an interrupted copy, a full disk) would otherwise map without complaint and yield empty
    or wrong sentences. Only sizes and the first and last offsets are read, so the check is instant on any
    corpus: offsets hold pairs + 1 int64 values, start at 0 and end at the token count, and the tokens file
    holds exactly that many tokens.
    """
    pairs, itemsize = manifest["splits"][split]["pairs"], np.dtype(manifest["token_dtype"]).itemsize
    for side in SIDES:
        tokens, offsets = data_dir / f"{split}.{side}.tokens", data_dir / f"{split}.{side}.offsets"
        for path in (tokens, offsets):
            if not path.is_file():
                _damaged(path, "is missing")
        expected_tokens = manifest["splits"][split][f"{side}_tokens"]
        size = offsets.stat().st_size
        if size != (pairs + 1) * 8:
            _damaged(offsets, f"is {size:,} bytes, but manifest.json's {pairs:,} {split} pairs need "
                              f"{(pairs + 1) * 8:,} ({pairs + 1:,} offsets of 8 bytes)")
        ends = np.memmap(offsets, dtype=np.int64, mode="r")  # only the two pages read below are loaded
        first, last = int(ends[0]), int(ends[-1])
        if first != 0 or last != expected_tokens:
            _damaged(offsets, f"runs from token {first:,} to {last:,}, but it should run from 0 to "
                              f"manifest.json's {expected_tokens:,} {side} tokens")
        size = tokens.stat().st_size
        if size != expected_tokens * itemsize:
            _damaged(tokens, f"is {size:,} bytes, but its {expected_tokens:,} tokens of {itemsize} bytes need "
                             f"{expected_tokens * itemsize:,}")


def _damaged(path: Path, found: str) -> NoReturn:
    raise MtxError(
        f"The prepared data is damaged: {path} {found}. Run `mtx prepare RECIPE` again: it rebuilds the damaged "
        "data."
    )
