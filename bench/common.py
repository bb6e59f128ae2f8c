"""What every benchmark shares: threads, timing, JSON lines, synthetic data, and the Marian twin of an mtx model.

Timing rules (the machines these run on are shared and noisy): warm up first, time several repeats, report the
median, and interleave the systems being compared repeat by repeat (`time_interleaved`), so that a burst of
load from a neighbour hits all of them rather than whichever happened to run at that moment.

The peers (Hugging Face `transformers`, `ctranslate2`) are imported lazily and only here, because they live in
the separate `.bench-venv` that `make bench` creates, never in mtx's own environment: `peers_missing()` tells a
script which are absent so it can print a `skipped` line instead of failing.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import re
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtx.batching import Batch, collate
from mtx.config import ModelConfig, resolve_model
from mtx.model import Transformer
from mtx.tokenizer import BOS, EOS, PAD, SPECIAL_TOKENS, UNK

FIRST_WORD = len(SPECIAL_TOKENS)  # random "words" are drawn from [FIRST_WORD, vocab): never a special token


# ------------------------------------------------------------------------------------------ environment


def set_threads(threads: int) -> None:
    """Intra-op threads as asked; one inter-op thread, as nothing here runs independent ops concurrently."""
    torch.set_num_threads(threads)
    with contextlib.suppress(RuntimeError):  # settable only before the first parallel op; harmless if it was
        torch.set_num_interop_threads(1)


def peers_missing(*modules: str) -> list[str]:
    """The peer packages (by import name) not installed in this environment."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def synchronize(device: torch.device) -> None:
    """Wait for queued GPU work, so that wall-clock time measures the work and not its launch."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# --------------------------------------------------------------------------------------------- output


def emit(name: str, config: dict[str, Any], samples: Sequence[float], units: str, **extra: Any) -> None:
    """One measurement as one JSON line on stdout: the median of `samples`, their count and spread."""
    record = {"name": name, "config": config, "median": significant(statistics.median(samples)),
              "repeats": len(samples), "min": significant(min(samples)), "max": significant(max(samples)),
              "units": units, **extra}
    print(json.dumps(record), flush=True)


def emit_skip(name: str, reason: str, config: dict[str, Any] | None = None) -> None:
    """A measurement that could not be taken here, and why (e.g. the peer packages are not installed)."""
    print(json.dumps({"name": name, "config": config or {}, "skipped": reason}), flush=True)


def emit_info(name: str, **fields: Any) -> None:
    """A fact about the run that is not a timing (a correctness check, a derived ratio against a bar)."""
    print(json.dumps({"name": name, **{k: significant(v) if isinstance(v, float) else v for k, v in fields.items()}}),
          flush=True)


def significant(x: float) -> float:
    """Five significant digits: what a JSON line shows of a figure."""
    return float(f"{x:.5g}")


# --------------------------------------------------------------------------------------------- timing


def time_interleaved(runs: dict[str, Callable[[], Any]], repeats: int, warmup: int = 1,
                     device: torch.device = torch.device("cpu")) -> dict[str, list[float]]:
    """Seconds per call of each function: `warmup` untimed calls each, then `repeats` rounds of one call each.

    The rounds interleave the functions (a, b, a, b, ...) so slow drifts in machine load affect all alike.
    """
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            synchronize(device)
            start = time.perf_counter()
            fn()
            synchronize(device)
            seconds[name].append(time.perf_counter() - start)
    return seconds


# ------------------------------------------------------------------------------------------ synthetic data


def model_config(preset: str) -> ModelConfig:
    return resolve_model(ModelConfig(preset=preset))


def build_model(preset: str, vocab: int, seed: int = 0) -> Transformer:
    """An mtx Transformer with the preset's shape and random weights (mtx's own initialisation)."""
    torch.manual_seed(seed)
    return Transformer(model_config(preset), vocab)


class RandomPairs:
    """Random sentence pairs of word ids in [FIRST_WORD, vocab), shaped like mtx.data's splits (a PairSource),
    so `mtx.batching.make_batches` and `collate` batch them exactly as the trainer batches real data.

    Source lengths are uniform in [min_len, max_len]; a target's length is its source's ± 3 (clipped to the
    same range), as translations' lengths follow their sources', which length-bucketed batching relies on.
    """

    def __init__(self, n: int, vocab: int, min_len: int, max_len: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.src_lens = rng.integers(min_len, max_len + 1, n)
        self.tgt_lens = np.clip(self.src_lens + rng.integers(-3, 4, n), min_len, max_len)
        self._src = [rng.integers(FIRST_WORD, vocab, k) for k in self.src_lens]
        self._tgt = [rng.integers(FIRST_WORD, vocab, k) for k in self.tgt_lens]

    def __len__(self) -> int:
        return len(self._src)

    def src(self, i: int) -> np.ndarray:
        return self._src[i]

    def tgt(self, i: int) -> np.ndarray:
        return self._tgt[i]


def random_batch(n: int, vocab: int, min_len: int, max_len: int, seed: int = 0) -> Batch:
    """n random pairs in one padded batch (src with EOS, tgt_in with BOS), in mtx's batch convention."""
    return collate(RandomPairs(n, vocab, min_len, max_len, seed), range(n))


