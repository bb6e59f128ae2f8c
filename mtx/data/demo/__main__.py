"""`python -m mtx.data.demo OUT/`: the demo corpus as plain text files, and monolingual text beside it.

Recipes read the demo corpus directly (`data.source.demo`); experiments that need it as files — a reverse model
trained on it (German→English), or monolingual German to back-translate — write it here:

    python -m mtx.data.demo corpus/ --pairs 3000 --monolingual 20000
    → corpus/{train,valid,test}.{en,de}: the corpus `demo: {pairs: 3000, valid: 500, test: 500, seed: 1}` reads
      corpus/mono.de: 20,000 German sentences drawn with --monolingual-seed, none of them a translation of an
      English sentence of the parallel splits (so none is a test sentence's reference)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mtx.config.data import DemoSource
from mtx.data.demo import demo_splits, sample_pairs
from mtx.errors import MtxError


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m mtx.data.demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the folder to write the files to")
    parser.add_argument("--pairs", type=int, default=40000, help="training pairs [default: 40000]")
    parser.add_argument("--valid", type=int, default=500, help="validation pairs [default: 500]")
    parser.add_argument("--test", type=int, default=500, help="test pairs [default: 500]")
    parser.add_argument("--seed", type=int, default=1, help="the corpus' seed, as data.source.demo.seed [default: 1]")
    parser.add_argument("--domain", choices=["all", "numbers", "general"], default="all")
    parser.add_argument("--monolingual", type=int, default=0, metavar="N",
                        help="also write N monolingual sentences to OUT/mono.SIDE [default: none]")
    parser.add_argument("--monolingual-side", choices=["en", "de"], default="de")
    parser.add_argument("--monolingual-seed", type=int, default=2)
    args = parser.parse_args(argv)
    try:
        config = DemoSource(pairs=args.pairs, valid=args.valid, test=args.test, seed=args.seed, domain=args.domain)
        splits = demo_splits(config, key="--pairs")
        args.out.mkdir(parents=True, exist_ok=True)
        for split, pairs in splits.items():
            for side in ("en", "de"):
                _write(args.out / f"{split}.{side}", [getattr(pair, side) for pair in pairs])
        if args.monolingual:
            parallel = {pair.en for pairs in splits.values() for pair in pairs}
            mono = sample_pairs(args.monolingual, args.monolingual_seed, exclude=parallel, domain=args.domain,
                                key="--monolingual")
            _write(args.out / f"mono.{args.monolingual_side}", [getattr(pair, args.monolingual_side) for pair in mono])
    except MtxError as e:
        sys.exit(f"error: {e}")


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


if __name__ == "__main__":
    main()
