"""Recipes: every shipped recipe validates, and every kind of mistake gets a message naming its key."""

import dataclasses
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Annotated

import pytest
from support import ROOT

from mtx import __version__
from mtx.config.decode import DecodeConfig
from mtx.config.fields import AT_LEAST_0, ConfigError, parse_duration, setting
from mtx.config.keys import all_keys, format_keys, type_name
from mtx.config.loading import load_recipe, parse_override
from mtx.config.model import ModelConfig, resolve_model
from mtx.errors import MtxError

RECIPES = sorted((ROOT / "recipes").glob("*.yaml"))
EXAMPLE_RECIPES = sorted((ROOT / "examples").rglob("*.yaml"))
GOOD = """\
name: t
data:
  source: {demo: {pairs: 100}}
  bpe: {vocab_size: 1000}
model: {preset: small}
train: {max_steps: 10}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def run_mtx(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mtx", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_validates(recipe: Path) -> None:
    loaded = load_recipe(recipe)
    assert loaded.name and loaded.model.d_model


@pytest.mark.parametrize("recipe", EXAMPLE_RECIPES, ids=lambda p: str(p.relative_to(ROOT / "examples")))
def test_every_example_recipe_validates(recipe: Path) -> None:
    """The walkthroughs' recipes (examples/, at any depth), which only their run.sh scripts run: a key renamed or a
    bound tightened in the code fails here rather than in a user's hour-long run."""
    assert load_recipe(recipe).name


def test_the_student_presets_are_deep_encoders_and_shallow_decoders() -> None:
    """A decoder runs once per output token and an encoder once per sentence: a student's speed is its decoder's."""
    for name, teacher in (("student", "base"), ("student-tiny", "small")):
        student, big = (resolve_model(ModelConfig(preset=p)) for p in (name, teacher))
        assert student.layers_enc > student.layers_dec and student.layers_dec < big.layers_dec
        assert student.d_model <= big.d_model


def test_presets_expand_and_fields_override(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD), ["model.dropout=0.2", "model.norm=pre"])
    assert (recipe.model.layers_enc, recipe.model.d_model, recipe.model.heads, recipe.model.d_ff) == (3, 256, 4, 1024)
    assert recipe.model.dropout == 0.2 and recipe.model.norm == "pre"


def test_overrides_are_typed_by_yaml(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, GOOD), ["train.max_steps=200", "train.betas=[0.9, 0.99]",
                                                 "train.max_time=2h", "train.lr=5e-4"])
    assert recipe.train.max_steps == 200 and recipe.train.betas == [0.9, 0.99]
    assert recipe.train.lr == 5e-4 and parse_duration(recipe.train.max_time) == 7200
    assert parse_override("a.b=[1, 2]") == (["a", "b"], [1, 2])


def test_resolved_recipe_round_trips(tmp_path: Path) -> None:
    """What `mtx config` prints is itself a recipe that resolves to the same thing."""
    result = run_mtx("config", str(write(tmp_path, GOOD)))
    assert result.returncode == 0, result.stderr
    printed = result.stdout
    assert "# params:" in printed.splitlines()[-1]
    again = write(tmp_path, printed)
    assert load_recipe(again) == load_recipe(tmp_path / "recipe.yaml")


