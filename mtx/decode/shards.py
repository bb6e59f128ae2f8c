"""One shard of a file to translate (`mtx translate --shard K/N`), and its output, resumable line by line.

Translating a training corpus with a teacher (distillation, back-translation) takes days of device time, so it is
cut into N shards that run as N processes, on N GPUs or N nodes (a SLURM array), and may be stopped at any point.
Shard K of N is the K-th of N contiguous runs of the input's lines, so the shards' outputs concatenated in order
(`cat out.1 ... out.N`) are the output of one process: each line is translated with its index in the whole file,
which is all that sampling's draws depend on besides the seed.

A shard writes OUT.partial, flushed a window of lines at a time, beside OUT.partial.json, which says what is being
written there (the input, the shard, the models and every option that changes an output line). Once the shard is
complete, the description is kept as OUT.json and OUT.partial renamed OUT. Run again after an interruption, the
same command keeps the complete lines of OUT.partial (a line cut short by the interruption is dropped; only the
file's end is read to find it, so resuming costs the same memory after a million lines as after ten) and
translates from the first missing one. Run again once OUT exists, the same command is done at once: a SLURM array
requeued in full finishes only its unfinished shards. An output, partial or finished, written by another
translation (other models, options or input) is refused, naming what differs, never extended or reused; so is
one whose description is missing or damaged.

One process at a time writes a shard: it holds OUT.lock (`ShardLock`, a lock file with a heartbeat as the
trainer's, mtx.lock_file) from before it looks at OUT until OUT is renamed, so a second start of the same shard (a
requeue while the first still runs) is refused, naming the first, rather than appending the lines a second time.
A holder that finds its lock taken over (a requeued incarnation of its SLURM job took it) stops before its next
write.
"""

from __future__ import annotations

import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

from mtx.data.corpora import count_lines
from mtx.errors import MtxError
from mtx.files import atomic_write_text
from mtx.lock_file import LockFile

BLOCK = 1 << 20  # bytes read at a time when looking for a partial output's last complete line


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
    """OUT.partial and its description while the shard runs; OUT and its description once it is complete. Used as
    a context manager, which holds the shard's lock: `is_done`, `resume` and `finish` are called inside it."""

    def __init__(self, path: Path, description: dict[str, Any]) -> None:
        self.path, self.description = path, description
        self.partial = path.with_name(path.name + ".partial")
        self.about = path.with_name(path.name + ".partial.json")
        self.record = path.with_name(path.name + ".json")
        self.lock = ShardLock(path, self.partial)

    def __enter__(self) -> ShardOutput:
        self.lock.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.lock.release()

    def is_done(self) -> bool:
        """Whether OUT is complete and was made by this translation. An OUT made by another one, or that does not
        say what made it (OUT.json missing or damaged), is refused: it may hold other translations."""
        if not self.path.exists():
            return False
        again = f"delete {self.path} and {self.record.name} to translate this shard again"
        if not self.record.exists():
            raise MtxError(f"{self.path} exists but {self.record.name}, which says what made it, does not: it cannot "
                           f"be told from a translation with other models or options. {again.capitalize()} (move "
                           f"{self.path} away first to keep it).")
        made_by = read_description(self.record, again)
        if made_by != self.description:
            raise MtxError(f"{self.path} was made by another translation (it differs in: "
                           f"{differences(made_by, self.description)}): {again} with this command, or run the "
                           "command that made it.")
        self.about.unlink(missing_ok=True)  # left if a `finish` was cut short after its rename
        return True

    def resume(self) -> tuple[int, BinaryIO]:
        """(the complete lines already written, OUT.partial open to append the next ones). A partial output of
        another translation, or whose description is damaged, is refused; one without its description is not
        trusted, and is started again."""
        if self.partial.exists() and self.about.exists():
            over = f"delete it and {self.partial.name} to start this shard over"
            written = read_description(self.about, over)
            if written != self.description:
                raise MtxError(f"{self.partial} was written by another translation (it differs in: "
                               f"{differences(written, self.description)}): delete it and {self.about.name} to start "
                               "this shard again, or run the command that wrote it.")
            kept = complete_lines(self.partial)
        else:
            kept = 0
            self.partial.write_bytes(b"")
            atomic_write_text(self.about, json.dumps(self.description, indent=1, sort_keys=True) + "\n")
        return kept, HeldAppend(self.partial, self.lock)

    def finish(self) -> None:
        """The shard is complete: its description becomes OUT.json, then OUT.partial becomes OUT. Interrupted
        between the two, the next run finds OUT.partial and its description still there and finishes again."""
        self.lock.check_held()
        atomic_write_text(self.record, json.dumps(self.description, indent=1, sort_keys=True) + "\n")
        os.replace(self.partial, self.path)
        self.about.unlink(missing_ok=True)


