"""Several corpora per run (`data.sources`): per-corpus filters, cross-corpus dedup, tags, weights; a vocabulary
from elsewhere (`data.bpe.from`); the demo's domains."""

from __future__ import annotations

import hashlib
import io
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from rich.console import Console
from support import REVERSE_WORDS, ROOT

import mtx.checkpoint
from mtx.checkpoint import make_checkpoint, save_checkpoint
from mtx.config.data import DemoSource
from mtx.config.fields import ConfigError
from mtx.config.keys import all_keys, format_keys
from mtx.config.loading import dump_recipe, load_recipe
from mtx.config.model import ModelConfig, resolve_model
from mtx.config.recipe import Recipe
from mtx.data.demo import NUMBER_WORDS, demo_splits, in_domain
from mtx.data.manifest import fingerprint
from mtx.data.prepare import prepare
from mtx.data.prepared import load_split
from mtx.data.vocabulary import CHECKPOINT_FORMAT
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokenizer import BYTE_LEVEL_SPACE, BYTE_TOKENS, METASPACE, SPECIAL_TOKENS, Tokenizer, why_not_a_tag
from mtx.train.run_data import check_data_matches_recipe, training_batches

RECIPES = ROOT / "recipes"

# Corpus "news" (files): two kept, an empty pair and a duplicate within it; a valid set, no test set.
NEWS = [("the dog sleeps", "der Hund schläft"), ("", "leer"), ("the cat runs", "die Katze rennt"),
        ("the dog sleeps", "der Hund schläft")]
NEWS_VALID = [("hello world", "hallo Welt"), ("good day", "guten Tag")]
# Corpus "bt" (tsv, tagged <bt>): a pair of news (a cross-corpus duplicate), one too long, two kept; a test set.
BT = [("the cat runs", "die Katze rennt"), ("one two three four five six seven", "eins zwei drei"),
      ("we see the house", "wir sehen das Haus"), ("I read", "ich lese es")]
BT_TEST = [("a new house", "ein neues Haus"), ("the old man", "der alte Mann")]


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _recipe(tmp_path: Path, data: dict, name: str = "recipe.yaml", **top: object) -> Path:
    recipe = {"name": "t", "run_dir": str(tmp_path / "run"), "data": {
        "filter": {"min_len": 1, "max_len": 6, "max_ratio": 3}, "bpe": {"vocab_size": 300, "min_frequency": 1},
        **data}, "model": {"preset": "tiny"}, **top}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True), encoding="utf-8")
    return path


def _prepare(path: Path, *overrides: str) -> tuple[dict, str]:
    out = io.StringIO()
    manifest = prepare(load_recipe(path, list(overrides)), workers=1, console=Console(file=out, width=200))
    return manifest, out.getvalue()


def _write_corpora(tmp_path: Path) -> None:
    """The files of the two corpora NEWS and BT, which `_two_corpora` names."""
    for name, pairs in (("news", NEWS), ("news-valid", NEWS_VALID)):
        _write(tmp_path / f"{name}.en", [s for s, _ in pairs])
        _write(tmp_path / f"{name}.de", [t for _, t in pairs])
    for name, pairs in (("bt", BT), ("bt-test", BT_TEST)):
        _write(tmp_path / f"{name}.tsv", [f"{s}\t{t}" for s, t in pairs])


def _two_corpora(tmp_path: Path, bt_weight: int = 1, bt_tag: str = "<bt>") -> dict:
    news = {"files": {split: [str(tmp_path / f"{name}.{lang}") for lang in ("en", "de")]
                      for split, name in (("train", "news"), ("valid", "news-valid"))}}
    bt = {"tsv": {"train": str(tmp_path / "bt.tsv"), "test": str(tmp_path / "bt-test.tsv")}, "tag": bt_tag,
          "weight": bt_weight}
    return {"sources": [news, bt]}


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp_path = tmp_path_factory.mktemp("corpora")
    _write_corpora(tmp_path)
    return tmp_path, _prepare(_recipe(tmp_path, _two_corpora(tmp_path)))[0]


