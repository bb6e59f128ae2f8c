"""An imported MarianMT tokenizer (mtx.spm_tokenizer) gives transformers' MarianTokenizer's ids and text, in mtx's
id order, on text built to break tokenizers; it survives a checkpoint; a broken folder is refused by name."""

from __future__ import annotations

import io
import json
import random
import sys
from pathlib import Path

import pytest
from support import marian_tokenizer_folder

from mtx.data.bpe_dropout import BpeDropout
from mtx.decode.facts import encode_prefixes, encode_sentences
from mtx.decode.target_lang import TargetLanguages, language_of
from mtx.errors import MtxError
from mtx.spm_tokenizer import SpmPairTokenizer, marian_order
from mtx.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK, Tokenizer, normalize_text

transformers = pytest.importorskip("transformers")
sentencepiece = pytest.importorskip("sentencepiece")

HOSTILE = [
    "Der große Hund läuft über die Straße.", "Café naïve façade Œuvre", "東京は晴れです。北京欢迎你", "한국어 문장",
    "a 😀 b 👍🏽 🇩🇪", "x\x00y\x07z\x1fq\x7f\x85w", "w" * 5000, "", "a </s> b", "a</s>b", "</s></s>",
    "<unk> x <pad>", "x <pad>>>fra<< y", "  leading, trailing and  multiple   spaces  ", "tab\there\t", "nb\u00a0sp",
    "e\u0301 combining a\u0308", "שלום עולם", "مرحبا بالعالم", ">>fra<< Hello", ">>fra<<Hello", ">>xyz<< unknown code",
    ">> x << y", "<<>>", ">>", "„quotes“ « guillemets » ‚single‘", "a\u2028b\u2029c", "zw\u200bsp", "bom\ufeffx",
    "\x1c\x1d\x1e", "ｆｕｌｌ ｗｉｄｔｈ", "ﬁ ligature", "a\rb\r\n", " ", "\t", "▁ meta▁space", "a\x01b", "<s> is text",
]


def fuzz(count: int, seed: int) -> list[str]:
    """Short strings over an alphabet dense in the characters of special tokens and language codes."""
    rng = random.Random(seed)
    alphabet = [*"abc <>/sunkpdfr é▁\x00\t", "</s>", "<unk>", "<pad>", ">>", "<<", ">>fra<<"]
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12))) for _ in range(count)]


TEXTS = HOSTILE + fuzz(300, seed=0)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return marian_tokenizer_folder(tmp_path_factory.mktemp("marian"), languages=("fra", "deu"))


@pytest.fixture(scope="module")
def marian(folder):
    return transformers.MarianTokenizer.from_pretrained(folder)


@pytest.fixture(scope="module")
def pair(folder) -> SpmPairTokenizer:
    return SpmPairTokenizer.from_marian_folder(folder)


@pytest.mark.parametrize("target", [False, True])
def test_the_ids_are_marian_tokenizers_in_mtx_order(pair, marian, target) -> None:
    """MarianTokenizer(text) (or text_target) is encode's ids mapped to Marian's, then its EOS, which mtx adds."""
    ours = pair.encode_batch(TEXTS, target=target)
    for text, ids in zip(TEXTS, ours, strict=True):
        theirs = (marian(text_target=text) if target else marian(text))["input_ids"]
        assert [pair.marian_ids[i] for i in [*ids, EOS]] == theirs, text[:40]
        assert pair.encode(text, target=target) == ids


def test_the_sides_are_segmented_by_their_own_models(pair) -> None:
    """A German sentence is cut by target.spm into fewer pieces than by the English source.spm."""
    german = "Der Lehrer hat dem Studenten ein großes Buch gegeben."
    assert len(pair.encode(german, target=True)) < len(pair.encode(german))


def test_language_codes_are_tags_and_their_ids(pair, marian) -> None:
    assert pair.tags == [">>fra<<", ">>deu<<"]
    ids = pair.encode(">>fra<< The dog.")
    assert ids[0] == pair.token_strings().index(">>fra<<") and ids[0] in pair.special_tokens
    assert pair.encode(">>xyz<< The dog.")[0] == UNK  # a code the vocabulary lacks, as MarianTokenizer: unk
    assert pair.split_tags(">>deu<<x") == ([pair.token_strings().index(">>deu<<")], "x")
    assert marian.supported_language_codes == pair.tags


def test_decoding_is_marian_tokenizers(pair, marian) -> None:
    """decode is MarianTokenizer.decode(skip_special_tokens=True) with target.spm, on encoded text and on ids
    drawn at random from the whole vocabulary (source pieces target.spm lacks, codes, specials)."""
    rng = random.Random(1)
    batches = [*pair.encode_batch(TEXTS, target=True),
               *([rng.randrange(pair.vocab_size) for _ in range(rng.randint(0, 20))] for _ in range(300))]
    for ids in batches:
        marian_ids = [pair.marian_ids[i] for i in ids if i != PAD]
        assert pair.decode(ids) == marian.decode(marian_ids, skip_special_tokens=True, use_source_tokenizer=False)
        assert pair.decode(ids) == marian.decode(marian_ids, skip_special_tokens=True)  # its default: source.spm
    assert pair.decode_batch(batches[:3]) == [pair.decode(ids) for ids in batches[:3]]