class ShardLock(LockFile):
    """OUT.lock: the right of one process to write the shard whose output is OUT."""

    def __init__(self, output: Path, partial: Path) -> None:
        self.partial = partial
        super().__init__(output.with_name(output.name + ".lock"))

    def check_held(self) -> None:
        """Refuse to write on once another process has taken the lock over."""
        if not self.still_held():
            raise MtxError(f"{self.partial} has been taken over by another process ({self.holder()}): this one "
                           "stops without writing, and that one goes on from the last complete line.")

    def _refusal(self, holder: dict[str, Any] | None, age: float) -> str:
        if holder is None:
            return (f"{self.partial} is being claimed by another process right now: its lock {self.path} was "
                    f"written {age:.0f} s ago and is not complete. Run this command again in a moment, or delete "
                    f"{self.path} if you are sure no other command is starting.")
        return (f"{self.partial} is being written by another process ({self.describe(holder, age)}): "
                f"`{holder.get('command') or '?'}`. Two processes writing one shard would write its lines twice. "
                "Wait for it to finish (this command then finds the shard done), or stop it "
                f"(`kill {holder['pid']}` on {holder['host']}) and run this command again: it goes on from the last "
                f"complete line. {self.stale_advice()}")


class HeldAppend(io.BufferedWriter):
    """A file opened to append, each write made only while `lock` is still held: a process whose lock was taken
    over stops before writing lines that the new holder writes too."""

    def __init__(self, path: Path, lock: ShardLock) -> None:
        super().__init__(io.FileIO(path, "ab"))
        self.lock = lock

    def write(self, data: bytes) -> int:
        self.lock.check_held()
        return super().write(data)


def read_description(path: Path, remedy: str) -> dict[str, Any]:
    """The description of a translation in `path`, or an MtxError naming the file and `remedy` if it is damaged
    (empty, cut off, not a JSON object): a damaged description cannot say what was written."""
    try:
        description = json.loads(path.read_bytes())
    except ValueError as e:  # json's errors and UnicodeDecodeError alike
        problem = f"it is not JSON ({e})"
    else:
        if isinstance(description, dict):
            return description
        problem = f"it holds a JSON {type(description).__name__}, not an object"
    raise MtxError(f"{path} is damaged: {problem}, so it cannot say which translation was written beside it: "
                   f"{remedy}.")


def differences(old: dict[str, Any], new: dict[str, Any]) -> str:
    """The keys (dotted, `decode.beam`) whose values differ between two descriptions, each with both values where
    they are short: `decode.beam 4 → 5`."""
    return ", ".join(differing_keys(old, new, ""))


def differing_keys(old: dict[str, Any], new: dict[str, Any], prefix: str) -> list[str]:
    found = []
    for key in sorted({*old, *new}):
        there, here = old.get(key), new.get(key)
        if isinstance(there, dict) and isinstance(here, dict):
            found += differing_keys(there, here, f"{prefix}{key}.")
        elif there != here:
            shown = f"{json.dumps(there)} → {json.dumps(here)}"
            found.append(f"{prefix}{key} {shown}" if len(shown) <= 60 else f"{prefix}{key}")
    return found


def complete_lines(path: Path) -> int:
    """The lines of `path` that end with a newline; what follows the last newline (a line cut short) is cut off.
    The last newline is looked for from the end, a block at a time, and the lines are counted a block at a time,
    so memory does not grow with the lines written."""
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        end = last_line_end(f, size)
        if end < size:
            f.truncate(end)
    return count_lines(path)


def last_line_end(f: BinaryIO, size: int) -> int:
    """The offset just past the last b"\\n" among the first `size` bytes of `f` (0 if there is none)."""
    stop = size
    while stop > 0:
        start = max(0, stop - BLOCK)
        f.seek(start)
        found = f.read(stop - start).rfind(b"\n")
        if found >= 0:
            return start + found + 1
        stop = start
    return 0


def file_identity(path: Path) -> dict[str, Any]:
    """What tells a file from its next version without reading it: its full path, size and modification time."""
    stat = path.stat()
    return {"path": str(path.resolve()), "bytes": stat.st_size, "modified_ns": stat.st_mtime_ns}