def test_each_corpus_is_filtered_on_its_own_and_deduplicated_against_the_earlier(two_corpora) -> None:
    _, manifest = two_corpora
    news, bt = manifest["corpora"]
    assert (news["name"], news["kind"], news["tag"], bt["name"], bt["kind"], bt["tag"]) == (
        "news", "files", None, "bt", "tsv", "<bt>")  # names derived from the files' stems
    assert news["filter"]["dropped"] == {**dict.fromkeys(news["filter"]["dropped"], 0), "empty": 1, "duplicate": 1}
    assert bt["filter"]["dropped"] == {**dict.fromkeys(bt["filter"]["dropped"], 0), "length": 1, "duplicate": 1}
    assert (news["filter"]["kept"], bt["filter"]["kept"]) == (2, 2)
    total = manifest["filter"]
    assert total["read"] == 8 and total["kept"] == manifest["splits"]["train"]["pairs"] == 4
    assert total["dropped"] == {name: news["filter"]["dropped"][name] + bt["filter"]["dropped"][name]
                                for name in total["dropped"]}
    assert manifest["source"]["kind"] == "mixed"


def test_corpora_follow_one_another_and_eval_sets_come_from_those_that_have_them(two_corpora) -> None:
    tmp_path, manifest = two_corpora
    data = tmp_path / "run" / "data"
    tokenizer = Tokenizer.from_file(data / "tokenizer.json")
    train = load_split(data, "train")
    decoded = [(tokenizer.decode(train.src(i)), tokenizer.decode(train.tgt(i))) for i in range(len(train))]
    assert decoded == [NEWS[0], NEWS[2], BT[2], BT[3]]  # news' range, then bt's
    news, bt = manifest["corpora"]
    assert [news["splits"]["train"]["pairs"], bt["splits"]["train"]["pairs"]] == [2, 2]
    assert set(news["splits"]) == {"train", "valid"} and set(bt["splits"]) == {"train", "test"}
    assert (news["splits"]["valid"]["pairs"], bt["splits"]["test"]["pairs"]) == (2, 2)
    assert manifest["splits"]["valid"]["pairs"] == 2 and manifest["splits"]["test"]["pairs"] == 2
    assert (data / "valid.en").read_text(encoding="utf-8").splitlines() == [s for s, _ in NEWS_VALID]
    assert (data / "test.en").read_text(encoding="utf-8").splitlines() == [f"<bt> {s}" for s, _ in BT_TEST]
    assert (data / "test.de").read_text(encoding="utf-8").splitlines() == [t for _, t in BT_TEST]
    assert not (data / "valid.align").exists()  # no corpus here has gold alignments


def test_a_tagged_corpus_sources_begin_with_the_tag_as_one_token(two_corpora) -> None:
    tmp_path, _ = two_corpora
    data = tmp_path / "run" / "data"
    tokenizer = Tokenizer.from_file(data / "tokenizer.json")
    assert tokenizer.tags == ["<bt>"] and tokenizer.special_tokens[4] == "<bt>"  # the id after the fixed four
    train, test = load_split(data, "train"), load_split(data, "test")
    assert [int(train.src(i)[0]) == 4 for i in range(len(train))] == [False, False, True, True]
    assert all(4 not in train.tgt(i) for i in range(len(train)))
    assert all(int(test.src(i)[0]) == 4 and 4 not in test.src(i)[1:] for i in range(len(test)))
    assert [list(train.src(i)[1:]) for i in (2, 3)] == [tokenizer.encode(s) for s in (BT[2][0], BT[3][0])]


