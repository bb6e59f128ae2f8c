"""One model for several language pairs: per-corpus languages, the target-language tag (`data.target_tag`), the
validation of each pair, and choosing the target language in `mtx translate`, `mtx serve` and a CTranslate2
export.

One model is trained here, on two corpora of the same kind of English sentences: en→de answers every sentence
"ja das ist gut", en→fr "oui c'est très bon"; the target tag (<2de>, <2fr>) is all that tells the two apart. The trained
model must produce each language on demand (--target-lang, a tag in the input line, a request's target_lang), its
validations must report each pair's BLEU (metrics.jsonl, the report page), and a CTranslate2 export must give its
tokens. Beside it: the recipe's rules of several pairs, and temperature sampling across corpora.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from rich.console import Console
from support import REVERSE_WORDS, Server, serving, translate_cli

from mtx.config.fields import ConfigError
from mtx.config.loading import load_recipe
from mtx.data.prepare import prepare
from mtx.data.prepared import load_split
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer
from mtx.train.run_data import load_valid_set, temperature_shares, training_batches

ANSWERS = {"de": "ja das ist gut", "fr": "oui c'est très bon"}


def _sentences(rng: np.random.Generator, count: int) -> list[str]:
    return [" ".join(rng.choice(REVERSE_WORDS, size=rng.integers(2, 6))) for _ in range(count)]


def _write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def multilingual(tmp_path_factory) -> dict:
    """The en→{de, fr} model trained for 150 updates, validated on both pairs, and 20 held-out sentences.
    Calibrated like test_corpora's tag test: the tag is read well before the last update."""
    from mtx.train.trainer import train

    folder = tmp_path_factory.mktemp("multilingual")
    rng = np.random.default_rng(5)
    sources = []
    for lang, answer in ANSWERS.items():
        train_src, valid_src = _sentences(rng, 200), _sentences(rng, 10)
        files = {"train": [_write(folder / f"train.{lang}.en", train_src),
                           _write(folder / f"train.{lang}.{lang}", [answer] * len(train_src))],
                 "valid": [_write(folder / f"valid.{lang}.en", valid_src),
                           _write(folder / f"valid.{lang}.{lang}", [answer] * len(valid_src))]}
        sources.append({"files": files, "name": f"en-{lang}", "tgt_lang": lang})
    raw = {"name": "multi", "run_dir": str(folder / "run"), "seed": 1,
           "data": {"sources": sources, "src_lang": "en", "tgt_lang": "de", "target_tag": "<2{lang}>",
                    "filter": {"min_len": 1, "max_len": 10, "max_ratio": 0, "dedup": False},
                    "bpe": {"vocab_size": 300, "min_frequency": 1}},
           "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": 32, "heads": 4, "d_ff": 64,
                     "dropout": 0.0, "max_positions": 32},
           "train": {"max_tokens": 256, "lr": 3.0e-3, "warmup": 10, "device": "cpu", "precision": "fp32",
                     "max_steps": 150, "save_every": 150, "log_every": 150, "validate_every": 75, "valid_beam": 1},
           "decode": {"beam": 1, "max_len_a": 0, "max_len_b": 12}}
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    recipe = load_recipe(path)
    manifest = prepare(recipe, workers=1, console=Console(file=io.StringIO()))
    torch.manual_seed(0)
    train(recipe)
    held_out = _sentences(rng, 20)
    return dict(recipe=recipe, manifest=manifest, data=recipe.run_path / "data", held_out=held_out,
                checkpoint=recipe.run_path / "checkpoints" / "last.pt",
                input=_write(folder / "held_out.en", held_out))


def test_each_pair_s_sources_begin_with_its_target_tag(multilingual: dict) -> None:
    data, manifest = multilingual["data"], multilingual["manifest"]
    tokenizer = Tokenizer.from_file(data / "tokenizer.json")
    assert tokenizer.tags == ["<2de>", "<2fr>"]
    de, fr = (tokenizer.encode(tag)[0] for tag in tokenizer.tags)
    train = load_split(data, "train")
    assert [int(train.src(i)[0]) for i in range(len(train))] == [de] * 200 + [fr] * 200
    assert [(c["src_lang"], c["tgt_lang"], c["prefix"]) for c in manifest["corpora"]] == [
        ("en", "de", "<2de> "), ("en", "fr", "<2fr> ")]
    valid = (data / "valid.en").read_text(encoding="utf-8").splitlines()
    assert [line.split()[0] for line in valid] == ["<2de>"] * 10 + ["<2fr>"] * 10