def test_config_prints_the_paper_parameter_count(tmp_path: Path) -> None:
    base = GOOD.replace("preset: small", "preset: base").replace("vocab_size: 1000", "vocab_size: 37000")
    result = run_mtx("config", str(write(tmp_path, base)))
    assert result.stdout.splitlines()[-1].startswith("# params: 63,082,496")


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        (None, [], "does not exist"),
        ("name: t\ndata: a: b\n", [], "not valid YAML at line 2"),
        (GOOD, ["train.max_tokns=10"], "train.max_tokns: did you mean train.max_tokens?"),
        (GOOD, ["max_tokens=10"], "did you mean train.max_tokens?"),
        (GOOD, ["train.max_tokens=many"], "train.max_tokens = 'many' must be an integer"),
        (GOOD, ["train.max_tokens=0"], "train.max_tokens = 0 must be at least 1"),
        (GOOD, ["train.update_tokens=0"], "train.update_tokens = 0 must be at least 1 (or null)"),
        (GOOD, ["train.update_tokens=28672", "train.update_freq=8"],
         "train.update_freq = 8 must be left at 1 with train.update_tokens"),
        (GOOD, ["model.preset=bse"], "did you mean 'base'?"),
        (GOOD, ["model.heads=5"], "model.heads = 5 must divide d_model (256)"),
        (GOOD, ["train.label_smoothing=1.5"], "train.label_smoothing = 1.5 must be in [0, 1)"),
        (GOOD, ["train.max_time=soon"], "train.max_time = 'soon' is not a duration"),
        (GOOD, ["decode.nbest=5"], "decode.nbest = 5 must be between 1 and decode.beam (4)"),
        (GOOD, ["decode.lenpen_style=wu"], "decode.lenpen_style = 'wu' must be one of 'gnmt', 'fairseq'"),
        (GOOD, ["data.source.files={train: [a.en, a.de]}"], "exactly one of hf, files, tsv, demo"),
        (GOOD.replace("name: t\n", ""), [], "name is missing"),
        (GOOD, ["train.max_steps"], "must look like KEY=VALUE"),
        (GOOD, ["data.bpe.style=sentencepiece"], "data.bpe.style = 'sentencepiece' must be one of 'bytelevel', "
                                                  "'metaspace'"),
        (GOOD, ["data.bpe.model=wordpiece"], "data.bpe.model = 'wordpiece' must be one of 'bpe', 'unigram'"),
        (GOOD, ["data.bpe.style=bytelevel", "data.bpe.model=unigram"],
         "data.bpe.model = 'unigram' needs data.bpe.style: metaspace"),
        (GOOD, ["train.bpe_dropout=1"], "train.bpe_dropout = 1.0 must be in [0, 1)"),
        (GOOD, ["train.bpe_dropout=-0.1"], "train.bpe_dropout = -0.1 must be in [0, 1)"),
        (GOOD, ["data.bpe.style=metaspace", "data.bpe.model=unigram", "train.bpe_dropout=0.1"],
         "train.bpe_dropout = 0.1 needs a BPE vocabulary, and data.bpe.model is unigram"),
    ],
)
def test_recipe_errors_name_the_key_and_exit_1(tmp_path: Path, text, overrides, expected) -> None:
    path = tmp_path / "missing.yaml" if text is None else write(tmp_path, text)
    with pytest.raises(ConfigError, match=None) as caught:
        load_recipe(path, overrides)
    assert expected in str(caught.value)
    args = ["config", str(path)] + [a for o in overrides for a in ("--set", o)]
    result = run_mtx(*args)
    assert result.returncode == 1
    assert expected in " ".join(result.stderr.split())
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) <= 4


# A sanity bound on the wall-clock time of `mtx --version` and `--help`, which SPEC promises well under a
# second: generous enough for a loaded 2-core machine. Whether torch was imported is checked directly.
HELP_SECONDS = 5.0


def test_version_and_help_are_fast_and_torch_free() -> None:
    """`mtx --version` and the help pages must start at once: importing torch or datasets for them would cost
    seconds on every call. `python -X importtime` lists every module the real command imports."""
    code = "import sys; import mtx.cli, mtx.config.loading; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0

    for args, expected in [(["--version"], f"mtx {__version__}\n"), (["--help"], "Example: mtx prepare"),
                           (["translate", "--help"], "Example: mtx translate")]:
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-X", "importtime", "-m", "mtx", *args], capture_output=True,
                                text=True, timeout=120)
        seconds = time.perf_counter() - started

        assert result.returncode == 0, result.stderr
        assert expected in result.stdout, args
        imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "mtx.cli" in imported, args  # the import log is really there
        assert not {name for name in imported if name.split(".")[0] in ("torch", "datasets")}, args
        assert seconds < HELP_SECONDS, (args, seconds)


