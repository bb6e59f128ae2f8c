"""Every key a recipe may hold, with its type in words, its default and its help: what `mtx config --keys` prints,
and what the loader's messages draw on ("must be an integer", "did you mean train.max_tokens?").

The keys are read off the recipe's dataclasses (mtx.config.recipe and its sections' modules), so a field added
there is listed here with no second place to keep up to date.
"""

from __future__ import annotations

import dataclasses
import textwrap
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Union

from mtx.config.fields import bounds_of, recipe_key
from mtx.config.model import FROM_PRESET, ModelConfig
from mtx.config.recipe import Recipe


@dataclass(frozen=True)
class KeyHelp:
    """One dotted key: its type in words, its default as YAML would write it (None: required), its help, and the
    range of its values in words where it declares one ("at least 1", "in (0, 1]")."""

    key: str
    type: str
    default: str | None
    help: str
    section: bool  # a mapping (train, data.bpe) or list of mappings (data.sources) of further keys, not a value
    range: str | None = None


def type_name(tp: Any) -> str:
    """A type hint in words, as a recipe's author thinks of it: "an integer", "one of 'post', 'pre'"."""
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(type_name(a) for a in typing.get_args(tp))
    if origin is list:
        item = typing.get_args(tp)[0]
        if dataclasses.is_dataclass(item):
            return "a list of mappings"
        return "a list of " + {int: "integers", float: "numbers", str: "strings"}.get(item, type_name(item))
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, str(tp))


LIST_ITEM = "[i]"  # how a key names any item of a list of sections: data.sources[i].tag


def section_type(tp: Any) -> type | None:
    """The dataclass a field holds, alone or as `X | None`; None for a plain value."""
    if dataclasses.is_dataclass(tp):
        return tp
    inner = [a for a in typing.get_args(tp) if dataclasses.is_dataclass(a)]
    return inner[0] if inner else None


def list_section_type(tp: Any) -> type | None:
    """The dataclass of each item of a field that holds a list of them (`list[X] | None`), else None."""
    lists = [a for a in (tp, *typing.get_args(tp)) if typing.get_origin(a) is list]
    return section_type(typing.get_args(lists[0])[0]) if lists else None


def all_keys(cls: type = Recipe, prefix: str = "") -> list[KeyHelp]:
    """Every key of the dataclass `cls` and of its sections, depth first, in the order the classes declare them;
    the keys of a list's items under `LIST_ITEM` (data.sources[i].tag)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{recipe_key(f)}" if prefix else recipe_key(f)
        nested, items = section_type(hints[f.name]), list_section_type(hints[f.name])
        bounds = bounds_of(f)
        keys.append(KeyHelp(key, type_name(hints[f.name]), _default(cls, f, nested), f.metadata.get("help", ""),
                            nested is not None or items is not None,
                            None if bounds is None else bounds.phrase(with_note=False)))
        if nested is not None:
            keys.extend(all_keys(nested, key))
        if items is not None:
            keys.extend(all_keys(items, key + LIST_ITEM))
    return keys


def _default(cls: type, f: dataclasses.Field, nested: type | None) -> str | None:
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return None
    if cls is ModelConfig and f.name != "preset":
        return FROM_PRESET
    value = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if nested is not None and value is not None:
        return "(its keys' defaults)"
    return _yaml(value)


def _yaml(value: Any) -> str:
    """A default as a recipe writes it: null, true, 4096, 7.0e-4, [0.9, 0.98], gnmt."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and value != 0 and abs(value) < 1e-3:
        return f"{value:.1e}"
    return str(value)


_UNSET = object()


def value_in(recipe: Recipe, key: str) -> Any:
    """The value a resolved recipe holds for a dotted key; `_UNSET` under a section it leaves out (data.source.hf
    of a demo recipe) and for the keys of a list's items, which have a value per item."""
    value: Any = recipe
    for part in key.split("."):
        if value is None or part.endswith(LIST_ITEM):
            return _UNSET
        value = getattr(value, next(f.name for f in dataclasses.fields(value) if recipe_key(f) == part))
    return value


def format_keys(keys: list[KeyHelp], recipe: Recipe | None = None, width: int = 100) -> str:
    """The keys as text: a line per key with its type and default (and, given a recipe, the recipe's own value
    where it differs), then its help, indented; each section headed by a comment line with its help."""
    lines = []
    for k in keys:
        if k.section:
            lines.append(f"\n# {k.key}: {k.help}")
            continue
        default = "required" if k.default is None else f"default {k.default}"
        line = f"{k.key}  ({k.type}{'' if k.range is None else ', ' + k.range}; {default})"
        value = _UNSET if recipe is None else value_in(recipe, k.key)
        if value is not _UNSET and _yaml(value) != k.default:
            line += f"  — this recipe: {_yaml(value)}"
        lines.append(line)
        lines.extend(textwrap.wrap(k.help, width, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines).lstrip("\n") + "\n"
