"""The joint vocabulary in each style: fixed special ids, normalization, and lossless encode → decode for any
normalized text."""

from __future__ import annotations

import json
import random
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import pre_tokenizers

from mtx.tokenizer import (
    BOS,
    EOS,
    PAD,
    UNK,
    Tokenizer,
    _metaspace_words,
    byte_level_spelling,
    normalize_text,
    smallest_vocab_size,
)

CORPUS = [
    "Der Mann sieht den Hund im Park.",
    "The man sees the dog in the park.",
    "Die Frau gibt dem Kind am dritten Mai dreihunderteinundzwanzig Äpfel.",
    "The woman gives the child three hundred twenty-one apples on the third of May.",
    "Hallo, Welt! Wie geht es dir? 12,5 % mehr als 2024.",
]


STYLES = [("bytelevel", "bpe"), ("metaspace", "bpe"), ("metaspace", "unigram")]


@pytest.fixture(scope="module", params=STYLES, ids=["-".join(style) for style in STYLES])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    style, model = request.param
    return Tokenizer.train(CORPUS * 20, vocab_size=400, min_frequency=2, style=style, model=model)


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
    if tokenizer.style == "bytelevel":
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
        assert other.vocab_size == tokenizer.vocab_size <= 400  # unigram keeps fewer pieces of a tiny corpus
        assert (other.style, other.model) == (tokenizer.style, tokenizer.model)
        assert other.encode(CORPUS[2]) == tokenizer.encode(CORPUS[2])
        assert other.sha256 == tokenizer.sha256
        assert other.encode("a </s>") == tokenizer.encode("a </s>")


@pytest.mark.parametrize("text", ["<0x41> <0xE9>", "<s> </s> <pad> <unk>", "▁", "▁▁ a▁b ▁", "x\u2581"])
def test_text_spelling_a_reserved_token_stays_text(tokenizer: Tokenizer, text: str) -> None:
    """What spells a byte token, a special token or the metaspace mark in the text is plain text: a unigram
    model matches pieces against the text, and the byte fallback decoder turns "<0x41>" into "A"."""
    ids = tokenizer.encode(text)
    assert not set(ids) & set(tokenizer.special_tokens)
    assert tokenizer.decode(ids) == text


def test_metaspace_layout_and_byte_fallback() -> None:
    """Byte tokens follow the specials and tags, in byte order; a character the vocabulary lacks is its bytes;
    a character it holds is one symbol, where a byte-level vocabulary's symbols are bytes."""
    french = ["Le café est très épicé à Besançon.", "Où est la fenêtre ? Déjà vu, naïveté."] * 30
    for model in ("bpe", "unigram"):
        tokenizer = Tokenizer.train(french, vocab_size=330, tags=["<bt>"], style="metaspace", model=model)
        assert [tokenizer._hf.id_to_token(i) for i in (4, 5, 5 + 0xE9, 260)] == ["<bt>", "<0x00>", "<0xE9>", "<0xFF>"]
        assert tokenizer.encode("龍") == [tokenizer._hf.token_to_id(t) for t in ("▁", "<0xE9>", "<0xBE>", "<0x8D>")]
        assert tokenizer._hf.token_to_id("é") is not None
    assert "Ã©" in Tokenizer.train(french, vocab_size=330, style="bytelevel")._hf.get_vocab()  # é, byte-level


def test_merges_that_spell_a_reserved_token_are_dropped() -> None:
    """A corpus full of "<0x41>" and "</s>" would teach BPE merges that spell them; those merges are dropped,
    with the merges built on them, so no learnt token decodes as a byte or vanishes as a special."""
    lines = ["<0x41> </s> <bt> x"] * 50
    tokenizer = Tokenizer.train(lines, vocab_size=300, tags=["<bt>"], style="metaspace")
    vocab = tokenizer._hf.get_vocab()
    assert len([t for t in vocab if t in ("<0x41>", "</s>", "<bt>")]) == 3  # the byte token, the special, the tag
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    assert all("".join(merge) not in ("<0x41>", "</s>", "<bt>") for merge in merges)
    assert tokenizer.decode(tokenizer.encode(lines[0])) == lines[0]


def test_a_tag_that_merges_would_spell_keeps_the_text_it_spells() -> None:
    """A tag "og" in a corpus of dogs and hogs: a byte-level merge o + g spelt the tag, took its id, and "hog"
    decoded as "h". Such merges are dropped in every style, and a tag that is one of the vocabulary's own pieces
    (`why_not_a_tag`) is refused."""
    lines = ["dogs dogged hogs logs", "the dog and the hog"] * 30
    for style, model in STYLES:
        tokenizer = Tokenizer.train(lines, vocab_size=400, min_frequency=1, tags=["og"], style=style, model=model)
        assert all(tokenizer.decode(tokenizer.encode(line)) == line for line in [*lines, "a hog", "dog og"])
    for tag in ("<0x41>", "▁", "e", "</s>"):
        with pytest.raises(ValueError, match=f"The tag {re.escape(repr(tag))} "):
            Tokenizer.train(lines, vocab_size=400, tags=[tag])


