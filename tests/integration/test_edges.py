"""Values at the edges of every numeric option, drawn by hypothesis: the next crash of issue 35's kind.

Each numeric field declares its range once (`mtx.config.fields.Bounds`), and every float must be finite. These
tests draw values from that range and from just outside it — the bounds themselves, their neighbours
(`math.nextafter` for floats, ±1 for integers), 0, -0.0, negatives, subnormals, 1e300, the largest float,
infinities, NaN, integers of 20 and 400 digits — and feed them to mtx wherever a user can: `mtx translate`'s
flags, `POST /translate`'s JSON, a recipe's keys (`--set`, `mtx config`) and `mtx prepare`. Whatever the value,
mtx must either do the job or refuse it with a message that names the option (exit 1, HTTP 4xx); a traceback,
an HTTP 5xx or a dead process is the defect these tests exist to find. And the declared range must be the
enforced one: a value `value_problem` accepts, which breaks no rule tying it to another option, must work; one
it refuses must be refused.

Values that would legitimately take unbounded time or memory are left out where they are drawn, each with a
comment saying why; a few of those that should be refused at once are run in a subprocess with a timeout.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import tempfile
import traceback
import types
import typing
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import Server, translate_cli
from typer.testing import CliRunner

from mtx.cli import app
from mtx.config.fields import Bounds, bounds_of, recipe_key, value_problem
from mtx.config.keys import LIST_ITEM, all_keys, list_section_type, section_type
from mtx.config.loading import load_recipe
from mtx.config.recipe import DecodeConfig, Recipe
from mtx.errors import MtxError


def edge_settings(examples: int) -> settings:
    """The same examples on every run (no database, no luck), no deadline on a shared CPU, a bounded count."""
    return settings(derandomize=True, database=None, deadline=None, max_examples=examples,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ---------------------------------------------------------------------------------------------- the values

HUGE_INTS = (10**20, -(10**20), 10**400, 2**31, 2**32, 2**63 - 1, 2**63, 2**64, -(2**63) - 1)
SPECIAL_FLOATS = (0.0, -0.0, 1.0, -1.0, 0.5, 5e-324, -5e-324, 1e-310, 1e-300, 1e300, -1e300, 1e308,
                  sys.float_info.max, -sys.float_info.max, math.inf, -math.inf, math.nan)


def number_kind(tp: Any) -> type | None:
    """int or float for a field that holds one (alone or `| None`), else None (bool, str, a list, a section)."""
    if typing.get_origin(tp) not in (None, typing.Union, types.UnionType):
        return None
    args = [a for a in (typing.get_args(tp) or (tp,)) if a is not type(None)]
    return args[0] if args in ([int], [float]) else None


def edges(bounds: Bounds | None, kind: type) -> list:
    """The values a field's range makes interesting: its bounds and their neighbours inside and outside, and the
    values at the edges of the number type itself."""
    if kind is float:
        values = list(SPECIAL_FLOATS)
        for edge in (bounds.low, bounds.high) if bounds else ():
            if edge is not None:
                values += [float(edge), math.nextafter(edge, -math.inf), math.nextafter(edge, math.inf)]
    else:
        values = [0, 1, -1, 2, *HUGE_INTS]
        for edge in (bounds.low, bounds.high) if bounds else ():
            if edge is not None:
                values += [math.floor(edge) - 1, math.floor(edge), math.ceil(edge), math.ceil(edge) + 1]
    return list({repr(v): v for v in values}.values())  # once each; -0.0 apart from 0.0, which equals it


def inside(bounds: Bounds | None, kind: type) -> st.SearchStrategy:
    """Any value of the declared range."""
    low, high = (bounds.low, bounds.high) if bounds else (None, None)
    if kind is float:
        return st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False,
                         exclude_min=bool(bounds and bounds.low_open and low is not None),
                         exclude_max=bool(bounds and bounds.high_open and high is not None))
    if low is not None:
        low = math.floor(low) + 1 if bounds.low_open else math.ceil(low)
    if high is not None:
        high = math.ceil(high) - 1 if bounds.high_open else math.floor(high)
    return st.integers(min_value=low, max_value=high)


def values_of(f: dataclasses.Field, kind: type) -> st.SearchStrategy:
    """A field's values: an edge, any value of its range, or any number at all (None too where it may be unset)."""
    bounds = bounds_of(f)
    anything = st.floats() if kind is float else st.integers()
    drawn = st.one_of(st.sampled_from(edges(bounds, kind)), inside(bounds, kind), anything)
    return st.one_of(st.none(), drawn) if f.default is None else drawn


