"""Issue 24: what the moving average of the weights (train.ema_decay) costs per update, and what it buys.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/ema.py cost [--preset tiny --vocab 2000] [--repeats 20]
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/ema.py quality runs/demo-ema [--every 100] [--average 5]

`cost`: one training update (bench/train.py's `Updater`: fused loss, backward, grad norm, AdamW) of a model of
the preset's shape on a batch of about the demo's size, with and without `WeightAverage.update` after it,
interleaved repeat by repeat: `ema.train_update`, `ema.train_update_with_ema`, and `ema.average_update`, the
update of the average alone; `ema.overhead` is its share of a training update.

`quality`: a run trained with train.ema_decay and keep_last 0 (every step checkpoint kept), e.g.

    mtx prepare recipes/demo.yaml
    mtx train recipes/demo.yaml --set name=demo-ema --set train.ema_decay=0.999 --set train.keep_last=0

(the same data as the demo: a run's data/ is its own, so prepare it for that name first). For every `--every`
updates it decodes the run's valid set (all of it, the recipe's beam) with the raw weights and with the moving
average of the same checkpoint, and once with the average of the last `--average` checkpoints' raw weights (what
`mtx average` gives a run without EMA) and of their moving averages (what `mtx average` gives this run): one JSON
line each, with valid BLEU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from common import build_model, emit, emit_info, random_batch, set_threads
from train import Updater

from mtx.checkpoint import load_checkpoint, model_config_of, step_checkpoints
from mtx.config.recipe import DecodeConfig
from mtx.model.transformer import Transformer
from mtx.tokenizer import Tokenizer
from mtx.train.ema import WeightAverage
from mtx.train.loss import batch_loss


def cost(args: argparse.Namespace) -> None:
    model = build_model(args.preset, args.vocab).train()
    batch = random_batch(args.pairs, args.vocab, 8, 20)
    updater = Updater(lambda b: batch_loss(model, b, 0.1)[0], model, torch.device("cpu"), None)
    ema = WeightAverage(model, 0.999)

    samples: dict[str, list[float]] = {"train_update": [], "train_update_with_ema": [], "average_update": []}
    for repeat in range(args.repeats + 2):  # two rounds warm up
        start = time.perf_counter()
        updater.run([batch])
        plain = time.perf_counter()
        updater.run([batch])
        updated = time.perf_counter()
        ema.update(repeat + 1000)
        end = time.perf_counter()
        if repeat >= 2:
            samples["train_update"].append(plain - start)
            samples["train_update_with_ema"].append(end - plain)
            samples["average_update"].append(end - updated)
    config = {"preset": args.preset, "vocab": args.vocab, "pairs": args.pairs, "target_tokens": batch.n_tgt_tokens,
              "parameters": sum(p.numel() for p in model.parameters()), "threads": args.threads}
    for name, values in samples.items():
        emit(f"ema.{name}", config, values, "s")
    overhead = statistics.median(samples["average_update"]) / statistics.median(samples["train_update"])
    emit_info("ema.overhead", **config, share_of_an_update=round(overhead, 4))


def quality(args: argparse.Namespace) -> None:
    from mtx.decode.translator import translate_sentences
    from mtx.score.metrics import corpus_bleu

    checkpoints = args.run / "checkpoints"
    steps = step_checkpoints(checkpoints)
    if not steps:
        raise SystemExit(f"no step checkpoints in {checkpoints}")
    first = load_checkpoint(steps[-1][1], mmap=True)
    if "ema" not in first:
        raise SystemExit(f"{steps[-1][1]} holds no moving average: train the run with train.ema_decay")
    tokenizer = Tokenizer.from_str(first["tokenizer"])
    recipe = first["recipe"]
    src, tgt = recipe["data"].get("src_lang", "en"), recipe["data"].get("tgt_lang", "de")
    sources = (args.run / "data" / f"valid.{src}").read_text(encoding="utf-8").splitlines()
    refs = (args.run / "data" / f"valid.{tgt}").read_text(encoding="utf-8").splitlines()
    decode = DecodeConfig.of_checkpoint(first)
    model = Transformer(model_config_of(first), first["vocab_size"]).eval()

    def bleu(weights: dict[str, torch.Tensor]) -> float:
        model.load_state_dict(weights)
        with torch.no_grad():
            return round(corpus_bleu(translate_sentences(model, tokenizer, sources, decode), refs), 2)

    config = {"run": str(args.run), "ema_decay": first["ema_decay"], "beam": decode.beam, "sentences": len(sources)}
    for step, path in steps:
        if step % args.every == 0:
            checkpoint = load_checkpoint(path, mmap=True)
            emit_info("ema.valid_bleu", **config, step=step, raw=bleu(checkpoint["model"]), ema=bleu(checkpoint["ema"]))
    last = steps[-args.average :]
    averages = {kind: _average([load_checkpoint(path)[kind] for _, path in last]) for kind in ("model", "ema")}
    emit_info("ema.valid_bleu_averaged", **config, steps=[step for step, _ in last],
              raw_average=bleu(averages["model"]), ema_average=bleu(averages["ema"]))


def _average(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    return {name: sum(state[name] for state in states) / len(states) for name in states[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    timing = commands.add_parser("cost")
    timing.add_argument("--preset", default="tiny")
    timing.add_argument("--vocab", type=int, default=2000)
    timing.add_argument("--pairs", type=int, default=256, help="pairs of 8-20 tokens in the batch")
    timing.add_argument("--repeats", type=int, default=20)
    timing.add_argument("--threads", type=int, default=2)
    scores = commands.add_parser("quality")
    scores.add_argument("run", type=Path)
    scores.add_argument("--every", type=int, default=100)
    scores.add_argument("--average", type=int, default=5)
    args = parser.parse_args()
    if args.command == "cost":
        set_threads(args.threads)
        cost(args)
    else:
        quality(args)


if __name__ == "__main__":
    main()