def test_the_moses_punctuation_normaliser_is_not_applied(pair, marian) -> None:
    """MarianTokenizer sets sacremoses' normaliser up but never calls it: were it applied, these ids would be
    those of the normalised text, which differ."""
    sacremoses = pytest.importorskip("sacremoses")
    text = "„Quotes“ « guillemets » – dash…"
    moses = sacremoses.MosesPunctNormalizer("en").normalize(text)
    assert pair.encode(moses) != pair.encode(text)
    assert [pair.marian_ids[i] for i in [*pair.encode(text), EOS]] == marian(text)["input_ids"]


def test_the_raw_line_reaches_sentencepiece(pair, marian) -> None:
    """mtx's normalize_text would change MarianTokenizer's ids (nmt_nfkc keeps U+0000 and U+0085, makes a BOM a
    space), so an imported pair's `normalize` leaves the line as it is."""
    for text in ["x\x00y\x85w", "bom\ufeffx"]:
        assert pair.normalize(text) == text
        assert pair.encode(normalize_text(text)) != pair.encode(text)
        assert [pair.marian_ids[i] for i in [*pair.encode(pair.normalize(text)), EOS]] == marian(text)["input_ids"]


def test_the_vocabulary_keeps_mtx_special_ids(folder, pair) -> None:
    vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
    assert pair.vocab_size == len(vocab) + 1
    assert pair.marian_ids[:4] == [None, vocab["<pad>"], vocab["</s>"], vocab["<unk>"]]
    assert pair.marian_ids[4:] == sorted(set(vocab.values()) - {vocab["<pad>"], vocab["</s>"], vocab["<unk>"]})
    assert marian_order(vocab) == pair.marian_ids
    assert pair.marian_vocab() == vocab and list(pair.marian_vocab()) == list(vocab)  # the same order too
    strings = pair.token_strings()
    assert strings[:4] == SPECIAL_TOKENS and len(strings) == pair.vocab_size
    piece_of = {i: piece for piece, i in vocab.items()}
    assert all(strings[k] == piece_of[pair.marian_ids[k]] for k in range(4, pair.vocab_size))
    assert pair.decode([BOS, *pair.encode("The dog."), EOS, PAD]) == "The dog."


def test_marian_order_on_a_hand_made_vocabulary() -> None:
    vocab = {"</s>": 0, "<unk>": 1, "▁a": 2, "b": 3, "<pad>": 4}
    assert marian_order(vocab) == [None, 4, 0, 1, 2, 3]


def test_a_checkpoints_text_gives_the_same_tokenizer(folder, pair, tmp_path) -> None:
    """to_str → mtx.tokenizer.Tokenizer.from_str (the one dispatch) → the same tokenizer, byte for byte."""
    text = pair.to_str()
    again = Tokenizer.from_str(text)
    assert isinstance(again, SpmPairTokenizer)
    assert again.to_str() == text and again.sha256 == pair.sha256
    assert again.encode_batch(TEXTS) == pair.encode_batch(TEXTS)
    assert again.marian_ids == pair.marian_ids and again.source_spm == (folder / "source.spm").read_bytes()
    assert (again.source_lang, again.target_lang) == ("en", "de")
    pair.save(tmp_path / "tokenizer.json")
    assert Tokenizer.from_file(tmp_path / "tokenizer.json").sha256 == pair.sha256
    assert SpmPairTokenizer.from_marian_folder(folder).sha256 == pair.sha256  # the same folder, the same hash


def test_the_same_arguments_build_the_same_folder(tmp_path, folder) -> None:
    other = marian_tokenizer_folder(tmp_path / "again", languages=("fra", "deu"))
    for name in ("source.spm", "target.spm", "vocab.json"):
        assert (other / name).read_bytes() == (folder / name).read_bytes(), name


def test_words_pieces_and_the_kind_of_model(pair) -> None:
    ids = pair.encode(">>fra<< The big dog.")
    pieces = pair.pieces(ids)
    assert pieces[0] == "" and "".join(pieces).strip() == "The big dog."
    owners = pair.word_of_each_token(ids)
    assert owners[0] is None and max(o for o in owners if o is not None) == 2
    assert pair.words("The  dog") == ["▁The", "▁dog"]
    assert (pair.style, pair.model, pair.word_mark) == ("metaspace", "unigram", "▁")


