"""Label-smoothed cross-entropy (paper §5.4, ε_ls = 0.1), summed over target tokens, padding ignored.

The smoothed target distribution q puts 1 − ε on the reference token, nothing on PAD, and spreads ε uniformly
over the V − 2 tokens that are neither (ε / (V − 2) each), as OpenNMT-py's LabelSmoothingLoss and the Annotated
Transformer build it (`true_dist[:, padding_idx] = 0`), so per token the loss is

    (1 − ε − ε/(V−2)) · (−log p(y)) + ε/(V−2) · Σ_{v ≠ PAD} −log p(v)

PAD is never a target, so a target distribution that gives it mass teaches the model to expect a token that never
comes. fairseq spreads ε over the V − 1 non-reference tokens, PAD included; for a model trained here the
difference is a small shift of the smoothed loss (`valid_loss` among its figures), while the unsmoothed `nll`,
perplexity and everything decoded are untouched. For an imported MarianMT model it is what makes fine-tuning
sound: its PAD has the output bias `mtx.importing.marian.NEVER` (−1e4), so p(PAD) is exactly 0 in float32 and
−log p(PAD) about 1e4. In q, PAD would add ε/(V−1) · 1e4 nats a token to the loss, and its gradient would push
PAD's bias and output row up at every step (Adam makes lr-sized steps of a consistent gradient, however small).
Left out of q, PAD's logit gets the gradient p(PAD) − 0: exactly 0.

The loss is a sum, not a mean: the trainer divides by the number of target tokens in the whole update, summed
over micro-batches and ranks, so the gradient does not depend on how an update is split among them.

Training computes it with `projected_label_smoothed_loss`, which fuses the output projection into the loss and
works through the target tokens a chunk at a time, so the (N, V) logits are never materialised: see there why.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mtx.data.batching import Batch
from mtx.model.transformer import Transformer
from mtx.tokenizer import PAD


def label_smoothed_loss(logits: Tensor, target: Tensor, epsilon: float, pad_id: int = PAD
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """(loss_sum, nll_sum, n_tokens) for (..., V) logits and (...) targets, in float32.

    Any leading shape: (N, V) logits of just the target tokens, as the model gives them at `Batch.tgt_positions`, or
    (B, T, V) logits of a padded batch, as most models produce them. Targets equal to `pad_id` are ignored,
    masked by multiplication rather than indexing, so no copy of the log-probabilities is made; `pad_id` is
    also the type the smoothed target distribution leaves out.
    `nll_sum` (the unsmoothed loss, for perplexity) is detached; `n_tokens` counts non-pad targets.
    """
    lprobs = F.log_softmax(logits.float(), dim=-1)
    keep = target != pad_id
    nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)
    nll_sum = (nll * keep).sum()
    n_tokens = keep.sum()
    if epsilon == 0.0:
        return nll_sum, nll_sum.detach(), n_tokens
    smooth_sum = (-_sum_but(lprobs, pad_id) * keep).sum()
    return _smoothed(nll_sum, smooth_sum, epsilon, lprobs.shape[-1]), nll_sum.detach(), n_tokens


def _sum_but(lprobs: Tensor, column: int) -> Tensor:
    """Σ over the last dimension of every column but one, as the sums of the two slices around it: not as the
    total minus that column, which for an imported model's PAD (log-probability about −1e4) would cancel most
    of float32's digits of the rest."""
    return lprobs[..., :column].sum(-1) + lprobs[..., column + 1:].sum(-1)


def _smoothed(nll_sum: Tensor, smooth_sum: Tensor, epsilon: float, vocab: int) -> Tensor:
    """The label-smoothed loss from its two sums over tokens, −log p(reference) and Σ_{v ≠ PAD} −log p(v): the
    reference has weight 1 − ε, PAD none and every other type ε / (V − 2), and the second sum counts the
    reference too."""
    other = epsilon / (vocab - 2)
    return (1.0 - epsilon - other) * nll_sum + other * smooth_sum


