"""What only a GPU can check: half-precision decoding, the fused loss and SDPA's fused kernels on CUDA.

The CPU suite pins these down in float32 on the CPU's kernels; on a GPU the same code runs other kernels
(cuBLAS, SDPA's flash and memory-efficient attention) in other precisions, which no CPU test reaches. Every test
here is marked `cuda` and skipped where PyTorch sees no CUDA GPU, so the file is collected everywhere and
`make gpu-check` (bench/gpu_check.py) runs it with `-m cuda` on the machine that has one.

Tolerances are those of half precision: bf16 keeps 8 significant bits (a relative step of 2^-8 ≈ 0.4%), fp16 11.
"""

from __future__ import annotations

import copy
from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from support import prepared, recipe
from torch import Tensor

import mtx.train.loss as loss_module
from mtx.config.recipe import ModelConfig, resolve_model
from mtx.decode.translator import prepare_model
from mtx.model.transformer import MultiHeadAttention, Transformer
from mtx.tokenizer import BOS, PAD
from mtx.train.loss import label_smoothed_loss, projected_label_smoothed_loss

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (PyTorch sees none)")]

CUDA = torch.device("cuda")
VOCAB = 1000


def padded_tokens(lengths: tuple[int, ...], vocab: int, seed: int, first: int | None = None) -> Tensor:
    """(B, max length) random word ids right-padded with PAD, on the GPU; `first` fixes column 0 (BOS)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.full((len(lengths), max(lengths)), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        tokens[i, :n] = torch.randint(4, vocab, (n,), generator=g)
    if first is not None:
        tokens[:, 0] = first
    return tokens.to(CUDA)


def relative_error(ours: Tensor, reference: Tensor) -> float:
    """‖ours − reference‖ / ‖reference‖: one number for a whole gradient, where elementwise tolerances would
    trip over the few entries that are near zero."""
    return float((ours.float() - reference.float()).norm() / reference.float().norm().clamp_min(1e-30))


# ------------------------------------------------------------------------- cached decoding in half precision

# Log-probabilities are float32 computed from half-precision logits, whose magnitude here reaches 8–16, where
# bf16's step is 1/16 and fp16's 1/128; the cache and teacher forcing run different kernels (one query at a time
# against whole sequences), so they may differ by a step or two of a logit, and on average by far less.
MAX_DIFF = {"bf16": 0.15, "fp16": 0.03}
MEAN_DIFF = {"bf16": 0.02, "fp16": 0.003}


def _teacher_forced_and_cached(model: Transformer, src: Tensor, tgt_in: Tensor) -> tuple[Tensor, Tensor]:
    """(B, T, V) log-probabilities of `forward` and of `decode_step` stepped over `tgt_in`, in float32."""
    src_pad = src == PAD
    with torch.inference_mode():
        forced = F.log_softmax(model.output_logits(model(src, src_pad, tgt_in)).float(), dim=-1)
        state = model.init_state(model.encode(src, src_pad), src_pad, max_len=tgt_in.shape[1] + 4)
        cached = torch.stack([model.decode_step(tgt_in[:, t], state)[0] for t in range(tgt_in.shape[1])], dim=1)
    return forced, cached


def _assert_close_logprobs(ours: Tensor, reference: Tensor, dtype: str, what: str) -> None:
    difference = (ours - reference).abs()
    assert torch.isfinite(ours).all(), f"{what}: non-finite log-probabilities"
    assert float(difference.max()) < MAX_DIFF[dtype], f"{what}: max |Δ log p| {float(difference.max()):.4f}"
    assert float(difference.mean()) < MEAN_DIFF[dtype], f"{what}: mean |Δ log p| {float(difference.mean()):.5f}"
    agreement = float((ours.argmax(-1) == reference.argmax(-1)).float().mean())
    assert agreement >= 0.95, f"{what}: the best next token agrees at {agreement:.0%} of the positions"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_cached_decoding_equals_teacher_forcing_in_half_precision(dtype: str) -> None:
    """`encode` / `init_state` / `decode_step` give `forward`'s log-probabilities with the model converted as
    `mtx translate --device cuda --dtype bf16|fp16` converts it, source padding included, and pick the same
    next token; both stay as close to the float32 model's."""
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="base", layers_enc=2, layers_dec=2, max_positions=128))
    model = Transformer(cfg, VOCAB).eval()
    src = padded_tokens((23, 9, 31, 1, 17), VOCAB, seed=1)
    tgt_in = padded_tokens((12,) * 5, VOCAB, seed=2, first=BOS)
    reference, _ = _teacher_forced_and_cached(copy.deepcopy(model).to(CUDA), src, tgt_in)
    forced, cached = _teacher_forced_and_cached(prepare_model(model, CUDA, dtype), src, tgt_in)
    assert cached.dtype == torch.float32
    _assert_close_logprobs(cached, forced, dtype, "decode_step against forward")
    _assert_close_logprobs(forced, reference, dtype, f"forward in {dtype} against float32")
    _assert_close_logprobs(cached, reference, dtype, f"decode_step in {dtype} against float32")


