"""Where the time of a training update or of a beam search goes: torch.profiler over a few, summarised.

    python3 bench/profiling.py --device cuda [--out DIR]     # `base` and `big` updates, a `base` beam-4 search
    python3 bench/profiling.py --device cpu --presets tiny --max-tokens 512 --vocab 1000

gpu_check.py's `profile` stage runs the same (`profile_training`, `profile_decoding`). Each profile is
`--steps` updates (or searches) after one untimed, and gives two JSON lines and a trace:

  profile.<what>.summary      the window (ms per step: from the first step's start to the device's last work),
                              how busy the device was in it, kernels (operators on a CPU) per step and their
                              mean duration, and the window's time by category, ms per step and share:
                                matmul        GEMMs (cuBLAS, CUTLASS; on a CPU aten::mm/addmm/bmm)
                                attention     SDPA's fused kernels (flash, memory-efficient, cuDNN), forward, backward
                                fused_loss    everything `mtx.train.loss`'s fused output projection + loss runs
                                              (its GEMMs too), forward and backward
                                optimizer     AdamW's step, zero_grad and the gradient norm
                                search        a search's own work outside the model (top-k, reordering the cache)
                                elementwise   every other kernel: softmax, LayerNorm, dropout, residual adds, casts,
                                              reductions, embedding lookups
                                memcpy        copies and fills between or on devices (a GPU's memcpy / memset)
                                host_gaps     the device idle inside the window: on a GPU, waiting for the host to
                                              launch work; on a CPU, time outside any operator (Python, dispatch)
  profile.<what>.top_kernels  the 15 costliest kernels (operators, by self time, on a CPU), each counted apart in
                              each category it ran in: ms per step, calls per step, mean µs, category
  <out>/profile.<what>.trace.json.gz   the Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing)

A kernel's category comes from where it was launched, then from its name: a kernel launched inside the fused
loss's autograd Function (`_ProjectedSmoothedLoss`, forward and backward), an optimizer's step or the
`mtx.grad_norm` range belongs to that; one launched inside a search (`mtx.search`) but outside the model's own
calls (`mtx.model`) is the search's; every other is classified by its name. The summary is computed from the
exported trace (the Chrome trace format's kernel, runtime-launch, operator and annotation events), so a trace
from another run can be summarised again with `summarise`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import sys
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, record_function, schedule

sys.path[:0] = [str(Path(__file__).resolve().parent.parent)]

from common import build_model, emit_info, significant, synchronize  # noqa: E402  (after the path set-up above)

CATEGORIES = ("matmul", "attention", "fused_loss", "optimizer", "search", "elementwise", "memcpy", "host_gaps")
TOP_KERNELS = 15

# Where a kernel was launched from decides its category first: (substring of an enclosing range's name,
# category), the innermost enclosing range that matches any rule deciding; None sends it on to its name.
REGIONS: list[tuple[str, str | None]] = [
    ("_ProjectedSmoothedLoss", "fused_loss"),  # the autograd Function's forward, and its backward
    ("Optimizer.step", "optimizer"),  # torch.optim names every step and zero_grad so
    ("Optimizer.zero_grad", "optimizer"),
    ("mtx.grad_norm", "optimizer"),
    ("mtx.model", None),
    ("mtx.search", "search"),
]
# Then its name. Attention first: CUTLASS's attention kernels (fmha_cutlassF…) would pass for GEMMs.
ATTENTION = re.compile(r"attention|flash|fmha|sdpa|_attn", re.IGNORECASE)
MATMUL = re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|wgmma"
                    r"|^aten::(mm|addmm|bmm|baddbmm|addbmm|_addmm_activation)$", re.IGNORECASE)
DEVICE_WORK = {"kernel", "gpu_memcpy", "gpu_memset"}
LAUNCHES = {"cuda_runtime", "cuda_driver"}
RANGES = {"cpu_op", "user_annotation"}
HOST_COPIES = {"aten::copy_", "aten::fill_", "aten::zero_"}  # a CPU's counterpart of a GPU's memcpy / memset


# ============================================================================================== summarising


def summarise(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The summary of a Chrome trace's events: a GPU's kernels when the trace has any, else a CPU's operators."""
    spans = [e for e in events if e.get("ph") == "X" and e.get("cat") in RANGES]
    steps = [e for e in spans if e["cat"] == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    if not steps:
        raise ValueError("the trace has no ProfilerStep ranges: profile with a schedule and call step()")
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in DEVICE_WORK]
    work, busy_intervals = device_work(events, spans, kernels) if kernels else host_work(spans)
    start = min(e["ts"] for e in steps)
    end = max(max(e["ts"] + e["dur"] for e in steps), max((b for _, b in busy_intervals), default=start))
    window = end - start
    busy = union_length(busy_intervals, start, end)
    per_step = len(steps)
    by_category: dict[str, float] = defaultdict(float)
    by_kernel: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0])  # (name, category): µs, calls
    for w in work:
        by_category[w["category"]] += w["self"]
        entry = by_kernel[w["name"], w["category"]]
        entry[0] += w["self"]
        entry[1] += 1
    by_category["host_gaps"] = window - busy
    total = sum(by_category.values())  # busy time counted per kernel (streams may overlap) plus the gaps
    categories = {c: {"ms_per_step": significant(by_category[c] / per_step / 1e3),
                      "share": significant(by_category[c] / total) if total else 0.0} for c in CATEGORIES}
    top = sorted(by_kernel.items(), key=lambda item: -item[1][0])[:TOP_KERNELS]
    return {
        "device": "cuda" if kernels else "cpu",
        "steps": per_step,
        "window_ms_per_step": significant(window / per_step / 1e3),
        "host_ms_per_step": significant(sum(e["dur"] for e in steps) / per_step / 1e3),
        "device_busy": significant(busy / window) if window else 0.0,
        "kernels_per_step": significant(len(work) / per_step),
        "mean_kernel_us": significant(sum(w["self"] for w in work) / len(work)) if work else 0.0,
        "categories": categories,
        "top_kernels": [{"name": name[:160], "category": category, "ms_per_step": significant(us / per_step / 1e3),
                         "calls_per_step": significant(calls / per_step), "mean_us": significant(us / calls)}
                        for (name, category), (us, calls) in top],
    }