def test_metaspace_words_are_those_of_the_pre_tokenizer() -> None:
    """The unigram vocabulary is learnt on words counted in Python (`_metaspace_words`); they must be the words
    Hugging Face's metaspace pre-tokenizer cuts, or the pieces would be learnt on other text."""
    lines = ["Der Mann sieht.", "", " ", "a  b", " leading", "trailing ", "  two", "x▁y ▁", "tab\tand\u00a0nbsp"]
    metaspace = Tokenizer.train(CORPUS * 20, vocab_size=400, style="metaspace", model="unigram")
    for line in lines:
        assert _metaspace_words([line]) == Counter(metaspace.words(line)), line
    assert _metaspace_words(lines) == sum((Counter(metaspace.words(line)) for line in lines), Counter())


@pytest.mark.parametrize("model", ["bpe", "unigram"])
def test_the_smallest_metaspace_vocabulary_learns_text_of_many_characters(model: str) -> None:
    """At vocab_size 300, the least `mtx config` accepts, a metaspace vocabulary has room for 39 pieces beside
    its 256 byte tokens, 4 special tokens and a tag, and the text below holds over 400 distinct characters.
    Hugging Face's unigram trainer failed on it ("The vocabulary is not large enough to contain all chars"); now
    only the most frequent characters are pieces, the others spelled by their bytes, and every sentence
    round-trips. With 26 tags, `smallest_vocab_size` (what a recipe's data.bpe.vocab_size must reach) is enough."""
    rng = random.Random(7)
    rare = [chr(0x4E00 + i) for i in range(300)] + [chr(c) for c in range(0xC0, 0x180)]
    words = ["das", "Haus", "ist", "rot", "und", "the", "house", "red"]
    lines = [" ".join(rng.choice(words) + "".join(rng.choices(rare, k=rng.randint(0, 2))) for _ in range(8))
             for _ in range(400)]
    assert len(set("".join(lines))) > 400
    tokenizer = Tokenizer.train(lines, vocab_size=300, tags=["<bt>"], style="metaspace", model=model)
    assert tokenizer.vocab_size <= 300
    assert tokenizer._hf.token_to_id("a") is not None  # a frequent character is a piece of its own
    probe = [*lines, "".join(rare), "<bt> das Haus", "▁ <0x41> </s>"]
    assert [tokenizer.decode(tokenizer.encode(line)) for line in probe] == [*lines, "".join(rare), "das Haus",
                                                                           "▁ <0x41> </s>"]
    tags = [f"<t{letter}{i}>" for i, letter in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZ")]
    smallest = smallest_vocab_size("metaspace", model, tags)
    tagged = Tokenizer.train(lines, vocab_size=smallest, tags=tags, style="metaspace", model=model)
    assert tagged.vocab_size <= smallest and tagged.tags == tags
    assert all(tagged.decode(tagged.encode(line)) == line for line in lines)


def test_learns_subwords_for_frequent_words(tokenizer: Tokenizer) -> None:
    text = "The man sees the dog in the park."
    assert len(tokenizer.encode(text)) < (12 if tokenizer.model == "bpe" else len(text) - 5)


# ---- which word of the decoded text each token belongs to (word alignments, mtx.decode.alignment)

# Words the vocabulary cuts into several subwords, punctuation attached to words, non-ASCII letters,
# an emoji and CJK characters (spelled as bytes: no merge covers them), and a combining accent.
SENTENCES = [
    "Donaudampfschifffahrt, Parkhaus! Hundefutter?",
    "Grüße aus Köln: «Straße», Maß und Fuß.",
    "🙂 漢字テスト (e\u0301) — 12,5% mehr.",
]


def words_by_token(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """Each word of the decoded text rebuilt from the pieces of the tokens mapped to it, normalised."""
    pieces, owners = tokenizer.pieces(ids), tokenizer.word_of_each_token(ids)
    count = 1 + max((w for w in owners if w is not None), default=-1)
    return [normalize_text("".join(p for p, o in zip(pieces, owners, strict=True) if o == w)) for w in range(count)]


def test_byte_level_spelling_is_the_pre_tokenizers_alphabet() -> None:
    spelling = byte_level_spelling()
    assert set(spelling) == set(pre_tokenizers.ByteLevel.alphabet())
    assert sorted(spelling.values()) == list(range(256))
    assert spelling["Ġ"] == ord(" ") and spelling["a"] == ord("a")


@pytest.mark.parametrize("sentence", SENTENCES)
def test_tokens_map_to_the_words_of_the_sentence(tokenizer: Tokenizer, sentence: str) -> None:
    """Words cut into several subwords, punctuation attached to a word, non-ASCII text: the tokens of each
    word, and only they, spell it."""
    text = normalize_text(sentence)
    ids = tokenizer.encode(text)
    assert len(ids) > len(text.split())  # some words are cut into several tokens
    assert "".join(tokenizer.pieces(ids)) == f" {text}"
    assert words_by_token(tokenizer, ids) == text.split()
    assert tokenizer.word_of_each_token([*ids, EOS])[-1] is None


def test_any_token_sequence_maps_to_the_words_of_its_decoded_text(tokenizer: Tokenizer) -> None:
    """Whatever a model emits (byte tokens that split a character, that never complete one, a lone space,
    control bytes, special tokens), the pieces rebuild `decode`, and the words rebuilt from the tokens mapped
    to them are the words of the normalised output line."""
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(tokenizer.vocab_size) for _ in range(rng.randint(0, 12))]
        decoded = tokenizer.decode(ids)
        joined = "".join(tokenizer.pieces(ids))
        assert (joined[1:] if joined.startswith(" ") else joined) == decoded
        assert words_by_token(tokenizer, ids) == normalize_text(decoded).split()