def test_validation_reports_each_pair(multilingual: dict) -> None:
    metrics = multilingual["recipe"].run_path / "metrics.jsonl"
    valid = [json.loads(line) for line in metrics.read_text().splitlines() if '"event": "valid"' in line]
    assert [line["step"] for line in valid] == [75, 150]
    last = valid[-1]
    assert set(last["valid_pairs"]) == {"en-de", "en-fr"}
    assert all(pair["bleu"] == pytest.approx(100.0) for pair in last["valid_pairs"].values())
    assert last["valid_bleu"] == pytest.approx(100.0)
    # train.valid_max_sentences takes that many sentences of each pair, not of the valid split.
    recipe = dataclasses.replace(multilingual["recipe"], train=dataclasses.replace(multilingual["recipe"].train,
                                                                                  valid_max_sentences=3))
    valid = load_valid_set(recipe, multilingual["manifest"], multilingual["data"])
    assert valid.pairs == ["en-de"] * 3 + ["en-fr"] * 3
    assert [line.split()[0] for line in valid.sources] == ["<2de>"] * 3 + ["<2fr>"] * 3
    assert valid.refs == [ANSWERS["de"]] * 3 + [ANSWERS["fr"]] * 3


def test_translate_produces_the_language_asked_for(multilingual: dict) -> None:
    model, held_out = str(multilingual["checkpoint"]), multilingual["held_out"]
    for lang, answer in ANSWERS.items():
        result, lines = translate_cli(["-m", model, "-i", multilingual["input"], "--target-lang", lang])
        assert result.exit_code == 0, result.output
        assert lines == [answer] * len(held_out)
    # A line's own tag wins over --target-lang, so one input can mix directions.
    mixed = f"<2fr> {held_out[0]}\n{held_out[1]}\n".encode()
    result, lines = translate_cli(["-m", model, "--target-lang", "de"], stdin=mixed)
    assert lines == [ANSWERS["fr"], ANSWERS["de"]]
    result, _ = translate_cli(["-m", model, "-i", multilingual["input"], "--target-lang", "es"])
    assert isinstance(result.exception, MtxError)
    assert str(result.exception) == ("--target-lang 'es' is not a target language of this model, which translates "
                                     "into de, fr.")


@serving
def test_serve_takes_target_lang_and_refuses_a_language_the_model_lacks(multilingual: dict, tmp_path: Path) -> None:
    server = Server(multilingual["checkpoint"], tmp_path / "serve.log")
    try:
        text = multilingual["held_out"][:4]
        for lang, answer in ANSWERS.items():
            status, _, body = server.translate({"text": text, "target_lang": lang})
            assert status == 200, body
            assert [t["text"] for t in body["translations"]] == [answer] * len(text)
        status, _, body = server.translate({"text": text, "target_lang": "es"})
        assert status == 400 and body["field"] == "target_lang" and "de, fr" in body["error"], body
    finally:
        server.stop()


