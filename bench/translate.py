"""Issue 5: translation speed, mtx's search against Hugging Face `generate` and CTranslate2, same weights.

    .bench-venv/bin/python bench/translate.py [--repeats 3] [--sentences 256]

The `small` preset with random weights (vocabulary 8000); 256 random sources of 15–35 words plus EOS, sorted by
length and cut into batches of 32 sentences, the same batches for every system; beam 4 and greedy; 2 threads.
Every sentence gets exactly 30 tokens: mtx with min_len = max_len = 30 (30 tokens, then the EOS that max_len
forces: 31 decoder steps), Marian with min_new_tokens 30 and max_new_tokens 31 with EOS forced last (the same
31 steps), CTranslate2 with min_decoding_length 30 and max_decoding_length 31 (31 steps; it does not force the
EOS, so its 31st token is free). Sentences/s and tokens/s (30 per sentence) are printed for:

  mtx fp32 / int8      `mtx.decode.search.search` on token tensors, the batches spread over the threads as
                       the torch engine spreads them (`mtx.decode.torch_engine.workers_for`: two batches at a time
                       in worker processes of one thread each, started once, `mtx.decode.workers.WorkerPool`), the
                       model as `mtx translate` prepares it (`mtx.decode.translator.prepare_model(..., "fp32" /
                       "int8")`)
  marian fp32          `MarianMTModel.generate` (SDPA attention) holding mtx's weights, one batch at a time
  ct2 fp32 / int8      CTranslate2's Translator on mtx's weights (mtx.export.ctranslate2; compute_type float32 / int8),
                       one batch at a time on both threads (inter_threads 1, intra_threads 2)
  ct2 … .parallel      the same, two batches at a time on one thread each (inter_threads 2, intra_threads 1)

Before timing: mtx and Marian must give the same log-probabilities (to 1e-4) and the same greedy output;
CTranslate2 float32's greedy output may leave mtx's only at a tie (two tokens within 1e-3 nats for mtx), and
the share identical to mtx's is printed. Then the issue's bars: mtx
beam 4 at least 2× Marian's sentences/s, and within 2× of CTranslate2 float32 in the faster of its two
configurations (both fp32).

A trained model and its vocabulary shortlist (issue 38):

    .bench-venv/bin/python bench/translate.py --checkpoint RUN/checkpoints/step_800.pt --data RUN/data \
        [--shortlist 20] [--frequent 100]

decodes the data folder's first `--sentences` test sources (sorted by length, in batches of `--batch`; still
exactly `--tokens` tokens each) with the checkpoint, and with its lexical table (the checkpoint's, else the data
folder's data/lexicon.npz) as each side uses it: mtx per sentence (`mtx translate --shortlist`,
mtx.decode.shortlist), CTranslate2 with the vocabulary map `mtx export --shortlist` writes (its `use_vmap`, a
batch's union). Systems: mtx fp32 / int8 with and without the shortlist, CTranslate2 float32 / int8 in its
faster layout (`.parallel`) with and without the map; Marian is left out. With a shortlist the outputs differ
from the whole vocabulary's (other candidates), so only the whole vocabulary's are held to mtx's greedy output.
Then `translate.mtx_over_ct2` lines: each mtx system's sentences/s over its CTranslate2 counterpart's (same
precision, shortlist or not, the faster layout), the issue's bar being 1.0.

`mtx translate`'s two engines, the whole command, against CTranslate2 called directly (issue 57):

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/translate.py --checkpoint runs/demo/average.pt \
        --input runs/demo/data/test.en

decodes the lines of --input at their natural lengths with `mtx translate --engine ct2` and `--engine torch`
(translate_file in this process, its engine's loading left out) and with CTranslate2's Translator in both layouts,
fp32 and int8: bench/translate_engines.py says how, and prints `translate.ct2_engine_over_direct` lines.
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from common import (
    build_model,
    check_same_function,
    emit,
    emit_info,
    emit_skip,
    peers_missing,
    random_batch,
    set_threads,
    time_interleaved,
    token_strings,
)
from torch import Tensor
from translate_engines import compare_engines

from mtx.data.lexicon import Lexicon
from mtx.data.prepared import load_manifest
from mtx.decode.ct2_folder import convert_to_ctranslate2
from mtx.decode.ensemble import load_models
from mtx.decode.facts import encode_sentences
from mtx.decode.search import Constraints, LengthPenalty, search
from mtx.decode.shortlist import Shortlist, ShortlistDecoder
from mtx.decode.torch_engine import workers_for
from mtx.decode.translator import prepare_model
from mtx.decode.workers import WorkerPool
from mtx.export.ctranslate2 import write_vocabulary_map
from mtx.export.marian import marian_from_mtx
from mtx.tokenizer import BOS, EOS, PAD

Batches = list[tuple[Tensor, Tensor]]  # (src, src_pad) per batch
Decoder = Callable[[int], list[list[int]]]  # beam size → the output tokens of every sentence, in batch order

HF_OVER_BAR = 2.0  # mtx beam 4 at least 2× HF generate's sentences/s
CT2_WITHIN = 2.0  # and at most 2× slower than CTranslate2 float32
GREEDY_TIE = 1e-3  # nats: two tokens this close in log-probability are a tie that float32 rounding may break


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch")
    parser.add_argument("--tokens", type=int, default=30, help="output tokens per sentence (min = max length)")
    parser.add_argument("--beams", default="4,1", help="comma-separated beam sizes; 1 is greedy search")
    parser.add_argument("--lenpen", type=float, default=0.6)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--checkpoint", type=Path, help="a trained model instead of random weights (with --data)")
    parser.add_argument("--data", type=Path, help="the checkpoint's prepared data folder: its test sources")
    parser.add_argument("--shortlist", type=int, default=20, help="translations per source token (with --checkpoint)")
    parser.add_argument("--frequent", type=int, default=100, help="frequent target tokens (with --checkpoint)")
    parser.add_argument("--input", type=Path, help="with --checkpoint: the two engines of `mtx translate` on this "
                        "file's lines, against CTranslate2 called directly (bench/translate_engines.py)")
    parser.add_argument("--batch-tokens", type=int, default=4096, help="with --input: mtx translate's and "
                        "CTranslate2's batch size in tokens")
    parser.add_argument("--max-len-a", type=float, help="with --input: the output limit's a [default: the "
                        "checkpoint's]; 0 gives every sentence one limit")
    args = parser.parse_args()
    set_threads(args.threads)
    if args.checkpoint is not None and args.input is not None:
        return compare_engines(args)
    if args.checkpoint is not None:
        return compare_trained(args)

    model = build_model(args.preset, args.vocab).eval()
    batches = length_sorted_batches(args.sentences, args.batch, args.vocab)
    systems: dict[str, Decoder] = {
        "mtx.fp32": mtx_decoder(prepare_model(copy.deepcopy(model), torch.device("cpu"), "fp32"), batches, args),
        "mtx.int8": mtx_decoder(prepare_model(copy.deepcopy(model), torch.device("cpu"), "int8"), batches, args),
    }
    with tempfile.TemporaryDirectory() as workdir:
        systems.update(peer_decoders(model, batches, args, workdir))
        check_outputs(systems, model, batches)
        config = {"preset": args.preset, "vocab": args.vocab, "sentences": args.sentences, "batch": args.batch,
                  "tokens_per_sentence": args.tokens, "lengths": "15-35", "threads": args.threads, "device": "cpu"}
        for beam, rates in time_systems(systems, config, args):
            report_bars(beam, rates)


def time_systems(systems: dict[str, Decoder], config: dict, args: argparse.Namespace):
    """Each beam size's timings of every system, interleaved, as JSON lines; yields (beam, sentences/s by system)."""
    if torch.get_num_threads() != args.threads:
        raise RuntimeError(f"PyTorch runs on {torch.get_num_threads()} threads, not {args.threads}")
    sentences = config["sentences"]
    for beam in (int(b) for b in args.beams.split(",")):
        seconds = time_interleaved({name: lambda d=decode, b=beam: d(b) for name, decode in systems.items()},
                                   args.repeats, warmup=0)  # check_outputs has warmed every system up
        rates = {}
        for name, samples in seconds.items():
            cfg = {**config, "system": name, "beam": beam}
            rates[name] = float(np.median([sentences / s for s in samples]))
            emit(f"{name}.beam{beam}.sentences_per_s", cfg, [sentences / s for s in samples], "sentences/s")
            emit(f"{name}.beam{beam}.tokens_per_s", cfg, [sentences * args.tokens / s for s in samples], "tokens/s")
        yield beam, rates