def test_shipped_recipes_match_the_paper() -> None:
    folder = RECIPES[0].parent
    names = ("en_de_base", "en_de_big", "en_fr_big")
    de_base, de_big, fr_big = (load_recipe(folder / f"wmt14_{name}.yaml") for name in names)
    assert de_base.data.bpe.vocab_size == de_big.data.bpe.vocab_size == 37000 and fr_big.data.bpe.vocab_size == 32000
    assert (de_base.model.dropout, de_big.model.dropout, fr_big.model.dropout) == (0.1, 0.3, 0.1)
    assert (de_base.train.max_steps, de_big.train.max_steps) == (100_000, 300_000)
    for recipe in (de_base, de_big, fr_big):
        assert (recipe.decode.beam, recipe.decode.lenpen, recipe.decode.max_len_b) == (4, 0.6, 50)
        assert (recipe.decode.lenpen_style, recipe.decode.nbest) == ("gnmt", 1)
        assert recipe.train.warmup == 4000 and recipe.train.label_smoothing == 0.1


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_header_commands_name_their_own_recipe_and_run_folder(path: Path) -> None:
    """A user copies the commands in a recipe's header: each must name that recipe and its run folder, or a
    copied command trains another model (or pair) for days."""
    commands = [line.lstrip("#").strip() for line in path.read_text(encoding="utf-8").splitlines()
                if line.startswith("#") and " mtx " in f" {line.lstrip('#').strip()}"]
    run = load_recipe(path).run_path.as_posix()
    assert any(c.startswith("mtx prepare ") for c in commands) and any(" mtx train " in f" {c}" for c in commands)
    for command in commands:
        for named in re.findall(r"recipes/\S+\.yaml", command):
            assert named == f"recipes/{path.name}", command
        for folder in re.findall(r"runs/[^/\s]+", command):
            assert folder == run, command
        if command.startswith(("mtx prepare", "torchrun", "mtx train")) or " mtx train " in command:
            assert f"recipes/{path.name}" in command, command
    assert sum(run in c for c in commands) >= 3, "average, translate and score name the run folder"


def test_decode_config_of_a_checkpoint_takes_its_recipe_then_the_flags() -> None:
    """The recipe's decode: section, the flags on top, the paper's defaults for fields an older recipe lacks,
    and a key mtx no longer knows passed over; a checkpoint without a recipe decodes as the paper does."""
    checkpoint = {"recipe": {"decode": {"beam": 6, "lenpen": 1.0, "retired_option": True}}}
    assert DecodeConfig.of_checkpoint(checkpoint, lenpen=0.2, nbest=2) == DecodeConfig(beam=6, lenpen=0.2, nbest=2)
    assert DecodeConfig.of_checkpoint({}) == DecodeConfig.of_checkpoint({"recipe": None}) == DecodeConfig()


def test_every_recipe_key_has_its_help_beside_it() -> None:
    """Each field of every section says what it does (`setting(default, help)`), so `mtx config --keys` has
    something to print for every key a recipe may hold."""
    keys = all_keys()
    assert len(keys) > 70 and {"name", "data.bpe.vocab_size", "train.max_tokens", "decode.lenpen"} <= {
        k.key for k in keys}
    undocumented = [k.key for k in keys if len(k.help) < 10]
    assert not undocumented, undocumented
    assert len({k.key for k in keys}) == len(keys)


def test_key_types_and_defaults_read_as_a_recipe_writes_them() -> None:
    by_key = {k.key: k for k in all_keys()}
    assert (by_key["train.max_tokens"].type, by_key["train.max_tokens"].default) == ("an integer", "4096")
    assert by_key["train.betas"].default == "[0.9, 0.98]" and by_key["train.betas"].type == "a list of numbers"
    assert by_key["train.max_time"].default == "null"
    assert by_key["train.lr"].default == "7.0e-04"
    assert by_key["decode.lenpen_style"].type == "one of 'gnmt', 'fairseq'"
    assert by_key["model.d_model"].default == "(the preset's)" and by_key["model.preset"].default == "base"
    assert by_key["name"].default is None and by_key["data.source.hf.path"].default is None  # required
    assert by_key["train"].section and not by_key["train.lr"].section
    assert type_name(int | None) == "an integer or null"


