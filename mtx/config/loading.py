"""Reading a recipe: YAML in, checked against the recipe's dataclasses, a `Recipe` out.

Every key is checked against the dataclasses, so a typo is caught before hours of training (`train.max_tokns` →
"did you mean train.max_tokens?"), and every value is checked for type and range with a message that names its
dotted key. `--set a.b=value` overrides are parsed with `yaml.safe_load`, so they are typed exactly as they
would be in the file.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from mtx.config.fields import ConfigError, recipe_key
from mtx.config.keys import all_keys, type_name
from mtx.config.model import ModelConfig, resolve_model
from mtx.config.recipe import Recipe


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check `value` against the type hint `tp`, converting only where YAML is loose (1 for 1.0)."""
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError:
                if _shaped_like(value, arg):  # the error inside a section says more than "must be a mapping"
                    raise
        raise ConfigError(f"{key} = {value!r} must be {type_name(tp)}.")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key} = {value!r} must be {type_name(tp)}{hint}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} = {value!r} must be {type_name(tp)}.")
        (item,) = typing.get_args(tp)
        return [_convert(v, item, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} = {value!r} must be a mapping.")
        _, item = typing.get_args(tp)
        return {str(k): _convert(v, item, f"{key}.{k}") for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if value is None:  # an empty section (`train:`) means all defaults
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a mapping of keys, got {value!r}.")
        return _dataclass_from_mapping(tp, value, key)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads "7e-4" (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif tp is str and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return str(value)
    raise ConfigError(f"{key} = {value!r} must be {type_name(tp)}.")


def _shaped_like(value: Any, tp: Any) -> bool:
    """Whether `value` has the shape of `tp`, a section (a mapping) or a list, so that an error converting it is
    about something inside it."""
    return ((dataclasses.is_dataclass(tp) and isinstance(value, dict))
            or (typing.get_origin(tp) is list and isinstance(value, list)))


def _dataclass_from_mapping(cls: type, values: dict[str, Any], prefix: str) -> Any:
    """An instance of the dataclass `cls` (a recipe or one of its sections) from a parsed YAML mapping: each
    key checked and typed by its field, the preset expanded and the whole validated, every error naming its
    dotted key under `prefix`. Keys are the recipe's (`recipe_key`), which a few fields spell otherwise."""
    hints = typing.get_type_hints(cls)
    fields = {recipe_key(f): f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            raise ConfigError(_unknown_key_message(key, str(name), prefix, list(fields)))
        kwargs[fields[name].name] = _convert(value, hints[fields[name].name], key)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in kwargs:
            key = f"{prefix}.{name}" if prefix else name
            raise ConfigError(f"{key} is missing: the recipe must set it ({type_name(hints[f.name])}).")
    obj = cls(**kwargs)
    if isinstance(obj, ModelConfig):
        obj = resolve_model(obj)
    if hasattr(obj, "validate"):
        obj.validate(prefix)
    return obj


def _unknown_key_message(key: str, name: str, prefix: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        suggestion = f"did you mean {prefix + '.' if prefix else ''}{close[0]}?"
    else:
        elsewhere = [k.key for k in all_keys() if k.key.rsplit(".", 1)[-1] == name]
        suggestion = (f"did you mean {elsewhere[0]}?" if elsewhere
                      else f"valid keys here: {', '.join(valid)}.")
    return f"Unknown recipe key {key}: {suggestion}"


def parse_override(text: str) -> tuple[list[str], Any]:
    """`train.max_steps=200` → (["train", "max_steps"], 200), the value typed by YAML."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r} must look like KEY=VALUE, e.g. --set train.max_steps=200.")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*", key):
        raise ConfigError(f"--set {text!r}: {key!r} is not a dotted recipe key such as train.max_steps.")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as e:
        raise ConfigError(f"--set {text!r}: the value is not valid YAML ({e}).") from None
    return key.split("."), value


def apply_overrides(raw: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    for text in overrides:
        path, value = parse_override(text)
        node = raw
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"--set {text!r}: {where} is a value, not a section.")
            node = child
        node[path[-1]] = value
    return raw


def load_recipe(path: str | Path, overrides: list[str] | None = None) -> Recipe:
    """Read, override, validate. Every failure is a ConfigError naming the file and key."""
    return recipe_from_raw(read_recipe(path, overrides), path)


def read_recipe(path: str | Path, overrides: list[str] | None = None) -> dict[str, Any]:
    """The recipe at `path` as a parsed mapping, the overrides applied, not yet checked: for a caller that
    completes it before it is read as a recipe (a fine-tuning recipe takes its parent's model section)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"Recipe {path} does not exist: pass the path of a YAML recipe, e.g. recipes/demo.yaml.")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ConfigError(f"Recipe {path} is not valid UTF-8 (byte {e.start}).") from None
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"Recipe {path} is not valid YAML{where}: {problem}.") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"Recipe {path} must be a mapping of sections (name, data, model, train, decode).")
    return apply_overrides(raw, overrides or [])


def recipe_from_raw(raw: dict[str, Any], path: str | Path) -> Recipe:
    """The recipe of the parsed mapping `raw`, read from the file `path`, which its errors name."""
    try:
        return _resolved(_dataclass_from_mapping(Recipe, raw, ""), raw)
    except ConfigError as e:
        raise ConfigError(f"Recipe {path}: {e}") from None


def recipe_from_dict(raw: dict[str, Any]) -> Recipe:
    """A recipe from an already-parsed mapping, e.g. the copy stored in a checkpoint or manifest."""
    return _resolved(_dataclass_from_mapping(Recipe, raw, ""), raw)


def _resolved(recipe: Recipe, raw: dict[str, Any]) -> Recipe:
    """`recipe` with the defaults that depend on which keys `raw` gives settled (train.tune_lenpen)."""
    recipe.train.tune_lenpen = tunes_lenpen(raw)
    return recipe


def tunes_lenpen(raw: dict[str, Any]) -> bool:
    """train.tune_lenpen of a recipe mapping: as given, else on unless decode.lenpen is given (pinned). A recipe
    stored before the key existed gives every decode key, so its α counts as pinned: its run decodes as it did."""
    given = (raw.get("train") or {}).get("tune_lenpen")
    return given if given is not None else "lenpen" not in (raw.get("decode") or {})


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True, default_flow_style=None)