# --------------------------------------------------------------------------------- FLOPs (for utilisation)


def train_matmul_flops(cfg: ModelConfig, vocab: int, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> float:
    """Matrix-multiply FLOPs of one training step (forward + backward) over the real (non-pad) tokens.

    Forward, per sentence of s source and t target positions (EOS / BOS included), D = d_model, F = d_ff:
      encoder layer:  2·s·(4D² + 2DF)            (Q, K, V, output projections; FFN)
                    + 4·s²·D                     (scores QKᵀ and the weighted sum AV)
      decoder layer:  2·t·(6D² + 2DF) + 4·s·D²   (self Q, K, V, out; cross Q, out; FFN) + cross K, V of the source
                    + 4·t²·D + 4·t·s·D           (self-attention counted in full, as PaLM's MFU does; cross)
      output:         2·t·D·V
    Backward costs twice the forward (gradients with respect to activations and to weights), so a training
    step is 3× the forward. Embedding lookups, LayerNorm, softmax and the optimizer are not matmuls and are left
    out, which is the usual convention for model FLOPs utilisation (MFU).
    """
    d, f = cfg.d_model, cfg.d_ff
    forward = 0.0
    for s, t in zip(src_lens, tgt_lens, strict=True):
        encoder = 2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d
        decoder = 2 * t * (6 * d * d + 2 * d * f) + 4 * s * d * d + 4 * t * t * d + 4 * t * s * d
        forward += cfg.layers_enc * encoder + cfg.layers_dec * decoder + 2 * t * d * vocab
    return 3.0 * forward


def train_model_flops(cfg: ModelConfig, vocab: int, src_lens: Sequence[int], tgt_lens: Sequence[int]) -> float:
    """Model FLOPs of one training step (forward + backward) as PaLM counts them for MFU (Chowdhery et al.,
    2022, appendix B): 6 FLOPs per parameter a token passes through, plus attention's two matmuls, with no
    recomputation counted, over the real (non-pad) tokens (EOS / BOS included).

    Why 6: a (D_in → D_out) matrix applied to one token costs 2·D_in·D_out FLOPs forward (a multiply and an
    add per weight) and twice that backward (gradients with respect to the input and to the weight), so each
    parameter costs 6 FLOPs per token it is applied to: PaLM's 6·N per token of a decoder-only model of N
    parameters. Biases and LayerNorm weights are counted too, as part of N (a few per d_model against d_model
    per row of a matrix). An encoder-decoder applies different parameters to different tokens, so each group
    is multiplied by the tokens it sees:

      source tokens (Σ s):  the encoder layers' parameters, and every decoder layer's cross-attention K/V
                            projection, which is applied to the encoder output, i.e. once per source token;
      target tokens (Σ t):  the rest of the decoder layers' parameters, and the output projection (V·D: the
                            embedding matrix used as a matmul; embedding lookups are not matmuls and are free).

    Attention's score and value matmuls (QKᵀ and AV) have no parameters: forward, a query attending to n keys
    costs 2·n·D for QKᵀ and 2·n·D for AV (over all heads, H·Dh = D), 4·n·D, so 12·n·D with the backward. This
    is PaLM's 12·L·H·Q·T per token with T the attended length; the decoder's causal self-attention is counted in
    full, as PaLM does, although half of its scores are masked. Per sentence of s source and t target tokens:

      encoder self-attention:   L_enc · 12·s·s·D
      decoder self-attention:   L_dec · 12·t·t·D
      cross-attention:          L_dec · 12·t·s·D

    So, with P_enc / P_dec the parameters of all encoder / decoder layers and P_kv those of the decoder's
    cross-attention K/V projections (2·D·D + 2·D per layer):

      FLOPs = 6·(P_enc + P_kv)·Σ s + 6·(P_dec − P_kv + V·D)·Σ t + 12·D·Σ (L_enc·s² + L_dec·(t² + t·s))

    `train_matmul_flops` counts the same matmuls weight by weight, leaving biases and LayerNorm out, which is
    all that tells the two apart.
    """
    with torch.device("meta"):
        model = Transformer(cfg, vocab)
    p_enc = sum(p.numel() for p in model.encoder_layers.parameters())
    p_dec = sum(p.numel() for p in model.decoder_layers.parameters())
    p_kv = sum(p.numel() for layer in model.decoder_layers for p in layer.cross_attn.kv_proj.parameters())
    s_sum, t_sum = float(sum(src_lens)), float(sum(tgt_lens))
    attended = sum(cfg.layers_enc * s * s + cfg.layers_dec * (t * t + t * s)
                   for s, t in zip(src_lens, tgt_lens, strict=True))
    return 6.0 * ((p_enc + p_kv) * s_sum + (p_dec - p_kv + vocab * cfg.d_model) * t_sum) + 12.0 * cfg.d_model * attended


# Dense (no sparsity) bf16 tensor-core peaks from the vendors' specification sheets, in TFLOP/s: (pattern matched
# against `torch.cuda.get_device_name()`, the part, its peak), tried in this order, so "H100 PCIe" before "H100"
# and "L40S" before "L4". None: the part has no bf16 tensor cores. A GPU not listed has an unknown peak and so no
# MFU, rather than a guessed one.
PEAK_BF16_TFLOPS: list[tuple[str, str, float | None]] = [
    (r"H200", "H200", 989.0),
    (r"H100.*PCIe", "H100 PCIe", 756.0),
    (r"H100(?!.*NVL)", "H100 SXM", 989.0),  # which names itself "H100 80GB HBM3"; the NVL is another part
    (r"A100", "A100", 312.0),
    (r"L40S", "L40S", 362.0),
    (r"\bL4\b", "L4", 121.0),
    (r"\bA10\b", "A10", 125.0),
    (r"RTX 4090", "RTX 4090", 165.0),
    (r"V100", "V100", None),
    (r"\bT4\b", "T4", None),
]


def peak_bf16_tflops(device_name: str) -> tuple[float | None, str]:
    """The GPU's dense bf16 peak (TFLOP/s) by its name, and where that figure comes from (or why there is none)."""
    for pattern, part, peak in PEAK_BF16_TFLOPS:
        if re.search(pattern, device_name):
            if peak is None:
                return None, f"the {part} has no bf16 tensor cores"
            return peak, f"{part} specification, dense bf16"
    return None, f"no specification figure for {device_name!r} in bench/common.py's PEAK_BF16_TFLOPS"


# ------------------------------------------------------------------------------- the Marian (HF) twin


def marian_config(cfg: ModelConfig, vocab: int):
    """A `transformers.MarianConfig` of the same architecture as an mtx model of config `cfg`.

    Marian in Transformers is the paper's post-norm Transformer with sinusoidal positions, which is what mtx's
    presets are; the settings that differ from Marian's defaults are spelled out: ReLU (its default is GELU),
    √d_model embedding scaling, one shared source/target/output matrix, dropout only on embeddings and residual
    branches, and mtx's special-token ids with decoding starting from BOS.
    """
    from transformers import MarianConfig

    if cfg.norm != "post" or not cfg.share_embeddings:
        raise ValueError("Marian is post-norm with shared embeddings; this mtx config is not")
    return MarianConfig(
        vocab_size=vocab, decoder_vocab_size=vocab, d_model=cfg.d_model,
        encoder_layers=cfg.layers_enc, decoder_layers=cfg.layers_dec,
        encoder_attention_heads=cfg.heads, decoder_attention_heads=cfg.heads,
        encoder_ffn_dim=cfg.d_ff, decoder_ffn_dim=cfg.d_ff, activation_function="relu",
        dropout=cfg.dropout, attention_dropout=cfg.attn_dropout, activation_dropout=cfg.relu_dropout,
        max_position_embeddings=cfg.max_positions, scale_embedding=True,
        share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, decoder_start_token_id=BOS, forced_eos_token_id=EOS,
    )


def build_marian(cfg: ModelConfig, vocab: int, attn_implementation: str = "sdpa"):
    """A MarianMTModel of the same shape as mtx's, with its own random weights (enough for training speed)."""
    from transformers import MarianMTModel

    model = MarianMTModel(marian_config(cfg, vocab))
    model.config._attn_implementation = attn_implementation
    return model


def marian_from_mtx(model: Transformer, attn_implementation: str = "sdpa"):
    """A MarianMTModel that computes the same function as `model`: every weight copied across.

    mtx packs self-attention Q, K, V into one matrix and cross-attention K, V into another; Marian keeps them
    separate, so those are split. mtx's sinusoidal table interleaves sin and cos across channels while Marian's
    puts all sines first, so mtx's table is copied into Marian's (frozen) position embeddings as well.
    """
    marian = build_marian(model.cfg, model.vocab_size, attn_implementation)
    with torch.no_grad():
        shared = marian.model.shared.weight
        shared.copy_(model.tgt_embed.weight)
        for stack in (marian.model.encoder, marian.model.decoder):
            stack.embed_positions.weight.copy_(model.positions[: stack.embed_positions.weight.shape[0]])
        for ours, theirs in zip(model.encoder_layers, marian.model.encoder.layers, strict=True):
            _copy_qkv(ours.self_attn.qkv_proj, theirs.self_attn)
            _copy_linear(ours.self_attn.out_proj, theirs.self_attn.out_proj)
            _copy_norm(ours.attn_residual.norm, theirs.self_attn_layer_norm)
            _copy_linear(ours.ffn.fc1, theirs.fc1)
            _copy_linear(ours.ffn.fc2, theirs.fc2)
            _copy_norm(ours.ffn_residual.norm, theirs.final_layer_norm)
        for ours, theirs in zip(model.decoder_layers, marian.model.decoder.layers, strict=True):
            _copy_qkv(ours.self_attn.qkv_proj, theirs.self_attn)
            _copy_linear(ours.self_attn.out_proj, theirs.self_attn.out_proj)
            _copy_norm(ours.self_residual.norm, theirs.self_attn_layer_norm)
            _copy_linear(ours.cross_attn.q_proj, theirs.encoder_attn.q_proj)
            for part, target in zip(_split(ours.cross_attn.kv_proj, 2), (theirs.encoder_attn.k_proj,
                                                                         theirs.encoder_attn.v_proj), strict=True):
                _copy_linear(part, target)
            _copy_linear(ours.cross_attn.out_proj, theirs.encoder_attn.out_proj)
            _copy_norm(ours.cross_residual.norm, theirs.encoder_attn_layer_norm)
            _copy_linear(ours.ffn.fc1, theirs.fc1)
            _copy_linear(ours.ffn.fc2, theirs.fc2)
            _copy_norm(ours.ffn_residual.norm, theirs.final_layer_norm)
        marian.final_logits_bias.zero_()
    tied = (marian.lm_head.weight.data_ptr() == shared.data_ptr() == marian.model.encoder.embed_tokens.weight.data_ptr()
            == marian.model.decoder.embed_tokens.weight.data_ptr())
    if not tied:
        raise RuntimeError("Marian's embeddings and output projection are not one shared matrix")
    return marian


def _split(linear: torch.nn.Linear, parts: int) -> list[tuple[Tensor, Tensor]]:
    return list(zip(linear.weight.chunk(parts), linear.bias.chunk(parts), strict=True))


def _copy_qkv(packed: torch.nn.Linear, attention) -> None:
    for part, target in zip(_split(packed, 3), (attention.q_proj, attention.k_proj, attention.v_proj), strict=True):
        _copy_linear(part, target)


def _copy_linear(source: torch.nn.Linear | tuple[Tensor, Tensor], target: torch.nn.Linear) -> None:
    weight, bias = (source.weight, source.bias) if isinstance(source, torch.nn.Linear) else source
    target.weight.copy_(weight)
    target.bias.copy_(bias)


def _copy_norm(source: torch.nn.LayerNorm, target: torch.nn.LayerNorm) -> None:
    target.weight.copy_(source.weight)
    target.bias.copy_(source.bias)


def check_same_function(model: Transformer, marian, batch: Batch, name: str = "marian.same_weights_check") -> None:
    """mtx and its Marian twin must give the same log-probabilities (to 1e-4), or a comparison of their speed
    would compare different work; prints the largest difference and raises if it is over."""
    with torch.inference_mode():
        ours = torch.log_softmax(model(batch.src, batch.src_pad, batch.tgt_in), dim=-1)
        theirs = torch.log_softmax(marian(input_ids=batch.src, attention_mask=(~batch.src_pad).long(),
                                          decoder_input_ids=batch.tgt_in, use_cache=False).logits, dim=-1)
    keep = batch.tgt_out != PAD
    max_diff = float((ours - theirs)[keep].abs().max())
    emit_info(name, max_abs_logprob_diff=max_diff, ok=max_diff < 1e-4)
    if max_diff >= 1e-4:
        raise RuntimeError(f"Marian's log-probabilities differ from mtx's by up to {max_diff}")


# ------------------------------------------------------------------------------- the CTranslate2 twin


def token_strings(vocab: int) -> list[str]:
    """The vocabulary as CTranslate2 sees it: mtx's special tokens, then "t<id>" for every other id."""
    return SPECIAL_TOKENS + [f"t{i}" for i in range(FIRST_WORD, vocab)]


def convert_to_ctranslate2(marian, vocab: int, output_dir: str) -> str:
    """Save `marian` (in memory) as a float32 CTranslate2 model; quantize at load time with `compute_type`.

    The stock `TransformersConverter` reloads a saved folder with its tokenizer and, for Marian, applies Marian's
    own conventions (the decoder starts from a zero embedding, the last vocabulary entry is dropped as padding),
    which are not mtx's. The model is mtx's post-norm Transformer in Marian's clothes, which CTranslate2's BART
    loader maps exactly (with the embedding LayerNorm and pre-norm switched off, as its Marian loader does) and
    with decoding starting from BOS, as mtx's does. A token list stands in for the tokenizer.
    """
    from ctranslate2.converters import Converter
    from ctranslate2.converters.transformers import BartLoader

    tokens = token_strings(vocab)

    class VocabularyOnly:
        """The part of a Transformers tokenizer that the loader reads."""

        bos_token, eos_token, unk_token = SPECIAL_TOKENS[BOS], SPECIAL_TOKENS[EOS], SPECIAL_TOKENS[UNK]

        def get_vocab(self) -> dict[str, int]:
            return {token: i for i, token in enumerate(tokens)}

        def convert_ids_to_tokens(self, i: int) -> str:
            return tokens[i]

    class InMemoryConverter(Converter):
        def _load(self):
            marian.config.normalize_before = False
            marian.config.normalize_embedding = False
            return BartLoader()(marian, VocabularyOnly())

    return InMemoryConverter().convert(output_dir, force=True)
