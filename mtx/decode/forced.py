"""Forced scores: the model's log-probability of given translations (`mtx translate --score-reference`).

Forced decoding: the decoder is fed the given translation token by token, as search feeds its own choices, and
each token's log-probability is read off the distribution of its step, EOS last. The total is log P(Y | X); divided
by the length penalty of |Y| (EOS counted) it is the score beam search reports for that hypothesis, so the two
can be compared: a translation scored here has the score the search gave it when it found it, to float rounding.
Through mtx.decode.ensemble's `Ensemble` an ensemble scores as it decodes, with its averaged distributions.

This is the primitive of reranking n-best lists, of quality estimation, and of dual conditional cross-entropy
filtering of noisy corpora (Junczys-Dowmunt, 2018): the scores of a pair under a forward and a backward model.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mtx.decode.search import Hypothesis, IncrementalDecoder, LengthPenalty, column_of, token_columns
from mtx.tokenizer import BOS, EOS


@torch.inference_mode()
def forced_scores(model: IncrementalDecoder, src: Tensor, src_pad: Tensor, targets: list[list[int]],
                  penalty: LengthPenalty) -> list[Hypothesis]:
    """Each target's tokens with its score (normalised by `penalty`, the search's) and its tokens'
    log-probabilities, EOS last.

    src, src_pad: (B, S); targets: B token lists, EOS excluded. All rows run to the longest target; a row's
    steps after its own EOS are computed and left unread (scoring is one pass, not a search).
    """
    batch, device = src.shape[0], src.device
    steps = max(len(t) for t in targets) + 1
    forced = torch.full((batch, steps), EOS, dtype=torch.long, device=device)
    for row, target in enumerate(targets):
        forced[row, : len(target)] = torch.tensor(target, dtype=torch.long)
    state = model.init_state(model.encode(src, src_pad), src_pad, max_len=steps)
    chosen = torch.empty(batch, steps, device=device)
    prev = src.new_full((batch,), BOS)
    for step in range(steps):
        log_probs, state = model.decode_step(prev, state)
        prev = forced[:, step]
        chosen[:, step] = log_probs.gather(1, column_of(prev, token_columns(state)).unsqueeze(1)).squeeze(1)
    hypotheses = []
    for target, row_log_probs in zip(targets, chosen.tolist(), strict=True):
        token_log_probs = row_log_probs[: len(target) + 1]
        score = sum(token_log_probs) / penalty(len(target) + 1.0)
        hypotheses.append(Hypothesis(list(target), score, token_log_probs))
    return hypotheses