def flag_text(value: Any) -> str:
    """A number as a user types it: 1e+308, inf, nan, -0.0, 400 digits."""
    return repr(value) if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- mtx translate and the server

DECODE_FIELDS = {f.name: f for f in dataclasses.fields(DecodeConfig)}
DECODE_KINDS = {name: kind for name, tp in typing.get_type_hints(DecodeConfig).items()
                if (kind := number_kind(tp)) is not None}
LINE_OFFSET = Bounds(0)  # --line-offset and the request's line_offset: an index, ≥ 0
NUMERIC_OPTIONS = {**DECODE_KINDS, "line_offset": int}
RECIPE_DECODE = {"beam": 4, "lenpen": 0.6}  # the copying checkpoint's `decode:`
MAX_BEAM = 16  # the server's --max-beam
# With sampling, nbest is the samples drawn per sentence, and they cost time in proportion (100,000 of two short
# sentences take a minute): from 17 up to what the memory check refuses at once, a value is slow, not wrong.
SLOW_SAMPLES = range(17, 10**12)


def line_offset_problem(value: int) -> str | None:
    return None if LINE_OFFSET.holds(value) else "must be ≥ 0"


@st.composite
def decode_options(draw: st.DrawFn, server: bool = False) -> dict[str, Any]:
    """One to three numeric options at or beyond their edges, with sampling on or off and, unless drawn, a beam
    of 1 or 4 (or the recipe's) and a small nbest (or the recipe's)."""
    names = draw(st.lists(st.sampled_from(list(NUMERIC_OPTIONS)), min_size=1, max_size=3, unique=True))
    options = {}
    for name in names:
        if name == "line_offset":
            options[name] = draw(st.one_of(st.sampled_from(edges(LINE_OFFSET, int)), st.integers()))
        else:
            options[name] = draw(values_of(DECODE_FIELDS[name], DECODE_KINDS[name]))
    if draw(st.booleans()):
        options["sampling"] = True
    for name, choices in (("beam", [None, 1, 4]), ("nbest", [None, 1, 2, 3]), ("lenpen_style", [None, "fairseq"])):
        if name not in options and (value := draw(st.sampled_from(choices))) is not None:
            options[name] = value
    options = {k: v for k, v in options.items() if v is not None}  # None: left to the recipe
    # The server refuses an nbest above --max-beam, so it takes them all.
    if not server and options.get("sampling") and options.get("nbest", 1) in SLOW_SAMPLES:
        options["nbest"] = draw(st.sampled_from([1, 16, 10**12, 10**20, 10**400]))
    return options


def rule_breakers(options: dict[str, Any], vocab_size: int, max_beam: int | None = None) -> set[str]:
    """The options that break a rule: their field's range, or one that ties it to another (nbest ≤ beam unless
    sampling; topk, topp and temperature only with sampling; sampling draws with beam 1; a beam at most the
    vocabulary; a shortlist only from a checkpoint's lexical table; the server's --max-beam), all of them: mtx
    names the first it checks. Empty: the options must decode."""
    decode = {**dataclasses.asdict(DecodeConfig()), **RECIPE_DECODE, **options}
    broken = {name for name, value in options.items()
              if (line_offset_problem(value) if name == "line_offset" else value_problem(DECODE_FIELDS[name], value))}
    if not decode["sampling"]:
        if decode["nbest"] > decode["beam"]:
            broken |= {"nbest", "beam"}
        broken |= {name for name, unset in (("topk", None), ("topp", 1.0), ("temperature", 1.0))
                   if decode[name] != unset}
    elif options.get("beam", 1) != 1:
        broken |= {"beam", "sampling"}
    if decode["beam"] > vocab_size:
        broken.add("beam")
    if decode["shortlist"] > 0:  # the copying checkpoint carries no lexical table for a shortlist to be made of
        broken.add("shortlist")
    if max_beam is not None:
        broken |= {name for name in ("beam", "nbest") if decode[name] > max_beam}
    return broken


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@pytest.fixture(scope="module")
def two(copying: dict) -> Path:
    """Two of the copying fixture's held-out sentences in a file: small inputs, fast decodes."""
    path = copying["folder"] / "two.txt"
    path.write_text("".join(f"{s}\n" for s in copying["held_out"][:2]), encoding="utf-8")
    return path


