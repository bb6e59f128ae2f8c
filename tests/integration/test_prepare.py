"""`mtx prepare` through the command line on plain files, TSV and local Hugging Face datasets, and the reader."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml
from rich.console import Console

import mtx.data.corpora
import mtx.data.prepare
from mtx.config.loading import load_recipe
from mtx.data.lexicon import Lexicon
from mtx.data.prepare import prepare
from mtx.data.prepared import load_manifest, load_split
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer
from mtx.train.run_data import check_data_matches_recipe

# A hand-checked training corpus: each line says which filter drops it (min_len 1, max_len 6, ratio 1.5).
TRAIN = [
    (b"the dog sleeps", b"der Hund schl\xc3\xa4ft", "kept"),
    (b"the  cat\tsleeps ", b"die Katze schl\xc3\xa4ft", "kept (whitespace collapsed)"),
    (b"the dog sleeps", b"der Hund schl\xc3\xa4ft", "duplicate of line 1"),
    (b"the cat sleeps", b"die Katze schla\xcc\x88ft", "duplicate of line 2 once NFC-normalized"),
    (b"a bad \xff byte", b"ein schlechtes Byte", "invalid utf8"),
    (b"", b"leer", "empty"),
    (b"nothing here", b"\x07 \x1b", "empty (only control characters)"),
    (b"one two three four five six seven", b"eins zwei drei vier f\xc3\xbcnf sechs sieben", "length"),
    (b"yes", b"ja ja ja ja", "ratio 4 > 1.5"),
    (b"we see the house", b"wir sehen das Haus", "kept"),
    (b"I read", b"ich lese es", "kept: ratio 1.5 is not above 1.5"),
    (b"caf\xc3\xa9 \xf0\x9f\x98\x80", b"Caf\xc3\xa9 \xf0\x9f\x98\x80", "copy (case and symbols set aside)"),
    (b"caf\xc3\xa9 \xf0\x9f\x98\x80 noir", b"schwarzer Kaffee \xf0\x9f\x98\x80", "kept"),
]
EXPECTED_DROPS = {"too_long_to_score": 0, "teacher_confidence": 0, "invalid_utf8": 1, "malformed": 0, "empty": 2,
                  "length": 1, "ratio": 1, "copy": 1, "numbers": 0, "placeholders": 0, "urls": 0, "non_letters": 0,
                  "repeats": 0, "long_word": 0, "script": 0, "language": 0, "duplicate": 2, "max_positions": 0}
KEPT = [("the dog sleeps", "der Hund schläft"), ("the cat sleeps", "die Katze schläft"),
        ("we see the house", "wir sehen das Haus"), ("I read", "ich lese es"), ("café 😀 noir", "schwarzer Kaffee 😀")]
VALID = [(b"hello  world", b"hallo Welt"), (b"", b""), (b"bad \xfe", b"schlecht")]
TEST = [(b"the dog sleeps", b"der Hund schl\xc3\xa4ft"), (b"a very long sentence " * 5, b"ein Satz")]


def _write(path: Path, lines: list[bytes]) -> Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def _recipe(tmp_path: Path, source: dict, **data: object) -> Path:
    recipe = {
        "name": "t",
        "run_dir": str(tmp_path / "run"),
        "data": {"source": source, "filter": {"min_len": 1, "max_len": 6, "max_ratio": 1.5, "dedup": True,
                                              "copies": True},
                 "bpe": {"style": "bytelevel", "vocab_size": 300, "min_frequency": 1}, **data},
    }
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    return path


def _mtx(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "HF_HOME": str(cwd / "hf-home")}
    return subprocess.run([sys.executable, "-m", "mtx", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def _pairs_source(tmp_path: Path, **splits: list[tuple[bytes, bytes]]) -> dict:
    """A `files` source of the given splits' (source, target) pairs, written as SPLIT.en and SPLIT.de."""
    return {"files": {split: [str(_write(tmp_path / f"{split}.en", [s for s, _ in pairs])),
                              str(_write(tmp_path / f"{split}.de", [t for _, t in pairs]))]
                      for split, pairs in splits.items()}}


def _files_source(tmp_path: Path) -> dict:
    return _pairs_source(tmp_path, train=[(s, t) for s, t, _ in TRAIN], valid=VALID, test=TEST)