def length_sorted_batches(sentences: int, batch: int, vocab: int) -> Batches:
    """Random sources, sorted by length as `mtx translate` sorts them, cut into batches of `batch` sentences."""
    pool = random_batch(sentences, vocab, 15, 35, seed=2)
    order = (~pool.src_pad).sum(1).argsort(descending=True, stable=True)
    src = pool.src[order]
    out = []
    for start in range(0, sentences, batch):
        rows = src[start : start + batch]
        rows = rows[:, : int((rows != PAD).sum(1).max())]
        out.append((rows, rows == PAD))
    return out


@dataclass(frozen=True)
class SearchSetup:
    """What a decoding worker holds (it travels by pickle): the prepared model, its threads, the constraints."""

    model: torch.nn.Module
    threads: int
    tokens: int
    lenpen: float
    shortlist: Shortlist | None


class BatchSearch:
    """A worker's search: `mtx.decode.search.search` on one batch, every sentence exactly `tokens` long."""

    def __init__(self, setup: SearchSetup) -> None:
        torch.set_num_threads(setup.threads)
        self.setup = setup

    @torch.inference_mode()
    def decode(self, batch: tuple[Tensor, Tensor], beam: int) -> list[list[int]]:
        src, src_pad = batch
        model, tokens, shortlist = self.setup.model, self.setup.tokens, self.setup.shortlist
        constraints = Constraints(torch.full((src.shape[0],), tokens), min_len=tokens)
        decoder = model if shortlist is None else ShortlistDecoder(
            model, model, shortlist.candidates([row[~pad].tolist() for row, pad in zip(src, src_pad, strict=True)]))
        nbests = search(decoder, src, src_pad, constraints, LengthPenalty(self.setup.lenpen), beam=beam)
        return [nbest[0].tokens for nbest in nbests]


