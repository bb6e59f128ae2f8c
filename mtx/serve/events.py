"""The server's log: one JSON line per event on standard error, for a log collector.

Everything the server writes there is such a line, uvicorn's own messages too (an invalid HTTP request, an error
outside the application): `UVICORN_LOGGING` routes its loggers through `LogHandler`, so a collector never meets
a line it cannot parse.
"""

from __future__ import annotations

import json
import logging
import sys
import traceback
from datetime import datetime, timezone
from typing import Any


def log_event(**fields: Any) -> None:
    """One JSON line: the time (UTC, milliseconds) and `fields`."""
    stamp = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    sys.stderr.write(json.dumps({"time": stamp, **fields}, ensure_ascii=False) + "\n")
    sys.stderr.flush()


class LogHandler(logging.Handler):
    """A `logging` handler that writes each record as a log line: its logger's package as the event, its level,
    its message, and its traceback where it has one."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            exception = {"traceback": "".join(traceback.format_exception(*record.exc_info))} if record.exc_info else {}
            log_event(event=record.name.partition(".")[0], level=record.levelname.lower(), message=record.getMessage(),
                      **exception)
        except Exception:  # as logging's own handlers do: a record that cannot be written never stops the server
            self.handleError(record)


# uvicorn's `log_config` (a logging.config.dictConfig): its loggers ("uvicorn", and below it "uvicorn.error" and
# "uvicorn.access") through LogHandler only.
UVICORN_LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"json": {"()": LogHandler}},
    "loggers": {"uvicorn": {"handlers": ["json"], "propagate": False}},
}
