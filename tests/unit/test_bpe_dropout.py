"""BPE-dropout: BPE's own segmentation at rate 0, other segmentations of the same text above it, reproducible from
(seed, epoch, pair, side), bounded by the model's positions, and a training run that resumes exactly with it."""

from __future__ import annotations

import io
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console
from support import Pairs, base_recipe, recipe, write_recipe

from mtx.checkpoint import load_checkpoint
from mtx.config.loading import load_recipe
from mtx.data.bpe_dropout import BpeDropout, DroppedOutSplit, growth
from mtx.data.prepare import prepare
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer
from mtx.train.trainer import train

WORDS = ["Donaudampfschifffahrt", "Straßenbahn", "unbelievable", "naïveté", "Übermütigkeit", "the", "and", "of",
         "Hausaufgaben", "reconsideration", "café", "12,5", "%", "«so»", "Köln:", "(e\u0301)"]
CORPUS = [" ".join(random.Random(i).choices(WORDS, k=random.Random(-i).randint(3, 12))) for i in range(400)]
TEXTS = [*CORPUS[:60], "龍 🐉 unseen x▁y <0x41>", "a", ""]


@pytest.fixture(scope="module", params=["bytelevel", "metaspace"])
def tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return Tokenizer.train(CORPUS, vocab_size=600, tags=["<bt>"], style=request.param)


def test_rate_zero_is_the_tokenizers_own_segmentation(tokenizer: Tokenizer) -> None:
    """Unseen characters (bytes), a tag, an empty sentence: at rate 0 every sentence comes back as stored."""
    none = BpeDropout(tokenizer, 0.0, seed=1)
    for i, text in enumerate([*TEXTS, "<bt> " + TEXTS[0]]):
        ids = tokenizer.encode(text)
        assert none.sentence(ids, epoch=1, pair=i, side="src").tolist() == ids


def test_dropout_segments_the_same_text_otherwise_and_reproducibly(tokenizer: Tokenizer) -> None:
    dropout = BpeDropout(tokenizer, 0.1, seed=1)
    stored = [tokenizer.encode(text) for text in TEXTS]
    epoch_1 = [dropout.sentence(ids, 1, i, "src") for i, ids in enumerate(stored)]
    assert [tokenizer.decode(ids) for ids in epoch_1] == [tokenizer.decode(ids) for ids in stored]  # the same text
    assert all(len(new) >= len(old) for new, old in zip(epoch_1, stored, strict=True))  # only merges are dropped
    assert sum(map(len, epoch_1)) > 1.05 * sum(map(len, stored))
    assert all(0 <= i < tokenizer.vocab_size for ids in epoch_1 for i in ids)

    again = BpeDropout(tokenizer, 0.1, seed=1)  # another process, or a resumed run: the same segmentations
    assert all(np.array_equal(again.sentence(ids, 1, i, "src"), epoch_1[i]) for i, ids in enumerate(stored))
    for other in [(2, "src", 1), (1, "tgt", 1), (1, "src", 2)]:  # another epoch, side or seed: others
        epoch, side, seed = other
        changed = BpeDropout(tokenizer, 0.1, seed=seed)
        assert any(not np.array_equal(changed.sentence(ids, epoch, i, side), epoch_1[i])
                   for i, ids in enumerate(stored)), other


def test_a_higher_rate_drops_more(tokenizer: Tokenizer) -> None:
    stored = [tokenizer.encode(text) for text in CORPUS[:100]]
    lengths = [sum(len(BpeDropout(tokenizer, rate, seed=3).sentence(ids, 1, i, "tgt")) for i, ids in enumerate(stored))
               for rate in (0.0, 0.1, 0.3, 0.6)]
    assert lengths == sorted(lengths) and len(set(lengths)) == 4


