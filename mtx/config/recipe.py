"""Typed recipes: YAML in, validated dataclasses out.

A recipe is the whole description of a run. Every key is checked against the dataclasses below, so a typo is
caught before hours of training (`train.max_tokns` → "did you mean train.max_tokens?"), and every value is
checked for type and range with a message that names its dotted key. `--set a.b=value` overrides are parsed
with `yaml.safe_load`, so they are typed exactly as they would be in the file. This module imports no torch:
`mtx config` and recipe errors must be instant.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from mtx.errors import MtxError


class ConfigError(MtxError):
    """A recipe problem, always naming the file and the dotted key."""


# --------------------------------------------------------------------------------------------------- model


@dataclass
class ModelConfig:
    """The Transformer's shape. `preset` fills every field left unset (None) in the recipe."""

    preset: Literal["tiny", "small", "base", "big"] = "base"
    layers_enc: int | None = None
    layers_dec: int | None = None
    d_model: int | None = None
    heads: int | None = None
    d_ff: int | None = None
    dropout: float | None = None  # on embeddings and residual branches (paper: P_drop)
    attn_dropout: float | None = None  # on attention weights (paper: none; tensor2tensor: 0.1)
    relu_dropout: float | None = None  # inside the feed-forward block
    norm: Literal["post", "pre"] | None = None  # post: the paper; pre: LayerNorm first, plus a final one
    share_embeddings: bool | None = None  # source, target and output projection share one matrix
    max_positions: int | None = None  # longest source or target sequence, in tokens

    def validate(self, key: str) -> None:
        for name in ("layers_enc", "layers_dec", "d_model", "heads", "d_ff", "max_positions"):
            _check(getattr(self, name) >= 1, f"{key}.{name}", getattr(self, name), "must be at least 1")
        for name in ("dropout", "attn_dropout", "relu_dropout"):
            value = getattr(self, name)
            _check(0.0 <= value < 1.0, f"{key}.{name}", value, "must be in [0, 1)")
        _check(
            self.d_model % self.heads == 0,
            f"{key}.heads",
            self.heads,
            f"must divide d_model ({self.d_model})",
        )


# Table 3 of the paper for base and big; tiny and small are for CPUs, tests and the demo.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(layers_enc=2, layers_dec=2, d_model=128, heads=4, d_ff=512, dropout=0.1),
    "small": dict(layers_enc=3, layers_dec=3, d_model=256, heads=4, d_ff=1024, dropout=0.1),
    "base": dict(layers_enc=6, layers_dec=6, d_model=512, heads=8, d_ff=2048, dropout=0.1),
    "big": dict(layers_enc=6, layers_dec=6, d_model=1024, heads=16, d_ff=4096, dropout=0.3),
}
PRESET_COMMON: dict[str, Any] = dict(
    attn_dropout=0.0, relu_dropout=0.0, norm="post", share_embeddings=True, max_positions=1024
)


def resolve_model(model: ModelConfig) -> ModelConfig:
    """The preset's values for every field the recipe left unset."""
    defaults = {**PRESET_COMMON, **PRESETS[model.preset]}
    values = {k: (v if v is not None else defaults[k]) for k, v in dataclasses.asdict(model).items()}
    return ModelConfig(**values)


# ---------------------------------------------------------------------------------------------------- data


@dataclass
class HfSource:
    """A Hugging Face dataset: a hub id (`wmt/wmt14`) or a local path (`save_to_disk` folder, parquet dir)."""

    path: str
    name: str | None = None  # the dataset config, e.g. de-en
    revision: str | None = None
    splits: dict[str, str] = field(
        default_factory=lambda: {"train": "train", "valid": "validation", "test": "test"}
    )


@dataclass
class FilesSource:
    """Aligned plain-text files per split: `[source_file, target_file]`, one sentence per line."""

    train: list[str]
    valid: list[str] | None = None
    test: list[str] | None = None


@dataclass
class TsvSource:
    """One tab-separated file per split: source<TAB>target per line."""

    train: str
    valid: str | None = None
    test: str | None = None


@dataclass
class DemoSource:
    """The built-in, generated English→German corpus (mtx/data/demo/)."""

    pairs: int = 40000
    valid: int = 500
    test: int = 500
    seed: int = 1


