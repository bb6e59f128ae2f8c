"""The `ct2` engine: mtx's model decoded by CTranslate2, on a CPU (`Ct2Engine`, opened by `open_ct2_engine`).

The checkpoint is converted once into a CTranslate2 folder and kept beside it (mtx.decode.ct2_folder); the engine
holds one `ctranslate2.Translator` over it, whose `inter_threads` workers share one copy of the weights and
decode with the GIL released, so one engine serves several threads at once (the server's feeding threads)
without processes. It takes what the torch engine takes and returns what it returns: sentences as token ids,
mapped to the folder's token strings by id (never tokenised again), truncated to the model's positions as the
torch engine truncates them, and translations decoded and normalised as it decodes them. Each field of a request
is honoured as its capability table says (mtx.decode.ct2_capabilities), or refused by name.

Where CTranslate2's numbers are not mtx's, the engine computes mtx's. A translation's score is log P(Y) /
lp(|Y|), |Y| counting EOS, from each token's log-probability, which a `score_batch` pass over the outputs gives
exactly as mtx's forced scoring does (EOS last): that pass runs where the scores are shown (jsonl, n-best lists)
or CTranslate2's cannot stand for them (a prefix, which its score leaves out). Elsewhere (one translation a
sentence, as text) the score is CTranslate2's own, normalised as mtx's; it differs from mtx's in the third
decimal on the copy-task model, by the renormalisation the capability table describes, and where a hypothesis
reached its length limit, which CTranslate2 scores without EOS.

Layout. The threads given are spent as `inter_threads` translators of `intra_threads` each: all of them
translators of one thread (`layout`), as bench/README.md ("CTranslate2 as an engine: layout") measured to be
the faster way to translate a file on two cores, as it is for mtx's own search (batches side by side rather
than one batch's products on several threads). The engine submits every group of sentences at once
(`asynchronous`), so each translator always has a batch to decode.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from mtx.decode.ct2_capabilities import ct2_prefix_refusal, ct2_refusal
from mtx.decode.ct2_folder import converted_folder, token_strings
from mtx.decode.doubts import TRUNCATED, doubts
from mtx.decode.engine import Dtype, cpu_instructions
from mtx.decode.facts import ModelFacts, encode_prefixes
from mtx.decode.request import Request, default_alignment_layer
from mtx.decode.translation import Scored, Source, TooLongToScore, Translation, TranslationStats
from mtx.errors import MtxError
from mtx.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, normalize_text

# The tokens mtx's search never produces; CTranslate2 is told to suppress them too.
NEVER_PRODUCED = [[SPECIAL_TOKENS[PAD]], [SPECIAL_TOKENS[BOS]]]
COMPUTE_TYPES = {"fp32": "float32", "int8": "int8"}  # --dtype → the folder's quantization and compute type


def layout(threads: int) -> tuple[int, int]:
    """(inter_threads, intra_threads) for `threads` CPU threads: a translator of one thread each (the module's
    docstring says why)."""
    return max(1, threads), 1


class Ct2Engine:
    """CTranslate2's translator over one converted checkpoint, given mtx's requests (mtx.decode.engine.Engine)."""

    name = "ct2"

    def __init__(self, facts: ModelFacts, translator, compute_type: str, batch_tokens: int, version: str) -> None:
        self.facts, self.translator, self.compute_type = facts, translator, compute_type
        self.batch_tokens, self.version = batch_tokens, version
        self.parallelism: int = translator.num_translators
        self.stats = TranslationStats()
        self._counting = threading.Lock()  # stats are added to from every calling thread
        self.tokens = token_strings(facts.tokenizer, facts.limits.vocab_size)
        self.ids = {token: i for i, token in enumerate(self.tokens)}

    def _refuse(self, request: Request) -> None:
        """A call's guard: what the callers check first (mtx.decode.engines.refusal), checked again here, as the
        engine must never decode a request it cannot honour, whoever calls it."""
        problem = ct2_refusal(request, self.facts)
        if problem is not None:
            raise MtxError(problem[1])

    def translate(self, sources: Sequence[Source], request: Request, lines: Sequence[int],
                  prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
        self._refuse(request)
        started = time.perf_counter()
        todo = [i for i, ids in enumerate(sources) if ids is not None]
        truncated = [not self.facts.holds(sources[i]) for i in todo]
        cut = [list(sources[i][: self.facts.limits.max_positions - 1]) for i in todo]
        limits = [self.facts.limits.output_limit(request, len(ids)) for ids in cut]
        forced = self._prefixes(prefixes, request, todo, limits, lines)
        groups: dict[int, list[int]] = {}  # output limit → the sentences (indices into todo) that have it
        for j, limit in enumerate(limits):
            groups.setdefault(limit, []).append(j)
        pending = [(limit, members, self._submit(request, [cut[j] for j in members],
                                                  None if forced is None else [forced[j] for j in members], limit))
                   for limit, members in groups.items()]
        found: list[list] = [[] for _ in todo]  # each sentence's CTranslate2 hypotheses (tokens, score, attention)
        for _, members, results in pending:
            for j, result in zip(members, results, strict=True):
                done = result.result()
                attention = done.attention if request.alignment else [None] * len(done.hypotheses)
                found[j] = [([self.ids[t] for t in hypothesis], score, rows)
                            for hypothesis, score, rows in zip(done.hypotheses, done.scores, attention, strict=True)]
        exact = request.details or request.nbest > 1 or forced is not None
        log_probs = self._log_probs(cut, found) if exact else None
        results = self._translations(request, sources, todo, cut, truncated, found, log_probs)
        with self._counting:
            self.stats.truncated += sum(truncated)
            self.stats.sentences += len(sources)
            self.stats.output_tokens += sum(len(nbest[0].tokens) for nbest in results if nbest)
            self.stats.seconds += time.perf_counter() - started
        return results

    def _submit(self, request: Request, sources: list[list[int]], prefixes: list[list[int]] | None, limit: int):
        """One asynchronous translate_batch call of sentences whose output limit is `limit` (which wins over
        min_len, as in mtx's search: CTranslate2 refuses a minimum above its maximum)."""
        return self.translator.translate_batch(
            [self._strings([*ids, EOS]) for ids in sources],
            None if prefixes is None else [self._strings(ids) for ids in prefixes],
            max_batch_size=self.batch_tokens, batch_type="tokens", asynchronous=True, beam_size=request.beam,
            num_hypotheses=request.nbest, length_penalty=request.lenpen, no_repeat_ngram_size=request.no_repeat_ngram,
            suppress_sequences=NEVER_PRODUCED, max_input_length=0, max_decoding_length=limit,
            min_decoding_length=min(request.min_len, limit), return_scores=True, return_attention=request.alignment)

    def _strings(self, ids: Sequence[int]) -> list[str]:
        return [self.tokens[i] for i in ids]

    def _prefixes(self, prefixes: Sequence[str] | None, request: Request, todo: list[int], limits: list[int],
                  lines: Sequence[int]) -> list[list[int]] | None:
        """Each non-empty sentence's prefix as token ids, refused where it is longer than the output may be, or
        where CTranslate2's beam search would rank its hypotheses otherwise than mtx's."""
        if prefixes is None or not any(prefixes):
            return None
        if (refused := ct2_prefix_refusal(request)) is not None:
            raise MtxError(refused)
        return encode_prefixes(self.facts.tokenizer, prefixes, todo, limits, lines)

    def _log_probs(self, cut: list[list[int]], found: list[list]) -> list[list[list[float]]]:
        """Each hypothesis' tokens' log-probabilities, EOS last, from one score_batch pass over them all."""
        pairs = [(self._strings([*ids, EOS]), self._strings(tokens)) for ids, nbest in zip(cut, found, strict=True)
                 for tokens, _, _ in nbest]
        scored = iter(self.translator.score_batch([source for source, _ in pairs], [target for _, target in pairs],
                                                  max_batch_size=self.batch_tokens, batch_type="tokens",
                                                  max_input_length=0) if pairs else [])
        return [[list(next(scored).log_probs) for _ in nbest] for nbest in found]

    def _translations(self, request: Request, sources: Sequence[Source], todo: list[int], cut: list[list[int]],
                      truncated: list[bool], found: list[list], log_probs: list[list[list[float]]] | None
                      ) -> list[list[Translation]]:
        """The engine's Translations of CTranslate2's hypotheses: texts decoded and normalised as the torch
        engine's, mtx's scores, alignments and doubts where asked for."""
        from mtx.decode.alignment import align_rows
        from mtx.decode.search import LengthPenalty

        penalty = LengthPenalty.of_config(request)
        texts = iter(normalize_text(text) for text in self.facts.tokenizer.decode_batch(
            [tokens for nbest in found for tokens, _, _ in nbest]))
        alignments = None
        if request.alignment:
            import torch

            rows = [([*ids, EOS], tokens, torch.tensor(attention).reshape(len(tokens), len(ids) + 1))
                    for ids, nbest in zip(cut, found, strict=True) for tokens, _, attention in nbest]
            alignments = iter(align_rows(self.facts.tokenizer, rows))
        results: list[list[Translation]] = [[] for _ in sources]
        for j, i in enumerate(todo):
            nbest = []
            for k, (tokens, score, _) in enumerate(found[j]):
                if log_probs is not None:
                    token_log_probs = log_probs[j][k]
                    score = sum(token_log_probs) / penalty(len(tokens) + 1.0)
                else:
                    token_log_probs = ()
                flags = ()
                if request.details:
                    flags = ((TRUNCATED,) if truncated[j] else ()) + tuple(
                        doubts(cut[j], tokens, token_log_probs, self.facts.doubts))
                nbest.append(Translation(next(texts), float(score), tokens, token_log_probs,
                                         None if alignments is None else next(alignments), flags))
            results[i] = nbest
        return results

    def score(self, sentences: Sequence[str], translations: Sequence[str], request: Request) -> list[Scored]:
        """Each sentence's given translation scored by the model, as `Translator.forced_scores` scores it: a
        sentence or translation the model cannot hold whole is `TooLongToScore`, an empty sentence None."""
        self._refuse(request)
        started = time.perf_counter()
        encoded = self.facts.encode(sentences, request.target_lang)
        present = [i for i, ids in enumerate(encoded) if ids is not None]
        tokenizer = self.facts.tokenizer
        given = tokenizer.encode_batch([tokenizer.normalize(translations[i]) for i in present], target=True)
        results: list[Scored] = [None] * len(sentences)
        todo = []
        for i, ids in zip(present, given, strict=True):
            if self.facts.holds(encoded[i]) and self.facts.holds(ids):
                todo.append((i, ids))
            else:
                results[i] = TooLongToScore(self.facts.tokenizer.decode(ids), ids)
        scored = self.translator.score_batch([self._strings([*encoded[i], EOS]) for i, _ in todo],
                                             [self._strings(ids) for _, ids in todo], max_batch_size=self.batch_tokens,
                                             batch_type="tokens", max_input_length=0) if todo else []
        from mtx.decode.search import LengthPenalty

        penalty = LengthPenalty.of_config(request)
        for (i, ids), result in zip(todo, scored, strict=True):
            token_log_probs = list(result.log_probs)
            results[i] = Translation(self.facts.tokenizer.decode(ids), sum(token_log_probs) / penalty(len(ids) + 1.0),
                                     ids, token_log_probs)
        with self._counting:
            self.stats.too_long_to_score += len(present) - len(todo)
            self.stats.sentences += len(sentences)
            self.stats.output_tokens += sum(len(ids) for _, ids in todo)
            self.stats.seconds += time.perf_counter() - started
        return results

    def provenance(self) -> dict[str, str]:
        return {"engine": self.name, "version": f"ctranslate2 {self.version}", "compute_type": self.compute_type,
                "device": "cpu", "cpu": cpu_instructions()}

    def pids(self) -> list[int]:
        """None: its translators are threads of this process."""
        return []

    def close(self) -> None:
        self.translator.unload_model()


def open_ct2_engine(checkpoints: Sequence[Path], *, device: str, dtype: Dtype, threads: int, batch_tokens: int,
                    log: Callable[[str], None]) -> Ct2Engine:
    """The `ct2` engine over one checkpoint, its folder converted now unless cached. Refused, naming what to
    change: without the ctranslate2 module (the extra mtx[ct2]), with several checkpoints (an ensemble), on a GPU
    (never tested here), in half precision (CTranslate2 has none on a CPU)."""
    try:
        import ctranslate2
    except ImportError:
        raise MtxError("--engine ct2 needs CTranslate2, which is not installed: pip install 'mtx[ct2]' (or use "
                       "--engine torch).") from None
    if len(checkpoints) > 1:
        raise MtxError(f"--engine ct2 decodes one model, and {len(checkpoints)} were given with -m (an ensemble): "
                       "give one -m, or use --engine torch, which ensembles them.")
    if device not in ("auto", "cpu"):
        raise MtxError(f"--engine ct2 runs on the CPU only (--device {device}): its GPU path has not been tested "
                       "with mtx's models. Use --device cpu, or --engine torch on the GPU.")
    compute_type = COMPUTE_TYPES.get("fp32" if dtype == "auto" else dtype)
    if compute_type is None:
        raise MtxError(f"--engine ct2 on a CPU computes in fp32 or int8, not --dtype {dtype}: use --dtype fp32, "
                       "--dtype int8, or --engine torch.")
    if batch_tokens < 1:
        raise MtxError(f"--batch-tokens {batch_tokens} must be at least 1.")
    facts = ModelFacts.read(checkpoints)
    aligning = default_alignment_layer(facts.limits.decoder_layers)
    folder = converted_folder(Path(checkpoints[0]), None if compute_type == "float32" else compute_type, aligning, log)
    inter, intra = layout(threads)
    translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type, inter_threads=inter,
                                        intra_threads=intra)
    return Ct2Engine(facts, translator, compute_type, batch_tokens, ctranslate2.__version__)