def test_a_tag_stays_one_token(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("<bt> " + CORPUS[5])
    dropped = BpeDropout(tokenizer, 0.5, seed=1).sentence(ids, 1, 0, "src")
    assert tokenizer.special_tokens[ids[0]] == "<bt>" and dropped[0] == ids[0]
    assert len(dropped) > len(ids) and tokenizer.decode(dropped) == tokenizer.decode(ids)


def test_unigram_is_refused_naming_the_key() -> None:
    unigram = Tokenizer.train(CORPUS, vocab_size=600, style="metaspace", model="unigram")
    with pytest.raises(MtxError, match="train.bpe_dropout = 0.1 needs a BPE vocabulary"):
        BpeDropout(unigram, 0.1, seed=1)


def test_a_sentence_dropout_would_make_too_long_keeps_its_stored_segmentation(tokenizer: Tokenizer) -> None:
    long, short = tokenizer.encode(" ".join(CORPUS[:3])), tokenizer.encode("the café")
    split = Pairs([long], [short])
    dropout = BpeDropout(tokenizer, 0.6, seed=1)
    assert len(dropout.sentence(long, 1, 0, "src")) > len(long) + 1
    epoch = DroppedOutSplit(split, dropout, epoch=1, max_positions=len(long) + 1)
    assert epoch.src(0).tolist() == long  # dropout would pass the positions: the stored segmentation
    assert len(epoch.tgt(0)) >= len(short) and tokenizer.decode(epoch.tgt(0)) == "the café"
    assert growth(split, dropout) > 1


@pytest.mark.parametrize("style", ["bytelevel", "metaspace"])
def test_training_with_bpe_dropout_resumes_exactly(tmp_path: Path, style: str, capfd) -> None:
    """12 updates straight = 5, a stop mid-epoch, 7 more: the same weights; the batches' tokens differ from a run
    without dropout, which they would not if the segmentation were not applied."""
    torch.set_num_threads(1)
    settings = dict(bpe_dropout=0.2, log_every=2, save_every=5, max_steps=12)
    runs = {}
    for name in ("straight", "resumed", "plain"):
        raw = base_recipe(tmp_path / name, train_pairs=300, valid_pairs=20)
        raw["data"]["bpe"]["style"] = style
        runs[name] = write_recipe(tmp_path / name, raw)
        prepare(load_recipe(runs[name]), workers=1, console=Console(file=io.StringIO()))
    assert train(recipe(runs["straight"], **settings)).step == 12
    assert "BPE-dropout 0.2: training sentences are segmented anew each epoch" in capfd.readouterr().err
    assert train(recipe(runs["resumed"], **{**settings, "max_steps": 5})).step == 5
    assert train(recipe(runs["resumed"], **settings)).step == 12
    assert train(recipe(runs["plain"], **{**settings, "bpe_dropout": 0.0})).step == 12

    def weights(path: Path) -> dict[str, torch.Tensor]:
        return load_checkpoint(load_recipe(path).run_path / "checkpoints" / "last.pt")["model"]

    straight, resumed, plain = (weights(runs[name]) for name in ("straight", "resumed", "plain"))
    for name, tensor in straight.items():
        torch.testing.assert_close(resumed[name], tensor, atol=1e-6, rtol=0, msg=name)
    assert any(not torch.equal(plain[name], tensor) for name, tensor in straight.items())


def test_worker_processes_segment_as_the_collation_thread_does(tmp_path: Path, capfd) -> None:
    """train.bpe_dropout_workers: the same segmentations from worker processes, so the same weights."""
    torch.set_num_threads(1)
    raw = base_recipe(tmp_path, train_pairs=300, valid_pairs=20)
    raw["data"]["bpe"]["style"] = "metaspace"
    path = write_recipe(tmp_path, raw)
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    shutil.copytree(tmp_path / "run" / "data", tmp_path / "run-2" / "data")
    weights = []
    for workers, run in ((0, "run"), (2, "run-2")):
        state = train(recipe(path, f"run_dir={tmp_path / run}", bpe_dropout=0.2, max_steps=6,
                             bpe_dropout_workers=workers))
        assert state.step == 6
        assert (f"segmented anew each epoch by {workers} worker processes" in capfd.readouterr().err) == (workers > 0)
        weights.append(load_checkpoint(tmp_path / run / "checkpoints" / "last.pt")["model"])
    for name, tensor in weights[0].items():
        assert torch.equal(weights[1][name], tensor), name