@dataclass
class SourceConfig:
    hf: HfSource | None = None
    files: FilesSource | None = None
    tsv: TsvSource | None = None
    demo: DemoSource | None = None

    @property
    def kind(self) -> str:
        return next(k for k in ("hf", "files", "tsv", "demo") if getattr(self, k) is not None)

    def validate(self, key: str) -> None:
        chosen = [k for k in ("hf", "files", "tsv", "demo") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ConfigError(
                f"{key} must name exactly one of hf, files, tsv, demo (found {len(chosen)}: "
                f"{', '.join(chosen) or 'none'})."
            )
        if self.files is not None:
            for split in ("train", "valid", "test"):
                pair = getattr(self.files, split)
                if pair is not None and len(pair) != 2:
                    raise ConfigError(
                        f"{key}.files.{split} must be a list of two files [source, target], got {pair!r}."
                    )


@dataclass
class FilterConfig:
    """Training-data cleaning, as Moses' clean-corpus-n.perl does it. Valid/test sets are never filtered."""

    min_len: int = 1  # words, per side
    max_len: int = 250
    max_ratio: float = 1.5  # longer/shorter side, in words; 0 disables
    dedup: bool = True  # drop exact duplicate pairs

    def validate(self, key: str) -> None:
        _check(self.min_len >= 0, f"{key}.min_len", self.min_len, "must be at least 0")
        _check(self.max_len >= max(self.min_len, 1), f"{key}.max_len", self.max_len, "must be ≥ min_len")
        _check(self.max_ratio >= 0, f"{key}.max_ratio", self.max_ratio, "must be ≥ 0 (0 disables it)")


@dataclass
class BpeConfig:
    vocab_size: int = 37000
    joint: bool = True  # one vocabulary learnt on both languages (the paper's shared source-target BPE)
    max_lines: int = 10_000_000  # training lines sampled per language to learn the merges on huge corpora
    min_frequency: int = 2

    def validate(self, key: str) -> None:
        _check(self.vocab_size >= 300, f"{key}.vocab_size", self.vocab_size, "must be at least 300")
        _check(self.max_lines >= 1, f"{key}.max_lines", self.max_lines, "must be at least 1")
        _check(
            self.joint,
            f"{key}.joint",
            self.joint,
            "must be true: mtx shares one vocabulary between source, target and output (three-way tying)",
        )


@dataclass
class DataConfig:
    source: SourceConfig
    src_lang: str = "en"
    tgt_lang: str = "de"
    filter: FilterConfig = field(default_factory=FilterConfig)
    bpe: BpeConfig = field(default_factory=BpeConfig)

    def validate(self, key: str) -> None:
        for name in ("src_lang", "tgt_lang"):  # they name files: data/test.en, data/test.de
            value = getattr(self, name)
            _check(bool(re.fullmatch(r"[A-Za-z][\w\-]*", value)), f"{key}.{name}", value,
                   "must be a language code such as en or de")
        _check(self.src_lang != self.tgt_lang, f"{key}.tgt_lang", self.tgt_lang, "must differ from src_lang")


# --------------------------------------------------------------------------------------------------- train


@dataclass
class TrainConfig:
    max_tokens: int = 4096  # per GPU per micro-step, max(source, target) tokens × sentences (fairseq)
    update_freq: int = 1  # gradient accumulation: micro-steps per update
    lr_schedule: Literal["inverse_sqrt", "noam"] = "inverse_sqrt"
    lr: float = 7.0e-4  # the peak for inverse_sqrt; a scale factor for noam
    warmup: int = 4000
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1.0e-9
    weight_decay: float = 0.0
    label_smoothing: float = 0.1
    clip_norm: float = 0.0  # 0 disables gradient clipping
    precision: Literal["auto", "fp32", "bf16", "fp16"] = "auto"
    compile: bool = False  # torch.compile the model
    device: Literal["auto", "cpu", "cuda"] = "auto"
    max_steps: int = 100_000
    max_epochs: int | None = None
    max_time: str | None = None  # "12h", "90m", "3600s"; stop cleanly with a checkpoint
    save_every: int = 1000  # steps
    save_every_minutes: float | None = None  # also save by wall clock (the paper: every 10 minutes)
    keep_last: int = 5  # step checkpoints kept; 0 keeps all
    validate_every: int = 1000
    valid_beam: int = 1  # 1: greedy decoding for valid BLEU
    valid_max_sentences: int | None = None  # decode only the first N valid sentences for BLEU
    patience: int | None = None  # validations without a better valid BLEU before stopping
    log_every: int = 100
    bleu_milestones: list[float] = field(default_factory=list)  # valid BLEU levels: when each was first reached
    tensorboard: bool = False  # also write TensorBoard event files, to runs/<name>/tensorboard/ (mtx[tensorboard])
    dist_timeout: str = "30m"  # how long ranks wait for one another (e.g. for rank 0's checkpoint write)

    def validate(self, key: str) -> None:
        for name in ("max_tokens", "update_freq", "max_steps", "save_every", "validate_every", "log_every",
                     "valid_beam"):
            _check(getattr(self, name) >= 1, f"{key}.{name}", getattr(self, name), "must be at least 1")
        _check(self.lr > 0, f"{key}.lr", self.lr, "must be positive")
        _check(self.warmup >= 0, f"{key}.warmup", self.warmup, "must be ≥ 0")
        _check(self.lr_schedule != "noam" or self.warmup >= 1, f"{key}.warmup", self.warmup,
               "must be at least 1 for the noam schedule")
        _check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{key}.betas", self.betas,
               "must be two numbers in [0, 1)")
        _check(self.eps > 0, f"{key}.eps", self.eps, "must be positive")
        _check(0 <= self.label_smoothing < 1, f"{key}.label_smoothing", self.label_smoothing, "must be in [0, 1)")
        _check(self.clip_norm >= 0, f"{key}.clip_norm", self.clip_norm, "must be ≥ 0 (0 disables it)")
        _check(self.keep_last >= 0, f"{key}.keep_last", self.keep_last, "must be ≥ 0 (0 keeps all)")
        for name in ("max_epochs", "patience", "valid_max_sentences"):
            value = getattr(self, name)
            _check(value is None or value >= 1, f"{key}.{name}", value, "must be at least 1 (or null)")
        levels = self.bleu_milestones
        _check(all(0 < level <= 100 for level in levels) and levels == sorted(set(levels)), f"{key}.bleu_milestones",
               levels, "must be BLEU levels in (0, 100], ascending without repeats, e.g. [20, 25, 27]")
        if self.max_time is not None:
            parse_duration(self.max_time, f"{key}.max_time")
        _check(parse_duration(self.dist_timeout, f"{key}.dist_timeout") > 0, f"{key}.dist_timeout",
               self.dist_timeout, "must be a positive duration")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")