def shown(options: dict[str, Any]) -> str:
    """Options for a message, a number of more than 30 digits by its size: {'nbest': '10**400'}."""
    def short(v: Any) -> Any:
        if isinstance(v, str) and v.lstrip("-").isdigit():
            v = int(v)
        return f"{'-' if v < 0 else ''}10**{len(str(abs(v))) - 1}" if isinstance(v, int) and abs(v) > 10**30 else v

    return str({k: short(v) for k, v in options.items()})


def check_translate(copying: dict, two: Path, options: dict[str, Any]) -> None:
    """`mtx translate` of two sentences with `options` as flags exits 0 with two lines if no option breaks a rule,
    and 1 with a message (an MtxError) naming one that does otherwise; any other exception fails the test."""
    args = [f"{flag(k)}={flag_text(v)}" if not isinstance(v, bool) else flag(k) for k, v in options.items()]
    result, lines = translate_cli(["-m", str(copying["checkpoint"]), "-i", str(two), *args])
    what = shown(options)
    assert result.exit_code in (0, 1), (what, result.output)
    broken = rule_breakers(options, copying["tokenizer"].vocab_size)
    if result.exit_code == 0:
        assert result.exception is None and len(lines) == 2, (what, lines)
        assert not broken, f"{what}: decoded, though {sorted(broken)} break a rule"
        return
    assert isinstance(result.exception, MtxError), (what, result.exception)
    message = str(result.exception)
    # With sampling, a huge nbest may be refused by the memory check: a refusal the ranges cannot foresee.
    memory = bool(options.get("sampling")) and options.get("nbest", 1) >= 10**12
    assert broken or memory, f"{what}: refused, though every value is in range and breaks no rule: {message}"
    if broken:
        assert any(flag(name) in message for name in broken), (what, sorted(broken), message)



def one_at_a_time(name: str, server: bool = False) -> Iterator[dict[str, Any]]:
    """The numeric option `name` at each of its edges, alone (with the recipe's beam 4) and with sampling."""
    bounds = LINE_OFFSET if name == "line_offset" else bounds_of(DECODE_FIELDS[name])
    for value in edges(bounds, NUMERIC_OPTIONS[name]):
        yield {name: value}
        if name != "nbest" or server or value not in SLOW_SAMPLES:
            yield {name: value, "sampling": True}


def every_failure(check: Callable[[dict[str, Any]], None], cases: Iterator[dict[str, Any]]) -> None:
    """Run `check` on every case, then fail with all the cases that failed (the exception, where it was raised),
    not only the first."""
    failures = []
    for options in cases:
        try:
            check(options)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # an assertion, a crash of mtx the check re-raised, a Rust panic (pyo3's)
            cause = e.__cause__ or e
            frames = traceback.extract_tb(cause.__traceback__)
            ours = [f"{f.filename}:{f.lineno}" for f in frames if "/mtx/" in f.filename and "/tests/" not in f.filename]
            where = ", ".join(dict.fromkeys([*ours[-1:], f"{frames[-1].filename}:{frames[-1].lineno}"]))
            failures.append(f"{shown(options)}: {type(cause).__name__}: {str(cause).splitlines()[0][:300]} ({where})")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("name", list(NUMERIC_OPTIONS))
def test_translate_flags_each_at_its_edges_decode_or_are_refused_by_name(copying: dict, two: Path,
                                                                          name: str) -> None:
    """`mtx translate` with one numeric flag at each edge of its range (the bound, its neighbours inside and
    outside, 0, -0.0, negatives, subnormals, 1e308, the largest float, ±inf, NaN, 20 and 400 digits), with and
    without --sampling: exit 0 with one output line per input line, or exit 1 with a message naming the flag —
    never another exception; and exit 0 exactly where the value is in range and breaks no rule."""
    every_failure(lambda options: check_translate(copying, two, options), one_at_a_time(name))