def projected_label_smoothed_loss(hidden: Tensor, weight: Tensor, target: Tensor, epsilon: float,
                                  pad_id: int = PAD, bias: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_loss(F.linear(hidden, weight, bias), target, ...)` for (N, D) decoder states, the (V, D)
    output matrix, (N,) targets and the model's (V,) output bias where it has one, computed without ever holding
    the (N, V) logits.

    The logits of a training batch are its largest tensors by far (4,000 target tokens × 8,000 types: 128 MB in
    float32; × 37,000 types on a GPU batch of 25,000 tokens: 3.7 GB), and the unfused loss makes five of their
    size, forward and backward: logits, log-probabilities, the gather's and the sum's gradients and their sum.
    Fresh tensors that large cost page faults on a CPU and memory on a GPU (bench/README.md has the time it
    saves on bench/train.py's batch). So the projection, the loss and its gradient go together,
    `_CHUNK_ELEMENTS` logits at a time in one reused buffer: log-softmax in place, the loss terms, then softmax
    in place and the closed-form gradient with respect to the logits, p − q (q the smoothed target
    distribution, nothing on PAD), multiplied at once into the gradients of `hidden` and `weight`, and summed
    over the tokens into the gradient of `bias`. The backward only scales those by the incoming gradient.

    Under fp16 autocast the plain path is taken: fp16 gradients need the GradScaler's scale applied before they
    are cast, which a gradient computed in the forward cannot have. bf16 (and fp32) have fp32's range.

    The gradients are computed only when autograd will ask for them: under `torch.no_grad()` (validation) an
    autograd.Function still sees its inputs' `requires_grad`, so the decision is taken here, outside it.
    """
    device = hidden.device.type
    compute = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    if compute == torch.float16:
        return label_smoothed_loss(F.linear(hidden, weight, bias), target, epsilon, pad_id)
    grad_mode = torch.is_grad_enabled()
    wanted = (grad_mode and hidden.requires_grad, grad_mode and weight.requires_grad,
              grad_mode and bias is not None and bias.requires_grad)
    loss, nll = _ProjectedSmoothedLoss.apply(hidden, weight, bias, target, epsilon, pad_id, compute, wanted)
    return loss, nll, (target != pad_id).sum()


# Logits per chunk: 32 MB in float32 on a CPU, where 2^22…2^23 ran best of 2^20…2^25 on bench/train.py's batch;
# on a GPU chunks large enough to keep the matrix multiplies efficient (1 GB, ~7,000 tokens at V = 37,000).
_CHUNK_ELEMENTS = {"cpu": 2**23, "cuda": 2**28}


class _ProjectedSmoothedLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, epsilon: float,
                pad_id: int, compute: torch.dtype, wanted: tuple[bool, bool, bool]) -> tuple[Tensor, Tensor]:
        n, vocab = hidden.shape[0], weight.shape[0]
        other = epsilon / (vocab - 2)  # q of every token but the reference (1 − ε) and PAD (0)
        grad_hidden = torch.empty_like(hidden) if wanted[0] else None
        grad_weight = torch.zeros_like(weight, dtype=torch.float32) if wanted[1] else None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if wanted[2] else None
        rows = max(1, _CHUNK_ELEMENTS.get(hidden.device.type, 2**28) // vocab)
        nll_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        smooth_sum = torch.zeros_like(nll_sum)  # Σ over tokens of Σ_{v ≠ PAD} −log p(v)
        # float32: one buffer for every chunk's logits, and gradients written in place. bf16: bf16 matmuls as
        # autocast would run them (it is off in here, the casts explicit), their outputs in fresh tensors.
        in_place = compute == torch.float32
        buffer = hidden.new_empty(min(rows, n), vocab, dtype=torch.float32) if in_place else None
        with torch.autocast(hidden.device.type, enabled=False):
            w, b = weight.to(compute), None if bias is None else bias.to(compute)
            for start in range(0, n, rows):
                chunk = slice(start, start + rows)
                h, t = hidden[chunk].to(compute), target[chunk, None]
                if in_place:
                    out = buffer[: len(h)]
                    logits = torch.mm(h, w.t(), out=out) if b is None else torch.addmm(b, h, w.t(), out=out)
                else:
                    logits = (torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())).float()
                lprobs = torch.log_softmax(logits, dim=-1, out=logits)
                # Padding is masked by multiplying per-token values, never by testing whether there is any:
                # on a GPU that test would make the host wait for the device.
                keep = (t != pad_id).to(torch.float32)  # (rows, 1)
                nll_sum -= (lprobs.gather(1, t) * keep).sum()
                smooth_sum -= (_sum_but(lprobs, pad_id) * keep[:, 0]).sum()
                if grad_hidden is None and grad_weight is None and grad_bias is None:
                    continue
                grad = torch.softmax(lprobs, dim=-1, out=lprobs).sub_(other)
                grad[:, pad_id] += other  # q(PAD) = 0
                grad.scatter_add_(1, t, grad.new_full(t.shape, other - (1.0 - epsilon)))
                if grad_bias is not None:  # Σ over the chunk's target tokens of the logits' gradient, in float32
                    grad_bias.addmv_(grad.t(), keep[:, 0])
                grad = grad.to(compute)  # a padding row's gradient is zeroed below, at its (rows, D) products
                if grad_hidden is not None:
                    if in_place:
                        torch.mm(grad, w, out=grad_hidden[chunk]).mul_(keep)
                    else:
                        grad_hidden[chunk] = torch.mm(grad, w) * keep.to(compute)
                if grad_weight is not None:
                    h = h * keep.to(compute)
                    if in_place:
                        grad_weight.addmm_(grad.t(), h)
                    else:
                        grad_weight += torch.mm(grad.t(), h).float()
        ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.mark_non_differentiable(nll_sum)
        return _smoothed(nll_sum, smooth_sum, epsilon, vocab), nll_sum

    @staticmethod
    def backward(ctx, grad_loss: Tensor, _grad_nll: Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_loss
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        if grad_bias is not None:
            grad_bias = (grad_bias * grad_loss).to(ctx.bias_dtype)
        return grad_hidden, grad_weight, grad_bias, None, None, None, None, None


def batch_loss(model: Transformer, batch: Batch, epsilon: float, run: nn.Module | None = None
               ) -> tuple[Tensor, Tensor, Tensor]:
    """`label_smoothed_loss` of an mtx Transformer on a batch, teacher-forced.

    The model's forward pass gives its final decoder states at the target tokens only (`Transformer.forward`'s
    `tgt_positions`), so the output projection and the loss, forward and backward, skip the batch's target
    padding, and `projected_label_smoothed_loss` projects them with the model's output matrix
    (`Transformer.output_weight`) and output bias (`Transformer.output_bias`, None in the paper's model). `run`,
    when given, is the module that runs that forward pass: the model's DistributedDataParallel or `torch.compile`
    wrapper, which shares the model's parameters. A batch whose sources have no padding passes no source mask
    (`Batch.src_pad_if_any`).
    """
    states = (model if run is None else run)(batch.src, batch.src_pad_if_any, batch.tgt_in, batch.tgt_positions)
    return projected_label_smoothed_loss(states, model.output_weight, batch.tgt_tokens, epsilon,
                                         bias=model.output_bias)