def test_the_tokenizer_reads_a_leading_tag_only() -> None:
    lines = ["the dog sleeps in the house", "der Hund schläft im Haus"] * 20
    tokenizer = Tokenizer.train(lines, 300, 1, tags=["<bt>", "<num>"], style="bytelevel")
    bt, num = 4, 5
    assert tokenizer.tags == ["<bt>", "<num>"] and tokenizer.special_tokens[num] == "<num>"
    assert tokenizer.encode("<bt> the dog") == [bt, *tokenizer.encode("the dog")]
    assert tokenizer.encode("<num>") == [num]
    assert tokenizer.encode("<num> <bt> the dog") == [num, bt, *tokenizer.encode("the dog")]  # leading tags, each
    assert tokenizer.encode("<num> the <bt> dog")[:1] == [num] and bt not in tokenizer.encode("<num> the <bt> dog")
    assert bt not in tokenizer.encode("the <bt> dog") and bt not in tokenizer.encode("<bt>dog")  # text there
    assert tokenizer.decode(tokenizer.encode("<bt> the dog")) == "the dog"
    assert tokenizer.decode(tokenizer.encode("the <bt> dog")) == "the <bt> dog"
    texts = ["<bt> the dog", "the house", "<num> der Hund", ""]
    assert tokenizer.encode_batch(texts) == [tokenizer.encode(text) for text in texts]
    ids = tokenizer.encode("<bt> the dog")
    assert tokenizer.pieces(ids)[0] == "" and tokenizer.word_of_each_token(ids) == [None, 0, 1]
    loaded = Tokenizer.from_str(tokenizer.to_str())
    assert loaded.tags == tokenizer.tags and loaded.encode("<num> the dog") == tokenizer.encode("<num> the dog")


def test_weights_repeat_a_corpus_in_every_epoch_and_need_no_new_data(two_corpora) -> None:
    tmp_path, manifest = two_corpora
    path = _recipe(tmp_path, _two_corpora(tmp_path, bt_weight=3), name="weighted.yaml")
    recipe = load_recipe(path)
    data = tmp_path / "run" / "data"
    check_data_matches_recipe(recipe, manifest, data)  # a weight is not the data's
    said: list[str] = []
    batches = training_batches(recipe, manifest, load_split(data, "train"), said.append)
    seen = Counter(int(i) for batch in batches for i in batch)
    assert seen == {0: 1, 1: 1, 2: 3, 3: 3}
    assert said == ["an epoch of training pairs, by corpus and weight: news 2 × 1, bt 2 × 3 = 8"]
    assert _prepare(path)[1].startswith(f"{data} is up to date")

    said.clear()
    unweighted = training_batches(load_recipe(tmp_path / "recipe.yaml"), manifest, load_split(data, "train"),
                                  said.append)
    assert sorted(int(i) for batch in unweighted for i in batch) == [0, 1, 2, 3] and said == []


def test_a_weight_that_no_memory_holds_is_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """`mtx train` with a weight that makes an epoch of two trillion pairs: before, numpy's allocation of its
    index failed with a traceback (_ArrayMemoryError); now the weight is refused before any memory is taken,
    naming the key, the epoch it makes and what to do."""
    from mtx import cli

    _write_corpora(tmp_path)
    path = _recipe(tmp_path, _two_corpora(tmp_path, bt_weight=10**12), train={"device": "cpu"})
    monkeypatch.setitem(cli._state, "debug", False)
    for command in ("prepare", "train"):
        monkeypatch.setattr(sys, "argv", ["mtx", command, str(path)])
        with pytest.raises(SystemExit) as exited:
            cli.main()
        err = " ".join(capsys.readouterr().err.split())
        assert exited.value.code == (0 if command == "prepare" else 1), err
    assert "Traceback" not in err
    assert err.startswith("error: data.sources[1].weight = 1,000,000,000,000 makes an epoch of "
                          "2,000,000,000,002 training pairs (news 2 × 1, bt 2 × 1,000,000,000,000), more than the "
                          "1,000,000,000 an epoch may hold"), err
    assert "Lower that weight" in err


