"""Label-smoothed cross-entropy: ε spread over the types that are neither the reference nor PAD (OpenNMT-py's
and the Annotated Transformer's q), padding ignored, sums not means."""

import dataclasses
from collections import Counter
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import mtx.train.loss as loss_module
from mtx.config.recipe import ModelConfig, resolve_model
from mtx.data.batching import Batch
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, PAD
from mtx.train.loss import batch_loss, label_smoothed_loss, projected_label_smoothed_loss

VOCAB = 11


def example(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, VOCAB, generator=g)
    target = torch.randint(4, VOCAB, (3, 5), generator=g)
    target[1, 3:] = PAD
    target[2, 1:] = PAD
    return logits, target


def smoothed_reference(logits: torch.Tensor, target: torch.Tensor, epsilon: float, pad_id: int = PAD
                       ) -> torch.Tensor:
    """Cross-entropy, in float64, against the smoothed distribution written out: 1 − ε on the reference,
    nothing on PAD, ε/(V−2) on every other type."""
    q = torch.full(logits.shape, epsilon / (VOCAB - 2), dtype=torch.float64)
    q[..., pad_id] = 0.0
    q.scatter_(-1, target.unsqueeze(-1), 1.0 - epsilon)
    per_token = -(q * F.log_softmax(logits.double(), dim=-1)).sum(-1)
    return per_token[target != pad_id].sum().float()


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("pad_id", [PAD, 5])  # PAD is mtx's first id; a column inside the vocabulary too
def test_matches_cross_entropy_with_a_smoothed_distribution(epsilon: float, pad_id: int) -> None:
    logits, target = example()
    target = target.masked_fill(target == pad_id, 4).masked_fill(target == PAD, pad_id)
    loss, nll, n_tokens = label_smoothed_loss(logits, target, epsilon, pad_id)
    torch.testing.assert_close(loss, smoothed_reference(logits, target, epsilon, pad_id))
    cross_entropy = F.cross_entropy(logits.transpose(1, 2), target, ignore_index=pad_id, reduction="sum")
    torch.testing.assert_close(nll, cross_entropy)
    if epsilon == 0.0:
        torch.testing.assert_close(loss, cross_entropy)
    assert int(n_tokens) == int((target != pad_id).sum()) == 5 + 3 + 1


def test_padding_positions_do_not_count() -> None:
    logits, target = example()
    loss, _, _ = label_smoothed_loss(logits, target, 0.1)
    garbage = logits.clone()
    garbage[target == PAD] = 1e4 * torch.randn_like(garbage[target == PAD])
    torch.testing.assert_close(label_smoothed_loss(garbage, target, 0.1)[0], loss)
    logits.requires_grad_(True)
    label_smoothed_loss(logits, target, 0.1)[0].backward()
    assert torch.all(logits.grad[target == PAD] == 0)


def test_nll_is_detached_and_loss_is_float32_under_half_logits() -> None:
    logits, target = example()
    loss, nll, _ = label_smoothed_loss(logits.bfloat16().requires_grad_(True), target, 0.1)
    assert loss.dtype == torch.float32 and loss.requires_grad and not nll.requires_grad


def test_flat_logits_of_the_target_tokens_give_the_padded_loss() -> None:
    """(N, V) logits of just the target tokens, as `batch_loss` uses them, give the (B, T, V) result."""
    logits, target = example()
    keep = target != PAD
    for flat, padded in zip(label_smoothed_loss(logits[keep], target[keep], 0.1),
                            label_smoothed_loss(logits, target, 0.1), strict=True):
        torch.testing.assert_close(flat, padded)


def model_and_batch() -> tuple[Transformer, Batch]:
    """A tiny model in eval mode and a padded batch of `example`'s targets."""
    torch.manual_seed(0)
    model = Transformer(resolve_model(ModelConfig(preset="tiny", d_model=32, heads=4, d_ff=64)), VOCAB).eval()
    _, target = example()
    src = torch.randint(4, VOCAB, (3, 7), generator=torch.Generator().manual_seed(1))
    tgt_in = torch.cat([torch.full((3, 1), BOS), target[:, :-1]], dim=1).masked_fill(target == PAD, PAD)
    return model, Batch(src, src == PAD, tgt_in, target, int((target != PAD).sum()))