def test_config_keys_lists_every_key_and_a_recipes_own_values(tmp_path: Path) -> None:
    """`mtx config --keys` needs no recipe; given one, it marks the values that differ from the defaults."""
    listed = run_mtx("config", "--keys")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == format_keys(all_keys())
    for k in all_keys():
        assert (f"# {k.key}: " if k.section else f"{k.key}  (") in listed.stdout, k.key
    assert "train.max_tokens  (an integer, at least 1; default 4096)\n    Padded token slots per GPU" in listed.stdout
    assert "decode.topp  (a number, in (0, 1]; default 1.0)\n" in listed.stdout  # the range the checks enforce

    mine = run_mtx("config", str(write(tmp_path, GOOD)), "--keys", "--set", "train.lr=0.002")
    assert mine.returncode == 0, mine.stderr
    assert "train.lr  (a number, positive; default 7.0e-04)  — this recipe: 0.002\n" in mine.stdout
    assert "train.max_steps  (an integer, at least 1; default 100000)  — this recipe: 10\n" in mine.stdout
    assert "train.warmup  (an integer, at least 0; default 4000)\n" in mine.stdout  # the default: nothing to mark
    assert ("model.d_model  (an integer or null, in [1, 131072]; default (the preset's))  — this recipe: 256\n"
            in mine.stdout)
    assert "data.source.hf.path  (a string; required)\n" in mine.stdout  # no hf source: no value


def test_config_without_a_recipe_or_keys_is_a_usage_error() -> None:
    result = run_mtx("config")
    assert result.returncode == 2 and "Missing argument 'RECIPE.yaml'" in result.stderr


def test_bounds_say_their_rule_in_words_and_as_json_schema() -> None:
    """One declaration per field is the check, the words of `mtx config --keys` and the server's schema."""
    from mtx.config.fields import Bounds

    cases = [
        (Bounds(1), "at least 1", {"minimum": 1}, [1, 10**400], [0, -1]),
        (Bounds(0, low_open=True), "positive", {"exclusiveMinimum": 0}, [5e-324, 1e308], [0.0, -1e-300]),
        (Bounds(0, 1, low_open=True), "in (0, 1]", {"exclusiveMinimum": 0, "maximum": 1}, [1e-300, 1.0], [0.0, 1.1]),
        (Bounds(0, 1, high_open=True), "in [0, 1)", {"minimum": 0, "exclusiveMaximum": 1}, [0.0], [1.0]),
        (Bounds(high=3, high_open=True), "less than 3", {"exclusiveMaximum": 3}, [-10**30, 2.999], [3]),
    ]
    for bounds, words, schema, inside, outside in cases:
        assert bounds.phrase() == words and bounds.json_schema() == schema
        assert all(bounds.holds(v) for v in inside) and not any(bounds.holds(v) for v in outside), words
    assert Bounds(0, note="0 disables it").phrase() == "at least 0 (0 disables it)"


