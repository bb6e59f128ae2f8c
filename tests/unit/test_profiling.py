"""bench/profiling.py, the summary of a profile that gpu-check prints: where a GPU's time went, computed from a
Chrome trace. A GPU trace cannot be recorded here, so the GPU path is checked on a trace written by hand in
the format PyTorch's profiler exports (kernels on a stream, the runtime calls that launched them on host
threads, linked by correlation ids); the CPU path on a real profile of a tiny model's update."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest
import torch
from support import ROOT

sys.path[:0] = [str(ROOT / "bench")]

from profiling import CATEGORIES, profile_decoding, profile_training, summarise, union_length  # noqa: E402

MAIN, AUTOGRAD, STREAM = 11, 12, 7


def span(name: str, ts: float, dur: float, tid: int = MAIN, cat: str = "cpu_op") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": {}}


def launch(correlation: int, ts: float, tid: int = MAIN) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": tid, "ts": ts, "dur": 2.0,
            "args": {"correlation": correlation}}


def kernel(name: str, correlation: int, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": STREAM, "ts": ts, "dur": dur,
            "args": {"correlation": correlation}}


def gpu_trace() -> list[dict]:
    """One profiled step of 1000 µs on the host. The GPU runs six kernels and a copy: 10 + 20 + 30 + 40 + 50 + 60
    + 5 = 215 µs, with no overlap, between 100 µs and 1100 µs (the last kernel ends after the step's host
    range, as a GPU lags its host): a window of 1000 µs, so 785 µs of host gaps."""
    return [
        {"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "python"}},
        span("ProfilerStep#1", 100, 900, cat="user_annotation"),
        span("aten::linear", 110, 20), span("aten::addmm", 112, 15), launch(1, 115),
        kernel("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 1, 100, 10),
        span("aten::scaled_dot_product_attention", 140, 20), launch(2, 145),
        kernel("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", 2, 200, 20),  # CUTLASS, but attention
        span("_ProjectedSmoothedLoss", 200, 100), span("aten::mm", 210, 10), launch(3, 212),
        kernel("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", 3, 300, 30),  # a GEMM inside the loss: the loss's
        launch(7, 250),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": STREAM, "ts": 340,
         "dur": 5, "args": {"correlation": 7}},
        span("autograd::engine::evaluate_function: LayerNormBackward0", 400, 50, tid=AUTOGRAD),
        span("aten::native_layer_norm_backward", 405, 40, tid=AUTOGRAD), launch(4, 410, tid=AUTOGRAD),
        kernel("void at::native::(anonymous namespace)::layer_norm_grad_input_kernel<float>", 4, 500, 40),
        span("Optimizer.step#AdamW.step", 600, 300, cat="user_annotation"), span("aten::_fused_adamw_", 610, 50),
        launch(5, 620), kernel("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>", 5, 700, 50),
        span("aten::add", 950, 5), launch(6, 951),  # after the step's host range: launched, still counted
        kernel("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", 6, 1040, 60),
    ]


def test_a_gpu_trace_is_summarised_by_where_each_kernel_was_launched_then_by_its_name() -> None:
    summary = summarise(gpu_trace())
    assert summary["device"] == "cuda" and summary["steps"] == 1
    ms = {c: v["ms_per_step"] for c, v in summary["categories"].items()}
    assert set(ms) == set(CATEGORIES)
    assert ms == pytest.approx({"matmul": 0.010, "attention": 0.020, "fused_loss": 0.030, "optimizer": 0.050,
                                "search": 0.0, "elementwise": 0.040 + 0.060, "memcpy": 0.005, "host_gaps": 0.785})
    assert summary["window_ms_per_step"] == pytest.approx(1.0)
    assert summary["host_ms_per_step"] == pytest.approx(0.9)
    assert summary["device_busy"] == pytest.approx(0.215)
    assert summary["kernels_per_step"] == 7
    assert sum(v["share"] for v in summary["categories"].values()) == pytest.approx(1.0)
    top = summary["top_kernels"]
    assert [k["ms_per_step"] for k in top] == sorted((k["ms_per_step"] for k in top), reverse=True)
    assert top[0]["name"].startswith("void at::native::vectorized") and top[0]["category"] == "elementwise"


def test_a_kernel_whose_launch_is_not_in_the_trace_is_classified_by_its_name() -> None:
    events = [e for e in gpu_trace() if not (e.get("cat") == "cuda_runtime" and e["args"]["correlation"] == 3)]
    ms = {c: v["ms_per_step"] for c, v in summarise(events)["categories"].items()}
    assert ms["fused_loss"] == 0.0 and ms["matmul"] == pytest.approx(0.040)


def test_a_trace_without_profiler_steps_is_refused() -> None:
    with pytest.raises(ValueError, match="ProfilerStep"):
        summarise([e for e in gpu_trace() if not e["name"].startswith("ProfilerStep")])


def test_union_length_counts_overlaps_once_and_clips_to_the_window() -> None:
    assert union_length([(0, 10), (5, 15), (20, 30), (28, 29)], 2, 25) == pytest.approx(13 + 5)
    assert union_length([], 0, 10) == 0.0


def test_a_real_cpu_profile_of_an_update_and_of_a_search(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    profile_training("tiny", 300, 256, torch.device("cpu"), "fp32", 1, tmp_path)
    profile_decoding("tiny", 300, 4, 6, torch.device("cpu"), "fp32", 1, tmp_path)
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    summaries = {line["name"]: line for line in lines if line["name"].endswith(".summary")}
    assert set(summaries) == {"profile.train.tiny.256.summary", "profile.decode.tiny.beam4.fp32.summary"}
    train, decode = summaries["profile.train.tiny.256.summary"], summaries["profile.decode.tiny.beam4.fp32.summary"]
    for summary in (train, decode):
        assert summary["device"] == "cpu" and summary["steps"] == 1
        assert sum(v["share"] for v in summary["categories"].values()) == pytest.approx(1.0, abs=1e-3)
        with gzip.open(summary["trace"], "rt") as f:
            assert json.load(f)["traceEvents"]
    for category in ("matmul", "attention", "fused_loss", "optimizer", "elementwise"):
        assert train["categories"][category]["ms_per_step"] > 0, category
    assert train["categories"]["search"]["ms_per_step"] == 0
    assert decode["categories"]["search"]["ms_per_step"] > 0 and decode["categories"]["matmul"]["ms_per_step"] > 0
    assert decode["categories"]["optimizer"]["ms_per_step"] == decode["categories"]["fused_loss"]["ms_per_step"] == 0
    tops = [line for line in lines if line["name"].endswith(".top_kernels")]
    assert len(tops) == 2 and all(0 < len(t["kernels"]) <= 15 for t in tops)
