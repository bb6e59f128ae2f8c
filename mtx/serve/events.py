"""The server's log: one JSON line per event on standard error, for a log collector."""

from __future__ import annotations

import json
import sys
from datetime import datetime, timezone
from typing import Any


def log_event(**fields: Any) -> None:
    """One JSON line: the time (UTC, milliseconds) and `fields`."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    sys.stderr.write(json.dumps({"time": stamp, **fields}, ensure_ascii=False) + "\n")
    sys.stderr.flush()
