"""The one exception type that means "the user can fix this": the CLI prints it and exits 1; and the check that
an optional extra is installed, which every command that needs one makes the same way."""

from __future__ import annotations

import importlib
from collections.abc import Sequence


class MtxError(Exception):
    """A user-facing error: the message names the file, key or value at fault and what to do about it."""


class PeersLostError(MtxError):
    """A collective with the other training processes failed: one of them stopped or died. Final for this
    process: it writes nothing more, and it exits at once, without the interpreter's clean-up, which could wait
    for ever on the broken process group (an NCCL communicator whose peer is gone)."""


def first_line(error: BaseException, width: int = 160) -> str:
    """The first line of an error's message, cut to `width` characters (its type's name if it has no message):
    what a one-paragraph message quotes of an error that PyTorch or a library raised."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:width]


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` is running out of memory: Python's MemoryError (numpy's failed allocations among them, an
    `_ArrayMemoryError`), PyTorch's on a GPU (OutOfMemoryError), or its CPU allocator's RuntimeError (whose type
    says nothing, so its message is read)."""
    message = str(error)
    return isinstance(error, MemoryError) or type(error).__name__ == "OutOfMemoryError" or (
        isinstance(error, RuntimeError) and ("DefaultCPUAllocator" in message or "out of memory" in message))


def require_extra(extra: str, modules: Sequence[str], needed_by: str, otherwise: str = "") -> None:
    """Refuse, naming the extra to install, when any of `modules` cannot be imported: "`needed_by` needs a and b,
    not installed here: pip install 'mtx[extra]'." with `otherwise` (what works without it) after. Imported, not
    only looked up, so that a package that is there but broken is refused here too, before any work."""
    missing = []
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            missing.append(module)
    if missing:
        raise MtxError(f"{needed_by} needs {' and '.join(missing)}, not installed here: pip install "
                       f"'mtx[{extra}]'.{f' {otherwise}' if otherwise else ''}")
