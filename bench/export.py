"""Issue 15: the CTranslate2 export of the demo model against `mtx translate`, beam 4, in the same run.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/export.py [--model runs/demo/average.pt] [--repeats 5]

The model is exported with `mtx export --to ctranslate2` (mtx.export) into a temporary folder, float32 and int8,
and the demo test set (runs/demo/data/test.en) is translated with beam 4 and the recipe's length penalty by:

  mtx.fp32 / mtx.int8   `mtx.decode.translator.Translator` (what `mtx translate` runs), --dtype fp32 / int8
  ct2.fp32 / ct2.int8   `ctranslate2.Translator` on the exported folders, with the exported tokenizer, batches of
                        4096 tokens as mtx's --batch-tokens, one worker on all the threads

Sentences/s (median of the repeats, interleaved) and the BLEU of each against runs/demo/data/test.de; the
issue's bar is int8 within 0.5 BLEU of mtx's own (fp32) translation.

Before timing, the exports must decode as mtx does: greedy decoding of the whole test set by CTranslate2 float32
and, where transformers is installed, by the `--to hf` export's `generate`, token for token against mtx's own
greedy decoding (an `export.*.greedy_identical` line each: sentences identical, of all).
"""

from __future__ import annotations

import argparse
import copy
import tempfile
from pathlib import Path

import torch
from common import emit, emit_info, emit_skip, peers_missing, set_threads, time_interleaved

from mtx.checkpoint import load_model
from mtx.config.recipe import DecodeConfig
from mtx.decode.translator import Translator, prepare_model
from mtx.export.command import export_checkpoint
from mtx.score.metrics import corpus_bleu

BLEU_BAR = 0.5  # a quantized export's BLEU at most this far below mtx's


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, default=Path("runs/demo/average.pt"))
    parser.add_argument("--data", type=Path, default=Path("runs/demo/data"), help="holds test.en and test.de")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    config = {"model": str(args.model), "beam": 4, "threads": args.threads}
    if peers_missing("ctranslate2"):
        emit_skip("export", "not installed here: ctranslate2 (pip install 'mtx[export]')", config)
        return
    sources = (args.data / "test.en").read_text(encoding="utf-8").splitlines()
    references = (args.data / "test.de").read_text(encoding="utf-8").splitlines()
    model, tokenizer, checkpoint = load_model(args.model)
    decode = DecodeConfig.of_checkpoint(checkpoint, beam=4)
    outputs: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as workdir:
        check_greedy_tokens(args.model, model, tokenizer, sources, Path(workdir))
        systems = {  # each model as mtx translate prepares it
            f"mtx.{dtype}": mtx_system(Translator(prepare_model(copy.deepcopy(model), torch.device("cpu"), dtype),
                                                  tokenizer, decode, 4096))
            for dtype in ("fp32", "int8")
        }
        for name, quantization in (("ct2.fp32", None), ("ct2.int8", "int8")):
            folder = Path(workdir) / name
            export_checkpoint(args.model, "ctranslate2", folder, quantization=quantization)
            systems[name] = ct2_system(folder, decode, args.threads)
        set_threads(args.threads)  # a CTranslate2 Translator sets OpenMP's thread count for the whole process
        runs = {name: (lambda system=system, name=name: outputs.__setitem__(name, system(sources)))
                for name, system in systems.items()}
        seconds = time_interleaved(runs, args.repeats)
    bleu = {name: corpus_bleu(hyps, references) for name, hyps in outputs.items()}
    for name, samples in seconds.items():
        emit(f"export.{name}.sentences_per_s", {**config, "system": name}, [len(sources) / s for s in samples],
             "sentences/s", bleu=round(bleu[name], 2))
    for name in ("mtx.int8", "ct2.fp32", "ct2.int8"):
        gap = bleu["mtx.fp32"] - bleu[name]
        emit_info(f"export.{name}.bleu_below_mtx_fp32", gap=gap, bar=BLEU_BAR, met=gap <= BLEU_BAR)


def check_greedy_tokens(path: Path, model: torch.nn.Module, tokenizer, sources: list[str], workdir: Path) -> None:
    """Greedy decoding of `sources` by each export, token for token against mtx's (EOS excluded)."""
    import ctranslate2
    from tokenizers import Tokenizer

    greedy = DecodeConfig(beam=1, max_len_a=0.0, max_len_b=200)
    expected = [list(nbest[0].tokens) if nbest else [] for nbest in Translator(model, tokenizer, greedy).translate(
        sources)]
    folder = workdir / "greedy.ct2"
    export_checkpoint(path, "ctranslate2", folder)
    exported = Tokenizer.from_file(str(folder / "tokenizer.json"))
    exported.encode_special_tokens = True
    results = ctranslate2.Translator(str(folder), device="cpu").translate_batch(
        [encoding.tokens for encoding in exported.encode_batch(sources)], beam_size=1,
        max_decoding_length=greedy.max_len_b,  # tokens before EOS, as mtx's cap: a sentence that loops stops at both
        suppress_sequences=[["<pad>"], ["<s>"]])
    found = {"ct2.fp32": [[exported.token_to_id(t) for t in r.hypotheses[0]] for r in results]}
    if not peers_missing("transformers", "safetensors"):
        found["hf"] = hf_greedy(path, sources, workdir / "greedy.hf")
    for name, tokens in found.items():
        emit_info(f"export.{name}.greedy_identical", identical=sum(a == b for a, b in zip(tokens, expected,
                                                                                        strict=True)),
                  of=len(sources))


def hf_greedy(path: Path, sources: list[str], folder: Path) -> list[list[int]]:
    """The `--to hf` export's greedy tokens, as its model card's lines decode (start token and EOS dropped)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    export_checkpoint(path, "hf", folder)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    outputs = []
    for start in range(0, len(sources), 64):
        batch = tokenizer(sources[start : start + 64], return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(**batch, num_beams=1, do_sample=False, max_new_tokens=201)
        for row in generated.tolist():
            outputs.append([t for t in row[1:] if t not in (tokenizer.eos_token_id, tokenizer.pad_token_id)])
    return outputs


def mtx_system(translator: Translator):
    return lambda sentences: [nbest[0].text if nbest else "" for nbest in translator.translate(sentences)]


def ct2_system(folder: Path, decode: DecodeConfig, threads: int):
    """Translate with the exported folder as its README shows, in batches of 4096 tokens."""
    import ctranslate2
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.encode_special_tokens = True
    translator = ctranslate2.Translator(str(folder), device="cpu", intra_threads=threads, inter_threads=1)

    def translate(sentences: list[str]) -> list[str]:
        tokens = [encoding.tokens for encoding in tokenizer.encode_batch(sentences)]
        results = translator.translate_batch(tokens, beam_size=decode.beam, length_penalty=decode.lenpen,
                                             suppress_sequences=[["<pad>"], ["<s>"]], max_batch_size=4096,
                                             batch_type="tokens")
        return tokenizer.decode_batch([[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results])

    return translate


if __name__ == "__main__":
    main()