def test_a_ctranslate2_export_gives_mtx_s_tokens_in_both_languages(multilingual: dict, tmp_path: Path) -> None:
    """The tag is a source token: CTranslate2 reads it as mtx does, with the export's own tokenizer."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tokenizers import Tokenizer as HfTokenizer

    from mtx.config.decode import DecodeConfig
    from mtx.decode.target_lang import TargetLanguages
    from mtx.decode.translator import Translator, load_prepared
    from mtx.export.command import export_checkpoint

    export_checkpoint(multilingual["checkpoint"], "ctranslate2", tmp_path / "ct2")
    exported = HfTokenizer.from_file(str(tmp_path / "ct2" / "tokenizer.json"))
    theirs = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    models, tokenizer, loaded = load_prepared([multilingual["checkpoint"]], "cpu", "fp32")
    held_out = multilingual["held_out"]
    for lang in ANSWERS:
        translator = Translator(models, tokenizer, DecodeConfig(beam=1, max_len_a=0, max_len_b=12, target_lang=lang),
                                targets=TargetLanguages.of_checkpoint(loaded[0]))
        ours = [nbest[0].tokens for nbest in translator.translate(held_out)]
        results = theirs.translate_batch([exported.encode(f"<2{lang}> {s}").tokens for s in held_out], beam_size=1,
                                         max_decoding_length=13, suppress_sequences=[["<pad>"], ["<s>"]])
        assert [[exported.token_to_id(t) for t in r.hypotheses[0]] for r in results] == [list(t) for t in ours]
        assert tokenizer.decode(ours[0]) == ANSWERS[lang]
    card = (tmp_path / "ct2" / "README.md").read_text(encoding="utf-8")
    assert card.startswith("# multi: en → de, fr translation")
    assert "This model translates into de, fr: start each source sentence with the tag of the language wanted and a " \
           "space (`<2de> `, `<2fr> `)." in card


# ------------------------------------------------------------------------------------------ the recipe's rules


def _data(**data: object) -> dict:
    corpus = {"files": {"train": ["a.en", "a.de"]}}
    return {"name": "t", "data": {"sources": [corpus, {**corpus, "tgt_lang": "fr"}], "target_tag": "<2{lang}>",
                                  **data}}


@pytest.mark.parametrize(("changes", "message"), [
    ({"target_tag": None}, "The corpora of data.sources translate into 2 languages (de, fr), and nothing tells the "
                           "model which to produce: set data.target_tag, e.g. <2{lang}>"),
    ({"target_tag": "<2lang>"}, "data.target_tag = '<2lang>' must hold {lang} once"),
    ({"target_tag": "<to {lang}>"}, "data.target_tag = '<to de>' must be one word without spaces"),
    ({"target_tag": "<{lang}>", "sources[1].tag": "<fr>"}, "data.sources[1].tag = '<fr>' is also the target tag of "
                                                           "fr (data.target_tag = '<{lang}>'): choose another"),
    ({"sources[1].tgt_lang": "en"}, "data.sources[1].tgt_lang = 'en' must differ from the corpus' source language"),
    ({"sources[1].src_lang": "e n"}, "data.sources[1].src_lang = 'e n' must be a language code such as en or de"),
    ({"temperature": 5, "sources[1].weight": 2}, "data.sources[1].weight = 2 and data.temperature both set the "
                                                 "corpora's shares"),
    ({"temperature": 0}, "data.temperature = 0.0 must be positive (or null)"),
])
def test_a_recipe_of_several_pairs_is_held_to_its_rules(tmp_path: Path, changes: dict, message: str) -> None:
    raw = _data()
    for key, value in changes.items():
        if key.startswith("sources["):
            index, name = int(key[8]), key.split(".", 1)[1]
            raw["data"]["sources"][index][name] = value
        else:
            raw["data"][key] = value
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError) as refused:
        load_recipe(path)
    assert message in str(refused.value)


def test_temperature_shares_follow_fairseq_s_rule() -> None:
    assert temperature_shares([900, 100], 1.0) == pytest.approx([0.9, 0.1])
    assert temperature_shares([900, 100], 1e9) == pytest.approx([0.5, 0.5])
    t5 = temperature_shares([900, 100], 5.0)  # NLLB's T: 0.9^0.2 : 0.1^0.2
    assert t5 == pytest.approx([0.9**0.2 / (0.9**0.2 + 0.1**0.2), 0.1**0.2 / (0.9**0.2 + 0.1**0.2)])
    assert temperature_shares([10, 0], 5.0) == [1.0, 0.0]


def test_temperature_sampling_repeats_a_small_corpus_and_subsamples_a_large_one(tmp_path: Path) -> None:
    """An epoch at T = 1e9 keeps the corpora's 12 pairs, half from each: the small corpus (3 pairs) repeated
    twice, the large one (9) drawn 6 without repeats; the draw is the seed's, and needs no new data."""
    raw = _data(temperature=1e9)
    raw.update(seed=3, model={"preset": "tiny"}, train={"max_tokens": 4096})
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    recipe = load_recipe(path)
    manifest = {"corpora": [{"splits": {"train": {"pairs": 9}}}, {"splits": {"train": {"pairs": 3}}}]}
    lens = np.full(12, 3)
    split = type("Split", (), {"src_lens": lens, "tgt_lens": lens})()
    said: list[str] = []
    batches = training_batches(recipe, manifest, split, said.append)
    seen = Counter(int(i) for batch in batches for i in batch)
    large = [seen[i] for i in range(9)]
    assert sorted(large) == [0, 0, 0, 1, 1, 1, 1, 1, 1] and [seen[i] for i in (9, 10, 11)] == [2, 2, 2]
    assert said == ["an epoch of training pairs, by corpus at temperature 1e+09: a 9 → 6 (50.0%), a-2 3 → 6 "
                    "(50.0%) = 12"]
    again = training_batches(recipe, manifest, split, said.append)
    assert Counter(int(i) for batch in again for i in batch) == seen