@edge_settings(200)
@given(options=decode_options())
def test_translate_flags_at_their_edges_together_decode_or_are_refused_by_name(copying: dict, two: Path,
                                                                                options: dict) -> None:
    """As above, for one to three flags at once, drawn by hypothesis from their edges, their ranges and all
    numbers, with sampling on or off, a beam of 1 or 4 and a small nbest: the rules between flags (nbest ≤
    beam, topk/topp/temperature only with sampling, sampling with beam 1) hold whatever the values."""
    check_translate(copying, two, options)


def json_spellings(value: Any) -> list[str]:
    """A number as a JSON body may hold it: Python's json.dumps (NaN, Infinity, -Infinity for non-finite floats),
    and the raw spellings a client may send instead (1e999 for infinity)."""
    spellings = [json.dumps(value)]
    if isinstance(value, float) and math.isinf(value):
        spellings.append("-1e999" if value < 0 else "1e999")
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        spellings.append(str(int(value)))  # a float field given a JSON integer
    return spellings


@pytest.fixture(scope="module")
def server(copying: dict, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """`mtx serve` of the copying checkpoint on a free port of 127.0.0.1, one decoding worker of one thread."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")

    started = Server(copying["checkpoint"], tmp_path_factory.mktemp("edges") / "serve.log", "--threads", "1",
                     "--max-beam", str(MAX_BEAM))
    yield started
    started.stop()


def check_request(server, copying: dict, options: dict[str, Any], sentences: int, spelling: int) -> None:
    """POST /translate of `sentences` sentences with `options`, each spelled its `spelling`-th way (modulo the
    number of ways): 200 with a translation per sentence if no option breaks a rule, else 4xx with a JSON body
    {"error", "field"} naming one that does — never 5xx."""
    text = copying["held_out"][:sentences]
    fields = [f'"{k}": {(ways := json_spellings(v))[spelling % len(ways)]}' for k, v in options.items()]
    body = "{" + ", ".join([f'"text": {json.dumps(text)}', *fields]) + "}"
    status, _, answer = server.request("POST", "/translate", body.encode(), {"Content-Type": "application/json"})
    assert status < 500, (body, status, answer)
    answer = json.loads(answer)
    broken = rule_breakers(options, copying["tokenizer"].vocab_size, MAX_BEAM)
    if status == 200:
        assert len(answer["translations"]) == len(text), (body, answer)
        assert not broken, f"{body}: translated, though {sorted(broken)} break a rule"
        return
    assert 400 <= status < 500 and isinstance(answer.get("error"), str), (body, status, answer)
    assert broken, f"{body}: {status}, though every value is in range and breaks no rule: {answer}"
    assert answer.get("field") in broken and answer["field"] in answer["error"], (body, sorted(broken), answer)


def test_post_translate_with_options_at_their_edges_answers_200_or_4xx_naming_the_field(server, copying: dict) -> None:
    """POST /translate with the options of the tests above as JSON, each alone at each edge in each spelling
    (NaN, Infinity and 1e999 sent raw), then 80 drawn together by hypothesis: 200 with one translation per
    sentence, or 4xx whose body {"error", "field"} names a field at fault — never 5xx; options within their
    ranges that break no rule must be translated; and the server is healthy at the end, with no 5xx logged."""
    def alone(options: dict[str, Any]) -> None:
        for spelling in range(max(len(json_spellings(v)) for v in options.values())):
            check_request(server, copying, options, 1, spelling)

    every_failure(alone, (options for name in NUMERIC_OPTIONS for options in one_at_a_time(name, server=True)))

    @edge_settings(80)
    @given(options=decode_options(server=True), sentences=st.sampled_from([1, 2]), spelling=st.integers(0, 2))
    def together(options: dict, sentences: int, spelling: int) -> None:
        check_request(server, copying, options, sentences, spelling)

    together()
    assert server.get("/health") == (200, b'{"status":"ready"}')
    errors = [e for e in server.events() if e.get("path") == "/translate" and e.get("status", 0) >= 500]
    assert not errors, errors


# --------------------------------------------------------------------------------------------- recipe keys


def numeric_keys(cls: type = Recipe, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, type]]:
    """(dotted key, field, int or float) for every numeric field of the recipe's dataclasses, depth first; a list's
    items under `LIST_ITEM` (data.sources[i].weight), as `all_keys` names them."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = f"{prefix}.{recipe_key(f)}" if prefix else recipe_key(f)
        if (nested := section_type(hints[f.name])) is not None:
            yield from numeric_keys(nested, key)
        elif (items := list_section_type(hints[f.name])) is not None:
            yield from numeric_keys(items, key + LIST_ITEM)
        elif (kind := number_kind(hints[f.name])) is not None:
            yield key, f, kind


NUMERIC_KEYS = {key: (f, kind) for key, f, kind in numeric_keys()}
NUMBER_TYPES = {"an integer", "a number", "an integer or null", "a number or null"}
DEMO = {"pairs": 200, "valid": 10, "test": 10}
BASE_RECIPE = {"name": "edges", "data": {"source": {"demo": DEMO}, "bpe": {"vocab_size": 400},
                                         "lexicon": {"learn": True}},  # so that the lexicon's keys are exercised
               "model": {"preset": "tiny"}}
# The rules that tie a key to another of the base recipe (tiny: d_model 128, heads 4; filter 1 to 250 words;
# decode beam 4, nbest 1, no sampling; no tags): (refuses the value, the keys its message may name).
OTHER_KEYS_RULES: dict[str, tuple[Callable[[Any], bool], tuple[str, ...]]] = {
    "data.filter.min_len": (lambda v: v > 250, ("data.filter.max_len",)),
    "model.heads": (lambda v: 128 % v != 0, ("model.heads",)),
    "model.d_model": (lambda v: v % 4 != 0, ("model.heads",)),
    "decode.nbest": (lambda v: v > 4, ("decode.nbest",)),
    "decode.topk": (lambda v: v is not None, ("decode.topk",)),
    "decode.topp": (lambda v: v != 1.0, ("decode.topp",)),
    "decode.temperature": (lambda v: v != 1.0, ("decode.temperature",)),
}
# Building the model for `mtx config`'s parameter count takes time in proportion to its layers, on the meta device
# too (1,000 decoder layers: 2 s); more than this many are checked by loading the recipe only, and 10**20 by
# `test_mtx_config_with_a_huge_layer_count_answers_within_seconds`.
LAYERS_FOR_CONFIG = 64


def test_every_numeric_recipe_key_is_drawn() -> None:
    """The walk of the recipe's dataclasses finds every key `mtx config --keys` lists as a number, so the tests
    below cover a numeric key added later without being told."""
    listed = {k.key for k in all_keys() if k.type in NUMBER_TYPES}
    assert listed == set(NUMERIC_KEYS)
    assert {"decode.lenpen", "train.ema_decay", "data.sources[i].weight", "data.source.demo.pairs"} <= listed


def yaml_spellings(value: Any) -> list[str]:
    """A number as a recipe or `--set` may spell it: YAML's .inf, -.inf and .nan, Python's inf and nan (strings to
    YAML, which the loader reads as numbers), 1e999, and digits for integers."""
    if value is None:
        return ["null"]
    if isinstance(value, int):
        return [str(value)]
    if math.isnan(value):
        return [".nan", "nan"]
    if math.isinf(value):
        sign = "-" if value < 0 else ""
        return [f"{sign}.inf", f"{sign}inf", f"{sign}1e999"]
    return [repr(value)]


@pytest.fixture(scope="module")
def recipes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding the small valid demo recipe, base.yaml."""
    folder = tmp_path_factory.mktemp("recipes")
    (folder / "base.yaml").write_text(yaml.safe_dump(BASE_RECIPE), encoding="utf-8")
    return folder


def recipe_with(folder: Path, key: str, spelling: str) -> tuple[Path, list[str], str]:
    """(recipe file, overrides, the key as messages spell it) setting `key` to `spelling`: by `--set` for a plain
    key (on a recipe whose source is files for a key of a files source: a teacher's .jsonl translations, which
    keep_best needs); written into a `data.sources` list of one corpus for a key of a list's items, which `--set`
    cannot name."""
    if key.startswith("data.source.files."):  # and data.sources[i].files.KEY below
        raw = {**BASE_RECIPE, "data": {**BASE_RECIPE["data"], "source": {"files": {"train": ["t.en", "t.de.jsonl"]}}}}
        path_ = folder / "files.yaml"
        path_.write_text(yaml.safe_dump(raw), encoding="utf-8")
        return path_, [f"{key}={spelling}"], key
    if LIST_ITEM not in key:
        return folder / "base.yaml", [f"{key}={spelling}"], key
    raw = json.loads(json.dumps(BASE_RECIPE))
    in_files = key.split(LIST_ITEM, 1)[1].startswith(".files.")
    corpus = {"files": {"train": ["t.en", "t.de.jsonl"]}} if in_files else {"demo": dict(DEMO)}
    raw["data"].pop("source")
    raw["data"]["sources"] = [corpus]
    node = corpus
    *path, last = key.split(LIST_ITEM, 1)[1].lstrip(".").split(".")
    for part in path:
        node = node.setdefault(part, {})
    node[last] = "@VALUE@"
    path_ = folder / "list.yaml"
    path_.write_text(yaml.safe_dump(raw).replace("'@VALUE@'", spelling), encoding="utf-8")
    return path_, [], key.replace(LIST_ITEM, "[0]")


def refusal(load: Callable[[], object]) -> str | None:
    """The message of a recipe refused (an MtxError), or None if it loads; any other exception fails the test."""
    try:
        load()
    except MtxError as e:
        return str(e)
    return None


def check_recipe_value(folder: Path, key: str, value: Any, spelling: str) -> None:
    f, _ = NUMERIC_KEYS[key]
    path, overrides, named = recipe_with(folder, key, spelling)
    message = refusal(lambda: load_recipe(path, overrides))
    what = f"{key} = {spelling}"
    if value_problem(f, value) is not None:
        assert message is not None, f"{what} loads, though outside its range ({value_problem(f, value)})"
        assert named in message, (what, message)
        return
    rule = OTHER_KEYS_RULES.get(key)
    if rule is not None and value is not None and rule[0](value):
        assert message is not None, f"{what} loads, though a rule tying it to another key refuses it"
        assert any(k in message for k in (named, *rule[1])), (what, message)
        return
    assert message is None, f"{what} is within its declared range ({bounds_of(f)}) but refused: {message}"


@pytest.mark.parametrize("key", list(NUMERIC_KEYS))
def test_each_recipe_key_at_its_edges_loads_or_is_refused_by_name(recipes: Path, key: str) -> None:
    """Every edge value of a numeric recipe key, in every YAML spelling: the recipe loads if the key's declared
    range takes the value (and no rule tying it to another key refuses it), and is refused with a ConfigError
    naming the key otherwise — nothing in between, no other exception."""
    f, kind = NUMERIC_KEYS[key]
    for value in [*edges(bounds_of(f), kind), *([None] if f.default is None else [])]:
        for spelling in yaml_spellings(value):
            check_recipe_value(recipes, key, value, spelling)


@pytest.mark.parametrize("key", list(NUMERIC_KEYS))
def test_each_recipe_key_with_any_value_loads_or_is_refused_by_name(recipes: Path, key: str) -> None:
    """As above, for values hypothesis draws from the key's range and from all numbers."""
    f, kind = NUMERIC_KEYS[key]

    @edge_settings(15)
    @given(value=values_of(f, kind), data=st.data())
    def one(value: Any, data: st.DataObject) -> None:
        check_recipe_value(recipes, key, value, data.draw(st.sampled_from(yaml_spellings(value))))

    one()


LIST_RULES = {  # the lists of numbers and the rule each item keeps: (the list a value is put in, the rule)
    "train.betas": (lambda v: [v, 0.98], lambda v: 0 <= v < 1),
    "train.bleu_milestones": (lambda v: [v], lambda v: 0 < v <= 100),
}


@pytest.mark.parametrize("key", list(LIST_RULES))
def test_lists_of_numbers_at_their_edges_load_or_are_refused_by_name(recipes: Path, key: str) -> None:
    """train.betas (two numbers in [0, 1)) and train.bleu_milestones (levels in (0, 100]) with one item at an
    edge: they load if the item keeps the rule, and are refused naming the key otherwise."""
    listed, holds = LIST_RULES[key]
    values = [*edges(Bounds(0, 1, high_open=True), float), *edges(Bounds(0, 100, low_open=True), float)]
    for value in values:
        spelling = "[" + ", ".join(yaml_spellings(v)[0] for v in listed(value)) + "]"
        message = refusal(lambda s=spelling: load_recipe(recipes / "base.yaml", [f"{key}={s}"]))
        if holds(value):
            assert message is None, (key, spelling, message)
        else:
            assert message is not None and key in message, (key, spelling, message)


# `mtx config` prints the parameter count, building the model on the meta device: the keys it reads.
CONFIG_KEYS = [key for key in NUMERIC_KEYS if key.startswith("model.")] + ["data.bpe.vocab_size"]


def mtx_in_process(args: list[str], what: str):
    """An mtx command run in this process (a Typer CliRunner); a user error comes back as the MtxError, anything
    else is raised, as the cause of an AssertionError that says which command."""
    result = CliRunner().invoke(app, args)
    if result.exception is not None and not isinstance(result.exception, MtxError | SystemExit):
        raise AssertionError(f"{what} raised {type(result.exception).__name__}") from result.exception
    return result


@pytest.mark.parametrize("key", CONFIG_KEYS)
def test_mtx_config_counts_the_parameters_of_every_model_the_ranges_allow(recipes: Path, key: str) -> None:
    """`mtx config --set KEY=VALUE` for each edge value of the model's keys and the vocabulary size: exit 0 with
    the parameter count where the recipe loads, exit 1 naming the key where it does not — never a traceback
    from building the model (a size PyTorch cannot hold must be out of the declared range)."""
    f, kind = NUMERIC_KEYS[key]

    def check(case: dict[str, Any]) -> None:
        spelling = case["spelling"]
        loads = refusal(lambda: load_recipe(recipes / "base.yaml", [f"{key}={spelling}"])) is None
        what = f"mtx config --set {key}={spelling}"
        result = mtx_in_process(["config", str(recipes / "base.yaml"), "--set", f"{key}={spelling}"], what)
        if loads:
            assert result.exit_code == 0 and "# params: " in result.stdout, (what, result.exception)
        else:
            named = (key, *OTHER_KEYS_RULES.get(key, (None, ()))[1])
            assert result.exit_code == 1 and any(k in str(result.exception) for k in named), (what, result.exception)

    values = [v for v in [*edges(bounds_of(f), kind), 300, 4096, 10**6]
              if not (key.startswith("model.layers_") and isinstance(v, int) and v > LAYERS_FOR_CONFIG)]
    every_failure(check, ({key: v, "spelling": spelling} for v in values for spelling in yaml_spellings(v)))


def run_mtx(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    return subprocess.run([sys.executable, "-m", "mtx", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_mtx_config_with_a_huge_layer_count_answers_within_seconds(recipes: Path) -> None:
    """model.layers_enc = 10**20 passes its range (at least 1) and `mtx config` then builds that many layers for
    the parameter count, for ever: it must answer (a count, or a refusal naming the key) within 30 s. In a
    subprocess, which the timeout can stop."""
    for key in ("model.layers_enc", "model.layers_dec"):
        try:
            result = run_mtx(["config", "base.yaml", "--set", f"{key}={10**20}"], recipes, timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"mtx config --set {key}=10**20 did not answer within 30 s")
        assert result.returncode in (0, 1), result.stderr[-2000:]
        assert "Traceback" not in result.stderr, result.stderr[-2000:]
        if result.returncode == 1:
            assert key in result.stderr


# ------------------------------------------------------------------------------------------------ mtx prepare

# The keys `mtx prepare` reads, each with the values that would take it unbounded time or memory, left out: the
# demo generator's time grows with the pairs it is asked for (10**20 valid pairs would be drawn for ever), so
# counts stay at most 1,000; the vocabulary trainer allocates memory in proportion to vocab_size, so sizes from
# 2**20 to 2**64 are left to `test_a_vocabulary_size_beyond_memory_is_refused_not_aborted`, in a subprocess.
PREPARE_KEYS: dict[str, Callable[[int | float], bool]] = {
    "data.filter.min_len": lambda v: False,
    "data.filter.max_len": lambda v: False,
    "data.filter.max_ratio": lambda v: False,
    "data.bpe.vocab_size": lambda v: 2**20 < v < 2**64,
    "data.bpe.min_frequency": lambda v: False,
    "data.bpe.max_lines": lambda v: False,
    "data.source.demo.pairs": lambda v: v > 1000,
    "data.source.demo.valid": lambda v: v > 1000,
    "data.source.demo.test": lambda v: v > 1000,
    "data.source.demo.seed": lambda v: False,
    "data.lexicon.iterations": lambda v: False,
    "data.lexicon.width": lambda v: False,
    "data.lexicon.pairs": lambda v: False,
}


def check_prepare(recipes: Path, key: str, value: Any, spelling: str) -> None:
    """`mtx prepare` of the 200-pair demo recipe with `key` spelled `spelling`: exit 0, or exit 1 with a message
    (an MtxError), the key named if its declared range refuses `value`; any other exception fails."""
    run_dir = tempfile.mkdtemp(dir=recipes, prefix="run")
    what = f"mtx prepare --set {key}={spelling}"
    result = mtx_in_process(["prepare", str(recipes / "base.yaml"), "--workers", "1", "--set", f"{key}={spelling}",
                             "--set", f"run_dir={run_dir}"], what)
    assert result.exit_code in (0, 1), (what, result.output)
    if result.exit_code == 1:
        assert isinstance(result.exception, MtxError) and str(result.exception), (what, result.exception)
    if value_problem(NUMERIC_KEYS[key][0], value) is not None:
        assert result.exit_code == 1 and key in str(result.exception), (what, result.exception)


@pytest.mark.parametrize("key", list(PREPARE_KEYS))
def test_mtx_prepare_with_data_keys_at_their_edges_prepares_or_exits_1(recipes: Path, key: str) -> None:
    """`mtx prepare` of a 200-pair demo corpus with one data key at each of its edges, then at 8 values drawn by
    hypothesis (from the range, all numbers and every spelling): exit 0, or exit 1 with a message (an MtxError),
    never a traceback from the filter, the demo generator or the vocabulary trainer; a value outside the key's
    declared range is refused naming it."""
    f, kind = NUMERIC_KEYS[key]
    slow = PREPARE_KEYS[key]
    every_failure(lambda case: check_prepare(recipes, key, case[key], yaml_spellings(case[key])[0]),
                  ({key: v} for v in edges(bounds_of(f), kind) if not slow(v)))
    counting = key.startswith("data.source.demo.") and key != "data.source.demo.seed"
    counts = st.integers(-1000, 1000) if counting else values_of(f, kind)

    @edge_settings(8)
    @given(value=counts.filter(lambda v: not slow(v)), data=st.data())
    def drawn(value: Any, data: st.DataObject) -> None:
        check_prepare(recipes, key, value, data.draw(st.sampled_from(yaml_spellings(value))))

    drawn()


def test_a_vocabulary_size_beyond_memory_is_refused_not_aborted(recipes: Path) -> None:
    """data.bpe.vocab_size = 2**32 passes the recipe's checks; the vocabulary trainer then asks for hundreds of
    gigabytes and, refused, aborts the process. `mtx prepare` must exit 1 with a message naming the key (or
    prepare), never die of a signal or print a traceback. In a subprocess: an abort would take pytest with it."""
    result = run_mtx(["prepare", "base.yaml", "--workers", "1", "--set", f"data.bpe.vocab_size={2**32}",
                      "--set", f"run_dir={recipes / 'huge-vocab'}"], recipes, timeout=300)
    assert result.returncode in (0, 1), f"exit {result.returncode}: {result.stderr[:500]}"  # -6: aborted
    assert "Traceback" not in result.stderr and "panicked" not in result.stderr, result.stderr[:2000]
    if result.returncode == 1:
        assert "data.bpe.vocab_size" in result.stderr, result.stderr[-2000:]