# ------------------------------------------------------------------------------------ the fused loss on CUDA


@pytest.mark.parametrize("chunk_rows", [None, 700], ids=["default-chunks", "700-row-chunks"])
@pytest.mark.parametrize("autocast", [None, torch.bfloat16], ids=["fp32", "bf16-autocast"])
def test_fused_projection_and_loss_equal_the_unfused_ones(monkeypatch, autocast: torch.dtype | None,
                                                           chunk_rows: int | None) -> None:
    """`projected_label_smoothed_loss` (projection, loss and gradient fused, a chunk of tokens at a time) gives
    the values and the gradients of `label_smoothed_loss(F.linear(h, w), ...)` through autograd, on the GPU in
    float32 and under bf16 autocast as training runs it, padding targets included, with the paper's 37k vocabulary."""
    if chunk_rows is not None:
        monkeypatch.setitem(loss_module._CHUNK_ELEMENTS, "cuda", chunk_rows * 37_000)
    g = torch.Generator(device=CUDA).manual_seed(0)
    n, d, vocab = 3000, 512, 37_000
    hidden = torch.randn(n, d, device=CUDA, generator=g)
    weight = torch.randn(vocab, d, device=CUDA, generator=g) * d**-0.5
    target = torch.randint(4, vocab, (n,), device=CUDA, generator=g)
    target[::17] = PAD
    results = []
    for compute in (lambda h, w: label_smoothed_loss(F.linear(h, w), target, 0.1),
                    lambda h, w: projected_label_smoothed_loss(h, w, target, 0.1)):
        h, w = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=autocast) if autocast is not None else nullcontext():
            loss, nll, n_tokens = compute(h, w)
        (2.5 * loss).backward()
        results.append((loss.detach(), nll, n_tokens, h.grad, w.grad))
    (loss, nll, n_tokens, grad_h, grad_w), (ref_loss, ref_nll, ref_tokens, ref_grad_h, ref_grad_w) = results[::-1]
    tolerance = 1e-4 if autocast is None else 1e-2
    assert int(n_tokens) == int(ref_tokens) == n - len(range(0, n, 17))
    assert loss.dtype == torch.float32 and grad_h.dtype == grad_w.dtype == torch.float32
    assert relative_error(loss, ref_loss) < tolerance
    assert relative_error(nll, ref_nll) < tolerance
    assert relative_error(grad_h, ref_grad_h) < 2 * tolerance
    assert relative_error(grad_w, ref_grad_w) < 2 * tolerance
    assert torch.all(grad_h[::17] == 0), "padding targets must get no gradient"


# ------------------------------------------------------------------------------- SDPA's kernels against MATH

HEADS = {"tiny": (128, 4), "base": (512, 8), "big": (1024, 16)}  # d_model, heads: head sizes 32 and 64


def _kernel(backend: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH}[backend]


def _attention_run(case: str, preset: str, padded: bool, backend: str) -> tuple[Tensor, ...]:
    """Output and input gradients of one of mtx's attention sub-layers under bf16 autocast (as training runs
    it), on one SDPA backend, from inputs and weights fixed by seeds.

    encoder: self-attention over 37 source positions, with the key padding mask mtx builds when `padded`;
    decoder: causal self-attention over 29 target positions; cross: 29 queries over 37 encoder positions,
    the padding mask when `padded`.
    """
    from torch.nn.attention import sdpa_kernel

    d_model, heads = HEADS[preset]
    torch.manual_seed(0)
    attention = MultiHeadAttention(d_model, heads, attn_dropout=0.0, self_attention=case != "cross").to(CUDA)
    g = torch.Generator(device=CUDA).manual_seed(1)
    batch, source, target = 4, 37, 29
    x = torch.randn(batch, source if case == "encoder" else target, d_model, device=CUDA, generator=g)
    memory = torch.randn(batch, source, d_model, device=CUDA, generator=g)
    pad = torch.arange(source, device=CUDA)[None, :] >= torch.tensor([37, 20, 5, 31], device=CUDA)[:, None]
    upstream = torch.randn(batch, x.shape[1], d_model, device=CUDA, generator=g)
    x.requires_grad_(True)
    memory.requires_grad_(True)
    with sdpa_kernel(_kernel(backend)), torch.autocast("cuda", dtype=torch.bfloat16):
        if case == "encoder":
            out = attention.forward_self(x, pad if padded else None)
        elif case == "decoder":
            out = attention.forward_self(x, causal=True)
        else:
            out = attention.forward_cross(x, memory, pad if padded else None)
        (out.float() * upstream).sum().backward()
    grads = (x.grad,) if case != "cross" else (x.grad, memory.grad)
    return (out.float(), *grads)


