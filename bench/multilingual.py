"""One model for en→de and en→fr against two bilingual models of the same size at the same total updates.

A multilingual model (data.target_tag, mtx.decode.target_lang) serves several directions from one deployment;
what it costs in quality at a fixed compute budget is the question. So on the real-data corpus
(bench/real_corpus.py), with the quality grid's CPU recipe (bench/quality.py: `tiny`, metaspace BPE 8,000,
4,096-token batches, lr 2e-3, warmup 300), this trains:

- `en-de` and `en-fr`: one bilingual model each, `--steps` updates each;
- `multi`: one model on both corpora (each source tagged <2de> or <2fr>), 2 × `--steps` updates, so that the
  three runs' updates balance: the multilingual model costs what the two bilingual ones cost together. Its
  vocabulary is one of the same size over three languages, and it validates each pair on its own.

Each model is translated with the average of its last 5 checkpoints (50 updates apart) and the recipe's decoding
defaults (beam 4), each pair's test set as the corpus gives it (the multilingual one with --target-lang), and
scored with BLEU, chrF and the length ratio, with sacreBLEU's paired bootstrap of the multilingual model against
the bilingual one. Two runs train at a time, one thread each: `en-de` then `en-fr` on one lane, `multi` on the
other. Resumable: a result is a file under --out, written once; a run that stopped trains on from its last
checkpoint. One JSON line per result on stdout, progress on stderr, a markdown table at the end.

    nice .venv/bin/python bench/multilingual.py --corpus runs/real_corpus --out runs/multilingual --steps 800
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

from mtx.score.metrics import score

ROOT = Path(__file__).resolve().parent.parent
MTX = [sys.executable, "-m", "mtx"]
PAIRS = ("en-de", "en-fr")
AVERAGED, SAVE_EVERY = 5, 50
VALID_LINES = 200  # each pair's valid sentences decoded at a validation


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def mtx(*command: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([*MTX, *command], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mtx {' '.join(command)} failed:\n{done.stderr[-3000:]}")


def corpus_files(corpus: Path, out: Path, pair: str) -> dict[str, list[str]]:
    """A pair's train and test files as the corpus has them, and the first VALID_LINES of its valid set."""
    src, tgt = pair.split("-")
    short = out / "valid"
    short.mkdir(parents=True, exist_ok=True)
    for lang in (src, tgt):
        kept = short / f"{pair}.{lang}"
        if not kept.exists():
            kept.write_text("".join(line + "\n" for line in lines(corpus / pair / f"valid.{lang}")[:VALID_LINES]),
                            encoding="utf-8")
    return {"train": [str(corpus / pair / f"train.{lang}") for lang in (src, tgt)],
            "valid": [str(short / f"{pair}.{lang}") for lang in (src, tgt)],
            "test": [str(corpus / pair / f"test.{lang}") for lang in (src, tgt)]}


def recipe(name: str, run: Path, corpus: Path, out: Path, steps: int, seed: int) -> dict[str, Any]:
    """The quality grid's CPU recipe for one run: a bilingual pair (`en-de`, `en-fr`) or `multi`."""
    if name == "multi":
        data = {"sources": [{"files": corpus_files(corpus, out, pair), "name": pair, "tgt_lang": pair.split("-")[1]}
                            for pair in PAIRS], "src_lang": "en", "tgt_lang": "de", "target_tag": "<2{lang}>"}
    else:
        src, tgt = name.split("-")
        data = {"source": {"files": corpus_files(corpus, out, name)}, "src_lang": src, "tgt_lang": tgt}
    data.update(filter={"min_len": 1, "max_len": 250, "max_ratio": 0, "dedup": True}, bpe={"vocab_size": 8000})
    return {"name": f"{name}-seed{seed}", "run_dir": str(run), "seed": seed, "data": data,
            "model": {"preset": "tiny"},
            "train": {"max_tokens": 4096, "lr": 2e-3, "warmup": 300, "max_steps": steps, "save_every": SAVE_EVERY,
                      "keep_last": 0, "validate_every": 400, "log_every": 100, "device": "cpu", "valid_beam": 4}}


def trained(name: str, args: argparse.Namespace, seed: int) -> Path:
    """The run's averaged checkpoint, trained and averaged once."""
    steps = args.steps * (len(PAIRS) if name == "multi" else 1)
    run = args.out / f"{name}-seed{seed}"
    return averaged_run(run, recipe(name, run, args.corpus, args.out, steps, seed), steps)


