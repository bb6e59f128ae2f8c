"""A recipe field: its default, its help and the range of values it takes, declared once beside it.

Everything that needs to know a field's rules reads them from here: the recipe's checks (`check_bounds`, which
each section's `validate` starts with), `mtx translate`'s flags and the server's requests (through
`DecodeConfig.first_problem`), `mtx config --keys`, and the server's OpenAPI schema (`Bounds.json_schema`). So
the range a user reads in the documentation is the range that is enforced, wherever the value comes from.

A number must also be finite: no search, schedule or filter has a meaning for NaN or infinity, and letting one
through turns into an overflow far from the key that caused it.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from mtx.errors import MtxError


class ConfigError(MtxError):
    """A recipe problem, always naming the file and the dotted key."""


@dataclass(frozen=True)
class Bounds:
    """The numbers a field may hold: at least (or, `low_open`, more than) `low`, at most (or less than) `high`;
    None: no bound on that side. `note` says what an edge value means ("0 disables it") and follows the
    message."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    note: str = ""

    def holds(self, value: float) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def phrase(self, with_note: bool = True) -> str:
        """The rule in words: "at least 1", "positive", "in (0, 1]", "at least 0 (0 disables it)"."""
        low, high = _number(self.low), _number(self.high)
        if self.low is not None and self.high is not None:  # no thousands' commas among the interval's own
            ends = _number(self.low, commas=False), _number(self.high, commas=False)
            words = f"in {'(' if self.low_open else '['}{ends[0]}, {ends[1]}{')' if self.high_open else ']'}"
        elif self.low is not None and self.low_open:
            words = "positive" if self.low == 0 else f"more than {low}"
        elif self.low is not None:
            words = f"at least {low}"
        elif self.high is not None:
            words = f"less than {high}" if self.high_open else f"at most {high}"
        else:
            words = "a finite number"
        return f"{words} ({self.note})" if self.note and with_note else words

    def json_schema(self, finite: bool = False) -> dict[str, float]:
        """The bounds as JSON Schema's keywords (minimum, exclusiveMinimum, maximum, exclusiveMaximum); `finite`,
        for a float: an open side bounded by the largest finite float, as JSON's numbers have no bound of their
        own and one beyond it reads as infinite, which no float field takes."""
        schema: dict[str, float] = {}
        if self.low is not None:
            schema["exclusiveMinimum" if self.low_open else "minimum"] = self.low
        elif finite:
            schema["minimum"] = -sys.float_info.max
        if self.high is not None:
            schema["exclusiveMaximum" if self.high_open else "maximum"] = self.high
        elif finite:
            schema["maximum"] = sys.float_info.max
        return schema


# The ranges fields of several sections share.
AT_LEAST_1 = Bounds(1)
AT_LEAST_0 = Bounds(0)
RATE = Bounds(0, 1, high_open=True)  # a dropout's or smoothing's share: 1 would leave nothing
POSITIVE = Bounds(0, low_open=True)


def _number(value: float | None, commas: bool = True) -> str:
    if value is None:
        return ""
    return f"{value:g}" if isinstance(value, float) else f"{value:,}" if commas else str(value)


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
            key: str | None = None, bounds: Bounds | None = None) -> Any:
    """A recipe field with its help text (`mtx config --keys` prints it); a list or mapping default is built by
    `factory`, once per recipe. No default: the recipe must set the key. `key`: the recipe's name for the field
    where it cannot be the attribute's, a Python keyword (`from`, attribute `from_`); see `recipe_key`.
    `bounds`: the numbers it may hold (None, the unset value of an optional field, is always allowed)."""
    metadata: dict[str, Any] = {"help": help}
    if key is not None:
        metadata["key"] = key
    if bounds is not None:
        metadata["bounds"] = bounds
    if factory is not None:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def recipe_key(f: dataclasses.Field) -> str:
    """The key a recipe writes for the field `f`: its name, unless `setting(key=...)` gave it another. The loader,
    `mtx config --keys`, a dumped recipe and the data fingerprint all spell fields this way."""
    return f.metadata.get("key", f.name)


def bounds_of(f: dataclasses.Field) -> Bounds | None:
    """The range `setting(bounds=...)` declared for the field `f`, if any."""
    return f.metadata.get("bounds")


def value_problem(f: dataclasses.Field, value: Any) -> str | None:
    """Why `value` cannot be the field `f`'s ("must be at least 1"), or None: an infinite or NaN number never
    can, a number outside the field's bounds neither."""
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    bounds = bounds_of(f)
    if bounds is None or value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if bounds.holds(value):
        return None
    return f"must be {bounds.phrase()}" + (" (or null)" if f.default is None else "")


def bounds_problems(section: Any) -> Iterator[tuple[str, str]]:
    """(field name, what is wrong) for each field of the dataclass instance `section` that breaks its bounds,
    in declaration order."""
    for f in dataclasses.fields(section):
        if (problem := value_problem(f, getattr(section, f.name))) is not None:
            yield f.name, problem


def check(ok: bool, key: str, value: Any, what: str) -> None:
    """A rule of a recipe section that bounds cannot say (one key against another): a ConfigError if not `ok`."""
    if not ok:
        raise ConfigError(f"{key} = {value!r} {what}.")


def check_bounds(section: Any, key: str) -> None:
    """Refuse the first field of `section` (the recipe's section `key`) that breaks its bounds, naming it."""
    for name, problem in bounds_problems(section):
        field_ = next(f for f in dataclasses.fields(section) if f.name == name)
        check(False, f"{key}.{recipe_key(field_)}" if key else recipe_key(field_), getattr(section, name), problem)


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str, key: str = "duration") -> float:
    """Seconds in "12h", "90m", "45s", "2d" or a bare number of seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"{key} = {text!r} is not a duration: write e.g. \"12h\", \"90m\" or \"3600s\".")
    seconds = float(match.group(1)) * {"s": 1, "m": 60, "h": 3600, "d": 86400}[match.group(2) or "s"]
    if not math.isfinite(seconds):
        raise ConfigError(f"{key} = {text!r} is longer than any clock can count: write e.g. \"12h\" or \"2d\".")
    return seconds