def losses_and_gradients(model: Transformer, *losses: Callable[[], tuple[torch.Tensor, ...]]) -> list[tuple]:
    """For each loss function: its (loss, nll, tokens) and the output matrix's gradient of its loss."""
    results = []
    for loss in losses:
        model.zero_grad()
        sums = loss()
        sums[0].backward()
        results.append((sums, model.tgt_embed.weight.grad.clone()))
    return results


def assert_same(results: list[tuple]) -> None:
    (first, first_grad), (second, second_grad) = results
    for a, b in zip(first, second, strict=True):
        torch.testing.assert_close(a, b)
    torch.testing.assert_close(first_grad, second_grad)


def test_batch_loss_equals_the_loss_of_the_full_logits() -> None:
    """Skipping the padding's logits changes the work, not the loss or its gradient."""
    model, batch = model_and_batch()

    def loss_of_every_position() -> tuple[torch.Tensor, ...]:
        logits = model.output_logits(model(batch.src, batch.src_pad, batch.tgt_in))  # (B, T, V)
        return label_smoothed_loss(logits, batch.tgt_out, 0.1)

    assert_same(losses_and_gradients(model, lambda: batch_loss(model, batch, 0.1), loss_of_every_position))


def test_a_batch_without_source_padding_attends_without_a_mask_to_the_same_loss() -> None:
    """Sources of one length: no mask goes to attention (SDPA may then take its flash kernel on a GPU), and
    the loss and every gradient are those of the all-False mask. A padded batch keeps its mask, moved or not."""
    model, batch = model_and_batch()
    assert not batch.src_padded and batch.src_pad_if_any is None
    masked = dataclasses.replace(batch, src_padded=True)
    assert masked.src_pad_if_any is masked.src_pad
    results = []
    for each in (batch, masked):
        model.zero_grad()
        sums = batch_loss(model, each, 0.1)
        sums[0].backward()
        results.append((sums, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])))
    assert_same(results)

    src = batch.src.clone()
    src[0, -2:] = PAD
    padded = Batch(src, src == PAD, batch.tgt_in, batch.tgt_out, batch.n_tgt_tokens)
    assert padded.src_padded and padded.to(torch.device("cpu")).src_pad_if_any is not None


def test_batch_loss_runs_the_forward_pass_through_the_wrapper_it_is_given() -> None:
    """The trainer's DDP or compiled wrapper runs the forward pass (`run`); the loss projects with the model's
    own output matrix, whose gradient it gives, as without the wrapper."""

    class Wrapper(torch.nn.Module):
        def __init__(self, inner: Transformer) -> None:
            super().__init__()
            self.inner, self.calls = inner, 0

        def forward(self, *args: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.inner(*args)

    model, batch = model_and_batch()
    wrapper = Wrapper(model)
    assert_same(losses_and_gradients(model, lambda: batch_loss(model, batch, 0.1),
                                     lambda: batch_loss(model, batch, 0.1, run=wrapper)))
    assert wrapper.calls == 1


def projection_example(n: int = 23, d: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=g)
    weight = torch.randn(VOCAB, d, generator=g)
    target = torch.randint(4, VOCAB, (n,), generator=g)
    return hidden, weight, target


@pytest.mark.parametrize("chunk_elements", [VOCAB, 5 * VOCAB, 2**23])  # one row per chunk, several, all at once
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("biased", [False, True])  # a model with model.output_bias
def test_projected_loss_equals_the_loss_of_the_logits(monkeypatch, chunk_elements: int, epsilon: float,
                                                      padded: bool, biased: bool) -> None:
    """The fused, chunked projection + loss: same values and same gradients (the output bias' among them) as
    projecting, then the loss, through autograd; padding targets count for nothing; the incoming gradient
    scales the result."""
    monkeypatch.setitem(loss_module._CHUNK_ELEMENTS, "cpu", chunk_elements)
    hidden, weight, target = projection_example()
    bias = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) if biased else None
    if padded:
        target[[2, 3, 17]] = PAD
    results = []
    for compute in (lambda h, w, b: label_smoothed_loss(F.linear(h, w, b), target, epsilon),
                    lambda h, w, b: projected_label_smoothed_loss(h, w, target, epsilon, bias=b)):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        b = None if bias is None else bias.clone().requires_grad_(True)
        loss, nll, n_tokens = compute(h, w, b)
        (2.5 * loss).backward()
        results.append((loss, nll, n_tokens, h.grad, w.grad, None if b is None else b.grad))
        assert not nll.requires_grad
    for ours, reference in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)
    if padded:
        assert torch.all(results[1][3][[2, 3, 17]] == 0)


