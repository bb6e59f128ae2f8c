"""What padding-free attention could save: the padding in the trainer's batches of WMT-shaped pairs (issue 26).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/padding.py [--pairs 1000000]

Packing a batch's sentences without padding (FlexAttention's block masks, a varlen kernel) saves only what is
padding. The trainer batches pairs of similar length (`mtx.data.batching.make_batches`), so this measures, on
bench/plan.py's synthetic WMT14-shaped lengths, for each train.max_tokens, the share of the batch that is padding:

  source_positions, target_positions   padded positions of the encoder's and the decoder's inputs: what every
                                       projection, feed-forward and elementwise kernel computes for nothing
  encoder_scores, decoder_scores,      padded entries of the attention score matrices (B·S², B·T², B·T·S
  cross_scores                         against Σ s², Σ t², Σ t·s): what SDPA computes for nothing

The output projection and the loss already skip target padding (`Transformer.forward`'s `tgt_positions`).
"""

from __future__ import annotations

import argparse

import numpy as np
from common import emit_info
from plan import wmt_like_lengths

from mtx.data.batching import make_batches, pairs_within


def padding_shares(src: np.ndarray, tgt: np.ndarray, batches: list[np.ndarray]) -> dict[str, float]:
    """Shares of padding in the batches' inputs and score matrices (EOS / BOS counted as a real position)."""
    real = {"source_positions": 0.0, "target_positions": 0.0, "encoder_scores": 0.0, "decoder_scores": 0.0,
            "cross_scores": 0.0}
    padded = dict.fromkeys(real, 0.0)
    for batch in batches:
        s, t = src[batch].astype(np.float64) + 1, tgt[batch].astype(np.float64) + 1
        n, s_max, t_max = len(batch), s.max(), t.max()
        for key, have, whole in (("source_positions", s.sum(), n * s_max), ("target_positions", t.sum(), n * t_max),
                                 ("encoder_scores", (s * s).sum(), n * s_max**2),
                                 ("decoder_scores", (t * t).sum(), n * t_max**2),
                                 ("cross_scores", (t * s).sum(), n * t_max * s_max)):
            real[key] += have
            padded[key] += whole
    return {key: 1.0 - real[key] / padded[key] for key in real}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=1_000_000)
    parser.add_argument("--max-tokens", default="3584,28672", help="comma-separated train.max_tokens")
    args = parser.parse_args()
    src, tgt = wmt_like_lengths(args.pairs)
    keep = pairs_within(src, tgt, 256)
    for max_tokens in (int(m) for m in args.max_tokens.split(",")):
        batches = make_batches(src, tgt, max_tokens, seed=1, keep=keep)
        emit_info("padding.shares", max_tokens=max_tokens, pairs=int(keep.sum()), batches=len(batches),
                  lengths="bench/plan.py's wmt_like_lengths", **padding_shares(src, tgt, batches))


if __name__ == "__main__":
    main()
