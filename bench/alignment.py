"""Issue 14: alignment error rate of mtx's word alignments on the demo test set, per decoder layer and head.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/alignment.py [-m runs/demo/average.pt] [--data runs/demo/data]

The data folder is a prepared demo run's (`mtx prepare recipes/demo.yaml`), which holds the test split's gold
alignment, `test.align` (mtx.data.demo.words). Each reference German sentence is forced through the decoder and its
cross-attention pooled to words as `mtx translate --alignment` pools it (mtx.analysis.aer.reference_attention): the gold
links are over the reference's words. Precision, recall and AER (Och & Ney, summed over the test set) are
printed as JSON lines for:

  alignment.layer<l>            decoder layer l (0-based), heads averaged: what `--alignment-layer l` gives
  alignment.layer<l>.head<h>    one head alone
  alignment.layers_averaged     every layer's and head's attention averaged
  alignment.diagonal            the monotone baseline: target word j → source word round(j·(m−1)/(n−1))
  alignment.default             the layer `mtx translate --alignment` uses by default, and its figures
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from common import emit_info, set_threads

from mtx.analysis.aer import AlignmentCounts, corpus_counts, diagonal, read_gold, reference_attention
from mtx.checkpoint import load_model
from mtx.decode.request import default_alignment_layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-m", "--checkpoint", default="runs/demo/average.pt")
    parser.add_argument("--data", default="runs/demo/data", help="a prepared demo run's data folder")
    parser.add_argument("--split", default="test")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    set_threads(args.threads)
    data = Path(args.data)
    manifest = json.loads((data / "manifest.json").read_text(encoding="utf-8"))
    sources, targets, gold_lines = (
        (data / f"{args.split}.{suffix}").read_text(encoding="utf-8").splitlines()
        for suffix in (manifest["src_lang"], manifest["tgt_lang"], "align"))
    gold = [read_gold(line) for line in gold_lines]
    model, tokenizer, _ = load_model(args.checkpoint)
    pairs = reference_attention(model, tokenizer, list(zip(sources, targets, strict=True)))
    check_words(pairs, targets)
    layers, heads = pairs[0].words.shape[:2]
    config = {"checkpoint": args.checkpoint, "split": args.split, "sentences": len(pairs), "layers": layers,
              "heads": heads}
    report("alignment.diagonal", config, corpus_counts(
        [diagonal(p.words.shape[3], p.words.shape[2]) for p in pairs], gold))
    for layer in range(layers):
        report(f"alignment.layer{layer}", config, corpus_counts([p.links(p.words[layer].mean(0)) for p in pairs],
                                                                gold))
    report("alignment.layers_averaged", config, corpus_counts([p.links(p.words.mean((0, 1))) for p in pairs], gold))
    for layer in range(layers):
        for head in range(heads):
            report(f"alignment.layer{layer}.head{head}", config,
                   corpus_counts([p.links(p.words[layer, head]) for p in pairs], gold))
    default = default_alignment_layer(layers)
    report("alignment.default", {**config, "layer": default},
           corpus_counts([p.links(p.words[default].mean(0)) for p in pairs], gold))


def check_words(pairs: list, targets: list[str]) -> None:
    """The tokenizer must read the reference's words as the gold alignment counts them."""
    for pair, target in zip(pairs, targets, strict=True):
        if pair.words.shape[2] != len(target.split()):
            raise SystemExit(f"{target!r}: {pair.words.shape[2]} words as tokenized, {len(target.split())} in gold")


def report(name: str, config: dict, counts: AlignmentCounts) -> None:
    emit_info(name, config=config, precision=counts.precision, recall=counts.recall, aer=counts.aer,
              links=counts.proposed, sure=counts.sure)


if __name__ == "__main__":
    with torch.inference_mode():
        main()