@pytest.mark.parametrize("chunk_elements", [5 * VOCAB, 2**23])
def test_a_pad_that_is_never_predicted_gets_no_gradient(monkeypatch, chunk_elements: int) -> None:
    """An imported MarianMT model's PAD: a zero output row and the bias NEVER = −1e4, so p(PAD) is exactly 0.
    Its −log p(PAD) of 1e4 is outside the smoothed target, so the loss is the written-out one and finite, and
    PAD's bias and output row get exactly zero gradient, fused and unfused: nothing moves them in fine-tuning."""
    monkeypatch.setitem(loss_module._CHUNK_ELEMENTS, "cpu", chunk_elements)
    hidden, weight, target = projection_example()
    target[[2, 17]] = PAD
    bias = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5))
    weight[PAD], bias[PAD] = 0.0, -1e4
    for compute in (lambda h, w, b: label_smoothed_loss(F.linear(h, w, b), target, 0.1),
                    lambda h, w, b: projected_label_smoothed_loss(h, w, target, 0.1, bias=b)):
        h, w, b = (t.clone().requires_grad_(True) for t in (hidden, weight, bias))
        loss = compute(h, w, b)[0]
        loss.backward()
        assert torch.isfinite(loss)
        torch.testing.assert_close(loss, smoothed_reference(F.linear(hidden, weight, bias), target, 0.1))
        assert b.grad[PAD] == 0 and torch.all(w.grad[PAD] == 0)
        assert torch.all(b.grad[1:] != 0)


class OpCounter(TorchDispatchMode):
    """Counts the ATen operations run inside it, by name (e.g. "mm"), and the shapes of the tensors they made."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()
        self.shapes: set[tuple[int, ...]] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.shapes.add(tuple(out.shape))
        return out


@pytest.mark.parametrize("chunk_elements", [5 * VOCAB, 2**23])
def test_projected_loss_without_gradients_computes_none(monkeypatch, chunk_elements: int) -> None:
    """Validation runs under no_grad with the real output matrix, a parameter: the loss alone, one matrix
    product per chunk (the logits) and no gradient products or buffers. With gradients, three per chunk."""
    monkeypatch.setitem(loss_module._CHUNK_ELEMENTS, "cpu", chunk_elements)
    hidden, weight, target = projection_example()
    hidden, weight = hidden.requires_grad_(True), torch.nn.Parameter(weight)
    chunks = -(-len(target) // max(1, chunk_elements // VOCAB))
    with torch.no_grad(), OpCounter() as ops:
        loss, nll, _ = projected_label_smoothed_loss(hidden, weight, target, 0.1)
    assert ops.counts["mm"] == chunks and ops.counts["addmm_"] == 0
    assert tuple(weight.shape) not in ops.shapes  # no buffer for the output matrix's gradient
    torch.testing.assert_close(loss, label_smoothed_loss(F.linear(hidden, weight), target, 0.1)[0])
    assert not loss.requires_grad
    with OpCounter() as ops:
        projected_label_smoothed_loss(hidden, weight, target, 0.1)
    assert ops.counts["mm"] + ops.counts["addmm_"] == 3 * chunks


def test_projected_loss_under_bf16_autocast_tracks_the_unfused_one() -> None:
    """bf16 autocast (here on the CPU, as on a GPU): bf16 matmuls, float32 softmax and loss, float32 gradients
    for float32 parameters (an output bias among them); within bf16 rounding of the plain path under the same
    autocast."""
    hidden, weight, target = projection_example(n=64, d=32)
    bias = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5))
    results = []
    for compute in (lambda h, w, b: label_smoothed_loss(F.linear(h, w, b), target, 0.1),
                    lambda h, w, b: projected_label_smoothed_loss(h, w, target, 0.1, bias=b)):
        h, w, b = (t.clone().requires_grad_(True) for t in (hidden, weight, bias))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = compute(h, w, b)[0]
        loss.backward()
        results.append((loss, h.grad, w.grad, b.grad))
    for ours, reference in zip(results[1], results[0], strict=True):
        assert ours.dtype == torch.float32
        torch.testing.assert_close(ours, reference, rtol=2e-2, atol=2e-2)
