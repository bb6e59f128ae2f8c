"""Beam-4 decoding speed in the unit peers publish: target tokens/s of a `base`-shaped model with a 32k vocabulary
on 3,000 sentences of news length, in bf16 and fp16, at a few batch sizes; CTranslate2 beside it when installed.

    python3 bench/decode_speed.py --device cuda                       # the GPU figures (gpu_check's decode_speed)
    python3 bench/decode_speed.py --device cpu --preset tiny --vocab 1000 --sentences 60 --batch-tokens 256,1024

CTranslate2's README states its speed so (target tokens per second, beam 4, a WMT14 En-De `base` Transformer on
newstest2014); this puts mtx's search beside that figure and, with `ctranslate2` installed, beside CTranslate2
itself on the same weights (mtx.export.ctranslate2), on the same device and sentences.

Random weights and synthetic sentences: source lengths are drawn log-normally (median 24 tokens, clipped to
3–150, as news sentences run), and every translation is made exactly `--tokens` long (28 by default, about a
newstest2014 sentence in subwords): mtx with min_len above the cap (the length cap wins, and forces EOS at
the step after), CTranslate2 with min_decoding_length `--tokens` and max_decoding_length one more (it forces no
EOS: that step is free). So every system does the same steps, whatever random weights would prefer.

mtx decodes as `mtx translate` does: sources sorted longest first and cut by
`mtx.data.batching.decoding_batches` within `--batch-tokens` (counting each sentence's source or output, EOS
included, whichever is longer, times the batch's sentences), each batch searched by `mtx.decode.search.search`.
CTranslate2 gets the same budget as `max_batch_size` with `batch_type="tokens"` (it counts source tokens).

One JSON line per system, dtype and batch size (`decode_speed.<system>.<dtype>.tokens_per_s`, the median of
`--repeats` after one warm-up run of the first batch).
"""

from __future__ import annotations

import argparse
import copy
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from common import FIRST_WORD, build_model, emit, emit_skip, peers_missing, synchronize  # noqa: E402

from mtx.data.batching import decoding_batches, padded  # noqa: E402
from mtx.decode.search import Constraints, LengthPenalty, search  # noqa: E402
from mtx.decode.translator import prepare_model  # noqa: E402
from mtx.tokenizer import EOS, PAD  # noqa: E402