def parse_duration(text: str, key: str = "duration") -> float:
    """Seconds in "12h", "90m", "45s", "2d" or a bare number of seconds."""
    match = _DURATION.match(str(text))
    if not match:
        raise ConfigError(f"{key} = {text!r} is not a duration: write e.g. \"12h\", \"90m\" or \"3600s\".")
    number, unit = float(match.group(1)), match.group(2) or "s"
    return number * {"s": 1, "m": 60, "h": 3600, "d": 86400}[unit]


# -------------------------------------------------------------------------------------------------- decode


LengthPenaltyStyle = Literal["gnmt", "fairseq"]


@dataclass
class DecodeConfig:
    """How to search; the defaults are the paper's (beam 4, α = 0.6, at most input length + 50 tokens).

    One set of options for both users: the recipe's `decode:` section, which validation BLEU decodes with
    (at `train.valid_beam`), and `mtx translate`, whose flags override the checkpoint's recipe field by field.
    So the errors can name a field either way: as a recipe key (`validate`) or as its flag (`validate_flags`).
    """

    beam: int = 4
    lenpen: float = 0.6  # α: score = log P(Y|X) / lp(|Y|)
    lenpen_style: LengthPenaltyStyle = "gnmt"  # lp = ((5 + |Y|) / 6) ** α (GNMT, the paper's) or |Y| ** α (fairseq)
    max_len_a: float = 1.0  # output length at most a · source length + b
    max_len_b: int = 50
    min_len: int = 0
    nbest: int = 1  # translations kept per sentence, best first

    @classmethod
    def of_checkpoint(cls, checkpoint: dict[str, Any], **overrides: Any) -> DecodeConfig:
        """The settings of a checkpoint's stored recipe (`decode:`), with `overrides` (the flags a user set)
        on top. A field the recipe lacks, as one written before the field existed, takes the paper's default,
        and a key mtx no longer knows is passed over, so every checkpoint still translates."""
        stored = (checkpoint.get("recipe") or {}).get("decode") or {}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in stored.items() if k in known}, **overrides})

    def validate(self, key: str) -> None:
        """As the recipe section `key`: `decode.beam = 0 must be at least 1.`"""
        self._validate(lambda name: f"{key}.{name}", " = ", ConfigError)

    def validate_flags(self) -> None:
        """As command-line flags: `--beam 0 must be at least 1.`, `--max-len-a -1.0 must be ≥ 0.`"""
        self._validate(lambda name: "--" + name.replace("_", "-"), " ", MtxError)

    def _validate(self, spell: Callable[[str], str], separator: str, error: type[MtxError]) -> None:
        """Refuse values the search cannot honour, naming the field as `spell` writes its name."""
        styles = typing.get_args(LengthPenaltyStyle)
        problems = [
            (self.lenpen_style in styles, "lenpen_style", f"is not one of {', '.join(styles)}"),
            (self.beam >= 1, "beam", "must be at least 1"),
            (1 <= self.nbest <= self.beam, "nbest", f"must be between 1 and {spell('beam')} ({self.beam})"),
            (self.lenpen >= 0, "lenpen", "must be ≥ 0"),
            (self.max_len_a >= 0, "max_len_a", "must be ≥ 0"),
            (self.max_len_b >= 1, "max_len_b", "must be at least 1"),
            (self.min_len >= 0, "min_len", "must be ≥ 0"),
        ]
        for ok, name, what in problems:
            if not ok:
                raise error(f"{spell(name)}{separator}{getattr(self, name)!r} {what}.")