# Flash attention takes no mask, so the padded cases run on the memory-efficient kernel only.
SUBLAYER_CASES = [(backend, case, padded) for backend in ("flash", "efficient")
                  for case, padded in (("encoder", False), ("encoder", True), ("decoder", False), ("cross", False),
                                       ("cross", True)) if not (backend == "flash" and padded)]


@pytest.mark.parametrize("preset", list(HEADS))
@pytest.mark.parametrize(("backend", "case", "padded"), SUBLAYER_CASES)
def test_fused_attention_kernels_equal_math(backend: str, case: str, padded: bool, preset: str) -> None:
    """SDPA's flash and memory-efficient kernels compute what its MATH kernel computes for mtx's attention
    sub-layers (training: forward and backward, in bf16), so a GPU trains the same model whichever kernel SDPA
    picks."""
    reference = _attention_run(case, preset, padded, "math")
    fused = _attention_run(case, preset, padded, backend)
    out, ref_out = fused[0], reference[0]
    torch.testing.assert_close(out, ref_out, atol=2e-2, rtol=2e-2)
    for ours, theirs in zip(fused[1:], reference[1:], strict=True):
        assert relative_error(ours, theirs) < 2e-2


@pytest.mark.parametrize("backend", ["flash", "efficient"])
@pytest.mark.parametrize("queries", [1, 4], ids=["self-step", "beam4-cross-step"])
def test_fused_attention_kernels_equal_math_when_decoding(backend: str, queries: int) -> None:
    """Decoding's shapes: one query per row against the cache's first 11 positions (a strided slice of the
    preallocated cache, as `DecoderLayer.step` reads it), and a sentence's 4 beams as 4 queries against its
    37 encoder positions (with the padding mask, on the memory-efficient kernel only), in bf16."""
    from torch.nn.attention import sdpa_kernel

    masked = queries > 1 and backend == "efficient"
    g = torch.Generator(device=CUDA).manual_seed(0)
    batch, heads, head_dim, keys = 8, 8, 64, (11 if queries == 1 else 37)
    cache = torch.randn(2, batch, heads, 64, head_dim, device=CUDA, generator=g, dtype=torch.bfloat16)
    k, v = cache[0, :, :, :keys], cache[1, :, :, :keys]
    q = torch.randn(batch, heads, queries, head_dim, device=CUDA, generator=g, dtype=torch.bfloat16)
    lengths = torch.randint(1, keys + 1, (batch,), device=CUDA, generator=g)
    mask = (torch.arange(keys, device=CUDA)[None, :] < lengths[:, None])[:, None, None, :] if masked else None
    outputs = {}
    for name in (backend, "math"):
        with sdpa_kernel(_kernel(name)), torch.inference_mode():
            outputs[name] = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
    torch.testing.assert_close(outputs[backend], outputs["math"], atol=2e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------- feeding the GPU, saving


def test_a_training_micro_batch_never_waits_for_the_gpu() -> None:
    """A pinned batch copied without blocking, then forward, fused loss and backward under bf16 autocast:
    CUDA's sync debug mode raises on any host synchronisation (an `.item()`, a boolean-mask index)."""
    from mtx.data.batching import Batch
    from mtx.train.loss import batch_loss

    torch.manual_seed(0)
    model = Transformer(resolve_model(ModelConfig(preset="tiny")), VOCAB).to(CUDA).train()
    src, tgt = padded_tokens((9, 5, 7), VOCAB, seed=1).cpu(), padded_tokens((6, 8, 3), VOCAB, seed=2).cpu()
    tgt_in = torch.cat([torch.full((3, 1), BOS), tgt[:, :-1]], dim=1).masked_fill(tgt == PAD, PAD)
    batch = Batch(src, src == PAD, tgt_in, tgt, int((tgt != PAD).sum())).pin_memory()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        on_gpu = batch.to(CUDA)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_sum, nll_sum, _ = batch_loss(model, on_gpu, 0.1)
        (loss_sum / batch.n_tgt_tokens).backward()
        sums = torch.stack([loss_sum.detach(), nll_sum]).double()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert sums.device.type == "cuda" and model.tgt_embed.weight.grad is not None


def test_a_batch_without_source_padding_trains_as_with_its_all_false_mask() -> None:
    """Sources of one length go to SDPA without a mask (`Batch.src_pad_if_any`), which may then run its flash
    kernel: under bf16 autocast the loss and the output matrix's gradient are those of the masked path, which
    runs another kernel, to bf16's tolerance."""
    import dataclasses

    from mtx.data.batching import Batch
    from mtx.train.loss import batch_loss

    torch.manual_seed(0)
    model = Transformer(resolve_model(ModelConfig(preset="tiny", dropout=0.0)), VOCAB).to(CUDA).train()
    src, tgt = padded_tokens((9, 9, 9), VOCAB, seed=1), padded_tokens((6, 8, 3), VOCAB, seed=2)
    tgt_in = torch.cat([torch.full((3, 1), BOS, device=CUDA), tgt[:, :-1]], dim=1).masked_fill(tgt == PAD, PAD)
    unmasked = Batch(src, src == PAD, tgt_in, tgt, int((tgt != PAD).sum()))
    assert unmasked.src_pad_if_any is None
    results = []
    for batch in (unmasked, dataclasses.replace(unmasked, src_padded=True)):
        model.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss_sum, _, _ = batch_loss(model, batch, 0.1)
        loss_sum.backward()
        results.append((loss_sum.detach(), model.tgt_embed.weight.grad.clone()))
    torch.testing.assert_close(results[0][0], results[1][0], atol=0, rtol=1e-2)
    torch.testing.assert_close(results[0][1], results[1][1], atol=1e-3, rtol=2e-2)


def test_a_checkpoint_of_a_gpu_model_stores_the_tied_matrix_once(tmp_path) -> None:
    """Moving a GPU model's state to the CPU must keep the three names of the tied embedding one tensor."""
    from mtx.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint

    model = Transformer(resolve_model(ModelConfig(preset="tiny")), VOCAB).to(CUDA)
    save_checkpoint(make_checkpoint(model, "{}", {}, 0), tmp_path / "model.pt")
    state = load_checkpoint(tmp_path / "model.pt")["model"]
    assert state["src_embed.weight"].data_ptr() == state["tgt_embed.weight"].data_ptr()


# --------------------------------------------------------------------------------- the trainer on a GPU


def test_fp16_training_with_fused_adamw_skips_an_inf_gradient(tmp_path) -> None:
    """The path only CUDA takes: fp16 autocast, the grad scaler and fused AdamW. An inf gradient at the third
    update is skipped (weights, Adam's state and the schedule unchanged), counted, and training goes on."""
    import math

    from mtx.train import distributed
    from mtx.train.components import Hooks, build_run
    from mtx.train.trainer import Trainer

    stepped: list[bool] = []

    def inject_at_third(state, batches, update):
        weight = trainer.parts.model.tgt_embed.weight
        hook = weight.register_hook(lambda g: torch.full_like(g, math.inf)) if len(stepped) == 2 else None
        before = weight.detach().clone()
        stepped.append(update())
        if hook is not None:
            hook.remove()
            assert torch.equal(before, weight.detach())
        return stepped[-1]

    run = recipe(prepared(tmp_path), "model.dropout=0.0", device="cuda", precision="fp16", max_steps=5, log_every=1,
                 validate_every=100, save_every=100)
    trainer = Trainer(build_run(run, distributed.setup("cuda"), Hooks(around_update=inject_at_third)))
    assert trainer.parts.optimizer.defaults["fused"] and trainer.parts.precision.scaler.is_enabled()
    state = trainer.fit()
    assert stepped == [True, True, False, True, True, True]
    assert (state.step, state.skipped_steps) == (5, 1)


def test_fp32_training_on_a_gpu_allows_tf32(tmp_path) -> None:

    from mtx.train import distributed
    from mtx.train.components import build_run
    from mtx.train.trainer import Trainer

    before = torch.backends.cuda.matmul.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = False
        Trainer(build_run(recipe(prepared(tmp_path), device="cuda", precision="fp32", max_steps=1),
                          distributed.setup("cuda")))
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
