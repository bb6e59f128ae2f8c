"""The translator: mtx's search over one request, in this process: sentences in, n-best lists out, in order.

`Translator` encodes the sentences, sorts them by length and packs them into batches of similar length, so
padding is rare (`plan`). A batch's size, kept within `batch_tokens`, is counted as training counts it: sentences ×
the longer side, EOS included, where the target side is the output length limit
(mtx.data.batching.decoding_batches). It decodes its batches one after the other; the torch engine
(mtx.decode.torch_engine) hands batches to workers instead, where a CPU decodes several side by side, each worker
running a Translator of its own over its one batch. `prepare_model` puts a checkpoint's model on its device in the
numeric format asked for.

`translate_sentences` (what the trainer's validation calls) and the torch engine share it. Asked for an
`alignment_layer`, it
also word-aligns every hypothesis it returns (mtx.decode.alignment), from the attention the search carries.
Given several models, it searches them as one ensemble (mtx.decode.ensemble); given `decode.shortlist` and the
checkpoint's lexical table, each sentence over its own shortlist of target tokens (mtx.decode.shortlist).

Length limits. A source longer than the model's `max_positions` (EOS included) is truncated to fit to be
translated, counted so the command can warn, and flagged `truncated` among its translation's doubts. Scoring
given translations cuts nothing: a line whose source or translation the model cannot hold whole is returned as
`TooLongToScore`, counted, and scored by nobody, since the score of the part that fits would be the score of
another text. The output of a source of n tokens (EOS not counted)
has at most floor(max_len_a · n + max_len_b) tokens before its EOS, and never more than max_positions - 1.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from mtx.config.recipe import DecodeConfig
from mtx.data.batching import decoding_batches, padded
from mtx.data.lexicon import Lexicon, width_of
from mtx.decode.alignment import AligningDecoder, align_searched
from mtx.decode.doubts import TRUNCATED, DoubtThresholds, doubts
from mtx.decode.engine import Dtype
from mtx.decode.ensemble import Ensemble, load_models
from mtx.decode.facts import encode_prefixes, encode_sentences
from mtx.decode.forced import forced_scores
from mtx.decode.limits import ModelLimits
from mtx.decode.request import aligning_layer
from mtx.decode.sampling import line_indices
from mtx.decode.search import Constraints, Hypothesis, IncrementalDecoder, LengthPenalty, Sampling, most_endings, search
from mtx.decode.shortlist import Shortlist, ShortlistDecoder
from mtx.decode.target_lang import TargetLanguages
from mtx.decode.translation import Alignment, Scored, TooLongToScore, Translation, TranslationStats
from mtx.devices import available_memory, choose_device, choose_dtype, half_precision_model
from mtx.errors import MtxError
from mtx.model import fast_paths, int8
from mtx.model.transformer import Transformer
from mtx.tokenizer import EOS, PAD, Tokenizer, normalize_text

# Batches of given translations to score, each (sources with EOS, translations' token ids), to their Translations.
ScoreBatches = Callable[[list[tuple[list[list[int]], list[list[int]]]]], list[list[Translation]]]


@dataclass
class ScorePlan:
    """Given translations to score: each line's result where no model is needed (None for an empty line,
    `TooLongToScore`), and the pairs the model scores: their indices, sources (EOS included), translations' token
    ids, and their batches (indices into those)."""

    results: list[Scored]
    todo: list[int] = field(default_factory=list)
    sources: list[list[int]] = field(default_factory=list)
    given: list[list[int]] = field(default_factory=list)
    batches: list[list[int]] = field(default_factory=list)


@dataclass
class Translator:
    """A model, its tokenizer and how to search: sentences in, n-best lists of `Translation`s out.

    `model` may be a sequence of models sharing the tokenizer, on one device in one format: an ensemble,
    whose next-token distributions are averaged at every step (mtx.decode.ensemble). The first model aligns, and the
    shortest of the models' position tables limits the lengths.

    `alignment_layer` (0-based; None: no alignments) is the decoder layer whose cross-attention word-aligns
    each hypothesis. Its errors name `mtx translate`'s flags (`--beam`, `--batch-tokens`): that command is where
    a user chooses these values, while the trainer's validation passes a recipe's, already checked.
    """

    model: Transformer | Sequence[Transformer]
    tokenizer: Tokenizer
    decode: DecodeConfig = field(default_factory=DecodeConfig)
    batch_tokens: int = 4096
    stats: TranslationStats = field(default_factory=TranslationStats)
    alignment_layer: int | None = None
    doubt_thresholds: DoubtThresholds | None = None  # flag doubtful translations (mtx.decode.doubts); None: do not
    lexicon: Lexicon | None = None  # the first checkpoint's lexical table, which decode.shortlist needs
    targets: TargetLanguages | None = None  # the first checkpoint's target languages, which decode.target_lang names
    # Return every hypothesis each beam search set aside (`most_endings`), not decode.nbest: those among which any
    # length penalty chooses, for choosing one (mtx.decode.lenpen_choice).
    every_ending: bool = False
    side_by_side: int = 1  # batches of this size decoded at once, by as many workers: what memory must hold

    def __post_init__(self) -> None:
        if self.batch_tokens < 1:
            raise MtxError(f"--batch-tokens {self.batch_tokens} must be at least 1.")
        self.models: list[Transformer] = [self.model] if isinstance(self.model, Transformer) else list(self.model)
        first = self.models[0]
        self.limits = ModelLimits.of_configs([(model.cfg, model.vocab_size) for model in self.models])
        self.decode.validate_flags(first.vocab_size, lexicon_width=width_of(self.lexicon),
                                   target_languages=None if self.targets is None else self.targets.languages)
        self.shortlist = None if not self.decode.shortlist else Shortlist(
            self.lexicon, self.decode.shortlist, self.decode.shortlist_frequent)
        if self.alignment_layer is not None:
            aligning_layer(True, self.alignment_layer, self.limits.decoder_layers)
        self.max_positions: int = self.limits.max_positions
        self.device = next(first.parameters()).device

    def translate(self, sentences: list[str], first_line: int | Sequence[int] = 0,
                  prefixes: list[str] | None = None) -> list[list[Translation]]:
        """The n-best translations of each sentence, best first; an empty sentence gets an empty list.

        `first_line`: the index of the first sentence in the whole input, which sampling's draws depend on; or
        each sentence's own index, where the sentences come from several inputs (a server's requests).
        `prefixes`: a target prefix per sentence ("": none), which its translations start with.
        """
        return self.translate_tokens(self._encoded(sentences), first_line, prefixes)

    def translate_tokens(self, token_ids: Sequence[list[int] | None], first_line: int | Sequence[int] = 0,
                         prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
        """`translate` of sentences tokenised already (`ModelFacts.encode`: None for an empty one), as the server's
        process hands them over, having tokenised them to check their length."""
        started = time.perf_counter()
        lines = range(first_line, first_line + len(token_ids)) if isinstance(first_line, int) else first_line
        todo, sources = self._sources(token_ids)
        limits = [self.output_limit(len(ids) - 1) for ids in sources]
        forced = encode_prefixes(self.tokenizer, prefixes, todo, limits, lines)
        results: list[list[Translation]] = [[] for _ in token_ids]
        batches = decoding_batches([len(ids) for ids in sources], limits, self.batch_tokens)
        self._check_memory([(len(b), max(len(sources[j]) for j in b), max(limits[j] for j in b)) for b in batches])
        for batch in batches:
            nbests, alignments = self._search_batch([sources[j] for j in batch], [limits[j] for j in batch],
                                                    [lines[todo[j]] for j in batch],
                                                    None if forced is None else [forced[j] for j in batch])
            # Normalised like the training targets, so no output can hold a line break or a tab, even if a
            # model emits the byte token of one.
            decoded = self.tokenizer.decode_batch([h.tokens for nbest in nbests for h in nbest])
            texts_out = iter(normalize_text(text) for text in decoded)
            if alignments is None:
                alignments = [[None] * len(nbest) for nbest in nbests]
            for j, nbest, aligned in zip(batch, nbests, alignments, strict=True):
                results[todo[j]] = [Translation(next(texts_out), h.score, h.tokens, h.token_log_probs, alignment,
                                                self._doubts(sources[j], h, not self.holds(token_ids[todo[j]])))
                                    for h, alignment in zip(nbest, aligned, strict=True)]
                self.stats.output_tokens += len(nbest[0].tokens)
        self.stats.sentences += len(token_ids)
        self.stats.seconds += time.perf_counter() - started
        return results

    def forced_scores(self, sentences: Sequence[str], translations: Sequence[str],
                      score_batches: ScoreBatches | None = None) -> list[Scored]:
        """Each sentence's given translation scored by the model (mtx.decode.forced): its normalised text, the
        length-normalised score that search would give it, its tokens and their log-probabilities (EOS last). An
        empty sentence gets None; an empty translation is scored too (EOS alone).

        A pair whose source or translation is longer than the model's positions gets `TooLongToScore`, and is
        counted (`stats.too_long_to_score`): a noisy corpus holds such lines, and scoring it must reach its end.
        `score_batches` scores the planned batches, each (sources, given translations), as `score_tokens` does
        (the torch engine hands them to its workers); None: here, one after the other.
        """
        started = time.perf_counter()
        plan = self.score_plan(sentences, translations)
        calls = [([plan.sources[j] for j in batch], [plan.given[j] for j in batch]) for batch in plan.batches]
        scored = score_batches(calls) if score_batches is not None else [self.score_tokens(*c) for c in calls]
        for batch, translations_of_batch in zip(plan.batches, scored, strict=True):
            for j, translation in zip(batch, translations_of_batch, strict=True):
                plan.results[plan.todo[j]] = translation
        self.stats.sentences += len(sentences)
        self.stats.output_tokens += sum(len(ids) for ids in plan.given)
        self.stats.seconds += time.perf_counter() - started
        return plan.results

    def score_plan(self, sentences: Sequence[str], translations: Sequence[str]) -> ScorePlan:
        """The pairs to score, in batches, and the results of those that need no model (`forced_scores`)."""
        encoded = self._encoded(sentences)
        present = [i for i, ids in enumerate(encoded) if ids is not None]
        translated = self.tokenizer.encode_batch([self.tokenizer.normalize(translations[i]) for i in present],
                                                 target=True)
        plan = ScorePlan([None] * len(sentences))
        for i, ids in zip(present, translated, strict=True):
            if self.holds(encoded[i]) and self.holds(ids):
                plan.todo.append(i)
                plan.sources.append([*encoded[i], EOS])
                plan.given.append(ids)
            else:
                plan.results[i] = TooLongToScore(self.tokenizer.decode(ids), ids)
                self.stats.too_long_to_score += 1
        plan.batches = decoding_batches([len(ids) for ids in plan.sources], [len(ids) for ids in plan.given],
                                        self.batch_tokens)
        return plan

    def score_tokens(self, sources: list[list[int]], given: list[list[int]]) -> list[Translation]:
        """One batch of `score_plan`'s: sources with EOS, their given translations' token ids."""
        src = padded(sources).to(self.device)
        decoder = self._decoder(sources, given, aligning=False)
        scored = forced_scores(decoder, src, src == PAD, given, LengthPenalty.of_config(self.decode))
        return [Translation(self.tokenizer.decode(h.tokens), h.score, h.tokens, h.token_log_probs) for h in scored]

    def _check_memory(self, batches: list[tuple[int, int, int]]) -> None:
        """Refuse, before allocating anything, a search whose state cannot fit in memory (`--beam 100000`).

        `batches` holds (sentences, longest source, longest output limit) per batch; `side_by_side` of them are
        decoded at once, by as many workers.
        """
        at_once = self.side_by_side
        # No batches at all when every sentence is empty (a window of blank lines): nothing to allocate.
        needed = at_once * max((self._batch_bytes(*batch) for batch in batches), default=0)
        available = available_memory(self.device)
        if needed > available:
            aligning = "" if self.alignment_layer is None else " (or for aligning them)"
            d = self.decode
            asked, lower = ((f"{d.nbest:,} samples a sentence", "--nbest") if d.sampling
                            else (f"Beam {d.beam}", "--beam"))
            raise MtxError(  # in whole MiB: the bytes of a huge --nbest are more than a float can hold
                f"{asked} needs about {needed // 2**20:,} MiB for the decoder's cache and "
                f"scores of its largest batch{'es' if at_once > 1 else ''}{aligning}, but only "
                f"{available // 2**20:,} MiB "
                f"of {'GPU ' if self.device.type == 'cuda' else ''}memory is available: lower {lower} or "
                "--batch-tokens (or --threads, which decodes batches side by side).")

    def _batch_bytes(self, sentences: int, source_len: int, limit: int) -> int:
        """The memory the search of one batch allocates: every model's decoder state (`Transformer.state_bytes`:
        its caches); a few (rows, V) score arrays, and two more per further model of an ensemble (its
        log-probabilities and their running average); the tokens and log-probabilities of every row; and,
        aligning, every row's attention at every step, twice (it is reordered into a copy), and one step's
        weights of every head."""
        d = self.decode
        rows, positions = sentences * (d.nbest if d.sampling else d.beam), limit + 1  # samples: a row each
        cache = sum(model.state_bytes(rows, sentences, source_len, positions) for model in self.models)
        score_arrays = 3 + 2 * (len(self.models) - 1)
        search = cache + score_arrays * 4 * rows * self.models[0].vocab_size + 12 * rows * positions
        if self.alignment_layer is not None:
            search += 4 * rows * source_len * (2 * positions + self.models[0].cfg.heads)
        return search

    def _encoded(self, sentences: list[str]) -> list[list[int] | None]:
        """`encode_sentences`, each sentence with the tag of decode.target_lang where the model has several."""
        return encode_sentences(self.tokenizer, sentences, self.targets, self.decode.target_lang)

    def _sources(self, token_ids: list[list[int] | None]) -> tuple[list[int], list[list[int]]]:
        """The indices of the sentences that are not empty once normalised, and their token ids plus EOS."""
        todo = [i for i, ids in enumerate(token_ids) if ids is not None]
        return todo, [self._source(token_ids[i]) for i in todo]

    def holds(self, ids: Sequence[int]) -> bool:
        """Whether the model reads these tokens whole: they and EOS fit in its positions (a target's tokens are
        fed after BOS, so they take as many positions as a source's with EOS)."""
        return len(ids) + 1 <= self.max_positions

    def _source(self, ids: list[int]) -> list[int]:
        """Token ids plus EOS, cut to the model's positions if need be (and counted)."""
        if not self.holds(ids):
            self.stats.truncated += 1
            ids = ids[: self.max_positions - 1]
        return [*ids, EOS]

    def output_limit(self, source_tokens: int) -> int:
        """The most tokens before EOS for a source of `source_tokens` (EOS not counted): `ModelLimits`'."""
        return self.limits.output_limit(self.decode, source_tokens)

    def _doubts(self, source: list[int], hypothesis: Hypothesis, truncated: bool) -> tuple[str, ...]:
        """The doubts about a translation of `source` (EOS included), `truncated` to fit the model's positions."""
        if self.doubt_thresholds is None:
            return ()
        cut = (TRUNCATED,) if truncated else ()
        return (*cut, *doubts(source[:-1], hypothesis.tokens, hypothesis.token_log_probs, self.doubt_thresholds))

    def _search_batch(self, sources: list[list[int]], limits: list[int], lines: list[int],
                      prefixes: list[list[int]] | None) -> tuple[list[list[Hypothesis]], list[list[Alignment]] | None]:
        """One batch's n-best lists, and their alignments when asked for (None otherwise)."""
        src = padded(sources).to(self.device)
        src_pad, d = src == PAD, self.decode
        decoder = self._decoder(sources, prefixes, aligning=self.alignment_layer is not None)
        sampling = None if not d.sampling else Sampling(d.seed, line_indices(lines),
                                                        d.temperature, d.topk or 0, d.topp)
        prefix = None if prefixes is None or not any(prefixes) else padded(prefixes).to(self.device)
        constraints = Constraints.of_config(d, torch.tensor(limits), prefix)
        nbest = most_endings(d.beam) if self.every_ending and sampling is None else d.nbest
        nbests = search(decoder, src, src_pad, constraints, LengthPenalty.of_config(d), beam=d.beam, nbest=nbest,
                        sampling=sampling)
        if self.alignment_layer is None:
            return nbests, None
        alignments = align_searched(self.tokenizer, sources, nbests)
        # The attention has served: what goes back from a decoding process is only what the translations need.
        return [[dataclasses.replace(h, attention=None) for h in nbest] for nbest in nbests], alignments


    def _decoder(self, sources: list[list[int]], forced: list[list[int]] | None, aligning: bool
                 ) -> IncrementalDecoder:
        """What searches or scores one batch: the model, or the ensemble of the models; the first one asked for
        its attention where the hypotheses are to be aligned (`aligning`), and each over the sentences'
        shortlists where decode.shortlist asks for them (the tokens `forced` on each sentence among them)."""
        candidates = None if self.shortlist is None else self.shortlist.candidates(sources, forced)
        members: list[IncrementalDecoder] = []
        for i, model in enumerate(self.models):
            member = AligningDecoder(model, self.alignment_layer) if aligning and i == 0 else model
            members.append(member if candidates is None else ShortlistDecoder(member, model, candidates))
        return members[0] if len(members) == 1 else Ensemble(members)


def translate_sentences(model: Transformer, tokenizer: Tokenizer, sentences: list[str], decode: DecodeConfig,
                        batch_tokens: int = 4096) -> list[str]:
    """The best translation of each (normalised) sentence, in order: what validation BLEU needs.

    `model` is an unwrapped mtx Transformer; it is put in eval mode for the search and back as it was after.
    Only the best translation is kept, so one is searched for whatever `decode.nbest` asks, and over the whole
    vocabulary whatever `decode.shortlist` asks: validation measures the model, not a speed-up.
    """
    translator = Translator(model, tokenizer, dataclasses.replace(decode, nbest=1, shortlist=0), batch_tokens)
    was_training = model.training
    model.eval()
    try:
        nbests = translator.translate(sentences)
    finally:
        model.train(was_training)
    if translator.stats.truncated:
        warnings.warn(f"{translator.stats.truncated} sentences were truncated to the model's "
                      f"{translator.max_positions} positions.", stacklevel=2)
    return [nbest[0][0] if nbest else "" for nbest in nbests]


def load_prepared(checkpoints: Sequence[Path], device: str, dtype: Dtype
                  ) -> tuple[list[Transformer], Tokenizer, list[dict]]:
    """The checkpoints' models (one, or an ensemble's: mtx.decode.ensemble.load_models) on `device` (auto, cpu,
    cuda; an unavailable one is refused before anything loads) in the format `dtype`, their shared tokenizer, and
    each checkpoint's metadata: what every translating command starts with."""
    target = choose_device(device, "--device")
    models, tokenizer, metadata = load_models(checkpoints)
    return [prepare_model(model, target, dtype) for model in models], tokenizer, metadata


def prepare_model(model: Transformer, device: torch.device, dtype: Dtype) -> Transformer:
    """The model on `device` in the numeric format asked for, converted in place (as `nn.Module.to` does).

    auto: fp32 on a CPU; on a GPU bf16 where it is native, else fp16 (mtx.devices, as training decides).
    Half precision keeps LayerNorm and the positional table in float32 (`half_precision_model`). int8
    computes every nn.Linear's product in 8-bit integers, its input quantised row by row as it comes
    (mtx.model.int8), which only CPUs run. That includes the output projection, a large share of the decoding
    time in fp32: it gets an int8 copy of the shared embedding matrix
    (`Transformer.make_output_projection_a_module`), while the embedding lookups keep reading the fp32 matrix.
    fp32 on a CPU stores every weight matrix transposed (`fast_paths.store_weights_transposed`), the output
    projection's as a copy beside the embedding's.
    """
    if dtype == "int8":
        if device.type != "cpu":
            raise MtxError("--dtype int8 runs on CPUs only: add --device cpu, or use --dtype bf16/fp16 on a GPU.")
        model = model.cpu()
        model.make_output_projection_a_module()
        return int8.quantize_linear_layers(model)
    torch_dtype = choose_dtype(dtype, device, "--dtype")
    model = model.to(device)
    if torch_dtype != torch.float32:
        return half_precision_model(model, torch_dtype)
    if device.type == "cpu":
        model.make_output_projection_a_module()
        fast_paths.store_weights_transposed(model)
    return model