# -------------------------------------------------------------------------------------------------- recipe


@dataclass
class Recipe:
    name: str
    data: DataConfig
    seed: int = 1
    run_dir: str | None = None  # default: runs/<name>, relative to the working directory
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    decode: DecodeConfig = field(default_factory=DecodeConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def validate(self, key: str) -> None:
        _check(bool(re.fullmatch(r"[\w.\-]+", self.name)), "name", self.name,
               "may hold only letters, digits, '.', '_' and '-' (it names the run directory)")

    def to_dict(self) -> dict[str, Any]:
        return strip_nones(dataclasses.asdict(self))


def strip_nones(value: Any) -> Any:
    """Drop unset optional keys, so a printed recipe loads back as the same recipe and a data fingerprint does
    not change when a key is added with an unset default."""
    if isinstance(value, dict):
        return {k: strip_nones(v) for k, v in value.items() if v is not None}
    return value


# --------------------------------------------------------------------------------------- loading, checking


def _check(ok: bool, key: str, value: Any, what: str) -> None:
    if not ok:
        raise ConfigError(f"{key} = {value!r} {what}.")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    if origin is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false",
            type(None): "null"}.get(tp, str(tp))


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
                if dataclasses.is_dataclass(arg) and isinstance(value, dict):
                    raise
        raise ConfigError(f"{key} = {value!r} must be {_type_name(tp)}.")
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in typing.get_args(tp)], n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(f"{key} = {value!r} must be {_type_name(tp)}{hint}.")
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{key} = {value!r} must be {_type_name(tp)}.")
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
    raise ConfigError(f"{key} = {value!r} must be {_type_name(tp)}.")


def _dataclass_from_mapping(cls: type, values: dict[str, Any], prefix: str) -> Any:
    """An instance of the dataclass `cls` (a recipe or one of its sections) from a parsed YAML mapping: each
    key checked and typed by its field, the preset expanded and the whole validated, every error naming its
    dotted key under `prefix`."""
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in values.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            raise ConfigError(_unknown_key_message(key, str(name), prefix, list(fields)))
        kwargs[name] = _convert(value, hints[name], key)
    for name, f in fields.items():
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and name not in kwargs:
            key = f"{prefix}.{name}" if prefix else name
            raise ConfigError(f"{key} is missing: the recipe must set it ({_type_name(hints[name])}).")
    obj = cls(**kwargs)
    if isinstance(obj, ModelConfig):
        obj = resolve_model(obj)
    if hasattr(obj, "validate"):
        obj.validate(prefix)
    return obj


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted key a recipe may hold, for suggestions across sections (`max_tokens` → train.max_tokens)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{f.name}" if prefix else f.name
        keys.append(key)
        inner = [a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)]
        nested = hints[f.name] if dataclasses.is_dataclass(hints[f.name]) else (inner[0] if inner else None)
        if nested is not None:
            keys.extend(_all_keys(nested, key))
    return keys


def _unknown_key_message(key: str, name: str, prefix: str, valid: list[str]) -> str:
    close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
    if close:
        suggestion = f"did you mean {prefix + '.' if prefix else ''}{close[0]}?"
    else:
        elsewhere = [k for k in _all_keys(Recipe) if k.rsplit(".", 1)[-1] == name]
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
    raw = apply_overrides(raw, overrides or [])
    try:
        return _dataclass_from_mapping(Recipe, raw, "")
    except ConfigError as e:
        raise ConfigError(f"Recipe {path}: {e}") from None


def recipe_from_dict(raw: dict[str, Any]) -> Recipe:
    """A recipe from an already-parsed mapping, e.g. the copy stored in a checkpoint or manifest."""
    return _dataclass_from_mapping(Recipe, raw, "")


def dump_recipe(recipe: Recipe) -> str:
    return yaml.safe_dump(recipe.to_dict(), sort_keys=False, allow_unicode=True, default_flow_style=None)