def news_length_sources(sentences: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """Random sources, EOS last, whose lengths are log-normal: median 24 tokens, most within 10–60, clipped
    to 3–150."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(24), 0.5, sentences)), 3, 150).astype(int)
    return [[*rng.integers(FIRST_WORD, vocab, n).tolist(), EOS] for n in lengths]


def mtx_tokens_per_s(model: torch.nn.Module, sources: list[list[int]], tokens: int, batch_tokens: int,
                     device: torch.device, repeats: int) -> tuple[list[float], int]:
    """Target tokens/s of each repeat of decoding every source, and the number of batches."""
    plan = decoding_batches([len(s) for s in sources], [tokens] * len(sources), batch_tokens)
    batches = [(src, src == PAD) for src in (padded([sources[i] for i in indices]).to(device) for indices in plan)]

    def decode_all(selected) -> int:
        produced = 0
        for src, src_pad in selected:
            limits = torch.full((src.shape[0],), tokens, device=device)
            found = search(model, src, src_pad, Constraints(limits, min_len=tokens + 1), LengthPenalty(0.6), beam=4)
            produced += sum(len(nbest[0].tokens) for nbest in found)
        return produced

    decode_all(batches[:1])  # warm-up: kernels, the allocator's pools
    rates = []
    for _ in range(repeats):
        synchronize(device)
        began = time.perf_counter()
        produced = decode_all(batches)
        synchronize(device)
        rates.append(produced / (time.perf_counter() - began))
    if produced != tokens * len(sources):
        raise RuntimeError(f"mtx produced {produced} tokens, not {tokens} per sentence")
    return rates, len(batches)


def ct2_tokens_per_s(model: torch.nn.Module, sources: list[list[int]], tokens: int, batch_tokens: int,
                     device: torch.device, compute_type: str, repeats: int, workdir: str) -> list[float]:
    import ctranslate2
    from common import token_strings

    from mtx.export.ctranslate2 import convert_to_ctranslate2

    strings = token_strings(model.vocab_size)
    path = convert_to_ctranslate2(model, strings, f"{workdir}/ct2")
    translator = ctranslate2.Translator(path, device=device.type, compute_type=compute_type)
    batch = [[strings[i] for i in source] for source in sources]

    def decode_all(inputs: list[list[str]]) -> int:
        # tokens + 1 steps, as mtx's (whose last one is the EOS its length cap forces; CTranslate2 forces none)
        results = translator.translate_batch(inputs, beam_size=4, length_penalty=0.6, min_decoding_length=tokens,
                                             max_decoding_length=tokens + 1, max_batch_size=batch_tokens,
                                             batch_type="tokens")
        return sum(len(r.hypotheses[0][:tokens]) for r in results)

    decode_all(batch[:16])
    rates = []
    for _ in range(repeats):
        began = time.perf_counter()
        produced = decode_all(batch)
        rates.append(produced / (time.perf_counter() - began))
    return rates


def measure(preset: str, vocab: int, sentences: int, tokens: int, batch_sizes: list[int], dtypes: list[str],
            device: torch.device, repeats: int) -> None:
    """Every (dtype, batch size) of mtx, then of CTranslate2 if it is installed and computes that dtype here."""
    base = build_model(preset, vocab).eval()
    sources = news_length_sources(sentences, vocab)
    config: dict[str, Any] = {"preset": preset, "vocab": vocab, "sentences": sentences, "tokens_per_sentence": tokens,
                              "source_tokens_mean": round(float(np.mean([len(s) for s in sources])), 1),
                              "beam": 4, "device": device.type}
    for dtype in dtypes:
        model = prepare_model(copy.deepcopy(base), device, dtype)
        for batch_tokens in batch_sizes:
            rates, batches = mtx_tokens_per_s(model, sources, tokens, batch_tokens, device, repeats)
            emit(f"decode_speed.mtx.{dtype}.tokens_per_s", {**config, "system": "mtx", "dtype": dtype,
                 "batch_tokens": batch_tokens, "batches": batches}, rates, "target tokens/s")
        del model
    missing = peers_missing("ctranslate2")
    if missing:
        emit_skip("decode_speed.ct2", "not installed here: ctranslate2 (optional)", {**config, "system": "ctranslate2"})
        return
    import ctranslate2

    supported = ctranslate2.get_supported_compute_types(device.type) if device.type == "cpu" or \
        ctranslate2.get_cuda_device_count() else set()
    with tempfile.TemporaryDirectory() as workdir:
        for dtype, compute_type in (("fp32", "float32"), ("bf16", "bfloat16"), ("fp16", "float16")):
            if dtype not in dtypes:
                continue
            cfg = {**config, "system": "ctranslate2", "dtype": dtype, "compute_type": compute_type}
            if compute_type not in supported:
                emit_skip(f"decode_speed.ct2.{dtype}", f"CTranslate2 computes no {compute_type} on this "
                          f"{device.type}", cfg)
                continue
            for batch_tokens in batch_sizes:
                rates = ct2_tokens_per_s(base, sources, tokens, batch_tokens, device, compute_type, repeats, workdir)
                emit(f"decode_speed.ct2.{dtype}.tokens_per_s", {**cfg, "batch_tokens": batch_tokens}, rates,
                     "target tokens/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab", type=int, default=32_000)
    parser.add_argument("--sentences", type=int, default=3000)
    parser.add_argument("--tokens", type=int, default=28, help="target tokens of every translation")
    parser.add_argument("--batch-tokens", default="4096,16384,65536", help="comma-separated batch budgets")
    parser.add_argument("--dtypes", default="bf16,fp16")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    measure(args.preset, args.vocab, args.sentences, args.tokens, [int(b) for b in args.batch_tokens.split(",")],
            args.dtypes.split(","), torch.device(args.device), args.repeats)


if __name__ == "__main__":
    main()