def load_search(setup: SearchSetup) -> BatchSearch:
    """A decoding worker's target (mtx.decode.workers: a module-level function of a picklable setup)."""
    return BatchSearch(setup)


def mtx_decoder(model: torch.nn.Module, batches: Batches, args: argparse.Namespace,
                shortlist: Shortlist | None = None) -> Decoder:
    """`mtx.decode.search.search` on each batch, the batches spread over worker processes as the torch engine
    spreads them (`workers_for`: a worker of one thread per thread, started once, a batch at a time); with
    `shortlist`, each sentence over its own (built per batch, as the translator builds it, and timed)."""
    workers, threads_each = workers_for(torch.device("cpu"), args.threads)
    pool = WorkerPool(workers, load_search, SearchSetup(model, threads_each, args.tokens, args.lenpen, shortlist))

    def decode(beam: int) -> list[list[int]]:
        return [tokens for batch in pool.map("decode", [(batch, beam) for batch in batches]) for tokens in batch]

    return decode


def peer_decoders(model: torch.nn.Module, batches: Batches, args: argparse.Namespace, workdir: str
                  ) -> dict[str, Decoder]:
    """Marian `generate` and CTranslate2 on mtx's weights, or a `skipped` line for each peer not installed."""
    missing = peers_missing("transformers", "ctranslate2")
    if "transformers" in missing:
        emit_skip("marian", "not installed here: transformers (run in .bench-venv, see bench/setup_env.sh)")
        emit_skip("ct2", "its converter needs transformers, not installed here")
        return {}
    marian = marian_from_mtx(model).eval()
    check_same_function(model, marian, random_batch(32, args.vocab, 15, 35, seed=3))
    decoders = {"marian.fp32": marian_decoder(marian, batches, args)}
    if "ctranslate2" in missing:
        emit_skip("ct2", "not installed here: ctranslate2 (run in .bench-venv, see bench/setup_env.sh)")
        return decoders
    import ctranslate2

    path = convert_to_ctranslate2(model, token_strings(args.vocab), f"{workdir}/ct2")
    # One batch at a time on all the threads, and CTranslate2's own way to decode batches side by side:
    # `inter_threads` workers, one thread each.
    layouts = {"": (1, args.threads), ".parallel": (args.threads, 1)}
    for compute_type in ("float32", "int8"):
        for suffix, (inter, intra) in layouts.items():
            translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type, inter_threads=inter,
                                                intra_threads=intra)
            decoders[f"ct2.{compute_type.replace('float', 'fp')}{suffix}"] = ct2_decoder(translator, batches, args)
    # A Translator's constructor sets OpenMP's thread count for the whole process to its intra_threads (1 for
    # the parallel ones), which would leave Marian, running on PyTorch's count, on one thread.
    set_threads(args.threads)
    return decoders


