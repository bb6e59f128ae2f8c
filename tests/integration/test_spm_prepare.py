"""`mtx prepare` with `data.bpe.from` naming an imported MarianMT tokenizer: sources are segmented by its source
model, targets by its target model, its language codes are the target tags, and the vocabulary is kept as is."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import yaml
from rich.console import Console
from support import marian_tokenizer_folder

from mtx.config.loading import load_recipe
from mtx.data.prepare import prepare
from mtx.data.prepared import load_split
from mtx.errors import MtxError
from mtx.spm_tokenizer import SpmPairTokenizer
from mtx.tokenizer import Tokenizer

pytest.importorskip("sentencepiece")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def imported(tmp_path_factory) -> tuple[SpmPairTokenizer, Path]:
    """An imported multilingual pair, stored as a checkpoint's tokenizer text is (tokenizer.json)."""
    tmp_path = tmp_path_factory.mktemp("imported")
    pair = SpmPairTokenizer.from_marian_folder(marian_tokenizer_folder(tmp_path / "marian", languages=("deu",)))
    pair.save(tmp_path / "tokenizer.json")
    return pair, tmp_path / "tokenizer.json"


def _recipe(tmp_path: Path, tokenizer: Path, tgt_lang: str) -> Path:
    recipe = {"name": "t", "run_dir": str(tmp_path / "run"), "model": {"preset": "tiny"},
              "data": {"source": {"demo": {"pairs": 60, "valid": 8, "test": 0, "seed": 5}}, "src_lang": "en",
                       "tgt_lang": tgt_lang, "target_tag": ">>{lang}<<", "bpe": {"from": str(tokenizer)}}}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True), encoding="utf-8")
    return path


def test_each_side_is_segmented_by_its_own_model(imported, tmp_path: Path) -> None:
    pair, tokenizer = imported
    manifest = prepare(load_recipe(_recipe(tmp_path, tokenizer, "deu")), workers=1, console=Console(file=io.StringIO()))
    data = tmp_path / "run" / "data"
    assert manifest["tokenizer_sha256"] == pair.sha256 == Tokenizer.from_file(data / "tokenizer.json").sha256
    valid = load_split(data, "valid")
    sources = (data / "valid.en").read_text(encoding="utf-8").splitlines()
    targets = (data / "valid.deu").read_text(encoding="utf-8").splitlines()
    assert len(valid) == len(sources) == 8 and all(line.startswith(">>deu<< ") for line in sources)
    for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
        assert valid.src(i).tolist() == pair.encode(source)
        assert valid.tgt(i).tolist() == pair.encode(target, target=True) != pair.encode(target)
    code = pair.token_strings().index(">>deu<<")
    train = load_split(data, "train")
    assert len(train) > 0 and all(int(train.src(i)[0]) == code for i in range(len(train)))


def test_a_language_the_imported_vocabulary_has_no_code_for_is_refused(imported, tmp_path: Path) -> None:
    _, tokenizer = imported
    with pytest.raises(MtxError, match=r"^data.target_tag = '>>\{lang\}<<' spells '>>ita<<' for ita"):
        prepare(load_recipe(_recipe(tmp_path, tokenizer, "ita")), workers=1, console=Console(file=io.StringIO()))
    assert not (tmp_path / "run").exists()
