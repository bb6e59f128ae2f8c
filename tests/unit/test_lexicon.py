"""The lexical table (mtx.data.lexicon): IBM Model 1 finds a planted dictionary that co-occurrence alone ranks
below a word of every sentence, the table reads the same from memory as from the split, a sample is evenly spread
and learnt from as those pairs alone would be, and the table survives the data folder and the checkpoint."""

from __future__ import annotations

import random

import numpy as np
import torch
from support import MemorySplit

from mtx.data.lexicon import FILE, Lexicon, evenly_spread, learn_lexicon
from mtx.data.prepared import TokenSplit
from mtx.tokenizer import PAD

WORDS = 40  # source words 10..49 translate into target words 60..99 (four times in five), the planted dictionary
FULL_STOP = 100  # a target token in every sentence, which translates no source word
VOCAB = 101


def planted_pairs(count: int, seed: int = 0) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(seed)
    pairs = []
    for _ in range(count):
        source = rng.sample(range(10, 10 + WORDS), rng.randint(2, 6))
        target = [word + 50 for word in source if rng.random() < 0.8]  # a fifth of the words left untranslated
        rng.shuffle(target)
        pairs.append((source, [*target, FULL_STOP]))
    return pairs


def test_em_finds_the_planted_dictionary_that_co_occurrence_ranks_below_the_full_stop() -> None:
    split = MemorySplit(planted_pairs(600))
    learnt = learn_lexicon(split, VOCAB, width=3, iterations=5)
    assert [int(learnt.translations[word, 0]) for word in range(10, 10 + WORDS)] == list(range(60, 60 + WORDS))
    counted = learn_lexicon(split, VOCAB, width=3, iterations=0)
    assert all(int(counted.translations[word, 0]) == FULL_STOP for word in range(10, 10 + WORDS))
    assert int(learnt.frequent[0]) == FULL_STOP and len(learnt.frequent) == WORDS + 1  # only the tokens seen
    assert (learnt.translations[0] == PAD).all()  # NULL's row, and that of every token never seen, stay empty
    assert (learnt.translations[5] == PAD).all()


def test_the_passes_from_memory_learn_what_the_passes_over_the_split_learn() -> None:
    split, seen = MemorySplit(planted_pairs(5000, seed=1)), []
    kept = learn_lexicon(split, VOCAB, width=5, iterations=3, advance=seen.append)
    streamed = learn_lexicon(split, VOCAB, width=5, iterations=3, cache_bytes=0)
    np.testing.assert_array_equal(kept.translations, streamed.translations)
    assert sum(seen) == (3 + 2) * len(split)  # every pass told of, the ones from memory too


def test_a_sample_is_evenly_spread_over_the_split_and_the_same_every_time() -> None:
    for total, count in [(10, 10), (10, 3), (1_000_003, 7), (36_000_000, 500_000)]:
        chosen = evenly_spread(total, count)
        assert len(chosen) == count and chosen[0] == 0 and chosen[-1] < total
        gaps = np.diff(chosen)
        assert gaps.min() >= total // count and gaps.max() <= -(-total // count)  # one every total / count
        np.testing.assert_array_equal(evenly_spread(total, count), chosen)
    np.testing.assert_array_equal(evenly_spread(10, 3), [0, 3, 6])


def test_a_table_learnt_on_a_sample_is_the_table_of_the_pairs_sampled() -> None:
    pairs = planted_pairs(3000, seed=2)
    sampled = learn_lexicon(MemorySplit(pairs), VOCAB, width=5, iterations=3, pairs=700)
    alone = learn_lexicon(MemorySplit([pairs[i] for i in evenly_spread(3000, 700)]), VOCAB, width=5, iterations=3)
    np.testing.assert_array_equal(sampled.translations, alone.translations)
    np.testing.assert_array_equal(sampled.frequent, alone.frequent)
    assert (sampled.pairs, alone.pairs) == (700, 700)
    whole = learn_lexicon(MemorySplit(pairs), VOCAB, width=5, iterations=3)
    assert learn_lexicon(MemorySplit(pairs), VOCAB, width=5, iterations=3, pairs=3000).pairs == whole.pairs == 3000
    assert not np.array_equal(sampled.translations, whole.translations)  # the sample is no copy of the whole


def test_a_prepared_split_reads_the_rows_of_a_sample_as_its_sentences(tmp_path) -> None:
    sentences = {"src": [[5, 6, 7], [], [8], [9, 10, 11, 12], [13, 14]], "tgt": [[1], [2, 3], [], [4, 4], [7]]}
    for side, rows in sentences.items():
        np.array([t for row in rows for t in row], dtype="uint16").tofile(tmp_path / f"train.{side}.tokens")
        np.cumsum([0, *map(len, rows)]).astype(np.int64).tofile(tmp_path / f"train.{side}.offsets")
    split = TokenSplit(tmp_path, "train", "uint16")
    for side, rows in sentences.items():
        tokens, offsets = split.rows(side, np.array([0, 1, 3, 4]))
        read = [tokens[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
        assert read == [rows[i] for i in (0, 1, 3, 4)]
        assert tokens.dtype == offsets.dtype == np.int64


def test_the_table_survives_the_data_folder_and_the_checkpoint(tmp_path) -> None:
    learnt = learn_lexicon(MemorySplit(planted_pairs(200)), VOCAB, width=4, iterations=2)
    assert Lexicon.load(tmp_path) is None
    learnt.save(tmp_path)
    assert (tmp_path / FILE).is_file()
    loaded = Lexicon.load(tmp_path)
    torch.save({"lexicon": learnt.to_checkpoint()}, tmp_path / "c.pt")
    carried = Lexicon.of_checkpoint(torch.load(tmp_path / "c.pt", weights_only=True))
    for table in (loaded, carried):
        np.testing.assert_array_equal(table.translations, learnt.translations)
        np.testing.assert_array_equal(table.frequent, learnt.frequent)
        assert (table.iterations, table.width, table.pairs) == (2, 4, 200)
    assert Lexicon.of_checkpoint({}) is None
