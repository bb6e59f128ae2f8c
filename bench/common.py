"""What every benchmark shares: threads, timing, JSON lines, synthetic data, and checks of an mtx model's twins.

Timing rules (the machines these run on are shared and noisy): warm up first, time several repeats, report the
median, and interleave the systems being compared repeat by repeat (`time_interleaved`), so that a burst of
load from a neighbour hits all of them rather than whichever happened to run at that moment.

The peers (Hugging Face `transformers`, `ctranslate2`) are imported lazily (here and in mtx.export, which maps
mtx's weights onto them), because they live in the separate `.bench-venv` that `make bench` creates or in the
optional extra `mtx[export]`, never among mtx's own dependencies: `peers_missing()` tells a
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

from mtx.config.recipe import ModelConfig, resolve_model
from mtx.data.batching import Batch, collate
from mtx.model.transformer import Transformer
from mtx.tokenizer import PAD, SPECIAL_TOKENS

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
                     device: torch.device = torch.device("cpu"),
                     clock: Callable[[], float] = time.perf_counter) -> dict[str, list[float]]:
    """Seconds per call of each function: `warmup` untimed calls each, then `repeats` rounds of one call each.

    The rounds interleave the functions (a, b, a, b, ...) so slow drifts in machine load affect all alike.
    `clock` is wall-clock time; `time.process_time` counts the CPU time of the process's threads instead,
    which other programs on a shared machine do not inflate as they inflate the wall-clock time.
    """
    for fn in runs.values():
        for _ in range(warmup):
            fn()
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(repeats):
        for name, fn in runs.items():
            synchronize(device)
            start = clock()
            fn()
            synchronize(device)
            seconds[name].append(clock() - start)
    return seconds


# ------------------------------------------------------------------------------------------ synthetic data


def model_config(preset: str) -> ModelConfig:
    return resolve_model(ModelConfig(preset=preset))


def build_model(preset: str, vocab: int, seed: int = 0) -> Transformer:
    """An mtx Transformer with the preset's shape and random weights (mtx's own initialisation)."""
    torch.manual_seed(seed)
    return Transformer(model_config(preset), vocab)


class RandomPairs:
    """Random sentence pairs of word ids in [FIRST_WORD, vocab), shaped like mtx.data.prepared's splits (a PairSource),
    so `mtx.data.batching.make_batches` and `collate` batch them exactly as the trainer batches real data.

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
# mtx.export.marian maps mtx's weights onto a MarianMT model and mtx.export.ctranslate2 converts them for
# CTranslate2 (`mtx export`); the benchmarks use those, and check here that the twin computes mtx's function.


def check_same_function(model: Transformer, marian, batch: Batch, name: str = "marian.same_weights_check") -> None:
    """mtx and its Marian twin must give the same log-probabilities (to 1e-4), or a comparison of their speed
    would compare different work; prints the largest difference and raises if it is over."""
    with torch.inference_mode():
        ours = torch.log_softmax(model.output_logits(model(batch.src, batch.src_pad, batch.tgt_in)), dim=-1)
        theirs = torch.log_softmax(marian(input_ids=batch.src, attention_mask=(~batch.src_pad).long(),
                                          decoder_input_ids=batch.tgt_in, use_cache=False).logits, dim=-1)
    keep = batch.tgt_out != PAD
    max_diff = float((ours - theirs)[keep].abs().max())
    emit_info(name, max_abs_logprob_diff=max_diff, ok=max_diff < 1e-4)
    if max_diff >= 1e-4:
        raise RuntimeError(f"Marian's log-probabilities differ from mtx's by up to {max_diff}")


# ------------------------------------------------------------------------------- the CTranslate2 twin


def token_strings(vocab: int) -> list[str]:
    """A synthetic model's vocabulary as CTranslate2 sees it (random ids have no tokenizer): mtx's special
    tokens, then "t<id>" for every other id."""
    return SPECIAL_TOKENS + [f"t{i}" for i in range(FIRST_WORD, vocab)]
