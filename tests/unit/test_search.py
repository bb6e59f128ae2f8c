"""Greedy and beam search against scripted models with hand-computed probabilities, and on a real Transformer."""

from __future__ import annotations

import math
import random

import pytest
import torch
from support import SCRIPTED_VOCAB, ScriptedModel, scripted_decode, scripted_sources

from mtx.config.recipe import ModelConfig, resolve_model
from mtx.decode.ensemble import Ensemble
from mtx.decode.search import (
    Constraints,
    LengthPenalty,
    Sampling,
    beam_search,
    greedy_search,
    most_endings,
    row_topk,
    search,
    top_candidates,
)
from mtx.model.transformer import Transformer
from mtx.tokenizer import EOS, PAD

A, B, C = 3, 4, 5  # three ordinary tokens after PAD, BOS, EOS, UNK

# The next-token distribution after each prefix (BOS left out). Beam 2 with α = 0, worked by hand:
#   step 0: a .6, b .4                                  → open: a, b
#   step 1: b·EOS .36, aa .27, a·EOS .18, ab .15, ba .04 → b ends (first two), open: aa, ab
#           with nbest 1 the search stops here: log .27 < log .36 and an open beam's probability only falls
#   step 2: aa·EOS .135, ab·EOS .12, aac .081, ...      → both end: three ended ≥ beam, done
# Greedy: a (.6), a (.45), EOS (.5) → "a a" with probability .135.
TABLE: dict[tuple[int, ...], dict[int, float]] = {
    (): {A: 0.6, B: 0.4},
    (A,): {A: 0.45, B: 0.25, EOS: 0.3},
    (B,): {EOS: 0.9, A: 0.1},
    (A, A): {EOS: 0.5, C: 0.3, B: 0.2},
    (A, B): {EOS: 0.8, C: 0.2},
}


def table_model() -> ScriptedModel:
    return ScriptedModel(lambda sentence, prefix: TABLE.get(prefix, {EOS: 1.0}))


def random_model(vocab_tokens: int = SCRIPTED_VOCAB - 3) -> ScriptedModel:
    """A fixed but arbitrary distribution for every (sentence, prefix), EOS included, via a seeded RNG."""

    def distribution(sentence: int, prefix: tuple[int, ...]) -> dict[int, float]:
        rng = random.Random(f"{sentence}:{prefix}")
        tokens = [EOS, *range(A, A + vocab_tokens - 1)]
        weights = [math.exp(3 * rng.gauss(0, 1)) for _ in tokens]
        return {t: w / sum(weights) for t, w in zip(tokens, weights, strict=True)}

    return ScriptedModel(distribution)


def as_pairs(nbest) -> list[tuple[list[int], float]]:
    return [(h.tokens, h.score) for h in nbest]


def test_length_penalty_formulas() -> None:
    lengths = torch.tensor([1, 7, 25])
    torch.testing.assert_close(LengthPenalty(0.6, "gnmt")(lengths), ((5 + lengths) / 6) ** 0.6)
    torch.testing.assert_close(LengthPenalty(0.6, "fairseq")(lengths), lengths**0.6)
    assert LengthPenalty(0.0, "gnmt")(3) == LengthPenalty(0.0, "fairseq")(3) == 1.0


def test_hand_computed_nbest() -> None:
    [nbest] = scripted_decode(table_model(), beam=2, penalty=LengthPenalty(0.0), nbest=2)
    assert [h.tokens for h in nbest] == [[B], [A, A]]
    assert [h.score for h in nbest] == pytest.approx([math.log(0.36), math.log(0.135)])


def test_hand_computed_scores_with_length_penalty() -> None:
    """α = 1: log P / ((5 + |Y|) / 6), EOS counted in |Y|; fairseq style: log P / |Y|."""
    [gnmt] = scripted_decode(table_model(), beam=2, penalty=LengthPenalty(1.0, "gnmt"), nbest=2)
    assert as_pairs(gnmt) == [([B], pytest.approx(math.log(0.36) / (7 / 6))),
                              ([A, A], pytest.approx(math.log(0.135) / (8 / 6)))]
    [fairseq] = scripted_decode(table_model(), beam=2, penalty=LengthPenalty(1.0, "fairseq"), nbest=2)
    assert as_pairs(fairseq) == [([B], pytest.approx(math.log(0.36) / 2)),
                                 ([A, A], pytest.approx(math.log(0.135) / 3))]


