"""Issue 41: BLEU of models trained on noisy, cleaned and clean data at equal updates.

    nice .venv/bin/python bench/cleaning_bleu.py --corpus runs/real_corpus --out runs/cleaning_bleu --steps 800

bench/cleaning.py measures what each filter removes of injected noise; this measures what that is worth. The
first `--pairs` training pairs of `--pair` are the clean pairs; `--noise` as many again are added, made from pairs
further down the corpus by bench/cleaning.py's `inject` (four kinds in equal number: wrong-language targets from
`--other`, shuffled targets, source copies, changed numbers). Three runs of the quality grid's CPU recipe
(bench/multilingual.py's: `tiny`, metaspace BPE 8,000, 4,096-token batches, lr 2e-3, warmup 300), each
`--steps` updates, two at a time on one thread each:

    clean    the clean pairs alone
    noisy    clean + noise, no cleaning filter
    cleaned  clean + noise, every cleaning filter at the setting docs/guides/data.md suggests (bench/cleaning.py's
             `all`), as `mtx prepare` applies them

Each is translated with the average of its last 5 checkpoints (beam 4) on the pair's test set and scored (BLEU,
chrF, length ratio; paired bootstrap against `noisy`). Resumable like bench/multilingual.py; JSON lines on stdout,
a markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from cleaning import SUGGESTED, inject, read
from multilingual import SAVE_EVERY, averaged_run, paired_p, translated

RUNS = ("clean", "noisy", "cleaned")


def corpus(args: argparse.Namespace) -> dict[str, list[str]]:
    """The training files of the clean and the noisy corpus, written once under --out."""
    src, tgt = args.pair.split("-")
    files = {name: [str(args.out / f"{name}.{lang}") for lang in (src, tgt)] for name in ("clean", "noisy")}
    if all(Path(path).exists() for paths in files.values() for path in paths):
        return files
    args.out.mkdir(parents=True, exist_ok=True)
    sources = read(args.corpus / args.pair / f"train.{src}")
    targets = read(args.corpus / args.pair / f"train.{tgt}")
    other = read(args.corpus / args.other / f"train.{args.other.split('-')[1]}")
    clean = list(zip(sources[: args.pairs], targets[: args.pairs], strict=True))
    noise = [pair for pairs in inject(sources[args.pairs:], targets[args.pairs:], other, int(args.pairs * args.noise),
                                      args.seed).values() for pair in pairs]
    for name, pairs in (("clean", clean), ("noisy", clean + noise)):
        for side, path in enumerate(files[name]):
            Path(path).write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    return files


def recipe(name: str, run: Path, train: list[str], args: argparse.Namespace) -> dict[str, Any]:
    src, tgt = args.pair.split("-")
    test = [str(args.corpus / args.pair / f"test.{lang}") for lang in (src, tgt)]
    cleaning = {k: v for change in SUGGESTED.values() for k, v in change.items()} if name == "cleaned" else {}
    return {"name": f"{name}-seed{args.seed}", "run_dir": str(run), "seed": args.seed,
            "data": {"source": {"files": {"train": train, "test": test}}, "src_lang": src, "tgt_lang": tgt,
                     "filter": {"min_len": 1, "max_len": 250, "max_ratio": 0, "dedup": True, **cleaning},
                     "bpe": {"vocab_size": 8000}},
            "model": {"preset": "tiny"},
            "train": {"max_tokens": 4096, "lr": 2e-3, "warmup": 300, "max_steps": args.steps,
                      "save_every": SAVE_EVERY, "keep_last": 0, "log_every": 100, "device": "cpu"}}


def measured(name: str, args: argparse.Namespace, files: dict[str, list[str]]) -> dict[str, Any]:
    run = args.out / f"{name}-seed{args.seed}"
    result_file = run / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    src, tgt = args.pair.split("-")
    averaged = averaged_run(run, recipe(name, run, files["clean" if name == "clean" else "noisy"], args), args.steps)
    scores = translated(averaged, args.corpus / args.pair / f"test.{src}", args.corpus / args.pair / f"test.{tgt}",
                        run / f"test.{tgt}")
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    result = {"name": "cleaning_bleu.run", "run": name, "pair": args.pair, "seed": args.seed, "steps": args.steps,
              "train_pairs": manifest["splits"]["train"]["pairs"], "dropped": manifest["filter"]["dropped"], **scores}
    result_file.write_text(json.dumps(result))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("runs/real_corpus"))
    parser.add_argument("--out", type=Path, default=Path("runs/cleaning_bleu"))
    parser.add_argument("--pair", default="en-de")
    parser.add_argument("--other", default="en-fr")
    parser.add_argument("--pairs", type=int, default=120_000)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.corpus, args.out = args.corpus.resolve(), args.out.resolve()
    files = corpus(args)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda name: measured(name, args, files), RUNS))
    for result in results:
        print(json.dumps(result), flush=True)
    tgt = args.pair.split("-")[1]
    lines = ["| training data | pairs trained on | BLEU | chrF | length ratio | p against noisy |",
             "|---|---|---|---|---|---|"]
    for result in results:
        p = "" if result["run"] == "noisy" else paired_p(args.out / f"{result['run']}-seed{args.seed}" / f"test.{tgt}",
                                                          args.out / f"noisy-seed{args.seed}" / f"test.{tgt}",
                                                          args.corpus / args.pair / f"test.{tgt}")
        lines.append(f"| {result['run']} | {result['train_pairs']:,} | {result['bleu']:.2f} | {result['chrf']:.2f} | "
                     f"{result['ratio']:.3f} | {p} |")
    (args.out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