def _decoded(data_dir: Path, split: str) -> list[tuple[str, str]]:
    tokenizer = Tokenizer.from_file(data_dir / "tokenizer.json")
    tokens = load_split(data_dir, split)
    return [(tokenizer.decode(tokens.src(i)), tokenizer.decode(tokens.tgt(i))) for i in range(len(tokens))]


@pytest.fixture(scope="module")
def prepared_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess]:
    tmp_path = tmp_path_factory.mktemp("files")
    result = _mtx("prepare", str(_recipe(tmp_path, _files_source(tmp_path))), "--workers", "1", cwd=tmp_path)
    return tmp_path, result


def test_files_filter_counts_match_the_hand_checked_fixture(prepared_files) -> None:
    tmp_path, result = prepared_files
    assert result.returncode == 0, result.stderr
    manifest = load_manifest(tmp_path / "run" / "data")
    assert manifest["filter"]["read"] == len(TRAIN)
    assert manifest["filter"]["dropped"] == EXPECTED_DROPS
    assert manifest["filter"]["kept"] == len(KEPT)
    assert manifest["filter"]["remaining"]["duplicate"] == len(KEPT)
    assert "training data filters" in result.stderr and "train" in result.stderr  # the summary tables


def test_files_round_trip_through_the_memory_mapped_splits(prepared_files) -> None:
    tmp_path, _ = prepared_files
    data_dir = tmp_path / "run" / "data"
    assert _decoded(data_dir, "train") == KEPT
    manifest = load_manifest(data_dir)
    assert manifest["splits"]["train"]["pairs"] == len(KEPT)
    tokens = load_split(data_dir, "train")
    assert tokens.src_lens.dtype == np.int32 and int(tokens.src_lens.sum()) == manifest["splits"]["train"]["src_tokens"]
    assert int(tokens.tgt_lens.sum()) == manifest["splits"]["train"]["tgt_tokens"]
    assert tokens.src(0).dtype == np.int64 and len(tokens.src(0)) == tokens.src_lens[0]
    with pytest.raises(IndexError):
        tokens.src(len(tokens))
    assert isinstance(tokens._tokens["src"], np.memmap)


def test_valid_and_test_are_normalized_but_never_filtered(prepared_files) -> None:
    tmp_path, _ = prepared_files
    data_dir = tmp_path / "run" / "data"
    assert (data_dir / "valid.en").read_text(encoding="utf-8") == "hello world\n\nbad \ufffd\n"
    assert (data_dir / "valid.de").read_text(encoding="utf-8") == "hallo Welt\n\nschlecht\n"
    assert load_manifest(data_dir)["splits"]["valid"]["invalid_utf8_replaced"] == 1
    assert [s for s, _ in _decoded(data_dir, "test")] == ["the dog sleeps", " ".join(["a very long sentence"] * 5)]
    assert not (tmp_path / "run" / "data.partial").exists()
    assert not (data_dir / "work").exists()


def _replace_in_file(path: Path, old: bytes, new: bytes, mtime_ns: int) -> None:
    """Replace `old` by `new` in `path`, then set its modification time to `mtime_ns`."""
    content = path.read_bytes()
    assert content.count(old) == 1, f"{old!r} must occur once in {path}"
    path.write_bytes(content.replace(old, new))
    os.utime(path, ns=(path.stat().st_atime_ns, mtime_ns))


