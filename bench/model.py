"""Issue 2: how fast is the bare model on a CPU? Teacher-forced `forward` and incremental `decode_step`.

    .bench-venv/bin/python bench/model.py [--repeats 10] [--threads 2]

Prints JSON lines: milliseconds per forward and target tokens/s (a batch of 32 random pairs of 15–35 tokens,
eval mode, no autograd), milliseconds per decode step and tokens/s (the same 32 sentences, `steps` steps from an
empty cache, so the figure averages over cache lengths 1..steps). When `transformers` is installed, the same
two measurements for a MarianMTModel holding the very same weights (checked: identical log-probabilities),
through its own KV cache, interleaved with mtx's so both see the same machine load.
"""

from __future__ import annotations

import argparse

import torch
from common import (
    build_model,
    check_same_function,
    emit,
    emit_skip,
    peers_missing,
    random_batch,
    set_threads,
    time_interleaved,
)

from mtx.export.marian import marian_from_mtx
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch")
    parser.add_argument("--steps", type=int, default=30, help="decode steps timed per repeat")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    set_threads(args.threads)

    model = build_model(args.preset, args.vocab).eval()
    batch = random_batch(args.batch, args.vocab, 15, 35, seed=1)
    config = {"preset": args.preset, "vocab": args.vocab, "batch": args.batch, "lengths": "15-35",
              "threads": args.threads, "dtype": "fp32", "device": "cpu"}
    forwards = {"mtx": lambda: model.output_logits(model(batch.src, batch.src_pad, batch.tgt_in))}
    steps = {"mtx": lambda: mtx_decode(model, batch.src, batch.src_pad, args.steps)}

    missing = peers_missing("transformers")
    if missing:
        emit_skip("marian", f"not installed here: {', '.join(missing)} (run in .bench-venv, see bench/setup_env.sh)")
    else:
        marian = marian_from_mtx(model).eval()
        check_same_function(model, marian, batch)
        mask = (~batch.src_pad).long()
        forwards["marian"] = lambda: marian(input_ids=batch.src, attention_mask=mask, decoder_input_ids=batch.tgt_in,
                                            use_cache=False).logits
        steps["marian"] = lambda: marian_decode(marian, batch.src, mask, args.steps)

    with torch.inference_mode():
        forward_s = time_interleaved(forwards, args.repeats, warmup=2)
        step_s = time_interleaved(steps, args.repeats, warmup=2)
    tgt_tokens = int((batch.tgt_out != 0).sum())
    for system, seconds in forward_s.items():
        emit(f"{system}.forward", {**config, "system": system}, [1e3 * s for s in seconds], "ms/forward")
        emit(f"{system}.forward.tokens_per_s", {**config, "system": system, "tokens": "target, non-pad"},
             [tgt_tokens / s for s in seconds], "tokens/s")
    for system, seconds in step_s.items():
        per_step = {**config, "system": system, "steps": args.steps}
        emit(f"{system}.decode_step", per_step, [1e3 * s / args.steps for s in seconds], "ms/step")
        emit(f"{system}.decode_step.tokens_per_s", per_step, [args.batch * args.steps / s for s in seconds],
             "tokens/s")


def mtx_decode(model: Transformer, src: torch.Tensor, src_pad: torch.Tensor, steps: int) -> None:
    """`steps` decode steps of the whole batch, from BOS, feeding back the argmax (what greedy search does)."""
    state = model.init_state(model.encode(src, src_pad), src_pad, max_len=steps)
    prev = src.new_full((src.shape[0],), BOS)
    for _ in range(steps):
        log_probs, state = model.decode_step(prev, state)
        prev = log_probs.argmax(dim=-1)


def marian_decode(marian, src: torch.Tensor, mask: torch.Tensor, steps: int) -> None:
    """The same for Marian: its decoder one token at a time through its KV cache, then output projection and
    log-softmax (what `generate` runs per step, without generate's own bookkeeping)."""
    from transformers import DynamicCache, EncoderDecoderCache

    memory = marian.model.encoder(input_ids=src, attention_mask=mask).last_hidden_state
    cache = EncoderDecoderCache(DynamicCache(config=marian.config), DynamicCache(config=marian.config))
    prev = src.new_full((src.shape[0], 1), BOS)
    for _ in range(steps):
        out = marian.model.decoder(input_ids=prev, encoder_hidden_states=memory, encoder_attention_mask=mask,
                                   cache=cache, use_cache=True)
        logits = marian.lm_head(out.last_hidden_state) + marian.final_logits_bias
        prev = torch.log_softmax(logits.float(), dim=-1).argmax(dim=-1)


if __name__ == "__main__":
    main()