def averaged_run(run: Path, recipe: dict[str, Any], steps: int) -> Path:
    """The average of the last AVERAGED checkpoints of `recipe`'s run, prepared and trained to `steps` updates;
    each step done once (an interrupted training resumes)."""
    averaged = run / f"average_{steps}.pt"
    if averaged.exists():
        return averaged
    run.mkdir(parents=True, exist_ok=True)
    path = run / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    say(f"prepare and train {run.name} to {steps} updates")
    started = time.perf_counter()
    mtx("prepare", str(path))
    mtx("train", str(path))
    (run / "train-seconds.json").write_text(json.dumps(time.perf_counter() - started))
    last = [run / "checkpoints" / f"step_{steps - k * SAVE_EVERY}.pt" for k in reversed(range(AVERAGED))]
    mtx("average", *map(str, last), "-o", str(averaged))
    return averaged


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def translated(checkpoint: Path, source: Path, reference: Path, hypothesis: Path, *flags: str) -> dict[str, float]:
    """`source` translated by `checkpoint` into `hypothesis` (beam 4, the recipe's decoding), scored against
    `reference`: BLEU, chrF and the length ratio, rounded as the tables show them."""
    mtx("translate", "-m", str(checkpoint), "-i", str(source), "-o", str(hypothesis), "--threads", "1",
        "--batch-tokens", "8192", *flags)
    scored = score(lines(hypothesis), [lines(reference)], ("bleu", "chrf"))
    return {"bleu": round(scored["bleu"], 2), "chrf": round(scored["chrf"], 2), "ratio": round(scored["ratio"], 3)}


def paired_p(hypothesis: Path, baseline: Path, reference: Path) -> str:
    """sacreBLEU's paired bootstrap p of `hypothesis`'s BLEU against `baseline`'s, as the tables show it."""
    scored = score(lines(hypothesis), [lines(reference)], ("bleu",), baseline=lines(baseline))
    return f"{scored['baseline']['p_value']['bleu']:.3f}"


def measured(name: str, pair: str, args: argparse.Namespace, seed: int, checkpoint: Path) -> dict[str, Any]:
    """One model's translation of one pair's test set, scored; kept in a file."""
    run = checkpoint.parent
    result_file = run / f"result-{pair}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    src, tgt = pair.split("-")
    chosen = ["--target-lang", tgt] if name == "multi" else []
    scores = translated(checkpoint, args.corpus / pair / f"test.{src}", args.corpus / pair / f"test.{tgt}",
                        run / f"test-{pair}.{tgt}", *chosen)
    result = {"name": "multilingual.run", "model": name, "pair": pair, "seed": seed, "steps": args.steps, **scores,
              "train_seconds": round(json.loads((run / "train-seconds.json").read_text()), 1)}
    result_file.write_text(json.dumps(result))
    return result


def lane(names: list[str], args: argparse.Namespace, seed: int) -> list[dict[str, Any]]:
    results = []
    for name in names:
        checkpoint = trained(name, args, seed)
        for pair in (PAIRS if name == "multi" else [name]):
            results.append(measured(name, pair, args, seed, checkpoint))
            print(json.dumps(results[-1]), flush=True)
    return results


def table(args: argparse.Namespace, results: list[dict[str, Any]]) -> str:
    """Each pair's bilingual and multilingual rows, with the bootstrap p of the multilingual against the other."""
    rows = ["| pair | model | updates | BLEU | chrF | length ratio | p |", "|---|---|---|---|---|---|---|"]
    for result in sorted(results, key=lambda r: (r["pair"], r["model"] == "multi", r["seed"])):
        pair, seed = result["pair"], result["seed"]
        tgt = pair.split("-")[1]
        p = ""
        if result["model"] == "multi":
            p = paired_p(args.out / f"multi-seed{seed}" / f"test-{pair}.{tgt}",
                         args.out / f"{pair}-seed{seed}" / f"test-{pair}.{tgt}", args.corpus / pair / f"test.{tgt}")
        updates = args.steps * (len(PAIRS) if result["model"] == "multi" else 1)
        model = "en→{de, fr}" if result["model"] == "multi" else pair.replace("-", "→")
        rows.append(f"| {pair} | {model} (seed {seed}) | {updates:,} | {result['bleu']:.2f} | {result['chrf']:.2f} "
                     f"| {result['ratio']:.3f} | {p} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("runs/real_corpus"))
    parser.add_argument("--out", type=Path, default=Path("runs/multilingual"))
    parser.add_argument("--steps", type=int, default=800, help="each bilingual model's updates; multi gets twice")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    args.corpus, args.out = args.corpus.resolve(), args.out.resolve()
    if args.steps % SAVE_EVERY or args.steps < AVERAGED * SAVE_EVERY:
        raise SystemExit(f"--steps must be a multiple of {SAVE_EVERY} and at least {AVERAGED * SAVE_EVERY}")
    with ThreadPoolExecutor(2) as pool:
        lanes = [pool.submit(lane, list(PAIRS), args, args.seed), pool.submit(lane, ["multi"], args, args.seed)]
        results = [result for done in lanes for result in done.result()]
    summary = table(args, results)
    (args.out / "summary.md").write_text(summary + "\n", encoding="utf-8")
    print(summary)


if __name__ == "__main__":
    main()
