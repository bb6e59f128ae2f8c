"""Issue 57: how the `ct2` engine spends its threads, `inter_threads` × `intra_threads`, translating a file.

    .venv/bin/python bench/ct2_layout.py [--threads 2] [--sentences 256] [--repeats 3]

The `small` preset with random weights (vocabulary 8000), converted as the engine converts it
(mtx.decode.ct2_folder); 256 random sources of 15–35 tokens plus EOS; every sentence gets 30 tokens
(min_decoding_length 30, max_decoding_length 31), beam 4 and greedy. The whole file is one asynchronous
translate_batch call cut into batches of --batch-tokens tokens, as Ct2Engine.translate submits a group of
sentences, so a translator of several workers decodes several batches at once. Sentences/s (median of the
repeats) for each layout of --threads threads and each compute type, as JSON lines.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from common import build_model, emit, random_batch, token_strings

from mtx.decode.ct2_folder import convert_to_ctranslate2
from mtx.tokenizer import BOS, PAD


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--sentences", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=30)
    parser.add_argument("--batch-tokens", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import ctranslate2

    strings = token_strings(args.vocab)
    src = random_batch(args.sentences, args.vocab, 15, 35).src
    sources = [[strings[i] for i in row if i != PAD] for row in src.tolist()]
    layouts = sorted({(args.threads, 1), (1, args.threads)})
    with tempfile.TemporaryDirectory() as workdir:
        model = build_model(args.preset, args.vocab)
        for compute_type in ("float32", "int8"):
            path = convert_to_ctranslate2(model, strings, f"{workdir}/{compute_type}",
                                          None if compute_type == "float32" else compute_type)
            for inter, intra in layouts:
                translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type,
                                                    inter_threads=inter, intra_threads=intra)
                for beam in (4, 1):
                    rates = []
                    for _ in range(args.repeats):
                        started = time.perf_counter()
                        pending = translator.translate_batch(
                            sources, max_batch_size=args.batch_tokens, batch_type="tokens", asynchronous=True,
                            beam_size=beam, length_penalty=0.6, min_decoding_length=args.tokens,
                            max_decoding_length=args.tokens + 1, max_input_length=0,
                            suppress_sequences=[[strings[PAD]], [strings[BOS]]])
                        for result in pending:
                            result.result()
                        rates.append(len(sources) / (time.perf_counter() - started))
                    emit(f"ct2_layout.{compute_type}.inter{inter}_intra{intra}.beam{beam}",
                         {"threads": args.threads, "sentences": args.sentences, "batch_tokens": args.batch_tokens},
                         rates, "sentences/s")
                del translator


if __name__ == "__main__":
    main()