def test_rerun_is_a_no_op_unless_the_data_section_or_inputs_change(tmp_path: Path) -> None:
    """The fingerprint is the data section, model.max_positions and each input file's size and modification time
    (as make and rsync judge staleness, without reading a corpus on every run). So each is changed alone: a
    fingerprint that missed one would serve data prepared from other inputs or another recipe. Content changed
    with both size and time restored is, by that design, not noticed, and not tested."""
    path = _recipe(tmp_path, _files_source(tmp_path))
    data_dir = tmp_path / "run" / "data"
    manifest_path = data_dir / "manifest.json"

    def reprepare(*overrides: str) -> bool:
        """Whether prepare rebuilt the data, after checking that what it said matches what it did."""
        before = data_dir.stat().st_ino, manifest_path.stat().st_mtime_ns
        _, printed = _prepare_quietly(path, *overrides)
        reused = "up to date" in printed
        # a rebuild renames a new folder into place while the old one still exists: another inode
        assert reused == ((data_dir.stat().st_ino, manifest_path.stat().st_mtime_ns) == before), printed
        return not reused

    _prepare_quietly(path)
    assert not reprepare()
    assert not reprepare("train.max_steps=7", "model.dropout=0.3")  # not part of the data
    assert not reprepare("data.bpe.model=bpe")  # the default, spelt out

    assert reprepare("data.bpe.style=metaspace")
    assert load_manifest(data_dir)["bpe"] | {"style": "metaspace", "model": "bpe"} == load_manifest(data_dir)["bpe"]
    assert Tokenizer.from_file(data_dir / "tokenizer.json").style == "metaspace"
    with pytest.raises(MtxError, match="prepared with a metaspace bpe vocabulary \\(the recipe asks for bytelevel bpe"):
        check_data_matches_recipe(load_recipe(path), load_manifest(data_dir), data_dir)
    assert reprepare()

    assert reprepare("data.filter.max_ratio=0")
    assert load_manifest(data_dir)["filter"]["dropped"]["ratio"] == 0
    assert reprepare()  # the recipe as it was: the data of max_ratio=0 is stale again
    assert load_manifest(data_dir)["filter"]["dropped"]["ratio"] == EXPECTED_DROPS["ratio"]

    # the same size, a new modification time
    train_en = tmp_path / "train.en"
    _replace_in_file(train_en, b"we see the house", b"we saw the house", train_en.stat().st_mtime_ns + 10**9)
    assert reprepare()
    assert ("we saw the house", "wir sehen das Haus") in _decoded(data_dir, "train")
    assert not reprepare()

    # another size, the modification time restored
    test_de = tmp_path / "test.de"
    _replace_in_file(test_de, b"ein Satz", b"ein langer Satz", test_de.stat().st_mtime_ns)
    assert reprepare()
    assert [t for _, t in _decoded(data_dir, "test")] == ["der Hund schläft", "ein langer Satz"]
    assert not reprepare()


def test_the_lexical_table_is_learnt_only_when_asked_and_then_alone_when_its_settings_change(tmp_path: Path
                                                                                            ) -> None:
    path = _recipe(tmp_path, _files_source(tmp_path))
    data_dir = tmp_path / "run" / "data"
    _, printed = _prepare_quietly(path)
    assert not (data_dir / "lexicon.npz").exists() and "lexical table" not in printed  # not asked for: no work
    splits = {p.name: p.stat().st_mtime_ns for p in data_dir.glob("*.tokens")}
    inode = data_dir.stat().st_ino

    def relearnt(*overrides: str) -> bool:
        """Whether prepare learnt the table again, after checking it kept the splits as they were."""
        printed = _prepare_quietly(path, "data.lexicon.learn=true", *overrides)[1]
        assert data_dir.stat().st_ino == inode  # the splits kept, not prepared again
        assert {p.name: p.stat().st_mtime_ns for p in data_dir.glob("*.tokens")} == splits
        return "up to date" not in printed and "lexical table" in printed

    assert relearnt()  # turned on for a prepared folder: the table alone
    lexicon = Lexicon.load(data_dir)
    pairs = len(load_split(data_dir, "train"))
    assert lexicon is not None and (lexicon.iterations, lexicon.width, lexicon.pairs) == (5, 100, pairs)
    assert relearnt("data.lexicon.iterations=1", "data.lexicon.width=7")
    assert (Lexicon.load(data_dir).iterations, Lexicon.load(data_dir).width) == (1, 7)
    assert not relearnt("data.lexicon.iterations=1", "data.lexicon.width=7")
    assert not relearnt("data.lexicon.iterations=1", "data.lexicon.width=7", f"data.lexicon.pairs={pairs + 1}")
    assert relearnt("data.lexicon.iterations=1", "data.lexicon.width=7", f"data.lexicon.pairs={pairs - 1}")
    assert Lexicon.load(data_dir).pairs == pairs - 1  # a sample, and a table of every pair again when unset
    assert relearnt("data.lexicon.iterations=1", "data.lexicon.width=7", "data.lexicon.pairs=null")
    assert "up to date" in _prepare_quietly(path)[1]  # turned off: the table learnt is left as it is
    assert Lexicon.load(data_dir).pairs == pairs