def marian_decoder(marian, batches: Batches, args: argparse.Namespace) -> Decoder:
    from transformers import GenerationConfig

    def decode(beam: int) -> list[list[int]]:
        generation = GenerationConfig(
            num_beams=beam, do_sample=False, min_new_tokens=args.tokens, max_new_tokens=args.tokens + 1,
            length_penalty=args.lenpen if beam > 1 else None, forced_eos_token_id=EOS, suppress_tokens=[PAD, BOS],
            decoder_start_token_id=BOS, bos_token_id=BOS, eos_token_id=EOS, pad_token_id=PAD,
        )
        outputs = []
        with torch.inference_mode():
            for src, src_pad in batches:
                generated = marian.generate(input_ids=src, attention_mask=(~src_pad).long(),
                                            generation_config=generation)
                outputs.extend(generated[:, 1 : 1 + args.tokens].tolist())  # after the start token, before EOS
        return outputs

    return decode


def ct2_decoder(translator, batches: Batches, args: argparse.Namespace, use_vmap: bool = False) -> Decoder:
    strings = token_strings(args.vocab)
    ids = {token: i for i, token in enumerate(strings)}
    sources = [[[strings[i] for i in row if i != PAD] for row in src.tolist()] for src, _ in batches]

    def decode(beam: int) -> list[list[int]]:
        # Every batch submitted at once (asynchronously), so that a translator with several workers decodes
        # several batches at a time; with one worker they run one after the other, as before.
        pending = [translator.translate_batch(
            source, beam_size=beam, length_penalty=args.lenpen, min_decoding_length=args.tokens,
            max_decoding_length=args.tokens + 1, suppress_sequences=[[strings[PAD]], [strings[BOS]]],
            use_vmap=use_vmap, asynchronous=True) for source in sources]
        return [[ids[t] for t in r.result().hypotheses[0][: args.tokens]] for batch in pending for r in batch]

    return decode


def check_outputs(systems: dict[str, Decoder], model: torch.nn.Module, batches: Batches) -> None:
    """Every system emits 30 tokens per sentence; Marian's greedy output is mtx's, token for token; CTranslate2
    float32's differs only where two tokens tie (another float32 implementation may break a tie the other way).
    Random weights make near-ties common, so CTranslate2 is held to ties, not to identical output."""
    reference = systems["mtx.fp32"](1)
    for name, decode in systems.items():
        outputs = reference if name == "mtx.fp32" else decode(1)
        same = sum(a == b for a, b in zip(outputs, reference, strict=True)) / len(reference)
        lengths = sorted({len(o) for o in outputs})
        gaps = greedy_divergence_gaps(model, batches, reference, outputs)
        emit_info(f"{name}.greedy_check", identical_to_mtx_fp32=same, output_lengths=lengths,
                  largest_divergence_gap=max(gaps, default=0.0))
        if name.endswith((".shortlist", ".vmap")):  # other candidates than the whole vocabulary's
            continue
        if name == "marian.fp32" and same < 1.0:
            raise RuntimeError(f"Marian's greedy output differs from mtx's on {1 - same:.1%} of the sentences")
        if name.startswith("ct2.fp32") and max(gaps, default=0.0) > GREEDY_TIE:
            raise RuntimeError(f"{name}'s greedy output leaves mtx's where mtx prefers its own token by "
                               f"{max(gaps):.2g} nats, more than a tie ({GREEDY_TIE})")


def greedy_divergence_gaps(model: torch.nn.Module, batches: Batches, reference: list[list[int]],
                           outputs: list[list[int]]) -> list[float]:
    """For each sentence where `outputs` leaves mtx's greedy `reference`: at the first token that differs,
    how much more log-probability mtx gives its own token than the other one, after their common prefix."""
    sources = [(src[i : i + 1], src_pad[i : i + 1]) for src, src_pad in batches for i in range(src.shape[0])]
    gaps = []
    with torch.inference_mode():
        for (src, src_pad), ours, theirs in zip(sources, reference, outputs, strict=True):
            t = next((t for t, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b), None)
            if t is None:
                continue
            tgt_in = torch.tensor([[BOS, *ours[:t]]])
            log_probs = torch.log_softmax(model.output_logits(model(src, src_pad, tgt_in)[0, -1]).float(), dim=-1)
            gaps.append(float(log_probs[ours[t]] - log_probs[theirs[t]]))
    return gaps


def report_bars(beam: int, rates: dict[str, float]) -> None:
    """The issue's bars, for beam 4: mtx ≥ 2× Marian generate, and CTranslate2 ≤ 2× mtx (fp32 both)."""
    if beam != 4:
        return
    if "marian.fp32" in rates:
        ratio = rates["mtx.fp32"] / rates["marian.fp32"]
        emit_info("translate.mtx_over_marian", beam=beam, ratio=ratio, bar=HF_OVER_BAR, met=ratio >= HF_OVER_BAR)
    ct2 = {name: rate for name, rate in rates.items() if name.startswith("ct2.fp32")}
    if ct2:
        best = max(ct2, key=ct2.get)  # CTranslate2 in its faster way of using the threads
        ratio = ct2[best] / rates["mtx.fp32"]
        emit_info("translate.ct2_over_mtx", beam=beam, ct2=best, ratio=ratio, bar=CT2_WITHIN, met=ratio <= CT2_WITHIN)