def test_a_bpe_sentencepiece_model_is_read_as_bpe(folder, tmp_path) -> None:
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(sentence_iterator=iter(["the dog sees the cat"] * 50),
                                             model_writer=model, vocab_size=20, model_type="bpe", minloglevel=2)
    copy = tmp_path / "bpe"
    copy.mkdir()
    for name in ("target.spm", "vocab.json", "tokenizer_config.json"):
        (copy / name).write_bytes((folder / name).read_bytes())
    (copy / "source.spm").write_bytes(model.getvalue())
    assert SpmPairTokenizer.from_marian_folder(copy).model == "bpe"


def broken_copy(folder: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    return copy


@pytest.mark.parametrize("name", ["source.spm", "target.spm", "vocab.json"])
def test_a_missing_file_is_named(folder, tmp_path, name) -> None:
    copy = broken_copy(folder, tmp_path)
    (copy / name).unlink()
    with pytest.raises(MtxError, match=f"has no {name}"):
        SpmPairTokenizer.from_marian_folder(copy)


@pytest.mark.parametrize("name, content", [("source.spm", b"not a model"), ("target.spm", b""),
                                           ("vocab.json", b"{\"</s>\": 0,"), ("vocab.json", b'{"</s>": 0, "x": 5}'),
                                           ("tokenizer_config.json", b"[")])
def test_a_damaged_file_is_named(folder, tmp_path, name, content) -> None:
    copy = broken_copy(folder, tmp_path)
    (copy / name).write_bytes(content)
    with pytest.raises(MtxError, match=name.replace(".", r"\.")):
        SpmPairTokenizer.from_marian_folder(copy)


@pytest.mark.parametrize("key, value", [("separate_vocabs", True), ("eos_token", "<eos>"),
                                        ("additional_special_tokens", ["<eop>"]), ("sp_model_kwargs", {"alpha": 0.1}),
                                        ("split_special_tokens", True)])
def test_a_configuration_read_otherwise_is_refused_by_its_key(folder, tmp_path, key, value) -> None:
    copy = broken_copy(folder, tmp_path)
    config = json.loads((copy / "tokenizer_config.json").read_text(encoding="utf-8"))
    (copy / "tokenizer_config.json").write_text(json.dumps({**config, key: value}), encoding="utf-8")
    with pytest.raises(MtxError, match=key):
        SpmPairTokenizer.from_marian_folder(copy)


def test_without_sentencepiece_the_extra_is_named(pair, monkeypatch) -> None:
    text = pair.to_str()
    monkeypatch.setitem(sys.modules, "sentencepiece", None)  # what an installation without it imports
    with pytest.raises(MtxError, match=r"pip install 'mtx\[marian\]'"):
        Tokenizer.from_str(text)


def test_mtx_own_tokenizer_has_the_same_interface() -> None:
    tokenizer = Tokenizer.train(["the dog sees the cat", "der Hund sieht die Katze"] * 20, vocab_size=300)
    assert tokenizer.token_strings()[:4] == SPECIAL_TOKENS and len(tokenizer.token_strings()) == tokenizer.vocab_size
    assert tokenizer.encode("der Hund", target=True) == tokenizer.encode("der Hund")
    assert tokenizer.encode_batch(["the cat"], target=True) == tokenizer.encode_batch(["the cat"])
    assert tokenizer.normalize(" a\tb\x00 ") == "a b"


def test_target_lang_puts_the_models_code_first(pair) -> None:
    """An imported multilingual model's stored recipe spells its tags >>{lang}<<; it translates into every
    language whose code its vocabulary holds, and --target-lang fra puts >>fra<< first, as a user of
    MarianTokenizer writes it."""
    recipe = {"name": "imported", "data": {"source": {"demo": {"pairs": 10}}, "src_lang": "en", "tgt_lang": "fra",
                                           "target_tag": ">>{lang}<<"}}
    targets = TargetLanguages.of_checkpoint({"recipe": recipe}, pair)
    assert targets.languages == ["fra", "deu"] and targets.tags["deu"] == ">>deu<<"
    fra = pair.token_strings().index(">>fra<<")
    hello, own, empty = encode_sentences(pair, ["The dog.", ">>deu<< The dog.", " \t"], targets, "fra")
    assert hello == [fra, *pair.encode("The dog.")] and own == pair.encode(">>deu<< The dog.") and empty is None
    assert language_of(">>{lang}<<", ">>fra<<") == "fra" and language_of("<2{lang}>", ">>fra<<") is None


def test_prefixes_and_given_translations_are_target_text(pair) -> None:
    german = "Der Hund schläft."
    assert encode_prefixes(pair, [german], [0], [100], [0]) == [pair.encode(german, target=True)]


def test_bpe_dropout_refuses_an_imported_pair_by_its_key(pair) -> None:
    with pytest.raises(MtxError, match=r"train.bpe_dropout = 0.1 .* imported MarianMT"):
        BpeDropout(pair, 0.1, seed=1)
