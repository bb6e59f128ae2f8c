"""Issues 41 and 56: BLEU of models trained on noisy, cleaned, model-scored and clean data at equal updates.

    nice .venv/bin/python bench/cleaning_bleu.py --corpus runs/real_corpus --out runs/cleaning_bleu --steps 800

bench/cleaning.py measures what each filter removes of injected noise; this measures what that is worth. The
first `--pairs` training pairs of `--pair` are the clean pairs; `--noise` as many again are added, made from pairs
further down the corpus by bench/cleaning.py's `inject` (four kinds in equal number: wrong-language targets from
`--other`, shuffled targets, source copies, changed numbers), and `--long` pairs of a crawl's run-on lines, half
with a source and half with a target of LONG_TIMES the model's positions in words (so at least as many tokens),
sentences further down the corpus run together. Four runs of the quality grid's CPU recipe
(bench/multilingual.py's: `tiny`, metaspace BPE 8,000, 4,096-token batches, lr 2e-3, warmup 300), each
`--steps` updates, two at a time on one thread each:

    clean    the clean pairs alone
    noisy    clean + noise, no cleaning filter
    cleaned  clean + noise, every cleaning filter at the setting docs/guides/data.md suggests (bench/cleaning.py's
             `all`), as `mtx prepare` applies them
    scored   clean + noise, each pair scored by the clean run's model (`mtx translate --score-reference --format
             jsonl`) and the best `--keep-best` of them kept (the files source's keep_best), no cleaning filter

The clean and noisy runs train first, side by side; then the clean model scores the noisy pairs while the
cleaned run trains, and the scored run trains beside it. Each is translated with the average of its last 5
checkpoints (beam 4) on the pair's test set and scored (BLEU, chrF, length ratio; paired bootstrap against
`noisy`). The scored run also reports the scoring's pairs/s and, by kind of noise, the share keep_best dropped.
Resumable like bench/multilingual.py; JSON lines on stdout, markdown tables at the end.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
from cleaning import KINDS, SUGGESTED, inject, read
from multilingual import SAVE_EVERY, averaged_run, mtx, paired_p, say, translated

from mtx.config.model import PRESET_COMMON

RUNS = (("clean", "noisy"), ("cleaned", "scored"))  # the runs trained side by side; scored needs clean's model
LONG_KINDS = ("long_source", "long_target")
LONG_TIMES = 10  # a long line's words, in times the model's positions


def corpus(args: argparse.Namespace) -> dict[str, Any]:
    """The training files of the clean and the noisy corpus, written once under --out, and the noisy corpus'
    layout: its kinds of pairs in order (clean, then each kind of noise), with their counts."""
    src, tgt = args.pair.split("-")
    files: dict[str, Any] = {name: [str(args.out / f"{name}.{lang}") for lang in (src, tgt)]
                             for name in ("clean", "noisy")}
    layout_file = args.out / "layout.json"
    if layout_file.exists():
        return {**files, "layout": json.loads(layout_file.read_text())}
    args.out.mkdir(parents=True, exist_ok=True)
    sources = read(args.corpus / args.pair / f"train.{src}")
    targets = read(args.corpus / args.pair / f"train.{tgt}")
    other = read(args.corpus / args.other / f"train.{args.other.split('-')[1]}")
    clean = list(zip(sources[: args.pairs], targets[: args.pairs], strict=True))
    noise = inject(sources[args.pairs:], targets[args.pairs:], other, int(args.pairs * args.noise), args.seed)
    noise.update(long_lines(sources[args.pairs:], targets[args.pairs:], args.long,
                            LONG_TIMES * PRESET_COMMON["max_positions"], args.seed))
    noisy = clean + [pair for kind in (*KINDS, *LONG_KINDS) for pair in noise[kind]]
    for name, pairs in (("clean", clean), ("noisy", noisy)):
        for side, path in enumerate(files[name]):
            Path(path).write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    layout = [["clean", len(clean)], *([kind, len(noise[kind])] for kind in (*KINDS, *LONG_KINDS))]
    layout_file.write_text(json.dumps(layout))
    return {**files, "layout": layout}


def long_lines(sources: list[str], targets: list[str], count: int, words: int, seed: int
               ) -> dict[str, list[tuple[str, str]]]:
    """`count` pairs of a crawl's run-on lines made from the pairs given (none of them among the clean): half
    `long_source` (the source is consecutive sentences run together to at least `words` words on that side, the
    target one sentence) and half `long_target` (the other way round), each starting at a random pair."""
    rng = random.Random(seed)
    long: dict[str, list[tuple[str, str]]] = {kind: [] for kind in LONG_KINDS}
    for n in range(count):
        kind = LONG_KINDS[n % 2]
        side = sources if kind == "long_source" else targets
        first = rng.randrange(len(side))
        run_on, length = [], 0
        for i in itertools.islice(itertools.cycle(range(len(side))), first, None):
            run_on.append(side[i])
            length += len(side[i].split())
            if length >= words:
                break
        pair = (" ".join(run_on), targets[first]) if kind == "long_source" else (sources[first], " ".join(run_on))
        long[kind].append(pair)
    return long


def recipe(name: str, run: Path, train: list[str], args: argparse.Namespace) -> dict[str, Any]:
    src, tgt = args.pair.split("-")
    test = [str(args.corpus / args.pair / f"test.{lang}") for lang in (src, tgt)]
    cleaning = {k: v for change in SUGGESTED.values() for k, v in change.items()} if name == "cleaned" else {}
    files = {"train": train, "test": test, **({"keep_best": args.keep_best} if name == "scored" else {})}
    return {"name": f"{name}-seed{args.seed}", "run_dir": str(run), "seed": args.seed,
            "data": {"source": {"files": files}, "src_lang": src, "tgt_lang": tgt,
                     "filter": {"min_len": 1, "max_len": 250, "max_ratio": 0, "dedup": True, **cleaning},
                     "bpe": {"vocab_size": 8000}},
            "model": {"preset": "tiny"},
            "train": {"max_tokens": 4096, "lr": 2e-3, "warmup": 300, "max_steps": args.steps,
                      "save_every": SAVE_EVERY, "keep_last": 0, "log_every": 100, "device": "cpu"}}


def measured(name: str, args: argparse.Namespace, files: dict[str, Any]) -> dict[str, Any]:
    run = args.out / f"{name}-seed{args.seed}"
    result_file = run / "result.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    src, tgt = args.pair.split("-")
    train, scoring = files["clean" if name == "clean" else "noisy"], {}
    if name == "scored":
        train, scoring = scored_pairs(args, files)
    averaged = averaged_run(run, recipe(name, run, train, args), args.steps)
    scores = translated(averaged, args.corpus / args.pair / f"test.{src}", args.corpus / args.pair / f"test.{tgt}",
                        run / f"test.{tgt}")
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    result = {"name": "cleaning_bleu.run", "run": name, "pair": args.pair, "seed": args.seed, "steps": args.steps,
              "train_pairs": manifest["splits"]["train"]["pairs"], "dropped": manifest["filter"]["dropped"],
              **scoring, **scores}
    result_file.write_text(json.dumps(result))
    return result


def scored_pairs(args: argparse.Namespace, files: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
    """The noisy pairs scored by the clean run's model, once: the training files of the scored run (the source
    file and the scores' jsonl), and what the scoring measured (its pairs/s on two threads; per kind of pair, the
    share that keep_best drops, ranked as mtx.data.corpora ranks them)."""
    scores = args.out / "noisy.scored.jsonl"
    timing = args.out / "scoring.json"
    if not timing.exists():
        scorer = args.out / f"clean-seed{args.seed}" / f"average_{args.steps}.pt"
        say(f"score the noisy pairs with {scorer}")
        started = time.perf_counter()
        mtx("translate", "-m", str(scorer), "-i", files["noisy"][0], "--score-reference", files["noisy"][1],
            "--format", "jsonl", "-o", str(scores), "--threads", "2", "--batch-tokens", "8192")
        timing.write_text(json.dumps(time.perf_counter() - started))
    seconds = json.loads(timing.read_text())
    lines = [json.loads(line) for line in scores.read_text(encoding="utf-8").splitlines()]
    confidence = np.array([np.nan if line["token_log_probs"] is None else
                           np.mean(line["token_log_probs"]) if line["token_log_probs"] else -np.inf
                           for line in lines])
    scored = np.flatnonzero(~np.isnan(confidence))
    kept = np.zeros(len(lines), dtype=bool)
    kept[scored[np.argsort(-confidence[scored], kind="stable")[:round(args.keep_best * len(lines))]]] = True
    dropped, start = {}, 0
    for kind, count in files["layout"]:
        dropped[kind] = round(1 - float(kept[start:start + count].mean()), 4)
        start += count
    flagged = sum("too_long_to_score" in line["flags"] for line in lines)
    return ([files["noisy"][0], str(scores)],
            {"scoring_seconds": round(seconds, 1), "scoring_pairs_per_s": round(len(lines) / seconds),
             "flagged_too_long": flagged, "keep_best": args.keep_best, "kind_dropped": dropped})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("runs/real_corpus"))
    parser.add_argument("--out", type=Path, default=Path("runs/cleaning_bleu"))
    parser.add_argument("--pair", default="en-de")
    parser.add_argument("--other", default="en-fr")
    parser.add_argument("--pairs", type=int, default=120_000)
    parser.add_argument("--noise", type=float, default=0.2)
    parser.add_argument("--long", type=int, default=100, help="pairs with a run-on source or target line")
    parser.add_argument("--keep-best", type=float, default=0.85, help="the scored run's keep_best")
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.corpus, args.out = args.corpus.resolve(), args.out.resolve()
    files = corpus(args)
    results = []
    with ThreadPoolExecutor(2) as pool:
        for side_by_side in RUNS:
            results += pool.map(lambda name: measured(name, args, files), side_by_side)
    for result in results:
        print(json.dumps(result), flush=True)
    tgt = args.pair.split("-")[1]
    lines = ["| training data | pairs trained on | BLEU | chrF | length ratio | p against noisy |",
             "|---|---|---|---|---|---|"]
    for result in sorted(results, key=lambda result: result["bleu"]):
        p = "" if result["run"] == "noisy" else paired_p(args.out / f"{result['run']}-seed{args.seed}" / f"test.{tgt}",
                                                          args.out / f"noisy-seed{args.seed}" / f"test.{tgt}",
                                                          args.corpus / args.pair / f"test.{tgt}")
        lines.append(f"| {result['run']} | {result['train_pairs']:,} | {result['bleu']:.2f} | {result['chrf']:.2f} | "
                     f"{result['ratio']:.3f} | {p} |")
    scoring = next(result for result in results if result["run"] == "scored")
    kinds = [kind for kind, _ in files["layout"]]
    lines += ["", f"| keep_best {scoring['keep_best']}: dropped of | {' | '.join(kinds)} |",
              f"|---|{'---|' * len(kinds)}",
              f"| share | {' | '.join(str(scoring['kind_dropped'][kind]) for kind in kinds)} |",
              "", f"Scoring: {scoring['scoring_pairs_per_s']:,} pairs/s on two threads "
              f"({scoring['scoring_seconds']} s); "
              f"flagged too_long_to_score: {scoring['flagged_too_long']}; manifest drops: "
              f"{ {k: v for k, v in scoring['dropped'].items() if v} }"]
    (args.out / "summary.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
