"""The joint BPE: fixed special ids, normalization, and lossless encode → decode for any text."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mtx.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, normalize_text

CORPUS = [
    "Der Mann sieht den Hund im Park.",
    "The man sees the dog in the park.",
    "Die Frau gibt dem Kind am dritten Mai dreihunderteinundzwanzig Äpfel.",
    "The woman gives the child three hundred twenty-one apples on the third of May.",
    "Hallo, Welt! Wie geht es dir? 12,5 % mehr als 2024.",
]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.train(CORPUS * 20, vocab_size=400, min_frequency=2)


def test_special_tokens_have_fixed_ids(tokenizer: Tokenizer) -> None:
    assert (PAD, BOS, EOS, UNK) == (0, 1, 2, 3)
    assert [tokenizer._hf.id_to_token(i) for i in range(4)] == ["<pad>", "<s>", "</s>", "<unk>"]


def test_normalize_text() -> None:
    assert normalize_text("  Hallo\tWelt \n") == "Hallo Welt"
    assert normalize_text("Cafe\u0301") == "Café"  # NFC: composed é
    assert normalize_text("a\x00b\x1bc\x7fd") == "abcd"  # control characters go
    assert normalize_text("\ufeffHallo\u2028Welt\u00a0!") == "Hallo Welt !"  # BOM goes, odd spaces collapse


@given(st.text())
def test_normalize_is_idempotent(text: str) -> None:
    once = normalize_text(text)
    assert normalize_text(once) == once
    assert "\n" not in once and "  " not in once


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",))))
def test_round_trip_is_lossless(tokenizer: Tokenizer, text: str) -> None:
    normalized = normalize_text(text)
    assert tokenizer.decode(tokenizer.encode(normalized)) == normalized
    assert tokenizer.decode(tokenizer.encode(text)) == text  # byte-level: even unnormalized text survives


@pytest.mark.parametrize("text", [
    "Hallo , Welt", "Hallo, Welt", "Hallo ,Welt", "3.14159 und 2,718 — 1 000 000", "日本語のテキスト 😀👍🏽",
    "Ünïcödé ñ ß ẞ ø œ", "«Anführungszeichen» „so“ ‚und so‘", "", "x", "a▁b", "tab\there",
])
def test_round_trip_examples(tokenizer: Tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_spacing_around_punctuation_is_kept_apart(tokenizer: Tokenizer) -> None:
    assert tokenizer.encode("Hallo , Welt") != tokenizer.encode("Hallo, Welt")


def test_unseen_characters_are_bytes_not_unk(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("龍 🐉")
    assert UNK not in ids and all(i >= 4 for i in ids)


def test_special_token_text_is_plain_text(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("a </s> b <pad>")
    assert not {PAD, BOS, EOS, UNK} & set(ids)
    assert tokenizer.decode(ids) == "a </s> b <pad>"


def test_decode_skips_specials_and_batches_agree(tokenizer: Tokenizer) -> None:
    texts = ["Der Mann sieht den Hund.", "The dog sleeps.", ""]
    batch = tokenizer.encode_batch(texts)
    assert batch == [tokenizer.encode(t) for t in texts]
    framed = [[BOS, *ids, EOS, PAD, PAD] for ids in batch]
    assert tokenizer.decode_batch(framed) == texts
    assert tokenizer.decode(framed[0]) == texts[0]


def test_serialization_round_trip(tokenizer: Tokenizer, tmp_path) -> None:
    copy = Tokenizer.from_str(tokenizer.to_str())
    tokenizer.save(tmp_path / "tokenizer.json")
    loaded = Tokenizer.from_file(tmp_path / "tokenizer.json")
    for other in (copy, loaded):
        assert other.vocab_size == tokenizer.vocab_size == 400
        assert other.encode(CORPUS[2]) == tokenizer.encode(CORPUS[2])
        assert other.sha256 == tokenizer.sha256
        assert other.encode("a </s>") == tokenizer.encode("a </s>")


def test_learns_merges_for_frequent_words(tokenizer: Tokenizer) -> None:
    assert len(tokenizer.encode("The man sees the dog in the park.")) < 12