def test_early_stop_when_no_open_beam_can_win() -> None:
    """With nbest 1, "b" (.36) beats every open beam (aa .27, ab .15) after two steps: no third step."""
    model = table_model()
    [nbest] = scripted_decode(model, beam=2, penalty=LengthPenalty(0.0))
    assert as_pairs(nbest) == [([B], pytest.approx(math.log(0.36)))]
    assert model.steps == 2


@pytest.mark.parametrize("lenpen", [0.0, 0.6, 2.0])
@pytest.mark.parametrize("style", ["gnmt", "fairseq"])
def test_early_stop_never_changes_the_best(lenpen: float, style: str) -> None:
    """nbest = beam never stops before `beam` hypotheses end; its best must equal the early-stopped best."""
    options = dict(beam=4, penalty=LengthPenalty(lenpen, style))
    early = scripted_decode(random_model(), n=30, max_len=12, **options)
    full = scripted_decode(random_model(), n=30, max_len=12, nbest=4, **options)
    assert [as_pairs(n) for n in early] == [as_pairs(n[:1]) for n in full]


@pytest.mark.parametrize("style", ["gnmt", "fairseq"])
def test_every_ending_rescored_is_the_search_with_any_penalty(style: str) -> None:
    """One search that keeps every hypothesis that ends gives, rescored, the translation of a search with each α
    (mtx.decode.lenpen_choice relies on it); an n-best list of `beam` would not hold them all."""
    every = scripted_decode(random_model(), n=40, max_len=10, beam=4, penalty=LengthPenalty(1.0, style),
                            nbest=most_endings(4))
    assert max(len(nbest) for nbest in every) > 4
    for alpha in (0.0, 0.3, 0.6, 1.0, 1.5, 2.5):
        penalty = LengthPenalty(alpha, style)
        direct = scripted_decode(random_model(), n=40, max_len=10, beam=4, penalty=penalty)
        rescored = [max(nbest, key=lambda h: sum(h.token_log_probs) / penalty(len(h.tokens) + 1.0)) for nbest in every]
        assert [h.tokens for h in rescored] == [nbest[0].tokens for nbest in direct], alpha
    with pytest.raises(ValueError, match="2 · beam - 1"):
        scripted_decode(random_model(), beam=4, penalty=LengthPenalty(1.0, style), nbest=most_endings(4) + 1)


def test_nbest_sorted_and_distinct() -> None:
    for nbest in scripted_decode(random_model(), n=20, beam=5, penalty=LengthPenalty(0.6), nbest=5):
        scores = [h.score for h in nbest]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in nbest}) == len(nbest)


def test_max_len_forces_eos() -> None:
    """At max_len 1 both open beams must end: a·EOS (.6 · .3) and b·EOS (.4 · .9)."""
    [nbest] = scripted_decode(table_model(), max_len=1, beam=2, penalty=LengthPenalty(0.0), nbest=2)
    assert as_pairs(nbest) == [([B], pytest.approx(math.log(0.36))), ([A], pytest.approx(math.log(0.18)))]
    for n in scripted_decode(random_model(), n=10, max_len=3, beam=3, penalty=LengthPenalty(0.6), nbest=3):
        assert all(len(h.tokens) <= 3 for h in n)


def test_min_len_forbids_early_eos() -> None:
    """EOS is forbidden for the first two tokens, so "b" cannot end; "a a" (.135) wins over "a b" (.12)."""
    [nbest] = scripted_decode(table_model(), beam=2, penalty=LengthPenalty(0.0), min_len=2, nbest=2)
    assert as_pairs(nbest) == [([A, A], pytest.approx(math.log(0.135))), ([A, B], pytest.approx(math.log(0.12)))]
    for n in scripted_decode(random_model(), n=10, beam=3, penalty=LengthPenalty(0.6), min_len=4):
        assert len(n[0].tokens) >= 4


