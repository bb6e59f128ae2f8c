"""One shard of a file to translate (`mtx translate --shard K/N`), and its output, resumable line by line.

Translating a training corpus with a teacher (distillation, back-translation) takes days of device time, so it is
cut into N shards that run as N processes, on N GPUs or N nodes (a SLURM array), and may be stopped at any point.
Shard K of N is the K-th of N contiguous runs of the input's lines, so the shards' outputs concatenated in order
(`cat out.1 ... out.N`) are the output of one process: each line is translated with its index in the whole file,
which is all that sampling's draws depend on besides the seed.

A shard writes OUT.partial, flushed a window of lines at a time, beside OUT.partial.json, which says what is being
written there (the input, the shard, the models and every option that changes an output line). Once the shard is
complete, OUT.partial is renamed OUT and the description removed. Run again after an interruption, the same command
keeps the complete lines of OUT.partial (a line cut short by the interruption is dropped) and translates from the
first missing one; a shard whose OUT exists is done and is not translated again. A partial output written by
another translation is refused, never extended.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from mtx.errors import MtxError
from mtx.files import atomic_write_text


@dataclass(frozen=True)
class Shard:
    """Shard `index` (1-based, as `--shard 3/8` says it) of `count`."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text)
        if match is None or not 1 <= int(match[1]) <= int(match[2]):
            raise MtxError(f"--shard {text!r} is not K/N with 1 ≤ K ≤ N: shard K of N, e.g. --shard 3/8 (a SLURM "
                           "array's --shard $SLURM_ARRAY_TASK_ID/8 with --array=1-8).")
        return cls(int(match[1]), int(match[2]))

    def lines(self, total: int) -> range:
        """The indices of this shard's lines among `total`: the N shards split them into contiguous runs whose
        sizes differ by at most one."""
        return range((self.index - 1) * total // self.count, self.index * total // self.count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


class ShardOutput:
    """OUT.partial and its description while the shard runs; OUT once it is complete."""

    def __init__(self, path: Path, description: dict[str, Any]) -> None:
        self.path, self.description = path, description
        self.partial = path.with_name(path.name + ".partial")
        self.about = path.with_name(path.name + ".partial.json")

    def resume(self) -> tuple[int, BinaryIO]:
        """(the complete lines already written, OUT.partial open to append the next ones). A partial output of
        another translation is refused; one without its description is not trusted, and is started again."""
        if self.partial.exists() and self.about.exists():
            written = json.loads(self.about.read_text(encoding="utf-8"))
            if written != self.description:
                changed = sorted(k for k in {*written, *self.description} if written.get(k) != self.description.get(k))
                raise MtxError(f"{self.partial} was written by another translation (it differs in: "
                               f"{', '.join(changed)}): delete it and {self.about.name} to start this shard again, "
                               "or run the command that wrote it.")
            kept = _complete_lines(self.partial)
        else:
            kept = 0
            self.partial.write_bytes(b"")
            atomic_write_text(self.about, json.dumps(self.description, indent=1, sort_keys=True) + "\n")
        return kept, open(self.partial, "ab")

    def finish(self) -> None:
        """The shard is complete: OUT.partial becomes OUT."""
        os.replace(self.partial, self.path)
        self.about.unlink(missing_ok=True)


def _complete_lines(path: Path) -> int:
    """The lines of `path` that end with a newline; what follows the last newline (a line cut short) is cut off."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end < len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
    return data.count(b"\n", 0, end)


def file_identity(path: Path) -> dict[str, Any]:
    """What tells a file from its next version without reading it: its full path, size and modification time."""
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}
