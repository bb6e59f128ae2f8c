"""What BPE-dropout (`train.bpe_dropout`) costs the host: seconds per epoch at WMT14 En-De scale.

Each epoch, the trainer's collation thread (or its worker processes, train.bpe_dropout_workers) segments every
training sentence anew with merges dropped (mtx.data.bpe_dropout). This times exactly that — `collate` over a
`DroppedOutSplit` of a prepared split, batch by batch as the trainer cuts them, in this process and then
through `SegmentingWorkers` — on a WMT-shaped synthetic corpus (bench/prepare.py's: Zipf pseudo-words, 5–40 a
sentence) with the recipes' 37k vocabulary, for each BPE style, or on the lines of a real corpus (--text).
Two epochs are timed, since the segmenter remembers the merge steps of the word states it has met: the first
is cold, the second is what the rest of a run costs. The figure per pair is scaled to WMT14 En-De's 4.5M
pairs; the ratio of tokens per stored token is reported too (batches hold that many more tokens than they
were cut for).

    OMP_WAIT_POLICY=PASSIVE python bench/bpe_dropout_cost.py --pairs 200000 --rate 0.1 --workers 0 2
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import yaml
from prepare import write_corpus
from rich.console import Console

from mtx.config.loading import load_recipe
from mtx.data.batching import collate, make_batches
from mtx.data.bpe_dropout import BpeDropout, DroppedOutSplit, SegmentingWorkers
from mtx.data.prepare import prepare
from mtx.data.prepared import load_split
from mtx.tokenizer import Tokenizer

WMT14_EN_DE_PAIRS = 4_500_000


def prepared_split(folder: Path, style: str, vocab_size: int) -> tuple[Path, Tokenizer]:
    recipe = {"name": f"bench-{style}", "run_dir": str(folder / style),
              "data": {"source": {"files": {"train": [str(folder / "train.src"), str(folder / "train.tgt")]}},
                       "bpe": {"vocab_size": vocab_size, "style": style}}}
    path = folder / f"{style}.yaml"
    path.write_text(yaml.safe_dump(recipe), encoding="utf-8")
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    data = folder / style / "data"
    return data, Tokenizer.from_file(data / "tokenizer.json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=200_000, help="pairs of the synthetic corpus, all timed")
    parser.add_argument("--rate", type=float, default=0.1)
    parser.add_argument("--vocab-size", type=int, default=37_000)
    parser.add_argument("--max-tokens", type=int, default=28_672, help="the batches' budget (the recipes')")
    parser.add_argument("--styles", nargs="+", default=["bytelevel", "metaspace"])
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2],
                        help="0: in this process, as the collation thread; N: through N worker processes")
    parser.add_argument("--text", type=Path, nargs=2, help="source and target files of a real corpus instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        if args.text:
            for name, path in zip(("train.src", "train.tgt"), args.text, strict=True):
                (folder / name).symlink_to(path.resolve())
        else:
            write_corpus(folder, args.pairs)
        for style in args.styles:
            data, tokenizer = prepared_split(folder, style, args.vocab_size)
            split = load_split(data, "train")
            batches = make_batches(split.src_lens, split.tgt_lens, args.max_tokens, seed=1)
            dropout = BpeDropout(tokenizer, args.rate, seed=1)
            stored = int(split.src_lens.sum() + split.tgt_lens.sum())
            for workers in args.workers:
                pool = SegmentingWorkers(workers, data, dropout, max_positions=1024) if workers else None
                for epoch in (1, 2):
                    started, tokens = time.perf_counter(), 0
                    if pool is None:
                        epoch_split = DroppedOutSplit(split, dropout, epoch, max_positions=1024)
                        collated = (collate(epoch_split, indices) for indices in batches)
                    else:
                        collated = (future.result() for future in [pool.submit(epoch, b) for b in batches])
                    for batch in collated:
                        tokens += int((~batch.src_pad).sum()) + batch.n_tgt_tokens - 2 * len(batch.src)  # no EOS
                    per_pair = (time.perf_counter() - started) / len(split)
                    print(json.dumps({
                        "name": "bpe_dropout.epoch", "style": style, "rate": args.rate, "workers": workers,
                        "epoch": epoch, "pairs": len(split), "vocab_size": tokenizer.vocab_size,
                        "stored_tokens_per_pair": round(stored / len(split), 1),
                        "tokens_per_stored_token": round(tokens / stored, 3),
                        "us_per_pair": round(per_pair * 1e6, 1),
                        "seconds_per_wmt14_en_de_epoch": round(per_pair * WMT14_EN_DE_PAIRS),
                    }), flush=True)
                if pool is not None:
                    pool.close()


if __name__ == "__main__":
    main()