def test_max_len_wins_over_min_len() -> None:
    [nbest] = scripted_decode(table_model(), max_len=1, beam=2, penalty=LengthPenalty(0.0), min_len=3)
    assert as_pairs(nbest) == [([B], pytest.approx(math.log(0.36)))]
    src, src_pad = scripted_sources(1)
    constraints = Constraints(torch.tensor([1]), min_len=3)
    [[hypothesis]] = greedy_search(table_model(), src, src_pad, constraints, LengthPenalty())
    assert hypothesis.tokens == [A]


def test_token_log_probs_are_each_tokens_own_hand_computed() -> None:
    """[B] is P(B) = 0.4 then P(EOS | B) = 0.9; [A, A] is 0.6, 0.45, then 0.5 for EOS (the table above)."""
    [nbest] = scripted_decode(table_model(), beam=2, penalty=LengthPenalty(0.0), nbest=2)
    assert nbest[0].token_log_probs == pytest.approx([math.log(0.4), math.log(0.9)])
    assert nbest[1].token_log_probs == pytest.approx([math.log(0.6), math.log(0.45), math.log(0.5)])
    src, src_pad = scripted_sources(1)
    [[greedy]] = greedy_search(table_model(), src, src_pad, Constraints(torch.tensor([10])), LengthPenalty())
    assert greedy.token_log_probs == pytest.approx([math.log(0.6), math.log(0.45), math.log(0.5)])


@pytest.mark.parametrize(("beam", "nbest"), [(1, 1), (4, 4)])
@pytest.mark.parametrize("style", ["gnmt", "fairseq"])
def test_token_log_probs_sum_to_the_score_times_the_length_penalty(beam: int, nbest: int, style: str) -> None:
    """Every hypothesis of every sentence, on hypotheses that end at many different steps: one log-probability
    per token and one for EOS, each that of the model's distribution at that step, summing to log P(Y|X)."""
    src, src_pad = scripted_sources(12)
    max_len = torch.randint(1, 12, (12,), generator=torch.Generator().manual_seed(0))
    model = random_model()
    for sentence, hypotheses in enumerate(search(model, src, src_pad, Constraints(max_len),
                                                 LengthPenalty(0.6, style), beam=beam, nbest=nbest)):
        for h in hypotheses:
            assert len(h.token_log_probs) == len(h.tokens) + 1
            expected = [math.log(model.distribution(sentence + 10, tuple(h.tokens[:i]))[token])
                        for i, token in enumerate([*h.tokens, EOS])]
            assert h.token_log_probs == pytest.approx(expected, abs=1e-5)
            lp = LengthPenalty(0.6, style)(len(h.tokens) + 1.0)
            assert sum(h.token_log_probs) / lp == pytest.approx(h.score, abs=1e-5)


def test_greedy_hand_computed() -> None:
    src, src_pad = scripted_sources(1)
    [[hypothesis]] = greedy_search(table_model(), src, src_pad, Constraints(torch.tensor([10])), LengthPenalty())
    assert hypothesis.tokens == [A, A]
    assert hypothesis.score == pytest.approx(math.log(0.135))


@pytest.mark.parametrize("lenpen", [0.0, 0.6])
def test_beam_one_is_greedy(lenpen: float) -> None:
    src, src_pad = scripted_sources(25)
    max_len = torch.randint(1, 12, (25,), generator=torch.Generator().manual_seed(0))
    greedy = greedy_search(random_model(), src, src_pad, Constraints(max_len, min_len=1), LengthPenalty(lenpen))
    beam = beam_search(random_model(), src, src_pad, Constraints(max_len, min_len=1), LengthPenalty(lenpen), beam=1)
    assert [as_pairs(n) for n in beam] == [as_pairs(n) for n in greedy]


# ------------------------------------------------------------------------------ on a real (random) Transformer


def transformer() -> Transformer:
    """Random weights, with EOS made likelier so that hypotheses end at many different steps."""
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=32, heads=4, d_ff=64, max_positions=64))
    model = Transformer(cfg, 40).eval()
    with torch.no_grad():
        model.tgt_embed.weight[EOS] *= 3
    return model


def random_sources(lengths: list[int]) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return [torch.cat([torch.randint(4, 40, (n,), generator=g), torch.tensor([EOS])]) for n in lengths]


def padded(rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)
    return src, src == PAD


@pytest.mark.parametrize(("beam", "nbest"), [(1, 1), (4, 1), (4, 4)])
def test_batch_invariance(beam: int, nbest: int) -> None:
    """One batch of eight sentences of mixed length decodes exactly as eight batches of one."""
    model, rows = transformer(), random_sources([3, 9, 1, 6, 12, 4, 4, 7])
    max_len = torch.tensor([len(r) + 5 for r in rows])
    options = dict(penalty=LengthPenalty(0.6), beam=beam, nbest=nbest)
    together = search(model, *padded(rows), Constraints(max_len), **options)
    alone = [search(model, *padded([r]), Constraints(max_len[i : i + 1]), **options)[0] for i, r in enumerate(rows)]
    assert [[h.tokens for h in n] for n in together] == [[h.tokens for h in n] for n in alone]
    for n, m in zip(together, alone, strict=True):
        assert [h.score for h in n] == pytest.approx([h.score for h in m], abs=1e-4)


def test_beam_one_is_greedy_on_a_transformer() -> None:
    model, rows = transformer(), random_sources([5, 2, 8, 3])
    max_len = torch.tensor([6, 9, 4, 7])
    greedy = greedy_search(model, *padded(rows), Constraints(max_len), LengthPenalty(0.6))
    beam = beam_search(model, *padded(rows), Constraints(max_len), LengthPenalty(0.6), beam=1)
    assert [[h.tokens for h in n] for n in beam] == [[h.tokens for h in n] for n in greedy]
    assert [n[0].score for n in beam] == pytest.approx([n[0].score for n in greedy], abs=1e-5)


@pytest.mark.parametrize(("beam", "vocab"), [(1, 9), (4, 50), (5, 7)])
def test_top_candidates_equal_the_best_of_all_extensions(beam: int, vocab: int) -> None:
    """Per-beam preselection changes the work, not the answer: the 2K best of all K · V extensions, including
    the first step's beams that may not extend yet (score -inf) and vocabularies smaller than 2K."""
    g = torch.Generator().manual_seed(beam)
    sentences = 6
    beam_scores = -torch.rand(sentences, beam, generator=g) * 5
    beam_scores[:2, 1:] = -torch.inf
    log_probs = torch.log_softmax(torch.randn(sentences * beam, vocab, generator=g), dim=-1)
    scores, parent, token = top_candidates(beam_scores, log_probs, beam)
    every = (beam_scores.unsqueeze(2) + log_probs.view(sentences, beam, vocab)).view(sentences, -1)
    expected, flat = every.topk(min(2 * beam, beam * vocab), dim=1)
    torch.testing.assert_close(scores, expected)
    finite = expected.isfinite()
    assert torch.equal(parent[finite], (flat // vocab)[finite]) and torch.equal(token[finite], (flat % vocab)[finite])


@pytest.mark.parametrize(("columns", "k"), [(8000, 8), (8003, 8), (37_000, 10), (600, 8), (70, 3)])
def test_row_topk_equals_topk(columns: int, k: int) -> None:
    """Top-k by blocks gives topk's values, and columns holding them, including rows with few finite values,
    ties, a last partial block, and rows too short for blocks."""
    g = torch.Generator().manual_seed(columns)
    values = torch.log_softmax(torch.randn(40, columns, generator=g) * 3, dim=-1)
    values[:, :3] = -torch.inf  # what `constrain` forbids
    values[1, 5:] = -torch.inf  # a row with two finite values (the length cap leaves one)
    values[2, -2:] = 1.0  # the best two in the last, partial block
    values[3] = values[3].round()  # many ties
    top, column = row_topk(values, k)
    expected = values.topk(k, dim=1).values
    assert torch.equal(top, expected)
    assert torch.equal(values.gather(1, column), top)
    assert all(len(set(row)) == k for row in column.tolist())  # k distinct columns


@pytest.mark.parametrize("beam", [1, 2, 3])
def test_search_passes_every_option_to_the_search_it_chooses(beam: int, monkeypatch) -> None:
    """`search` is what translate and validation call: beam 1 is greedy search, with the same options; wider
    beams are beam search. Its defaults are those of the two searches: no minimum length, the best only."""
    import mtx.decode.search

    src, src_pad = scripted_sources(6)
    max_len = torch.full((6,), 8)
    options = dict(constraints=Constraints(max_len, min_len=3), penalty=LengthPenalty(1.3, "fairseq"))
    expected = (greedy_search(random_model(), src, src_pad, **options) if beam == 1 else
                beam_search(random_model(), src, src_pad, beam=beam, nbest=beam, **options))
    got = search(random_model(), src, src_pad, beam=beam, nbest=beam, **options)
    assert [as_pairs(n) for n in got] == [as_pairs(n) for n in expected]
    assert all(len(h.tokens) >= 3 for n in got for h in n)

    called: list[str] = []
    module = mtx.decode.search
    monkeypatch.setattr(module, "greedy_search", lambda *a, **k: called.append("greedy") or greedy_search(*a, **k))
    monkeypatch.setattr(module, "beam_search", lambda *a, **k: called.append("beam") or beam_search(*a, **k))
    ends_at_once = ScriptedModel(lambda sentence, prefix: {EOS: 0.9, A: 0.1} if not prefix else {EOS: 1.0})
    [defaults] = search(ends_at_once, *scripted_sources(1), Constraints(torch.tensor([10])), LengthPenalty(0.0),
                        beam=beam)
    assert called == ["greedy" if beam == 1 else "beam"]
    assert [h.tokens for h in defaults] == [[]]  # the empty translation is allowed, and only the best comes back


# A search never runs out of candidates (the module docstring's rule). The model below says only "a" or EOS:
# with no repeated unigram and at least two tokens, after "a" every token is forbidden but EOS, which a length
# floor forbids too. EOS stays allowed: "a" then EOS, at the model's own probabilities, by every search.
ONLY_A = ScriptedModel(lambda sentence, prefix: {A: 0.9, EOS: 0.1})
SEARCHES = {
    "greedy": dict(beam=1),
    "beam": dict(beam=4, nbest=4),
    "sampling": dict(beam=1, nbest=3, sampling=Sampling(seed=1, lines=torch.arange(3))),
}


@pytest.mark.parametrize("options", SEARCHES.values(), ids=SEARCHES.keys())
@pytest.mark.parametrize("members", [1, 2], ids=["model", "ensemble"])
def test_when_constraints_forbid_every_token_the_length_floor_gives_way_to_eos(options: dict, members: int) -> None:
    model = ONLY_A if members == 1 else Ensemble([ONLY_A] * members)
    src, src_pad = scripted_sources(3)
    constraints = Constraints(torch.full((3,), 10), min_len=2, no_repeat_ngram=1)
    found = search(model, src, src_pad, constraints, LengthPenalty(0.0), **options)
    assert len(found) == 3
    for nbest in found:
        assert nbest and all(h.tokens == [A] for h in nbest)
        assert all(h.token_log_probs == pytest.approx([math.log(0.9), math.log(0.1)]) for h in nbest)


@pytest.mark.parametrize("options", SEARCHES.values(), ids=SEARCHES.keys())
def test_a_prefix_that_repeats_itself_is_kept_under_no_repeated_ngrams(options: dict) -> None:
    """The n-gram ban never reaches the prefix's tokens: "a a" is the user's, then the ban holds ("a b" once)."""
    model = ScriptedModel(lambda sentence, prefix: {A: 0.5, B: 0.4, EOS: 0.1})
    src, src_pad = scripted_sources(3)
    constraints = Constraints(torch.full((3,), 10), no_repeat_ngram=1, prefix=torch.tensor([[A, A]] * 3))
    for nbest in search(model, src, src_pad, constraints, LengthPenalty(0.0), **options):
        assert nbest and all(h.tokens[:2] == [A, A] and h.tokens[2:] in ([], [B]) for h in nbest)
        assert all(math.isfinite(h.score) for h in nbest)
