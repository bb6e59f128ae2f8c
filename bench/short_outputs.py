"""Why a model's translations run short: the search, or the model?

A beam search whose outputs are shorter than the references either failed to find the longer translation the model
prefers (a search error: the reference scores higher than what the search returned, under the same length
penalty) or found what the model prefers (a model error: the model scores its short output above the reference).
For each checkpoint this measures, on a test set:

- the length ratio (sacreBLEU's, output ÷ reference) of greedy search, of beam 4 with each length penalty, and how
  many outputs are below 0.8 of their reference's tokens ("short");
- search errors: the share of sentences whose reference the model scores above the search's output, overall and
  among the short outputs, with the paper's penalty (GNMT's, α 0.6);
- the model's end of sentence, teacher-forced on the references: P(EOS) where the reference ends, the mean
  P(EOS) inside it, and the share of references where EOS is the model's first choice somewhere before the end
  (where greedy search, fed the reference so far, would stop early).

One JSON line per checkpoint on stdout.

    python bench/short_outputs.py -m runs/quality/en-fr/defaults-seed1/own/step_800.pt \\
        --source runs/real_corpus/en-fr/test.en --reference runs/real_corpus/en-fr/test.fr
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch

from mtx.checkpoint import load_model
from mtx.config.recipe import DecodeConfig
from mtx.data.batching import decoding_batches
from mtx.decode.translator import Translator
from mtx.score.metrics import score
from mtx.tokenizer import BOS, EOS, PAD, normalize_text

SHORT = 0.8  # an output below this share of its reference's tokens is "short"
PENALTIES = (("gnmt", 0.6), ("gnmt", 1.0), ("fairseq", 0.6), ("fairseq", 1.0))


@torch.inference_mode()
def end_of_sentence(model, sources: list[list[int]], references: list[list[int]], batch_tokens: int) -> dict:
    """What the model says of EOS along each reference, teacher-forced."""
    at_end, inside, early = [], [], 0
    for batch in decoding_batches([len(s) for s in sources], [len(r) + 1 for r in references], batch_tokens):
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor(sources[j]) for j in batch], batch_first=True,
                                              padding_value=PAD)
        tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([BOS, *references[j]]) for j in batch],
                                                 batch_first=True, padding_value=PAD)
        log_probs = model.output_logits(model(src, src == PAD, tgt_in)).float().log_softmax(-1)
        for row, j in enumerate(batch):
            n = len(references[j])
            eos = log_probs[row, : n + 1, EOS].exp()
            at_end.append(float(eos[n]))
            inside.extend(eos[:n].tolist())
            early += bool((log_probs[row, :n].argmax(-1) == EOS).any())
    return {"p_eos_at_end": round(statistics.mean(at_end), 4), "p_eos_inside": round(statistics.mean(inside), 4),
            "eos_first_choice_early": round(early / len(references), 4)}


def diagnose(checkpoint: Path, source_lines: list[str], reference_lines: list[str], batch_tokens: int) -> dict:
    model, tokenizer, _ = load_model(checkpoint)
    keep = [i for i, (s, r) in enumerate(zip(source_lines, reference_lines, strict=True))
            if normalize_text(s) and normalize_text(r)]
    sources = [source_lines[i] for i in keep]
    references = [reference_lines[i] for i in keep]
    result: dict = {"name": "short_outputs", "checkpoint": str(checkpoint), "sentences": len(keep)}
    for name, decode in [("greedy", DecodeConfig(beam=1))] + [
            (f"beam4/{style}-{alpha:g}", DecodeConfig(beam=4, lenpen=alpha, lenpen_style=style))
            for style, alpha in PENALTIES]:
        translator = Translator(model, tokenizer, decode, batch_tokens=batch_tokens)
        outputs = [nbest[0] for nbest in translator.translate(sources)]
        scored = score([t.text for t in outputs], [references], ("bleu",))
        given = translator.forced_scores(sources, references)
        short = [len(t.tokens) < SHORT * len(g.tokens) for t, g in zip(outputs, given, strict=True)]
        entry = {"bleu": round(scored["bleu"], 2), "ratio": round(scored["ratio"], 3),
                 "short": round(sum(short) / len(short), 4)}
        if decode.beam > 1:
            better = [g.score > t.score + 1e-5 for t, g in zip(outputs, given, strict=True)]
            entry["search_errors"] = round(sum(better) / len(better), 4)
            entry["search_errors_among_short"] = (round(sum(b for b, s in zip(better, short, strict=True) if s)
                                                        / sum(short), 4) if any(short) else None)
        result[name] = entry
    encoded_sources = [[*ids, EOS] for ids in tokenizer.encode_batch([normalize_text(s) for s in sources])]
    encoded_references = tokenizer.encode_batch([normalize_text(r) for r in references])
    result.update(end_of_sentence(model, encoded_sources, encoded_references, batch_tokens))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--model", type=Path, nargs="+", required=True, help="checkpoints")
    parser.add_argument("--source", type=Path, required=True)
    parser.add_argument("--reference", type=Path, required=True)
    parser.add_argument("--lines", type=int, help="the first N lines only")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    args = parser.parse_args()
    sources = args.source.read_text(encoding="utf-8").splitlines()[: args.lines]
    references = args.reference.read_text(encoding="utf-8").splitlines()[: args.lines]
    for checkpoint in args.model:
        print(json.dumps(diagnose(checkpoint, sources, references, args.batch_tokens)), flush=True)


if __name__ == "__main__":
    main()
