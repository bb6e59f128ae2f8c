"""An export's folder: written beside its destination under a temporary name, renamed into place when complete,
so a failed export never leaves a folder that looks like a finished one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from mtx.errors import MtxError
from mtx.files import current_umask


def check_destination(folder: Path, force: bool) -> None:
    """An export goes into a new or empty folder; `force` replaces a non-empty one."""
    if folder.exists() and not folder.is_dir():
        raise MtxError(f"{folder} is a file, not a folder: name a folder to export into.")
    if folder.is_dir() and any(folder.iterdir()) and not force:
        raise MtxError(f"{folder} already exists and is not empty: name a new folder, or pass --force to replace it.")


def write_folder(folder: Path, fill: Callable[[Path], None], readme: str, force: bool) -> None:
    """Call `fill(staging)` on a new folder beside `folder`, add README.md, then rename it to `folder`
    (replacing an existing one only with `force`, once the new one is complete)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    replaced = staging.with_suffix(".old")
    try:
        fill(staging)
        (staging / "README.md").write_text(readme, encoding="utf-8")
        for path in (staging, *staging.iterdir()):  # mkdtemp's folder, like some writers' files, is private
            os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~current_umask())
        check_destination(folder, force)  # again: another process may have written there meanwhile
        if folder.is_dir() and any(folder.iterdir()):
            folder.rename(replaced)
        os.replace(staging, folder)  # onto a missing or empty folder
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if replaced.exists() and not folder.exists():
            replaced.rename(folder)
        raise
    shutil.rmtree(replaced, ignore_errors=True)
