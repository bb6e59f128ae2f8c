"""Label-smoothed cross-entropy (paper §5.4, ε_ls = 0.1), summed over target tokens, padding ignored.

fairseq's formulation: the smoothed target puts 1 − ε on the reference token and spreads ε uniformly over the
V − 1 other tokens (ε / (V − 1) each), so per token the loss is

    (1 − ε − ε/(V−1)) · (−log p(y)) + ε/(V−1) · Σ_v −log p(v)

The loss is a sum, not a mean: the trainer divides by the number of target tokens in the whole update, summed
over micro-batches and ranks, so the gradient does not depend on how an update is split among them.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from mtx.tokenizer import PAD


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int = PAD
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """(loss_sum, nll_sum, n_tokens) for (B, T, V) logits and (B, T) targets, in float32.

    `nll_sum` (the unsmoothed loss, for perplexity) is detached; `n_tokens` counts non-pad targets. Padding
    is masked by multiplication rather than indexing, so no copy of the (B·T, V) log-probabilities is made.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)  # (B, T, V)
    keep = target != pad_id  # (B, T)
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)  # (B, T)
    nll_sum = (nll * keep).sum()
    n_tokens = keep.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach(), n_tokens
    eps_other = epsilon / (lprobs.shape[-1] - 1)
    smooth_sum = (-lprobs.sum(dim=-1) * keep).sum()
    loss_sum = (1.0 - epsilon - eps_other) * nll_sum + eps_other * smooth_sum
    return loss_sum, nll_sum.detach(), n_tokens
