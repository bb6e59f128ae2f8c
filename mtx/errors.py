"""The one exception type that means "the user can fix this": the CLI prints it and exits 1."""


class MtxError(Exception):
    """A user-facing error: the message names the file, key or value at fault and what to do about it."""
