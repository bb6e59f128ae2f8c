"""Label-smoothed cross-entropy (paper §5.4, ε_ls = 0.1), summed over target tokens, padding ignored.

fairseq's formulation: the smoothed target puts 1 − ε on the reference token and spreads ε uniformly over the
V − 1 other tokens (ε / (V − 1) each), so per token the loss is

    (1 − ε − ε/(V−1)) · (−log p(y)) + ε/(V−1) · Σ_v −log p(v)

The loss is a sum, not a mean: the trainer divides by the number of target tokens in the whole update, summed
over micro-batches and ranks, so the gradient does not depend on how an update is split among them.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from mtx.batching import Batch
from mtx.tokenizer import PAD


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int = PAD
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """(loss_sum, nll_sum, n_tokens) for (..., V) logits and (...) targets, in float32.

    Any leading shape: (N, V) logits of just the target tokens, as `batch_loss` has the model produce, or
    (B, T, V) logits of a padded batch, as most models produce them. Targets equal to `pad_id` are ignored,
    masked by multiplication rather than indexing, so no copy of the log-probabilities is made.
    `nll_sum` (the unsmoothed loss, for perplexity) is detached; `n_tokens` counts non-pad targets.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    nll_sum = (nll * keep).sum()
    n_tokens = keep.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach(), n_tokens
    eps_other = epsilon / (lprobs.shape[-1] - 1)
    smooth_sum = (-lprobs.sum(dim=-1) * keep).sum()
    loss_sum = (1.0 - epsilon - eps_other) * nll_sum + eps_other * smooth_sum
    return loss_sum, nll_sum.detach(), n_tokens


def batch_loss(model: nn.Module, batch: Batch, epsilon: float) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_loss` of an mtx Transformer (or a wrapper of one) on a batch, teacher-forced.

    The model is asked for the logits of the target tokens only (`Transformer.forward`'s `tgt_mask`), so the
    output projection and the loss, forward and backward, skip the batch's target padding.
    """
    has_target = batch.tgt_out != PAD
    logits = model(batch.src, batch.src_pad, batch.tgt_in, has_target)
    return label_smoothed_loss(logits, batch.tgt_out[has_target], epsilon)