def _translations(path: Path, texts: list[str], confidences: list[float], nbest: bool = False) -> Path:
    """A teacher's translations as `mtx translate --format jsonl` writes them, each with three tokens of the
    given mean log-probability."""
    lines = []
    for text, confidence in zip(texts, confidences, strict=True):
        hypothesis = {"text": text, "score": confidence, "tokens": ["a", "b", "</s>"],
                      "token_log_probs": [confidence - 0.5, confidence + 0.5, confidence], "flags": []}
        lines.append(json.dumps({"nbest": [hypothesis, {**hypothesis, "text": "worse"}]} if nbest else hypothesis))
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_a_teachers_translations_keep_their_most_confident_share(tmp_path: Path) -> None:
    """keep_best 0.5 keeps the 3 of 6 distilled pairs whose translations have the highest mean log-probability a
    token, and the manifest counts the other 3 as teacher_confidence, before every other filter; valid pairs are
    read from an n-best jsonl's best translation and never dropped."""
    sources = ["one house", "two cats", "three dogs", "four birds", "five trees", "six rivers"]
    texts = ["ein Haus", "zwei Katzen", "drei Hunde", "vier Vögel", "fünf Bäume", "sechs Flüsse"]
    confidence = [-0.2, -3.0, -0.1, -2.5, -0.4, -4.0]
    train = [str(_write(tmp_path / "train.en", [s.encode() for s in sources])),
             str(_translations(tmp_path / "train.de.jsonl", texts, confidence))]
    valid = [str(_write(tmp_path / "valid.en", [b"one house"])),
             str(_translations(tmp_path / "valid.de.jsonl", ["ein Haus"], [-9.0], nbest=True))]
    recipe = _recipe(tmp_path, {"files": {"train": train, "valid": valid, "keep_best": 0.5}})
    result = _mtx("prepare", str(recipe), "--workers", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data = tmp_path / "run" / "data"
    manifest = load_manifest(data)
    assert manifest["filter"]["read"] == 6 and manifest["filter"]["kept"] == 3
    assert manifest["filter"]["dropped"] == {**dict.fromkeys(EXPECTED_DROPS, 0), "teacher_confidence": 3}
    assert manifest["filter"]["remaining"]["teacher_confidence"] == 3
    assert _decoded(data, "train") == [("one house", "ein Haus"), ("three dogs", "drei Hunde"),
                                       ("five trees", "fünf Bäume")]
    assert _decoded(data, "valid") == [("one house", "ein Haus")]
    assert "teacher confidence" in result.stderr  # in the summary of the filters


@pytest.mark.parametrize(("case", "message"), [
    ("not jsonl", "data.source.files.keep_best = 0.5 needs a .jsonl target file"),
    ("bad line", "train.de.jsonl, line 2: not a translation as mtx translate --format jsonl writes one"),
    ("no log-probabilities", "train.de.jsonl, line 1: it has no token_log_probs"),
    ("keep none", "keep_best = 0.0 must be in (0, 1]"),
])
def test_teacher_translations_that_cannot_be_ranked_are_refused(tmp_path: Path, case: str, message: str) -> None:
    source = _write(tmp_path / "train.en", [b"one", b"two"])
    target = tmp_path / ("train.de" if case == "not jsonl" else "train.de.jsonl")
    if case == "not jsonl":
        _write(target, [b"eins", b"zwei"])
    elif case == "bad line":
        _translations(target, ["eins"], [-1.0]).write_text(target.read_text() + "{not json\n", encoding="utf-8")
    elif case == "no log-probabilities":
        target.write_text('{"text": "eins"}\n{"text": "zwei"}\n', encoding="utf-8")
    else:
        _translations(target, ["eins", "zwei"], [-1.0, -2.0])
    keep = 0.0 if case == "keep none" else 0.5
    result = _mtx("prepare", str(_recipe(tmp_path, {"files": {"train": [str(source), str(target)],
                                                              "keep_best": keep}})), cwd=tmp_path)
    assert result.returncode == 1 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_tsv_source_counts_malformed_lines(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.tsv", [s + b"\t" + t for s, t, _ in TRAIN] + [b"no tab here", b"a\tb\tc"])
    test = _write(tmp_path / "test.tsv", [s + b"\t" + t for s, t in TEST])
    result = _mtx("prepare", str(_recipe(tmp_path, {"tsv": {"train": str(train), "test": str(test)}})),
                  "--workers", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    manifest = load_manifest(tmp_path / "run" / "data")
    # line 2 holds a tab inside its source, so it is malformed here and line 4 is no longer its duplicate
    assert manifest["filter"]["dropped"] == {**EXPECTED_DROPS, "malformed": 3, "duplicate": 1}
    assert set(manifest["splits"]) == {"train", "test"}
    assert _decoded(tmp_path / "run" / "data", "train") == KEPT


def test_tsv_eval_split_with_a_malformed_line_is_an_error(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.tsv", [b"a b\tc d"])
    valid = _write(tmp_path / "valid.tsv", [b"a\tb", b"no tab"])
    result = _mtx("prepare", str(_recipe(tmp_path, {"tsv": {"train": str(train), "valid": str(valid)}})),
                  "--workers", "1", cwd=tmp_path)
    assert result.returncode == 1
    assert "line 2" in result.stderr and "Traceback" not in result.stderr


def _wmt_rows(pairs: list[tuple[str, str]]) -> dict:
    return {"translation": [{"de": de, "en": en} for en, de in pairs]}


HF_TRAIN = [("the dog sleeps", "der Hund schläft"), ("the dog sleeps", "der Hund schläft"), ("", "leer"),
            ("we  see the house", "wir sehen das Haus"), ("yes", "ja ja ja ja")]


def test_hf_dataset_saved_to_disk_in_wmt_layout(tmp_path: Path) -> None:
    from datasets import Dataset, DatasetDict

    DatasetDict(train=Dataset.from_dict(_wmt_rows(HF_TRAIN)),
                validation=Dataset.from_dict(_wmt_rows([("hello", "hallo")])),
                test=Dataset.from_dict(_wmt_rows([("good  day", "guten Tag"), ("bye", "tschüss")]))
                ).save_to_disk(str(tmp_path / "wmt"))
    result = _mtx("prepare", str(_recipe(tmp_path, {"hf": {"path": str(tmp_path / "wmt"), "name": "de-en"}})),
                  "--workers", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    data_dir = tmp_path / "run" / "data"
    manifest = load_manifest(data_dir)
    assert manifest["filter"]["dropped"] == {**EXPECTED_DROPS, "invalid_utf8": 0, "length": 0, "empty": 1,
                                             "copy": 0, "duplicate": 1}
    assert _decoded(data_dir, "train") == [("the dog sleeps", "der Hund schläft"),
                                           ("we see the house", "wir sehen das Haus")]
    assert (data_dir / "test.en").read_text(encoding="utf-8") == "good day\nbye\n"
    assert (data_dir / "test.de").read_text(encoding="utf-8") == "guten Tag\ntschüss\n"
    assert manifest["splits"]["valid"]["pairs"] == 1


def test_hf_parquet_folder_with_language_columns_and_workers(tmp_path: Path) -> None:
    from datasets import Dataset

    folder = tmp_path / "pq" / "data"
    folder.mkdir(parents=True)
    rows = [(f"sentence number {i}", f"Satz Nummer {i}") for i in range(40)]
    Dataset.from_dict({"en": [e for e, _ in rows], "de": [d for _, d in rows]}).to_parquet(
        str(folder / "train-00000-of-00001.parquet"))
    recipe = load_recipe(_recipe(tmp_path, {"hf": {"path": str(tmp_path / "pq")}}))
    sequential = prepare(recipe, workers=1)
    data_dir = recipe.run_path / "data"
    assert _decoded(data_dir, "train") == rows
    first = {f.name: f.read_bytes() for f in data_dir.iterdir() if f.name != "manifest.json"}
    recipe.run_dir = str(tmp_path / "parallel")
    parallel = prepare(recipe, workers=2)
    assert {f.name: f.read_bytes() for f in (tmp_path / "parallel" / "data").iterdir()
            if f.name != "manifest.json"} == first
    assert parallel["splits"] == sequential["splits"] == {"train": {"pairs": 40, "src_tokens": ANY,
                                                                    "tgt_tokens": ANY}}


class _Any:
    def __eq__(self, other: object) -> bool:
        return True


ANY = _Any()


def _prepare_quietly(recipe_path: Path, *overrides: str, workers: int = 1) -> tuple[dict, str]:
    """(manifest, what prepare printed), in this process."""
    out = io.StringIO()
    manifest = prepare(load_recipe(recipe_path, list(overrides)), workers=workers,
                       console=Console(file=out, width=200))
    return manifest, out.getvalue()


def test_pairs_longer_than_max_positions_are_dropped_from_train_only(tmp_path: Path) -> None:
    rng = random.Random(0)
    unspaced = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(300)).encode() for _ in range(4)]
    short = [(f"sentence number {i}".encode(), f"Satz Nummer {i}".encode()) for i in range(40)]
    long = [(unspaced[0], b"kurz"), (b"short", unspaced[1]), (unspaced[2], unspaced[3])]
    train = short[:10] + long[:1] + short[10:30] + long[1:] + short[30:]
    valid = [(b"hello", b"hallo"), (unspaced[0], b"kurz")]
    source = _pairs_source(tmp_path, train=train, valid=valid)
    path = _recipe(tmp_path, source)
    manifest, printed = _prepare_quietly(path, "model.max_positions=64")
    limit, data_dir = 64, tmp_path / "run" / "data"
    assert manifest["filter"]["max_positions"] == limit
    assert manifest["filter"]["dropped"] == {**{name: 0 for name in EXPECTED_DROPS}, "max_positions": len(long)}
    assert manifest["filter"]["kept"] == manifest["filter"]["remaining"]["max_positions"] == len(short)
    assert manifest["splits"]["train"]["pairs"] == len(short)
    assert "over 64 tokens" in printed  # the summary table's row
    tokens = load_split(data_dir, "train")
    assert int((tokens.src_lens + 1).max()) <= limit and int((tokens.tgt_lens + 1).max()) <= limit
    assert _decoded(data_dir, "train") == [(s.decode(), t.decode()) for s, t in short]
    valid_tokens = load_split(data_dir, "valid")  # never filtered, however long
    assert len(valid_tokens) == 2 and valid_tokens.src_lens[1] + 1 > limit

    assert "up to date" in _prepare_quietly(path, "model.max_positions=64", "model.dropout=0.3")[1]
    manifest, printed = _prepare_quietly(path, "model.max_positions=1024")  # the limit is in the fingerprint
    assert "up to date" not in printed
    assert manifest["filter"]["dropped"]["max_positions"] == 0 and manifest["filter"]["kept"] == len(train)


CHUNK = 7  # pairs per chunk in the chunked prepare: neither pair count below is a multiple, so chunks end unevenly


def _chunked_corpus() -> tuple[list[tuple[bytes, bytes]], list[tuple[str, str]], dict[str, int]]:
    """(training pairs, the pairs prepare keeps of them in order, its drops by filter) for CHUNK-pair chunks.

    Every filter drops a line at or beside a chunk boundary, and duplicates sit just after a boundary (their
    original just before it), several chunks on, in the last (partial) chunk and within a chunk. The unspaced
    lines are over the test's max_positions of 64 BPE tokens, so the encoder's chunks drop pairs too.
    """
    rng = random.Random(0)
    unspaced = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(300)).encode() for _ in range(4)]
    dropped = {13: TRAIN[4][:2], 14: TRAIN[5][:2], 20: TRAIN[6][:2], 21: TRAIN[7][:2], 40: TRAIN[8][:2],
               35: TRAIN[11][:2], 27: (unspaced[0], b"kurz"), 28: (b"short", unspaced[1]),
               50: (unspaced[2], unspaced[3])}
    duplicate_of = {7: 6, 30: 3, 60: 3, 17: 15, 45: 10}
    train: list[tuple[bytes, bytes]] = []
    kept: list[tuple[str, str]] = []
    for i in range(61):
        if i in dropped:
            train.append(dropped[i])
        elif i == 10:  # "the cat sleeps" spaced oddly, and at 45 with a decomposed ä: one pair once normalized
            train.append(TRAIN[1][:2])
            kept.append(("the cat sleeps", "die Katze schläft"))
        elif i in duplicate_of:
            train.append(TRAIN[3][:2] if i == 45 else train[duplicate_of[i]])
        else:
            train.append((f"sentence number {i}".encode(), f"Satz Nummer {i}".encode()))
            kept.append((f"sentence number {i}", f"Satz Nummer {i}"))
    assert any(i % CHUNK == 0 and j == i - 1 for i, j in duplicate_of.items())  # the two sides of a boundary
    assert any(i // CHUNK - j // CHUNK > 1 for i, j in duplicate_of.items())  # chunks apart
    assert len(train) % CHUNK and len(kept) % CHUNK and (len(kept) + 3) % CHUNK  # uneven last chunks
    return train, kept, {**EXPECTED_DROPS, "duplicate": len(duplicate_of), "max_positions": 3}


def _spy_on_chunks(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[list[int]]]:
    """Record the sizes of the chunks each stage of prepare hands to `_ordered_map` (which runs them on the
    workers), per stage and split, so a test can see the chunking it meant to cause did happen."""
    seen: dict[str, list[list[int]]] = {}
    ordered_map = mtx.data.prepare._ordered_map

    def spy(fn: Callable[..., Any], jobs: Iterable[tuple[Any, ...]], pool: Executor | None, workers: int
            ) -> Iterator[Any]:
        jobs = list(jobs)
        sizes = [len(job[0][0]) if fn is mtx.data.prepare._encode_chunk else len(job[0]) for job in jobs]
        seen.setdefault(fn.__name__, []).append(sizes)
        return ordered_map(fn, jobs, pool, workers)

    monkeypatch.setattr(mtx.data.prepare, "_ordered_map", spy)
    return seen


def test_chunk_boundaries_change_nothing_in_the_prepared_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                              ) -> None:
    """Prepare cleans and encodes a chunk at a time (10,000 pairs) and joins the chunks: their order, the token
    offsets that run on across chunks, the counts summed over chunks and dedup, which must find a duplicate in
    any chunk, are only exercised when a corpus spans chunks. So the same corpus is prepared in one chunk and
    in chunks of CHUNK pairs, on two workers (whose results may arrive out of order), and must give the same
    bytes.
    """
    train, kept, drops = _chunked_corpus()
    valid = [(f"hello {i}".encode(), f"hallo {i}".encode()) for i in range(10)]
    valid[2], valid[7], valid[8] = (b"bad \xfe", b"schlecht"), (b"", b""), (b"x", b"y \xff")
    source = _pairs_source(tmp_path, train=train, valid=valid)
    path = _recipe(tmp_path, source)
    chunks = _spy_on_chunks(monkeypatch)
    whole, _ = _prepare_quietly(path, "model.max_positions=64", f"run_dir={tmp_path / 'whole'}")
    assert chunks == {"_clean_chunk": [[len(train)], [len(valid)]],
                      "_encode_chunk": [[len(kept) + drops["max_positions"]], [len(valid)]]}

    chunks.clear()
    monkeypatch.setattr(mtx.data.corpora, "CHUNK_PAIRS", CHUNK)  # reading the sources
    monkeypatch.setattr(mtx.data.prepare, "CHUNK_PAIRS", CHUNK)  # reading the cleaned text to encode it
    chunked, _ = _prepare_quietly(path, "model.max_positions=64", f"run_dir={tmp_path / 'chunked'}", workers=2)

    assert chunked["filter"]["dropped"] == whole["filter"]["dropped"] == drops
    assert chunked["splits"]["valid"]["invalid_utf8_replaced"] == 2
    for manifest in (whole, chunked):
        del manifest["seconds"]
    assert chunked == whole
    files = {f.name for f in (tmp_path / "whole" / "data").iterdir()}
    assert files == {f.name for f in (tmp_path / "chunked" / "data").iterdir()}
    for name in sorted(files - {"manifest.json"}):
        assert (tmp_path / "chunked" / "data" / name).read_bytes() == (tmp_path / "whole" / "data" / name
                                                                        ).read_bytes(), name
    assert _decoded(tmp_path / "chunked" / "data", "train") == kept
    assert [s for s, _ in _decoded(tmp_path / "chunked" / "data", "valid")] == [
        "bad \ufffd" if i == 2 else "" if i == 7 else "x" if i == 8 else f"hello {i}" for i in range(10)]

    def sizes(pairs: int) -> list[int]:
        return [CHUNK] * (pairs // CHUNK) + [pairs % CHUNK]

    # the patches reached both stages: otherwise the comparison above proved nothing
    assert chunks == {"_clean_chunk": [sizes(len(train)), sizes(len(valid))],
                      "_encode_chunk": [sizes(len(kept) + drops["max_positions"]), sizes(len(valid))]}


@pytest.mark.parametrize("case", ["missing", "misaligned", "empty", "too_long", "unknown_dataset"])
def test_user_errors_exit_1_with_a_message(tmp_path: Path, case: str) -> None:
    en = _write(tmp_path / "c.en", [b"one", b"two", b"three"])
    de = _write(tmp_path / "c.de", [b"eins", b"zwei"] + ([b"drei"] if case != "misaligned" else []))
    if case == "missing":
        source, expected = {"files": {"train": [str(en), "nope.de"]}}, "nope.de does not exist"
    elif case == "misaligned":
        source, expected = {"files": {"train": [str(en), str(de)]}}, f"{en} has 3 lines but {de} has 2"
    elif case == "empty":
        source, expected = {"files": {"train": [str(en), str(de)]}}, "No training pairs are left"
    elif case == "too_long":
        source, expected = {"files": {"train": [str(en), str(de)]}}, "longer than model.max_positions = 1 BPE"
    else:
        source, expected = {"hf": {"path": "no-such-org/no-such-dataset", "name": "de-en"}}, "could not load"
    extra = {"empty": ["--set", "data.filter.min_len=2"], "too_long": ["--set", "model.max_positions=1"]}.get(case, [])
    result = _mtx("prepare", str(_recipe(tmp_path, source)), *extra, "--workers", "1", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert expected in " ".join(result.stderr.split()), result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run" / "data").exists() and not (tmp_path / "run" / "data.partial").exists()


def test_reader_errors(tmp_path: Path) -> None:
    with pytest.raises(MtxError, match="run `mtx prepare RECIPE`"):
        load_manifest(tmp_path)


def _damage(data_dir: Path, case: str) -> Path:
    """Damage the prepared data as `case` says; the file a message must name."""
    manifest_path = data_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    if case == "tokens_cut":
        path = data_dir / "train.tgt.tokens"
        os.truncate(path, path.stat().st_size - 2)
    elif case == "offsets_cut":
        path = data_dir / "valid.src.offsets"
        os.truncate(path, path.stat().st_size - 8)
    elif case == "offsets_overwritten":
        path = data_dir / "train.src.offsets"
        with open(path, "r+b") as f:
            f.write(np.array([1], dtype=np.int64).tobytes())
    elif case == "manifest_pairs":
        path = data_dir / "train.src.offsets"
        manifest["splits"]["train"]["pairs"] += 1
    elif case == "manifest_tokens":
        path = data_dir / "test.tgt.offsets"
        manifest["splits"]["test"]["tgt_tokens"] += 1
    else:
        path = data_dir / "train.src.tokens"
        path.unlink()
    manifest_path.write_text(json.dumps(manifest), encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["tokens_cut", "offsets_cut", "offsets_overwritten", "manifest_pairs",
                                  "manifest_tokens", "missing"])
def test_damaged_data_is_an_error_naming_the_file_and_prepare_rebuilds_it(tmp_path: Path, case: str) -> None:
    path = _recipe(tmp_path, _files_source(tmp_path))
    _prepare_quietly(path)
    data_dir = tmp_path / "run" / "data"
    damaged = _damage(data_dir, case)
    with pytest.raises(MtxError) as error:
        load_split(data_dir, damaged.name.split(".")[0])
    message = str(error.value)
    assert str(damaged) in message and "Run `mtx prepare RECIPE` again: it rebuilds the damaged data" in message
    if case != "missing":
        assert "but" in message  # what was found, against what was expected
    _, printed = _prepare_quietly(path)
    assert "up to date" not in printed
    assert _decoded(data_dir, "train") == KEPT
    for split in ("train", "valid", "test"):
        load_split(data_dir, split)
