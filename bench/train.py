"""Issue 4: training throughput, target tokens/s of one optimizer update, mtx against Hugging Face's MarianMT.

    .bench-venv/bin/python bench/train.py [--repeats 5] [--steps 3]         # CPU: small, fp32, 2 threads
    .bench-venv/bin/python bench/train.py --device cuda                     # GPU: small, base, big in bf16 + MFU

One update is what `mtx.train.trainer.Trainer._train_update` does for one micro-batch (it is a method of the whole
trainer, which needs a prepared run directory, so its body is replicated here, step for step): under autocast
(none on the CPU), `mtx.train.loss.batch_loss` (ε = 0.1: the forward to the decoder states of the target tokens, then
`mtx.train.loss.projected_label_smoothed_loss`, the output projection fused with the loss) divided by the batch's
target tokens, backward, `clip_grad_norm_` (the trainer always computes the norm, for its log), AdamW (weight
decay 0, i.e. Adam; betas 0.9/0.98, eps 1e-9; fused on CUDA as in the trainer), `zero_grad(set_to_none=True)`.
Only the trainer's logging sums and the per-update dropout reseeding are left out.

Marian gets the same update on the same batches with the same optimizer, and the same loss function,
`label_smoothed_loss`, on its logits of every position with the padding masked (Transformers' own label smoother
works on the padded logits too).
Its MarianConfig mirrors the mtx preset (post-norm, ReLU, sinusoidal positions, √d embedding scale, one shared
embedding/output matrix, dropout 0.1 with none on attention weights or inside the FFN, SDPA attention).

Batches: random pairs of 15–35 word tokens (targets ± 3 of their sources), cut by `mtx.data.batching.make_batches`
into the trainer's length-bucketed batches of `--max-tokens` (padded max(src, tgt) + EOS tokens; ~3,900 target
tokens each at 4096); `--steps` of them, spread over the length range (by default one, from the middle of it:
4–10 s per update on two busy cores), make one timed repeat.

FLOPs: `common.train_matmul_flops` (exact matmul count, 3× the forward); on CUDA, MFU against `--peak-tflops`
(989 by default: H100/H200 dense bf16).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import torch
from common import (
    RandomPairs,
    build_model,
    emit,
    emit_info,
    emit_skip,
    model_config,
    peers_missing,
    set_threads,
    time_interleaved,
    train_matmul_flops,
)
from torch import Tensor

from mtx.data.batching import Batch, collate, make_batches
from mtx.export.marian import MarianIds, build_marian
from mtx.train.loss import batch_loss, label_smoothed_loss

LABEL_SMOOTHING = 0.1
BAR = 1.2  # the bar: mtx at least 1.2× Marian's target tokens/s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--presets", help="comma-separated; default small on CPU, small,base,big on CUDA")
    parser.add_argument("--precision", choices=["fp32", "bf16"], help="default fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--vocab", type=int, help="default 8000 for small, 37000 (the paper's) for base and big")
    parser.add_argument("--max-tokens", type=int, default=4096, help="batch budget, as train.max_tokens counts it")
    parser.add_argument("--steps", type=int, default=1, help="updates (batches) per timed repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--peak-tflops", type=float, help="for MFU; default 989 on CUDA (H100/H200 dense bf16)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    set_threads(args.threads)
    presets = (args.presets or ("small,base,big" if cuda else "small")).split(",")
    precision = args.precision or ("bf16" if cuda else "fp32")
    peak = args.peak_tflops or (989.0 if cuda else None)
    missing = peers_missing("transformers")
    if missing:
        emit_skip("marian.train", f"not installed here: {', '.join(missing)} (run in .bench-venv, see "
                                  "bench/setup_env.sh)")
    for preset in presets:
        vocab = args.vocab or (8000 if preset in ("tiny", "small") else 37000)
        bench_preset(preset, vocab, precision, torch.device(args.device), args, peak, with_marian=not missing)


def bench_preset(preset: str, vocab: int, precision: str, device: torch.device, args: argparse.Namespace,
                 peak_tflops: float | None, with_marian: bool) -> None:
    batches = spread_batches(vocab, args.max_tokens, args.steps)
    tokens = sum(b.n_tgt_tokens for b in batches)
    flops = sum(train_matmul_flops(model_config(preset), vocab, (~b.src_pad).sum(1).tolist(),
                                   (b.tgt_out != 0).sum(1).tolist()) for b in batches)
    batches = [b.to(device) for b in batches]
    autocast = torch.bfloat16 if precision == "bf16" else None
    config = {"preset": preset, "vocab": vocab, "device": device.type, "precision": precision,
              "threads": args.threads, "max_tokens": args.max_tokens, "steps": args.steps,
              "tgt_tokens_per_step": round(tokens / len(batches)), "lengths": "15-35",
              "label_smoothing": LABEL_SMOOTHING}

    mtx_model = build_model(preset, vocab).to(device).train()
    updates = {"mtx": Updater(lambda b: batch_loss(mtx_model, b, LABEL_SMOOTHING)[0], mtx_model, device, autocast)}
    if with_marian:
        marian = build_marian(model_config(preset), MarianIds.of_mtx(vocab)).to(device).train()

        def marian_loss(b: Batch) -> Tensor:
            logits = marian(input_ids=b.src, attention_mask=(~b.src_pad).long(), decoder_input_ids=b.tgt_in,
                            use_cache=False).logits
            return label_smoothed_loss(logits, b.tgt_out, LABEL_SMOOTHING)[0]

        updates["marian"] = Updater(marian_loss, marian, device, autocast)
    seconds = time_interleaved({name: lambda u=u: u.run(batches) for name, u in updates.items()},
                               args.repeats, warmup=1, device=device)
    medians = {}
    for system, samples in seconds.items():
        cfg = {**config, "system": system}
        rates = [tokens / s for s in samples]
        medians[system] = float(np.median(rates))
        emit(f"{system}.train.tokens_per_s", cfg, rates, "target tokens/s")
        emit(f"{system}.train.step_ms", cfg, [1e3 * s / len(batches) for s in samples], "ms/update")
        tflops = [flops / s / 1e12 for s in samples]
        emit(f"{system}.train.tflops", cfg, tflops, "matmul TFLOP/s", flops_formula="common.train_matmul_flops")
        if peak_tflops:
            emit(f"{system}.train.mfu", cfg, [t / peak_tflops for t in tflops], "fraction of peak",
                 peak_tflops=peak_tflops)
    if "marian" in medians:
        ratio = medians["mtx"] / medians["marian"]
        emit_info("train.mtx_over_marian", preset=preset, ratio=ratio, bar=BAR, met=ratio >= BAR)


def spread_batches(vocab: int, max_tokens: int, count: int) -> list[Batch]:
    """`count` of the trainer's batches over a random corpus: the middle batch of each of `count` equal slices
    of their length order."""
    pairs = RandomPairs(max(2000, 200 * count), vocab, 15, 35, seed=0)
    all_batches = make_batches(pairs.src_lens, pairs.tgt_lens, max_tokens, seed=0)
    chosen = ((np.arange(count) + 0.5) * len(all_batches) / count).astype(int)  # the middles of `count` slices
    return [collate(pairs, all_batches[i]) for i in chosen]


class Updater:
    """One model, its optimizer and the trainer's update; `run` performs one update per batch.

    `loss` is a batch's summed label-smoothed loss: forward and loss together, as each system computes them.
    """

    def __init__(self, loss: Callable[[Batch], Tensor], model: torch.nn.Module, device: torch.device,
                 autocast: torch.dtype | None) -> None:
        self.loss, self.device, self.autocast = loss, device, autocast
        self.params = list(model.parameters())
        self.optimizer = torch.optim.AdamW(self.params, lr=1e-4, betas=(0.9, 0.98), eps=1e-9, weight_decay=0.0,
                                           fused=device.type == "cuda")

    def run(self, batches: list[Batch]) -> None:
        for batch in batches:
            with torch.autocast(self.device.type, dtype=self.autocast) if self.autocast else nullcontext():
                (self.loss(batch) / batch.n_tgt_tokens).backward()
            torch.nn.utils.clip_grad_norm_(self.params, math.inf)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    main()