def test_data_of_other_corpora_or_tags_is_refused_by_the_trainer(two_corpora) -> None:
    tmp_path, manifest = two_corpora
    retagged = load_recipe(_recipe(tmp_path, _two_corpora(tmp_path, bt_tag="<back>"), name="retagged.yaml"))
    with pytest.raises(MtxError, match=r"prepared from the corpora news, bt tagged <bt> \(the recipe has news, bt "
                                       r"tagged <back>\): run `mtx prepare RECIPE` again"):
        check_data_matches_recipe(retagged, manifest, tmp_path / "run" / "data")
    assert fingerprint(retagged.data, 1024) != fingerprint(load_recipe(tmp_path / "recipe.yaml").data, 1024)


# ------------------------------------------------------------------------------------- data.bpe.from


@pytest.fixture(scope="module")
def demo_corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """Two demo corpora, an in-domain one (numbers, tagged) and a general one: the run whose vocabulary the
    data.bpe.from tests borrow."""
    tmp_path = tmp_path_factory.mktemp("demo")
    sources = [{"demo": {"pairs": 60, "valid": 5, "test": 5, "seed": 2, "domain": "numbers"}, "tag": "<num>"},
               {"demo": {"pairs": 200, "valid": 10, "test": 0, "seed": 2, "domain": "general"}}]
    path = _recipe(tmp_path, {"sources": sources, "bpe": {"vocab_size": 400}})
    return tmp_path, _prepare(path)[0]


def test_demo_corpora_keep_their_gold_alignments_and_tag(demo_corpora) -> None:
    tmp_path, manifest = demo_corpora
    data = tmp_path / "run" / "data"
    assert [c["name"] for c in manifest["corpora"]] == ["demo", "demo-2"] and manifest["source"]["kind"] == "demo"
    valid = (data / "valid.en").read_text(encoding="utf-8").splitlines()
    aligned = (data / "valid.align").read_text(encoding="utf-8").splitlines()
    assert len(valid) == len(aligned) == 15 and len((data / "test.align").read_text().splitlines()) == 5
    assert all(line.startswith("<num> ") for line in valid[:5]) and not any("<num>" in line for line in valid[5:])
    held_out = demo_splits(DemoSource(pairs=60, valid=5, test=5, seed=2, domain="numbers"))["valid"]
    assert aligned[:5] == [pair.alignment for pair in held_out]  # word indices of the untagged sentence


def _tiny_checkpoint(tokenizer: Tokenizer, path: Path) -> Path:
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=16, heads=2, d_ff=32, layers_enc=1, layers_dec=1))
    save_checkpoint(make_checkpoint(Transformer(cfg, tokenizer.vocab_size), tokenizer.to_str(), {"name": "t"}, 1),
                    path)
    return path


@pytest.mark.parametrize("kind", ["tokenizer.json", "data folder", "checkpoint"])
def test_a_vocabulary_from_elsewhere_is_used_as_it_is(demo_corpora, tmp_path: Path, kind: str) -> None:
    parent_dir, parent = demo_corpora
    parent_data = parent_dir / "run" / "data"
    tokenizer = Tokenizer.from_file(parent_data / "tokenizer.json")
    source = {"tokenizer.json": parent_data / "tokenizer.json", "data folder": parent_data,
              "checkpoint": _tiny_checkpoint(tokenizer, tmp_path / "parent.pt")}[kind]
    sources = [{"demo": {"pairs": 50, "valid": 5, "test": 5, "seed": 3, "domain": "numbers"}, "tag": "<num>"}]
    path = _recipe(tmp_path, {"sources": sources, "bpe": {"from": str(source), "vocab_size": 999}})
    manifest, _ = _prepare(path)
    data = tmp_path / "run" / "data"
    assert manifest["tokenizer_sha256"] == parent["tokenizer_sha256"] == tokenizer.sha256
    assert Tokenizer.from_file(data / "tokenizer.json").sha256 == tokenizer.sha256
    assert manifest["bpe"] == {"from": str(source)} and manifest["vocab_size"] == tokenizer.vocab_size
    train = load_split(data, "train")
    assert all(int(train.src(i)[0]) == 4 for i in range(len(train)))  # <num>, the parent's id for it
    recipe = load_recipe(path)
    check_data_matches_recipe(recipe, manifest, data)
    file = source / "tokenizer.json" if source.is_dir() else source
    assert [str(file), file.stat().st_size, file.stat().st_mtime_ns] in manifest["inputs"]
    assert _prepare(path, "data.bpe.vocab_size=555")[1].startswith(f"{data} is up to date")  # ignored with from
    with pytest.raises(MtxError, match=r"prepared with a vocabulary learnt on its text \(the recipe asks for the "
                                       r"vocabulary of data.bpe.from = "):
        check_data_matches_recipe(recipe, parent, data)


