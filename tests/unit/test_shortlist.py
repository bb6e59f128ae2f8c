"""Vocabulary shortlists (mtx.decode.shortlist): each sentence searched over its own set, the same whatever it is
batched with or however many threads decode it; every token searched, sampled or forced is in its sentence's set;
and a set of every token is the whole vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from support import TINY_VOCAB, tiny_model

from mtx.config.model import ModelConfig, resolve_model
from mtx.data.lexicon import Lexicon
from mtx.decode.forced import forced_scores
from mtx.decode.search import Constraints, LengthPenalty, Sampling, search
from mtx.decode.shortlist import Shortlist, ShortlistDecoder, union_projection
from mtx.decode.translator import prepare_model
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD


def model():
    """A random tiny model, EOS made likelier so that hypotheses end at many different steps."""
    m = tiny_model(seed=3)
    with torch.no_grad():
        m.tgt_embed.weight[EOS] *= 3
    return m


def random_lexicon(width: int = 6) -> Lexicon:
    rng = np.random.default_rng(0)
    translations = rng.integers(4, TINY_VOCAB, size=(TINY_VOCAB, width)).astype(np.int32)
    return Lexicon(translations, np.arange(TINY_VOCAB - 1, 3, -1, dtype=np.int32), iterations=5)


SOURCES = [[5, 9, 11, EOS], [30, EOS], [7, 7, 8, 21, 40, 12, 6, EOS], [44, 13, 9, EOS], [18, 19, 20, 21, 22, EOS]]


def batch(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.nn.utils.rnn.pad_sequence([torch.tensor(r) for r in rows], batch_first=True, padding_value=PAD)
    return src, src == PAD


def decode(m, rows: list[list[int]], shortlist: Shortlist | None, prefix: list[list[int]] | None = None, **options):
    decoder = m if shortlist is None else ShortlistDecoder(m, m, shortlist.candidates(rows, prefix))
    limits = torch.tensor([len(r) + 4 for r in rows])
    forced = None if prefix is None else torch.nn.utils.rnn.pad_sequence(
        [torch.tensor(p, dtype=torch.long) for p in prefix], batch_first=True, padding_value=PAD)
    return search(decoder, *batch(rows), Constraints(limits, prefix=forced), LengthPenalty(0.6), **options)


def test_the_candidates_are_the_frequent_tokens_the_translations_of_the_source_eos_and_the_forced_tokens() -> None:
    lexicon = random_lexicon()
    shortlist = Shortlist(lexicon, translations=2, frequent=3)
    [own] = shortlist.candidates([[5, 9, EOS]], [[BOS, 4]])
    expected = {*lexicon.frequent[:3].tolist(), *lexicon.translations[[5, 9, EOS], :2].ravel().tolist(), 4}
    assert own.tolist() == sorted(expected | {PAD, BOS, EOS})


def test_a_shortlist_of_every_token_searches_as_the_whole_vocabulary() -> None:
    every = Lexicon(np.tile(np.arange(TINY_VOCAB, dtype=np.int32), (TINY_VOCAB, 1)), np.zeros(0, np.int32), 0)
    m = model()
    whole = decode(m, SOURCES, None, beam=4, nbest=2)
    listed = decode(m, SOURCES, Shortlist(every, TINY_VOCAB, 0), beam=4, nbest=2)
    assert [[h.tokens for h in n] for n in listed] == [[h.tokens for h in n] for n in whole]
    for a, b in zip(listed, whole, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_an_int8_model_projects_onto_its_own_int8_rows_of_the_shortlist() -> None:
    m = prepare_model(model(), torch.device("cpu"), "int8")
    union = torch.tensor([0, 1, 2, 7, 30, 31, TINY_VOCAB - 1])
    hidden = torch.randn(5, m.cfg.d_model)
    assert torch.equal(union_projection(m, union)(hidden), m.output_logits(hidden)[:, union])
    every = Lexicon(np.tile(np.arange(TINY_VOCAB, dtype=np.int32), (TINY_VOCAB, 1)), np.zeros(0, np.int32), 0)
    whole = decode(m, SOURCES, None, beam=4)
    listed = decode(m, SOURCES, Shortlist(every, TINY_VOCAB, 0), beam=4)
    assert [[h.tokens for h in n] for n in listed] == [[h.tokens for h in n] for n in whole]


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
def test_a_model_with_an_output_bias_projects_onto_its_bias_entries_of_the_shortlist(dtype: str) -> None:
    """model.output_bias (an imported Marian model's final_logits_bias): each token's logit keeps its own bias."""
    torch.manual_seed(3)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=32, heads=4, d_ff=64, max_positions=64, output_bias=True))
    m = Transformer(cfg, TINY_VOCAB).eval()
    with torch.no_grad():
        m.output_bias.normal_(std=3.0)
    m = prepare_model(m, torch.device("cpu"), dtype)
    union = torch.tensor([0, 1, 2, 7, 30, 31, TINY_VOCAB - 1])
    hidden = torch.randn(5, m.cfg.d_model)
    with torch.no_grad():
        torch.testing.assert_close(union_projection(m, union)(hidden), m.output_logits(hidden)[:, union])
    every = Lexicon(np.tile(np.arange(TINY_VOCAB, dtype=np.int32), (TINY_VOCAB, 1)), np.zeros(0, np.int32), 0)
    whole = decode(m, SOURCES, None, beam=4)
    listed = decode(m, SOURCES, Shortlist(every, TINY_VOCAB, 0), beam=4)
    assert [[h.tokens for h in n] for n in listed] == [[h.tokens for h in n] for n in whole]


@pytest.mark.parametrize("dtype", ["fp32", "int8"])
@pytest.mark.parametrize("beam", [1, 4])
def test_a_sentence_decodes_the_same_whatever_it_is_batched_with_and_on_any_threads(beam: int, dtype: str) -> None:
    """In int8 too: its inputs are quantised row by row (mtx.model.int8), so no row's rounding depends on another's."""
    m = prepare_model(model(), torch.device("cpu"), dtype)
    shortlist = Shortlist(random_lexicon(), translations=4, frequent=5)
    threads = torch.get_num_threads()
    try:
        together = decode(m, SOURCES, shortlist, beam=beam)
        torch.set_num_threads(1)
        alone = [decode(m, [row], shortlist, beam=beam)[0] for row in SOURCES]
    finally:
        torch.set_num_threads(threads)
    assert [[h.tokens for h in n] for n in together] == [[h.tokens for h in n] for n in alone]
    for a, b in zip(together, alone, strict=True):
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)


def test_every_token_searched_or_sampled_is_in_its_sentences_shortlist() -> None:
    m, shortlist = model(), Shortlist(random_lexicon(), translations=3, frequent=2)
    allowed = [set(own.tolist()) for own in shortlist.candidates(SOURCES)]
    searched = decode(m, SOURCES, shortlist, beam=4, nbest=4)
    sampled = decode(m, SOURCES, shortlist, beam=1, nbest=5,
                     sampling=Sampling(seed=1, lines=torch.arange(len(SOURCES)), temperature=2.0))
    for nbests in (searched, sampled):
        for own, nbest in zip(allowed, nbests, strict=True):
            assert all(set(h.tokens) <= own for h in nbest)
    assert len({tuple(h.tokens) for nbest in sampled for h in nbest}) > len(SOURCES)  # the draws differ


def test_a_forced_token_joins_its_sentences_shortlist_and_scores_as_the_search_scored_it() -> None:
    m, shortlist = model(), Shortlist(random_lexicon(), translations=2, frequent=0)
    outside = next(t for t in range(4, TINY_VOCAB) if t not in shortlist.candidates(SOURCES[:1])[0])
    [[prefixed]] = decode(m, SOURCES[:1], shortlist, prefix=[[outside]], beam=4)
    assert prefixed.tokens[0] == outside
    found = decode(m, SOURCES, shortlist, beam=4)
    targets = [n[0].tokens for n in found]
    decoder = ShortlistDecoder(m, m, shortlist.candidates(SOURCES, targets))
    scored = forced_scores(decoder, *batch(SOURCES), targets, LengthPenalty(0.6))
    assert [h.score for h in scored] == pytest.approx([n[0].score for n in found], abs=1e-5)