def device_work(events: list[dict[str, Any]], spans: list[dict[str, Any]], kernels: list[dict[str, Any]]
                ) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """A GPU's kernels, copies and fills, each categorised by the ranges around the host call that launched it
    (matched by the runtime's correlation id), then by its name; and the intervals the GPU was busy."""
    launches = {e["args"]["correlation"]: e for e in events
                if e.get("ph") == "X" and e.get("cat") in LAUNCHES and "correlation" in e.get("args", {})}
    located = [(k, launches.get(k.get("args", {}).get("correlation"))) for k in kernels]
    chains = enclosing_ranges(spans, [(launch["tid"], launch["ts"]) if launch else None for _, launch in located])
    work = []
    for (kernel, _), chain in zip(located, chains, strict=True):
        category = "memcpy" if kernel["cat"] != "kernel" else category_of(kernel["name"], chain)
        work.append({"name": kernel["name"], "self": kernel["dur"], "category": category})
    return work, [(k["ts"], k["ts"] + k["dur"]) for k in kernels]


def host_work(spans: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """A CPU's operators, each with its self time (its duration less its directly nested operators') and
    categorised by the ranges around it, itself included, then by its name; and the intervals some operator ran
    (the outermost ones of each thread)."""
    ops = [e for e in spans if e["cat"] == "cpu_op"]
    chains = enclosing_ranges(spans, [(op["tid"], op["ts"], op["dur"]) for op in ops])
    parents = enclosing_ops(ops)
    nested: dict[int, float] = defaultdict(float)
    for i, parent in enumerate(parents):
        if parent is not None:
            nested[parent] += ops[i]["dur"]
    work = [{"name": op["name"], "self": max(0.0, op["dur"] - nested[i]),
             "category": "memcpy" if op["name"] in HOST_COPIES else category_of(op["name"], chain)}
            for i, (op, chain) in enumerate(zip(ops, chains, strict=True))]
    return work, [(op["ts"], op["ts"] + op["dur"]) for op, parent in zip(ops, parents, strict=True) if parent is None]


def category_of(name: str, chain: list[str]) -> str:
    """A kernel's (or operator's) category: by the innermost enclosing range that a REGIONS rule names, else
    by its own name."""
    for enclosing in reversed(chain):
        for pattern, category in REGIONS:
            if pattern in enclosing:
                if category is not None:
                    return category
                return by_name(name)
    return by_name(name)


def by_name(name: str) -> str:
    if ATTENTION.search(name):
        return "attention"
    if MATMUL.search(name):
        return "matmul"
    return "elementwise"


def enclosing_ranges(spans: list[dict[str, Any]], points: list[tuple | None]) -> list[list[str]]:
    """For each point (thread id, time[, duration]) the names of the ranges of that thread that contain it,
    outermost first (a point with a duration is a range itself and contains itself); None: no point, [].
    The trace's ranges on a thread nest, so one sweep with a stack per thread finds them."""
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for span in spans:
        by_thread[span["tid"]].append(span)
    for ranges in by_thread.values():
        ranges.sort(key=lambda e: (e["ts"], -e["dur"]))
    queries: dict[Any, list[tuple[float, float, int]]] = defaultdict(list)
    for i, point in enumerate(points):
        if point is not None:
            queries[point[0]].append((point[1], point[2] if len(point) > 2 else 0.0, i))
    result: list[list[str]] = [[] for _ in points]
    for tid, asked in queries.items():
        ranges, stack, next_range = by_thread.get(tid, []), [], 0
        for ts, dur, i in sorted(asked, key=lambda q: (q[0], -q[1])):
            while next_range < len(ranges) and (ranges[next_range]["ts"], -ranges[next_range]["dur"]) <= (ts, -dur):
                span = ranges[next_range]
                while stack and stack[-1]["ts"] + stack[-1]["dur"] <= span["ts"]:
                    stack.pop()
                stack.append(span)
                next_range += 1
            inside = [s["name"] for s in stack if s["ts"] <= ts and ts + dur <= s["ts"] + s["dur"]]
            result[i] = inside
    return result


def enclosing_ops(ops: list[dict[str, Any]]) -> list[int | None]:
    """The index of each operator's directly enclosing operator on its thread (None: top level)."""
    order = sorted(range(len(ops)), key=lambda i: (ops[i]["tid"], ops[i]["ts"], -ops[i]["dur"]))
    parents: list[int | None] = [None] * len(ops)
    stack: list[int] = []
    for i in order:
        op = ops[i]
        while stack and (ops[stack[-1]]["tid"] != op["tid"] or
                         ops[stack[-1]]["ts"] + ops[stack[-1]]["dur"] <= op["ts"]):
            stack.pop()
        parents[i] = stack[-1] if stack else None
        stack.append(i)
    return parents


def union_length(intervals: Iterable[tuple[float, float]], start: float, end: float) -> float:
    """The length of the union of the intervals, clipped to [start, end]."""
    total, reach = 0.0, start
    for a, b in sorted(intervals):
        a, b = max(a, reach), min(b, end)
        if b > a:
            total += b - a
            reach = b
    return total


def load_trace(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
        return json.load(f)["traceEvents"]


# =============================================================================================== profiling


def profile_steps(step: Callable[[], None], device: torch.device, steps: int, trace: Path) -> dict[str, Any]:
    """Run `step` once untimed, then `steps` times under the profiler (CPU, and CUDA on a GPU); write the
    gzipped Chrome trace to `trace` and return its summary."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    plain = trace.with_suffix("")  # profile.x.trace.json.gz → profile.x.trace.json
    with warnings.catch_warnings():  # that a profiler's events are cleared after its one cycle: as wanted
        warnings.filterwarnings("ignore", message=".*Profiler clears events")
        with torch.profiler.profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps),
                                    on_trace_ready=lambda p: p.export_chrome_trace(str(plain))) as profiler:
            for _ in range(1 + steps):
                step()
                profiler.step()
            synchronize(device)
    with open(plain, "rb") as raw, gzip.open(trace, "wb", compresslevel=6) as packed:
        packed.writelines(raw)
    os.unlink(plain)
    return summarise(load_trace(trace))


def report(what: str, config: dict[str, Any], summary: dict[str, Any], trace: Path) -> None:
    top = summary.pop("top_kernels")
    emit_info(f"profile.{what}.summary", config=config, trace=str(trace), **summary)
    emit_info(f"profile.{what}.top_kernels", config=config, kernels=top)


def profile_training(preset: str, vocab: int, max_tokens: int, device: torch.device, precision: str, steps: int,
                     out: Path) -> None:
    """Updates of bench/train.py's replica of the trainer's (`Updater`) on one of the trainer's batches."""
    from common import model_config, train_model_flops
    from train import Updater, spread_batches

    from mtx.tokenizer import PAD
    from mtx.train.loss import batch_loss

    batch = spread_batches(vocab, max_tokens, 1)[0]
    flops = train_model_flops(model_config(preset), vocab, (~batch.src_pad).sum(1).tolist(),
                              (batch.tgt_out != PAD).sum(1).tolist())
    batch = batch.to(device)
    model = build_model(preset, vocab).to(device).train()
    autocast = torch.bfloat16 if precision == "bf16" else None
    updater = Updater(lambda b: batch_loss(model, b, 0.1)[0], model, device, autocast)
    what = f"train.{preset}.{max_tokens}"
    trace = out / f"profile.{what}.trace.json.gz"
    summary = profile_steps(lambda: updater.run([batch]), device, steps, trace)
    seconds = summary["window_ms_per_step"] / 1e3
    config = {"preset": preset, "vocab": vocab, "max_tokens": max_tokens, "tgt_tokens": batch.n_tgt_tokens,
              "precision": precision, "device": device.type}
    summary["tgt_tokens_per_s"] = significant(batch.n_tgt_tokens / seconds)
    summary["model_tflops"] = significant(flops / seconds / 1e12)
    report(what, config, summary, trace)


class AnnotatedModel:
    """A model that search drives (mtx.decode.search.IncrementalDecoder), its calls marked `mtx.model` in the
    profile, so that what a search does around them counts as the search's."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model

    def encode(self, src, src_pad):
        with record_function("mtx.model"):
            return self.model.encode(src, src_pad)

    def init_state(self, memory, src_pad, max_len):
        with record_function("mtx.model"):
            return self.model.init_state(memory, src_pad, max_len)

    def decode_step(self, prev, state):
        with record_function("mtx.model"):
            return self.model.decode_step(prev, state)


def profile_decoding(preset: str, vocab: int, sentences: int, tokens: int, device: torch.device, dtype: str,
                     steps: int, out: Path) -> None:
    """Beam-4 searches of one batch of `sentences` random sources of 15–35 tokens, each translation made
    exactly `tokens` long (the length cap wins over min_len), as bench/translate.py does."""
    from common import random_batch

    from mtx.decode.search import Constraints, LengthPenalty, search
    from mtx.decode.translator import prepare_model

    model = prepare_model(build_model(preset, vocab).eval(), device, dtype)
    batch = random_batch(sentences, vocab, 15, 35, seed=2).to(device)
    constraints = Constraints(torch.full((sentences,), tokens, device=device), min_len=tokens)
    annotated = AnnotatedModel(model)

    def one_search() -> None:
        with record_function("mtx.search"):
            search(annotated, batch.src, batch.src_pad, constraints, LengthPenalty(0.6), beam=4)

    what = f"decode.{preset}.beam4.{dtype}"
    trace = out / f"profile.{what}.trace.json.gz"
    summary = profile_steps(one_search, device, steps, trace)
    summary["tgt_tokens_per_s"] = significant(sentences * tokens / (summary["window_ms_per_step"] / 1e3))
    config = {"preset": preset, "vocab": vocab, "sentences": sentences, "tokens_per_sentence": tokens, "beam": 4,
              "dtype": dtype, "device": device.type}
    report(what, config, summary, trace)


# ================================================================================================= command


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--presets", default="base,big", help="comma-separated presets of the training profiles")
    parser.add_argument("--max-tokens", default="3584,28672",
                        help="comma-separated train.max_tokens: the recipes' per-GPU batch on 8 GPUs, and on one")
    parser.add_argument("--vocab", type=int, default=37_000)
    parser.add_argument("--decode-preset", default="base")
    parser.add_argument("--decode-vocab", type=int, default=32_000)
    parser.add_argument("--decode-sentences", type=int, default=128)
    parser.add_argument("--steps", type=int, default=3, help="profiled updates (searches), after one untimed")
    parser.add_argument("--out", type=Path, default=Path("."), help="where the traces go")
    args = parser.parse_args()
    device = torch.device(args.device)
    precision = "bf16" if device.type == "cuda" else "fp32"
    args.out.mkdir(parents=True, exist_ok=True)
    for preset in args.presets.split(","):
        for max_tokens in (int(m) for m in args.max_tokens.split(",")):
            profile_training(preset, args.vocab, max_tokens, device, precision, args.steps, args.out)
    profile_decoding(args.decode_preset, args.decode_vocab, args.decode_sentences, 28, device,
                     "bf16" if device.type == "cuda" else "fp32", args.steps, args.out)


if __name__ == "__main__":
    main()