def test_a_tag_the_borrowed_vocabulary_lacks_is_refused_before_any_work(demo_corpora, tmp_path: Path) -> None:
    parent_data = demo_corpora[0] / "run" / "data"
    sources = [{"demo": {"pairs": 50, "seed": 3}}, {"demo": {"pairs": 50, "seed": 4}, "tag": "<bt>"}]
    path = _recipe(tmp_path, {"sources": sources, "bpe": {"from": str(parent_data)}})
    with pytest.raises(MtxError) as error:
        _prepare(path)
    assert str(error.value).startswith("data.sources[1].tag = '<bt>' is not a special token of the tokenizer of "
                                       f"data.bpe.from = {parent_data} (its tags: <num>)")
    assert not (tmp_path / "run").exists()

    with pytest.raises(MtxError, match=r"^data.bpe.from = .*missing.json does not exist"):
        _prepare(path, f"data.bpe.from={tmp_path / 'missing.json'}")
    (tmp_path / "broken.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(MtxError, match=r"^data.bpe.from: cannot read a tokenizer from .*broken.pt"):
        _prepare(path, f"data.bpe.from={tmp_path / 'broken.pt'}")
    assert not (tmp_path / "run").exists()


def test_the_data_stage_knows_the_checkpoint_format() -> None:
    assert CHECKPOINT_FORMAT == mtx.checkpoint.FORMAT


# ------------------------------------------------------------------------------------------ the recipe


def _load_data(tmp_path: Path, data: dict) -> Recipe:
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "data": data}), encoding="utf-8")
    return load_recipe(path)


DEMO = {"demo": {"pairs": 10}}


@pytest.mark.parametrize(("data", "key", "what"), [
    ({"sources": [{**DEMO, "name": "a"}, {**DEMO, "name": "a"}]}, "data.sources[1].name", "names an earlier"),
    ({"sources": [{**DEMO, "name": "a b"}]}, "data.sources[0].name", "may hold only"),
    ({"sources": [{**DEMO, "weight": 0}]}, "data.sources[0].weight", "must be at least 1"),
    ({"sources": [DEMO, {**DEMO, "tag": "<b t>"}]}, "data.sources[1].tag", "must be one word"),
    ({"sources": [{**DEMO, "tag": ""}]}, "data.sources[0].tag", "must be one word"),
    ({"sources": [{**DEMO, "tag": "</s>"}]}, "data.sources[0].tag", "is one of mtx's own special tokens"),
    ({"sources": [DEMO, {**DEMO, "tag": "<0x41>"}]}, "data.sources[1].tag", "spells a byte token"),
    ({"sources": [{**DEMO, "tag": "<0xe9>"}]}, "data.sources[0].tag", "spells a byte token"),
    ({"sources": [{**DEMO, "tag": "▁"}]}, "data.sources[0].tag", "holds '▁', the word mark"),
    ({"sources": [{**DEMO, "tag": "<bt▁>"}]}, "data.sources[0].tag", "holds '▁', the word mark"),
    ({"sources": [{**DEMO, "tag": "Ġbt"}]}, "data.sources[0].tag", "holds 'Ġ', the word mark"),
    ({"sources": [{**DEMO, "tag": "A"}]}, "data.sources[0].tag", "is a single character"),
    ({"sources": [{**DEMO, "tag": "\x01bt"}]}, "data.sources[0].tag", "becomes 'bt' when mtx normalizes a line"),
    ({"sources": [{"tag": "<bt>"}]}, "data.sources[0]", "must name exactly one of hf, files, tsv, demo"),
    ({"sources": [{**DEMO, "tag": f"<t{letter}>"} for letter in "ABCDEFGHIJKLMNOP"],
      "bpe": {"vocab_size": 300, "model": "unigram"}}, "data.bpe.vocab_size",
     "is too small for the 16 tags of data.sources: a metaspace unigram vocabulary with them needs at least 316"),
    ({"sources": [{**DEMO, "wieght": 2}]}, "data.sources[0].wieght", "did you mean data.sources[0].weight?"),
    ({"sources": []}, "data.sources", "must list at least one corpus"),
    ({"source": DEMO, "sources": [DEMO]}, "data.source and data.sources", "are both set"),
    ({"src_lang": "en"}, "data.source", "is missing: set data.source (one corpus) or data.sources"),
    ({"source": DEMO, "bpe": {"from_": "x"}}, "data.bpe.from_", "did you mean data.bpe.from?"),
])
def test_bad_corpora_are_refused_naming_the_key(tmp_path: Path, data: dict, key: str, what: str) -> None:
    with pytest.raises(ConfigError) as error:
        _load_data(tmp_path, data)
    assert key in str(error.value) and what in str(error.value), str(error.value)