def test_the_report_draws_and_tabulates_each_pair(multilingual: dict) -> None:
    from mtx.report.charts import pair_curves
    from mtx.report.page import validations_section
    from mtx.report.run_folder import read_run

    run = read_run(multilingual["recipe"].run_path)
    curves = pair_curves([run])
    assert [curve.title for curve in curves] == ["Valid BLEU, en-de", "Valid BLEU, en-fr"]
    assert [value for _, _, value in curves[1].points(run)][-1] == pytest.approx(100.0)
    assert "<th>BLEU en-de</th><th>BLEU en-fr</th>" in validations_section([run])


def test_a_recipe_s_decode_target_lang_is_one_of_its_target_languages(tmp_path: Path) -> None:
    raw = {**_data(), "decode": {"target_lang": "es"}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"decode.target_lang = 'es' is not a target language of this model, which "
                                          r"translates into de, fr\."):
        load_recipe(path)
    raw["decode"]["target_lang"] = "fr"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    assert load_recipe(path).decode.target_lang == "fr"


def test_language_identification_refuses_a_language_it_does_not_know_before_any_work(tmp_path: Path) -> None:
    pytest.importorskip("py3langid")
    raw = _data(filter={"language_id": True})
    raw["data"]["sources"][1]["tgt_lang"] = "xx"
    raw["run_dir"] = str(tmp_path / "run")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(MtxError, match=r"^data.sources\[1\].tgt_lang = 'xx' is not one of the \d+ languages py3langid "
                                       r"identifies \(ace, af, .*\), so data.filter.language_id would drop almost "
                                       r"every pair: use its ISO 639-1 code, or turn language_id off\.$"):
        prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    assert not (tmp_path / "run").exists()  # the files a.en, a.de do not exist either: nothing was read


def test_a_hugging_face_export_reads_the_tag_too(multilingual: dict, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from mtx.config.decode import DecodeConfig
    from mtx.decode.target_lang import TargetLanguages
    from mtx.decode.translator import Translator, load_prepared
    from mtx.export.command import export_checkpoint
    from mtx.tokenizer import EOS, PAD

    export_checkpoint(multilingual["checkpoint"], "hf", tmp_path / "hf")
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "hf")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    models, ours_tokenizer, loaded = load_prepared([multilingual["checkpoint"]], "cpu", "fp32")
    held_out = multilingual["held_out"][:8]
    for lang in ANSWERS:
        translator = Translator(models, ours_tokenizer, DecodeConfig(beam=1, max_len_a=0, max_len_b=12,
                                                                     target_lang=lang),
                                targets=TargetLanguages.of_checkpoint(loaded[0]))
        ours = [list(nbest[0].tokens) for nbest in translator.translate(held_out)]
        batch = tokenizer([f"<2{lang}> {s}" for s in held_out], return_tensors="pt", padding=True)
        generated = model.generate(**batch, num_beams=1, max_new_tokens=13)
        assert [[t for t in row[1:] if t not in (EOS, PAD)] for row in generated.tolist()] == ours