# ------------------------------------------------------------------- a trained model and its shortlist (issue 38)


def compare_trained(args: argparse.Namespace) -> None:
    """The module docstring's second mode: a trained model's test sources, with and without its shortlist."""
    if args.data is None:
        raise SystemExit("--checkpoint needs --data, the prepared data folder whose test sources it decodes")
    models, tokenizer, metadata = load_models([args.checkpoint])
    model = models[0].eval()
    lexicon = Lexicon.of_checkpoint(metadata[0]) or Lexicon.load(args.data)
    if lexicon is None:
        raise SystemExit(f"neither {args.checkpoint} nor {args.data} holds a lexical table: run mtx prepare "
                         "with --set data.lexicon.learn=true")
    args.vocab = model.vocab_size
    batches = test_batches(args, tokenizer)
    shortlist = Shortlist(lexicon, args.shortlist, args.frequent)
    fp32, int8 = (prepare_model(copy.deepcopy(model), torch.device("cpu"), dtype) for dtype in ("fp32", "int8"))
    systems: dict[str, Decoder] = {
        "mtx.fp32": mtx_decoder(fp32, batches, args),
        "mtx.fp32.shortlist": mtx_decoder(fp32, batches, args, shortlist),
        "mtx.int8": mtx_decoder(int8, batches, args),
        "mtx.int8.shortlist": mtx_decoder(int8, batches, args, shortlist),
    }
    with tempfile.TemporaryDirectory() as workdir:
        if not peers_missing("transformers", "ctranslate2"):
            import ctranslate2

            path = convert_to_ctranslate2(model, token_strings(args.vocab), f"{workdir}/ct2")
            write_vocabulary_map(lexicon, args.shortlist, args.frequent, token_strings(args.vocab),
                                 Path(path) / "vmap.txt")
            for compute_type in ("float32", "int8"):
                translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type,
                                                    inter_threads=args.threads, intra_threads=1)
                name = f"ct2.{compute_type.replace('float', 'fp')}.parallel"
                systems[name] = ct2_decoder(translator, batches, args)
                systems[f"{name}.vmap"] = ct2_decoder(translator, batches, args, use_vmap=True)
            set_threads(args.threads)
        else:
            emit_skip("ct2", "not installed here: ctranslate2 (run in .bench-venv, see bench/setup_env.sh)")
        check_outputs(systems, model, batches)
        config = {"checkpoint": str(args.checkpoint), "vocab": args.vocab, "sentences": args.sentences,
                  "batch": args.batch, "tokens_per_sentence": args.tokens, "shortlist": args.shortlist,
                  "frequent": args.frequent, "threads": args.threads, "device": "cpu"}
        for beam, rates in time_systems(systems, config, args):
            for name in (n for n in rates if n.startswith("mtx.")):
                peer = ct2_counterpart(name)
                if peer in rates:
                    ratio = rates[name] / rates[peer]
                    emit_info("translate.mtx_over_ct2", beam=beam, mtx=name, ct2=peer, ratio=ratio, bar=1.0,
                              met=ratio >= 1.0)


def ct2_counterpart(name: str) -> str:
    """mtx.<precision>[.shortlist] → ct2.<precision>.parallel[.vmap]: the same precision, with a shortlist or
    not, in CTranslate2's faster layout."""
    precision = name.split(".")[1]
    return f"ct2.{precision}.parallel" + (".vmap" if name.endswith(".shortlist") else "")


def test_batches(args: argparse.Namespace, tokenizer) -> Batches:
    """The data folder's first `--sentences` test sources (EOS added), sorted by length and cut into batches."""
    src_lang = load_manifest(args.data)["src_lang"]
    lines = (args.data / f"test.{src_lang}").read_text(encoding="utf-8").splitlines()
    sources = [[*ids, EOS] for ids in encode_sentences(tokenizer, lines) if ids][: args.sentences]
    args.sentences = len(sources)
    sources.sort(key=len, reverse=True)
    out = []
    for start in range(0, len(sources), args.batch):
        rows = sources[start : start + args.batch]
        width = max(len(r) for r in rows)
        src = torch.tensor([r + [PAD] * (width - len(r)) for r in rows])
        out.append((src, src == PAD))
    return out


if __name__ == "__main__":
    main()