def test_corpora_may_share_a_tag_that_is_no_piece_of_the_vocabulary(tmp_path: Path) -> None:
    """Several back-translated corpora may all be tagged <bt>: one special token. Every piece the vocabulary
    reserves for itself is refused as a tag, each of the 256 byte tokens included."""
    data = _load_data(tmp_path, {"sources": [DEMO, {**DEMO, "tag": "<bt>"}, {**DEMO, "tag": "<bt>"}]}).data
    assert data.tags == ["<bt>"]
    reserved = [*SPECIAL_TOKENS, *BYTE_TOKENS, METASPACE, BYTE_LEVEL_SPACE, "\x01"]
    assert all(why_not_a_tag(piece) is not None for piece in reserved)
    assert all(why_not_a_tag(tag) is None for tag in ("<bt>", "<2de>", "<medical>", "bt", "Ä-Ä"))


def test_a_reserved_tag_stops_prepare_before_any_work(tmp_path: Path) -> None:
    """What a user's shell gets for a tag that spells a byte token: exit 1, one message naming the key, no
    traceback, no run folder (before, prepare went on, the text lost its "A"s and training crashed)."""
    path = _recipe(tmp_path, {"sources": [DEMO, {**DEMO, "tag": "<0x41>"}]})
    done = subprocess.run([sys.executable, "-m", "mtx", "prepare", str(path)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "data.sources[1].tag = '<0x41>' spells a byte token" in " ".join(done.stderr.split())
    assert not (tmp_path / "run").exists()


def test_corpus_names_are_derived_from_their_sources(tmp_path: Path) -> None:
    data = _load_data(tmp_path, {"sources": [
        DEMO, {**DEMO, "name": "demo-2"}, DEMO, {"hf": {"path": "wmt/wmt14", "name": "de-en"}},
        {"files": {"train": ["corpus/europarl.en", "corpus/europarl.de"]}}, {"tsv": {"train": "x/paracrawl.tsv"}},
    ]}).data
    assert [c.name for c in data.corpora] == ["demo", "demo-2", "demo-3", "wmt14-de-en", "europarl", "paracrawl"]
    assert [c.weight for c in data.corpora] == [1] * 6 and data.tags == []
    single = _load_data(tmp_path, {"source": DEMO}).data
    assert [(c.name, c.tag, c.weight, c.demo) for c in single.corpora] == [("demo", None, 1, single.source.demo)]


def test_one_source_recipes_keep_the_fingerprint_they_had() -> None:
    """Measured before data.sources, tags, domains and vocabulary styles existed: prepared data stays up to date,
    the byte-level BPE of those recipes spelt out or not. The WMT14 recipes have since moved to metaspace BPE,
    whose data is another."""
    demo = load_recipe(RECIPES / "demo.yaml").data
    wmt = load_recipe(RECIPES / "wmt14_en_de_base.yaml", ["data.bpe.style=bytelevel"]).data
    assert fingerprint(demo, 1024)["recipe_sha256"] == (
        "8727011944aa6c6b946a2bdf119443114cd84c1523d27a38ab08c8b562e5b224")
    assert fingerprint(wmt, 1024)["recipe_sha256"] == (
        "343e8a90b397249d5fab270afef2347674f15a4f57c7551eb7ce4ce28eaf3dc6")
    metaspace = load_recipe(RECIPES / "wmt14_en_de_base.yaml").data
    assert fingerprint(metaspace, 1024)["recipe_sha256"] != fingerprint(wmt, 1024)["recipe_sha256"]
    explicit = load_recipe(RECIPES / "demo.yaml", ["data.source.demo.domain=all"]).data
    assert fingerprint(explicit, 1024) == fingerprint(demo, 1024)


def test_data_filtered_by_the_former_language_rule_is_not_up_to_date() -> None:
    """Issue 56 replaced language identification's rule ("confident of another language") with a ratio: data a
    recipe with language_id prepared before it (this fingerprint, measured at f97816c) is prepared again, as it
    holds pairs the new rule drops."""
    recipe = load_recipe(RECIPES / "demo.yaml", ["data.filter.language_id=true"]).data
    assert fingerprint(recipe, 1024)["recipe_sha256"] != (
        "b3b8f10eace5ecf1105483ae6d9b5db992ad7434b9ae3096ac35bbf333f35336")
    assert fingerprint(load_recipe(RECIPES / "demo.yaml").data, 1024)["recipe_sha256"] == (
        "8727011944aa6c6b946a2bdf119443114cd84c1523d27a38ab08c8b562e5b224")  # language_id off: unchanged


def test_keys_list_the_corpora_and_the_borrowed_vocabulary(tmp_path: Path) -> None:
    by_key = {k.key: k for k in all_keys()}
    assert by_key["data.sources"].section and by_key["data.sources"].type == "a list of mappings or null"
    for key in ("data.sources[i].demo.domain", "data.sources[i].files.train", "data.sources[i].name",
                "data.sources[i].tag", "data.sources[i].weight", "data.source.demo.domain", "data.bpe.from"):
        assert key in by_key and by_key[key].help, key
    assert by_key["data.sources[i].weight"].default == "1" and "data.bpe.from_" not in by_key

    path = _recipe(tmp_path, {**_two_corpora(tmp_path, bt_weight=2), "bpe": {"from": "runs/parent/data"}})
    recipe = load_recipe(path)
    assert recipe.data.bpe.from_ == "runs/parent/data"
    listed = format_keys(all_keys(), recipe)
    assert "data.bpe.from  (a string or null; default null)  — this recipe: runs/parent/data\n" in listed
    dumped = dump_recipe(recipe)
    bpe = yaml.safe_load(dumped)["data"]["bpe"]
    assert bpe["from"] == "runs/parent/data" and "from_" not in bpe
    again = tmp_path / "dumped.yaml"
    again.write_text(dumped, encoding="utf-8")
    assert load_recipe(again) == recipe
    assert load_recipe(path, ["data.bpe.from=other.json"]).data.bpe.from_ == "other.json"


# ------------------------------------------------------------------------------------------ demo domains


def test_demo_domains_split_the_corpus_and_all_is_unchanged() -> None:
    every = demo_splits(DemoSource(pairs=300, valid=20, test=20, seed=2))
    text = "\n".join(f"{p.en}\t{p.de}\t{p.alignment}" for split in ("train", "valid", "test") for p in every[split])
    assert hashlib.md5(text.encode()).hexdigest() == "ccec2e55e3fab655be8eecb2f09e2f67"  # measured before domains
    numbers, general = (demo_splits(DemoSource(pairs=100, valid=10, test=10, seed=2, domain=domain))
                        for domain in ("numbers", "general"))
    number_en = {p.en for split in numbers.values() for p in split}
    general_en = {p.en for split in general.values() for p in split}
    assert len(number_en) == len(general_en) == 120 and not number_en & general_en
    assert all(in_domain(en, "numbers") and not in_domain(en, "general") for en in number_en)
    assert all(in_domain(en, "general") for en in general_en)
    assert "o'clock" in NUMBER_WORDS and "twenty-first" in NUMBER_WORDS and "june" in NUMBER_WORDS
    assert in_domain("She came on the first of June.", "numbers") and in_domain("He came at one o'clock.", "numbers")
    assert in_domain("The dog sleeps on Monday.", "general")
    share = np.mean([in_domain(p.en, "numbers") for p in every["train"]])
    assert 0.05 < share < 0.35  # about one sentence in six


def test_a_model_trained_on_tagged_data_reads_the_tag(tmp_path: Path) -> None:
    """Two corpora of the same kind of sentences, one answered "ja", the other, tagged <t>, "nein": the tag is
    all that tells them apart. Every tagged pair reaches the model with the tag token first, and the trained
    model answers "nein" to a held-out sentence that starts with the tag, "ja" to the same sentence without.
    Calibrated: with seed 1 it does so from update 60 on (not yet at 50); 150 updates leave a wide margin."""

    from mtx.config.recipe import DecodeConfig
    from mtx.data.batching import collate
    from mtx.decode.translator import translate_sentences
    from mtx.model.transformer import Transformer
    from mtx.train.trainer import train

    rng = np.random.default_rng(5)

    def sentences(count: int) -> list[str]:
        return [" ".join(rng.choice(REVERSE_WORDS, size=rng.integers(2, 6))) for _ in range(count)]

    plain, tagged, held_out = sentences(200), sentences(200), sentences(20)
    _write(tmp_path / "plain.en", plain)
    _write(tmp_path / "plain.de", ["ja"] * len(plain))
    _write(tmp_path / "tagged.tsv", [f"{s}\tnein" for s in tagged])
    data = {"sources": [{"files": {"train": [str(tmp_path / "plain.en"), str(tmp_path / "plain.de")]}},
                        {"tsv": {"train": str(tmp_path / "tagged.tsv")}, "tag": "<t>"}],
            "filter": {"min_len": 1, "max_len": 10, "max_ratio": 0}}
    path = _recipe(tmp_path, data)
    raw = yaml.safe_load(path.read_text())
    raw["model"] = {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": 32, "heads": 4, "d_ff": 64,
                    "dropout": 0.0, "max_positions": 32}
    raw["train"] = {"max_tokens": 256, "lr": 3.0e-3, "warmup": 10, "device": "cpu", "precision": "fp32",
                    "max_steps": 150, "save_every": 150, "log_every": 150}
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    manifest, _ = _prepare(path)
    recipe = load_recipe(path)
    tokenizer = Tokenizer.from_file(recipe.run_path / "data" / "tokenizer.json")
    tag = tokenizer.encode("<t>")[0]
    split = load_split(recipe.run_path / "data", "train")
    first_tagged = manifest["corpora"][0]["splits"]["train"]["pairs"]
    for batch in training_batches(recipe, manifest, split, say=lambda line: None):
        src = collate(split, batch).src
        assert (src[:, 0] == tag).tolist() == (batch >= first_tagged).tolist()

    torch.manual_seed(0)
    train(recipe)
    checkpoint = mtx.checkpoint.load_checkpoint(recipe.run_path / "checkpoints" / "last.pt")
    model = Transformer(ModelConfig(**checkpoint["model_config"]), checkpoint["vocab_size"]).eval()
    model.load_state_dict(checkpoint["model"])
    decode = DecodeConfig(beam=1, max_len_a=0, max_len_b=4)
    assert translate_sentences(model, tokenizer, [f"<t> {s}" for s in held_out], decode) == ["nein"] * 20
    assert translate_sentences(model, tokenizer, held_out, decode) == ["ja"] * 20
