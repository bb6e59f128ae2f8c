"""Which vocabulary style to use: byte-level BPE, metaspace BPE, metaspace unigram, metaspace BPE with BPE-dropout.

On the real-data corpus (bench/real_corpus.py: human translations of Debian's message catalogs), each style's
vocabulary is learnt at the same size for en-de and en-fr and its tokens per sentence counted per language (what
an epoch costs, and how long attention's sequences are). Then, for one language pair, a model of one preset is
trained with each style for the same number of updates and seeds, and measured on the held-out test set:

- valid loss per *sentence* (the per-token nll × the valid target tokens, EOS included, ÷ sentences): per token
  it is not comparable, since the styles cut the same text into different numbers of tokens;
- test BLEU and chrF (sacreBLEU, beam 4), and the length ratio (hypothesis ÷ reference, sacreBLEU's) at 3/4 of
  the budget and at its end: if it still moves, outputs have not stopped shortening and the budget is too small;
- training wall time (each run alone in its process, `--threads` threads, runs `--parallel` at a time).

One JSON line per measurement on stdout; a finished run is not trained again (delete its folder to redo it), and
one run again with a larger --steps continues from its last checkpoint.

    OMP_WAIT_POLICY=PASSIVE python bench/subword_styles.py --corpus runs/real_corpus --out runs/subword_styles \\
        --pair en-de --preset small --steps 1200 --seeds 1 2 --parallel 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

# name: (data.bpe.style, data.bpe.model, train.bpe_dropout)
STYLES = {
    "bytelevel-bpe": ("bytelevel", "bpe", 0.0),
    "metaspace-bpe": ("metaspace", "bpe", 0.0),
    "metaspace-unigram": ("metaspace", "unigram", 0.0),
    "metaspace-bpe-dropout0.1": ("metaspace", "bpe", 0.1),
}
MTX = [sys.executable, "-m", "mtx"]


def recipe(args: argparse.Namespace, pair: str, style: str, seed: int, run: Path) -> dict:
    src, tgt = pair.split("-")
    corpus = args.corpus.resolve() / pair
    bpe_style, model, dropout = STYLES[style]
    files = {split: [str(corpus / f"{split}.{src}"), str(corpus / f"{split}.{tgt}")]
             for split in ("train", "valid", "test")}
    return {
        "name": f"{pair}-{style}-{seed}", "run_dir": str(run), "seed": seed,
        "data": {"source": {"files": files}, "src_lang": src, "tgt_lang": tgt,
                 "filter": {"min_len": 1, "max_len": 250, "max_ratio": 0, "dedup": True},
                 "bpe": {"vocab_size": args.vocab_size, "style": bpe_style, "model": model}},
        "model": {"preset": args.preset},
        "train": {"max_tokens": args.max_tokens, "lr": args.lr, "warmup": args.warmup, "max_steps": args.steps,
                  "save_every": args.steps // 4, "keep_last": 0, "validate_every": args.steps,
                  "valid_max_sentences": 200, "log_every": 50, "device": "cpu", "precision": "fp32",
                  "bpe_dropout": dropout},
        "decode": {"beam": 4, "lenpen": 0.6},
    }


def mtx(*command: str, threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([*MTX, *command], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mtx {' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done.stdout


def prepared(args: argparse.Namespace, pair: str, style: str, seed: int) -> Path:
    """The recipe file of a run whose data is prepared: runs of one style share the data of seed 1."""
    run = args.out / pair / f"{style}-seed{seed}"
    run.mkdir(parents=True, exist_ok=True)
    path = run / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(args, pair, style, seed, run)), encoding="utf-8")
    first = args.out / pair / f"{style}-seed1"
    if seed != 1 and not (run / "data").exists():
        prepared(args, pair, style, 1)
        (run / "data").symlink_to(first / "data", target_is_directory=True)
    mtx("prepare", str(path), threads=args.threads)
    return path


def tokens_per_sentence(args: argparse.Namespace, pair: str, style: str) -> dict:
    manifest = json.loads((prepared(args, pair, style, 1).parent / "data" / "manifest.json").read_text())
    src, tgt = pair.split("-")
    counts = {}
    for split in ("train", "test"):
        numbers = manifest["splits"][split]
        counts[split] = {src: round(numbers["src_tokens"] / numbers["pairs"], 2),
                         tgt: round(numbers["tgt_tokens"] / numbers["pairs"], 2)}
    return {"name": "subword_styles.tokens_per_sentence", "pair": pair, "style": style,
            "vocab_size": manifest["vocab_size"], **counts}


def trained(args: argparse.Namespace, pair: str, style: str, seed: int) -> dict:
    path = prepared(args, pair, style, seed)
    run = path.parent
    result_file = run / f"result-{args.steps}.json"
    if result_file.exists():
        return json.loads(result_file.read_text())
    started = time.perf_counter()
    mtx("train", str(path), threads=args.threads)
    seconds = time.perf_counter() - started
    manifest = json.loads((run / "data" / "manifest.json").read_text())
    valid = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    valid = [event for event in valid if event["event"] == "valid"][-1]
    sentences = manifest["splits"]["valid"]["pairs"]
    per_sentence = valid["valid_nll"] * (manifest["splits"]["valid"]["tgt_tokens"] + sentences) / sentences
    src, tgt = pair.split("-")
    reference = run / "data" / f"test.{tgt}"
    scores = {}
    for step in (args.steps * 3 // 4, args.steps):
        hypothesis = run / f"test.step{step}.{tgt}"
        mtx("translate", "-m", str(run / "checkpoints" / f"step_{step}.pt"), "-i", str(run / "data" / f"test.{src}"),
            "-o", str(hypothesis), threads=args.threads)
        score = json.loads(mtx("score", "-r", str(reference), "-i", str(hypothesis), "--json", "--metrics", "bleu,chrf",
                               threads=1))
        scores[step] = score
    result = {"name": "subword_styles.run", "pair": pair, "style": style, "seed": seed, "preset": args.preset,
              "steps": args.steps, "train_seconds": round(seconds, 1), "valid_nll_per_sentence": round(per_sentence, 3),
              "valid_nll_per_token": round(valid["valid_nll"], 4),
              **{f"step{step}": score for step, score in scores.items()}}
    result_file.write_text(json.dumps(result), encoding="utf-8")
    return result


def summary(results: list[dict]) -> None:
    """The mean over seeds per style, one line each."""
    for style in STYLES:
        runs = [r for r in results if r["style"] == style]
        if not runs:
            continue
        last = [r[f"step{r['steps']}"] for r in runs]
        earlier = [r[f"step{r['steps'] * 3 // 4}"] for r in runs]
        print(json.dumps({
            "name": "subword_styles.mean", "style": style, "seeds": [r["seed"] for r in runs],
            "valid_nll_per_sentence": round(statistics.mean(r["valid_nll_per_sentence"] for r in runs), 3),
            "bleu": round(statistics.mean(s["bleu"] for s in last), 2),
            "bleu_each": [round(s["bleu"], 2) for s in last],
            "chrf": round(statistics.mean(s["chrf"] for s in last), 2),
            "length_ratio_at_3_4": round(statistics.mean(s["ratio"] for s in earlier), 3),
            "length_ratio": round(statistics.mean(s["ratio"] for s in last), 3),
            "train_seconds": round(statistics.mean(r["train_seconds"] for r in runs), 1),
        }), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=Path("runs/real_corpus"))
    parser.add_argument("--out", type=Path, default=Path("runs/subword_styles"))
    parser.add_argument("--pair", default="en-de", help="the language pair models are trained on")
    parser.add_argument("--count-pairs", nargs="+", default=["en-de", "en-fr"], help="pairs whose tokens are counted")
    parser.add_argument("--styles", nargs="+", default=list(STYLES), choices=list(STYLES))
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--lr", type=float, default=1.5e-3)
    parser.add_argument("--warmup", type=int, default=400)
    parser.add_argument("--steps", type=int, default=1200)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="threads of each run")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time")
    parser.add_argument("--count-only", action="store_true", help="tokens per sentence only, no training")
    args = parser.parse_args()
    args.out = args.out.resolve()
    for pair in args.count_pairs:
        for style in [s for s in args.styles if STYLES[s][2] == 0]:  # dropout: metaspace-bpe's vocabulary
            print(json.dumps(tokens_per_sentence(args, pair, style)), flush=True)
    if args.count_only:
        return
    for style in args.styles:  # prepared one at a time: seeds 2+ link to seed 1's data
        prepared(args, args.pair, style, 1)
    jobs = [(style, seed) for seed in args.seeds for style in args.styles]
    with ThreadPoolExecutor(args.parallel) as pool:
        results = []
        for result in pool.map(lambda job: trained(args, args.pair, *job), jobs):
            print(json.dumps(result), flush=True)
            results.append(result)
    summary(results)


if __name__ == "__main__":
    main()