@pytest.mark.parametrize(("override", "message"), [
    ("train.lr=.inf", "train.lr = inf must be a finite number"),
    ("train.label_smoothing=.nan", "train.label_smoothing = nan must be a finite number"),
    ("decode.max_len_a=-.inf", "decode.max_len_a = -inf must be a finite number"),
    ("train.save_every_minutes=0", "train.save_every_minutes = 0.0 must be positive (or null)"),
    ("train.weight_decay=-0.1", "train.weight_decay = -0.1 must be at least 0"),
    ("decode.lenpen=300", "decode.lenpen = 300.0 must be in [0, 10]"),
    ("data.filter.max_ratio=-1", "data.filter.max_ratio = -1.0 must be at least 0 (0 disables it)"),
    ("data.source.demo.pairs=0", "data.source.demo.pairs = 0 must be at least 1"),
    ("train.max_time='1" + "0" * 400 + "s'", "train.max_time = '1000"),
])
def test_non_finite_and_out_of_range_numbers_are_refused_naming_the_key(tmp_path: Path, override: str,
                                                                       message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_recipe(write(tmp_path, GOOD), [override])
    assert message in str(caught.value)


def test_sampling_refuses_a_chosen_beam_in_each_places_spelling() -> None:
    """One rule, phrased for a flag and for a request's field: sampling draws, so a beam the user chose besides
    is refused. A recipe that samples holds a beam all the same (the default 4, unused), and loads."""
    from mtx.config.decode import flag_name

    sampling = DecodeConfig(sampling=True, beam=4)
    assert sampling.first_problem(lambda name: f"decode.{name}", " = ") is None
    assert sampling.first_problem(flag_name, " ", given={"beam"}) == ("beam", (
        "--sampling draws each token, --beam 4 searches: give one or the other (with --sampling, --nbest N draws N "
        "samples)."))
    assert sampling.first_problem(lambda name: name, " = ", given={"beam", "sampling"}) == ("beam", (
        "sampling draws each token, beam = 4 searches: give one or the other (with sampling, nbest = N draws N "
        "samples)."))
    assert DecodeConfig(sampling=True, beam=1).first_problem(flag_name, " ", given={"beam"}) is None
    assert DecodeConfig(beam=4).first_problem(flag_name, " ", given={"beam"}) is None
    with pytest.raises(MtxError, match="--sampling draws each token, --beam 3 searches"):
        DecodeConfig(sampling=True, beam=3).validate_flags(given={"beam", "sampling"})


def test_every_decoding_option_is_a_translate_flag_made_from_its_field() -> None:
    """`mtx translate`'s decoding flags are DecodeConfig's fields: each one's name, help, range and default as
    the field declares them, unset (None) unless given, so that the checkpoint's recipe decides."""
    import typer

    from mtx.cli import app
    from mtx.config.decode import flag_name
    from mtx.config.fields import bounds_of

    translate = typer.main.get_command(app).commands["translate"]
    params = {param.name: param for param in translate.params}
    for f in dataclasses.fields(DecodeConfig):
        param = params[f.name]
        assert param.opts == [flag_name(f.name)] and param.default is None, f.name
        assert param.help.startswith(f.metadata["help"]), f.name
        if (bounds := bounds_of(f)) is not None:
            assert f" Must be {bounds.phrase(with_note=False)}. " in param.help, f.name
    assert params["beam"].help.endswith("[default: the recipe's, 4]")
    assert params["lenpen"].help.endswith("[default: the recipe's, 1.0]")
    assert params["sampling"].is_flag and not params["sampling"].secondary_opts  # --sampling alone, no --no-sampling
    assert params["sampling"].help.endswith("[default: the recipe's, off]")
    assert params["topk"].help.endswith("[default: the recipe's, unset]")
    assert params["lenpen_style"].metavar == "gnmt|fairseq"
    assert "Must be" not in params["seed"].help  # a seed has no range


@dataclasses.dataclass(frozen=True)
class WithNewOption(DecodeConfig):
    """DecodeConfig and one more option, as a contributor adds one."""

    max_unk: int | None = setting(None, "Output at most this many unknown tokens; unset: any number.",
                                  bounds=AT_LEAST_0)


def test_a_new_field_is_a_new_flag() -> None:
    """Adding a field is the one edit a new decoding option takes: the command gets its flag, with its help, its
    range and its default, and the value the user gives among the options it is handed."""
    import typer
    from typer.testing import CliRunner

    from mtx.decode.command import with_flags_of

    handed: list[tuple[dict[str, object], int]] = []

    @with_flags_of(WithNewOption)
    def command(*, options: dict[str, object], batch_tokens: Annotated[int, typer.Option()] = 7) -> None:
        handed.append((options, batch_tokens))

    app = typer.Typer(rich_markup_mode=None)
    app.command()(command)
    result = CliRunner().invoke(app, ["--max-unk", "3", "--beam", "2", "--sampling", "--lenpen", "0.5",
                                      "--lenpen-style", "gnmt"])
    assert result.exit_code == 0, result.output
    assert handed == [({"beam": 2, "lenpen": 0.5, "lenpen_style": "gnmt", "sampling": True, "max_unk": 3}, 7)]
    assert [type(value) for value in handed[0][0].values()] == [int, float, str, bool, int]  # each field's type
    assert CliRunner().invoke(app, ["--max-unk", "many"]).exit_code == 2  # not a number: a usage error
    assert CliRunner().invoke(app, []).exit_code == 0 and handed[-1] == ({}, 7)  # nothing set: nothing handed
    helped = " ".join(CliRunner().invoke(app, ["--help"]).output.split())
    assert ("--max-unk <int> Output at most this many unknown tokens; unset: any number. Must be at least 0. "
            "[default: the recipe's, unset]") in helped
