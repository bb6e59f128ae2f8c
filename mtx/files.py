"""Files written atomically: a reader, or a later command after a crash, sees the old file or the new one.

Checkpoints, metrics.jsonl, the run lock. No torch here: the lock needs none.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: Path, write: Callable[[BinaryIO], object]) -> None:
    """Call `write(file)` on a temporary file beside `path`, then rename it over `path`.

    A crash or SIGKILL at any moment leaves either the old file or the new one, never a torn one: rename
    within one filesystem is atomic, and fsync makes the bytes durable before the name points at them.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        # mkstemp creates 0600 files; give the result the mode any new file would get, so colleagues on a
        # shared cluster can read the run's checkpoints as the user's umask allows.
        os.chmod(tmp, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """`atomic_write` of a text, in UTF-8."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))


def current_umask() -> int:
    """The process's umask, which only setting it reveals (it is set straight back)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask
