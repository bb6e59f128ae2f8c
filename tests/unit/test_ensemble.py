"""Ensemble decoding (mtx.decode.ensemble): the averaging rule on scripted distributions, ensembles of real models
searched step by step, and `mtx translate` with several -m on two copy-task models trained with different seeds."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from support import SCRIPTED_VOCAB, ScriptedModel, prepared, recipe, scripted_decode, translate_cli

import mtx.decode.torch_engine
from mtx.checkpoint import make_checkpoint, save_checkpoint
from mtx.config.recipe import DecodeConfig, ModelConfig, resolve_model
from mtx.decode.alignment import align_rows
from mtx.decode.ensemble import Ensemble, average_distributions, load_models
from mtx.decode.search import Constraints, Hypothesis, LengthPenalty, beam_search, search
from mtx.errors import MtxError
from mtx.model.int8 import Int8Linear
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD, Tokenizer
from mtx.train.trainer import train

A, B, C = 3, 4, 5  # ordinary tokens of the scripted models (test_search's)
DECODE = DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=5)  # the copy-task recipe's, with a beam


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> dict:
    """Two copy-task checkpoints trained on the same prepared data with seeds 1 and 2, and a file of sources."""
    folder = tmp_path_factory.mktemp("ensemble")
    path = prepared(folder)
    checkpoints = []
    for seed in (1, 2):
        train(recipe(path, f"seed={seed}", max_steps=150), restart=True)
        checkpoints.append(shutil.copy(folder / "run" / "checkpoints" / "last.pt", folder / f"seed{seed}.pt"))
    sources = (folder / "text" / "valid.src").read_text(encoding="utf-8").splitlines()
    (folder / "sources.txt").write_text("".join(f"{line}\n" for line in sources), encoding="utf-8")
    models, tokenizer, _ = load_models(checkpoints)
    return dict(checkpoints=[Path(p) for p in checkpoints], models=models, tokenizer=tokenizer, sources=sources,
                input=folder / "sources.txt")


def random_transformer(seed: int, vocab_size: int, **shape: object) -> Transformer:
    torch.manual_seed(seed)
    cfg = resolve_model(ModelConfig(preset="tiny", **{"d_model": 32, "heads": 4, "d_ff": 64, "layers_enc": 1,
                                                      "layers_dec": 1, "dropout": 0.0, "max_positions": 64, **shape}))
    return Transformer(cfg, vocab_size).eval()


# ------------------------------------------------------------------------------------------ the rule


def test_the_average_is_of_probabilities_and_a_distribution() -> None:
    """The mean of the members' probabilities, not of their log-probabilities: a distribution (it sums to
    one), never above 0 even where a member is certain, and a member of one is returned as it is."""
    first = torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]).log()
    second = torch.tensor([[0.9, 0.0, 0.1], [1.0, 0.0, 0.0]]).log()
    averaged = average_distributions([first, second])
    torch.testing.assert_close(averaged.exp(), torch.tensor([[0.7, 0.25, 0.05], [1.0, 0.0, 0.0]]))
    assert bool((averaged <= 0).all())
    assert average_distributions([first]) is first
    same = average_distributions([second, second])
    torch.testing.assert_close(same, second)


def scripted(table: dict[tuple[int, ...], dict[int, float]]) -> ScriptedModel:
    return ScriptedModel(lambda sentence, prefix: table.get(prefix, {EOS: 1.0}))


def test_a_confident_member_is_not_vetoed_by_one_that_doubts() -> None:
    """A is likely to one member and all but ruled out by the other. The mixture keeps it first (.45 against
    .3 and .25); the mean of their log-probabilities (a product of experts) would rank B first."""
    first = scripted({(): {A: 0.9, B: 0.1}})
    second = scripted({(): {A: 0.0001, B: 0.5, C: 0.4999}})
    [[best, *_]] = scripted_decode(Ensemble([first, second]), beam=3, nbest=3, penalty=LengthPenalty(0.0))
    assert best.tokens == [A]
    assert best.token_log_probs[0] == pytest.approx(math.log(0.45005), abs=1e-6)


def mixture_of(*distributions):
    def mixed(sentence: int, prefix: tuple[int, ...]) -> dict[int, float]:
        each = [d(sentence, prefix) for d in distributions]
        return {t: sum(d.get(t, 0.0) for d in each) / len(each) for t in set().union(*each)}

    return mixed


def seeded_distribution(salt: str):
    """A fixed but arbitrary distribution for every (sentence, prefix), as test_search's random model, salted
    so that two of them differ."""

    def distribution(sentence: int, prefix: tuple[int, ...]) -> dict[int, float]:
        rng = random.Random(f"{salt}:{sentence}:{prefix}")
        tokens = [EOS, *range(A, SCRIPTED_VOCAB)]
        weights = [math.exp(2 * rng.gauss(0, 1)) for _ in tokens]
        return {t: w / sum(weights) for t, w in zip(tokens, weights, strict=True)}

    return distribution


def test_beam_search_over_an_ensemble_is_beam_search_over_the_mixture() -> None:
    """The ensemble of two scripted models searches as one scripted model whose distributions are their
    mixture: the same n-best lists, scores and per-token log-probabilities, for several sentences at once."""
    first, second = seeded_distribution("first"), seeded_distribution("second")
    options = dict(n=3, max_len=6, beam=3, nbest=3, penalty=LengthPenalty(0.6))
    together = scripted_decode(Ensemble([ScriptedModel(first), ScriptedModel(second)]), **options)
    mixed = scripted_decode(ScriptedModel(mixture_of(first, second)), **options)
    alone = scripted_decode(ScriptedModel(first), **options)
    assert [[h.tokens for h in nbest] for nbest in together] != [[h.tokens for h in nbest] for nbest in alone]
    for ours, theirs in zip(together, mixed, strict=True):
        assert [h.tokens for h in ours] == [h.tokens for h in theirs]
        for h, g in zip(ours, theirs, strict=True):
            assert h.score == pytest.approx(g.score, abs=1e-5)
            assert h.token_log_probs == pytest.approx(g.token_log_probs, abs=1e-5)


# --------------------------------------------------------------------------------- models, in the library


def batch(tokenizer: Tokenizer, sentences: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = [torch.tensor([*ids, EOS]) for ids in tokenizer.encode_batch(sentences)]
    src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)
    return src, src == PAD, torch.tensor([len(row) + 4 for row in rows])


def test_an_ensemble_of_one_model_or_of_a_model_with_itself_is_that_model(pair: dict) -> None:
    """The same tokens and scores: exactly for one member, up to rounding for a model with itself (the mean of
    two equal distributions is that distribution)."""
    model, sentences = pair["models"][0], pair["sources"]
    src, src_pad, max_len = batch(pair["tokenizer"], sentences)
    constraints, penalty = Constraints(max_len), LengthPenalty(0.6)
    alone = search(model, src, src_pad, constraints, penalty, beam=4, nbest=2)
    assert search(Ensemble([model]), src, src_pad, constraints, penalty, beam=4, nbest=2) == alone
    doubled = search(Ensemble([model, model]), src, src_pad, constraints, penalty, beam=4, nbest=2)
    assert [[h.tokens for h in n] for n in doubled] == [[h.tokens for h in n] for n in alone]
    assert [h.score for n in doubled for h in n] == pytest.approx([h.score for n in alone for h in n], abs=1e-5)


def teacher_forced_log_probs(model: Transformer, src: torch.Tensor, hypothesis: Hypothesis) -> torch.Tensor:
    """log P(each token of the hypothesis, then EOS | its prefix) under `model`, without the cache."""
    target = torch.tensor([[*hypothesis.tokens, EOS]])
    tgt_in = torch.tensor([[BOS, *hypothesis.tokens]])
    with torch.no_grad():
        log_probs = F.log_softmax(model.output_logits(model(src, src == PAD, tgt_in)).float(), dim=-1)
    return log_probs[0].gather(1, target[0].unsqueeze(1)).squeeze(1)


def test_models_of_different_shapes_are_averaged_step_by_step() -> None:
    """Members of different widths and depths, each with its own cache, reordered together by beam search:
    every token's log-probability in the n-best list is the mixture of what each model, teacher-forced on
    the hypothesis without any cache, gives it."""
    small = random_transformer(1, 40)
    large = random_transformer(2, 40, d_model=48, layers_enc=2, layers_dec=2, norm="pre")
    src = torch.tensor([[7, 9, 11, 13, EOS]])
    [nbest] = beam_search(Ensemble([small, large]), src, src == PAD, Constraints(torch.tensor([8])),
                          LengthPenalty(0.6), beam=4, nbest=4)
    assert len(nbest) == 4
    for hypothesis in nbest:
        expected = average_distributions([teacher_forced_log_probs(m, src, hypothesis) for m in (small, large)])
        torch.testing.assert_close(torch.tensor(hypothesis.token_log_probs), expected, atol=1e-5, rtol=1e-5)


def test_the_memory_check_counts_every_model(pair: dict, monkeypatch) -> None:
    """With memory for one model's cache but not for two, the model alone translates and the ensemble is
    refused before it starts."""
    sentence = " ".join(pair["sources"][:4])
    alone = mtx.decode.translator.Translator(pair["models"][0], pair["tokenizer"], DECODE)
    both = mtx.decode.translator.Translator(pair["models"], pair["tokenizer"], DECODE)
    source = len(pair["tokenizer"].encode(sentence)) + 1
    limit = alone.output_limit(source - 1)
    one, two = alone._batch_bytes(1, source, limit), both._batch_bytes(1, source, limit)
    assert two > one
    monkeypatch.setattr(mtx.decode.translator, "available_memory", lambda device: (one + two) // 2)
    assert alone.translate([sentence])[0]
    with pytest.raises(MtxError, match="Beam 4 needs about"):
        both.translate([sentence])


def test_an_ensemble_aligns_with_its_first_model(pair: dict) -> None:
    """--alignment with an ensemble: the hypotheses the ensemble chose, aligned by the first model's
    cross-attention."""
    first, tokenizer, sentences = pair["models"][0], pair["tokenizer"], pair["sources"][:5]
    translator = mtx.decode.translator.Translator(pair["models"], tokenizer, DECODE, alignment_layer=0)
    results = translator.translate(sentences)
    for sentence, nbest in zip(sentences, results, strict=True):
        ids = [*tokenizer.encode(sentence), EOS]
        src = torch.tensor([ids])
        rows = []
        for t in nbest:  # teacher-forced through the first model: its weights for the tokens the ensemble chose
            tgt_in = torch.tensor([[BOS, *t.tokens]])
            with torch.no_grad():
                weights = first.cross_attention_weights(first.encode(src, src == PAD), src == PAD, tgt_in, 0)
            rows.append((ids, list(t.tokens), weights.mean(dim=1)[0]))
        assert [t.alignment for t in nbest] == align_rows(tokenizer, rows)


# -------------------------------------------------------------------------------------- checkpoints, CLI


def test_checkpoints_with_different_tokenizers_are_refused_by_name(pair: dict, tmp_path: Path) -> None:
    other = Tokenizer.train([f"{w} {w}" for w in ("alpha", "beta", "gamma", "delta")] * 20, vocab_size=60,
                            style="bytelevel")
    path = tmp_path / "other.pt"
    save_checkpoint(make_checkpoint(random_transformer(3, other.vocab_size), other.to_str(), {}, 1), path)
    first = pair["checkpoints"][0]
    with pytest.raises(MtxError, match="different tokenizers") as refused:
        load_models([first, path])
    assert str(first) in str(refused.value) and str(path) in str(refused.value)
    result, lines = translate_cli(["-m", str(first), "-m", str(path), "-i", str(pair["input"])])
    assert result.exit_code == 1 and lines == []


def test_translate_with_two_models_decodes_their_ensemble(pair: dict, monkeypatch) -> None:
    """Two -m print what the library's ensemble of the two gives, which is neither model's own output (the
    seeds made two different models), and --dtype int8 reaches both."""
    made: list[mtx.decode.translator.Translator] = []

    class Recorded(mtx.decode.translator.Translator):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)

    first, second = map(str, pair["checkpoints"])
    args = ["-i", str(pair["input"]), "--threads", "1", "--device", "cpu", "--beam", "4", "--lenpen", "0.6"]
    result, both = translate_cli(["-m", first, "-m", second, *args])
    assert result.exit_code == 0
    expected = mtx.decode.translator.Translator(pair["models"], pair["tokenizer"], DECODE).translate(pair["sources"])
    assert both == [nbest[0].text for nbest in expected]
    alone = [translate_cli(["-m", path, *args])[1] for path in (first, second)]
    assert both != alone[0] and both != alone[1]

    monkeypatch.setattr(mtx.decode.torch_engine, "Translator", Recorded)  # the engine makes one per call
    result, _ = translate_cli(["-m", first, "-m", second, *args, "--dtype", "int8"])
    assert result.exit_code == 0
    [translator] = made
    assert len(translator.models) == 2
    for model in translator.models:
        assert isinstance(model.output_proj, Int8Linear)
