"""`make gpu-check`: the one prepared device check. JSON lines on stdout, within 9 minutes on one GPU.

    python3 bench/gpu_check.py [--device cuda|cpu] [--out DIR] [--budget SECONDS]
    make gpu-check                # on a GPU machine: DEVICE=cuda
    make gpu-check DEVICE=cpu     # small sizes, every code path (CI runs it through tests/system/test_gpu_check.py)

GPU time is scarce and a session may be cut short, so the stages run in the order of what matters most, each in a
process of its own with a share of the time budget (killed when it overruns it, so that the later stages still
run), and every result is printed and flushed the moment it is measured:

  cuda_tests       pytest -m cuda tests/cuda/test_cuda.py: half-precision cached decoding, the fused loss and SDPA's
                   fused kernels on CUDA (all skipped on a CPU); the outcome counts as one line
  profile          where the time goes (bench/profiling.py): torch.profiler over a few updates of `base` and `big`
                   at the recipes' per-GPU batch on 8 GPUs and on one (max_tokens 3584 and 28672), and over a
                   `base` beam-4 search; per profile its time by category, its 15 costliest kernels, and its trace
  train_speed      the GPU, its dense bf16 peak and a measured bf16 matmul; then target tokens/s and MFU of one
                   training update of `base` and `big` (37k vocabulary, bf16 autocast), eager and compiled; the
                   largest max_tokens that fits in memory (doubling from 4096 until out of memory)
  decode_speed     beam-4 target tokens/s of a `base`-shaped model with a 32k vocabulary on 3,000 sentences of news
                   length (bench/decode_speed.py), bf16 and fp16, at batch budgets of 4096, 16384 and 65536
                   tokens: the unit CTranslate2 publishes; CTranslate2 beside it when installed
  demo             recipes/demo.yaml prepared and trained in bf16 on the GPU, time-to-BLEU (from launching
                   `mtx train` to the first validation at the gate), then average → translate → score as
                   `make demo` does, gated on its test BLEU
  translate_speed  beam-4 sentences/s of the demo model on its test set in bf16 and fp16; CTranslate2 beside
                   it when `ctranslate2` is installed
  torchrun         `torch.distributed.run -m mtx train` resuming the demo run for a few steps (NCCL; one
                   process, and two when there are two GPUs); gloo with two processes on a CPU

With `--device cpu` everything is small (tiny models, a 4,000-pair demo with a modest gate, a max_tokens search
capped at 2048), so CI can run the whole script in a few minutes on two cores and it cannot rot. Each stage's
failure is reported as a line with `"ok": false` and its error; later stages still run; the last line is a
summary and the exit status is 1 if anything failed. Logs and run directories go to --out (default: a new
temporary directory, kept). bench/README.md lists every line.

Runs from the source tree with nothing installed but mtx's dependencies (`datasets` and `ctranslate2` are not
needed): the repository root goes on sys.path here and on PYTHONPATH for the subprocesses.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import xml.etree.ElementTree as ElementTree
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from common import emit, emit_info, emit_skip, significant  # noqa: E402  (after the path set-up above)

STAGES = ("cuda_tests", "profile", "train_speed", "decode_speed", "demo", "translate_speed", "torchrun")
# Seconds each stage is planned to take. A stage may use the time the earlier ones left unused, but never the
# time planned for the stages after it; the budget as a whole is 540 s on a GPU, under a device call's 10 minutes.
STAGE_SECONDS = {
    "cuda": {"cuda_tests": 45, "profile": 75, "train_speed": 160, "decode_speed": 60, "demo": 105,
             "translate_speed": 35, "torchrun": 40},
    "cpu": {"cuda_tests": 20, "profile": 30, "train_speed": 35, "decode_speed": 20, "demo": 95, "translate_speed": 20,
            "torchrun": 35},
}
DEFAULT_BUDGET = {"cuda": 540.0, "cpu": 280.0}
DEMO_RECIPE = ROOT / "recipes" / "demo.yaml"
LABEL_SMOOTHING = 0.1


# ============================================================================================ the stages' runner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--out", type=Path, help="run directories and logs [default: a new temporary directory]")
    parser.add_argument("--budget", type=float, help="seconds for the whole check [default: 540 on cuda, 280 on cpu]")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated subset, in this order")
    parser.add_argument("--stage", choices=STAGES, help=argparse.SUPPRESS)  # run one stage (in a child process)
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # its time.time() deadline
    args = parser.parse_args()
    if args.stage:
        sys.exit(run_stage(args.stage, args.device, args.out, args.deadline or time.time() + 600))
    out = args.out or Path(tempfile.mkdtemp(prefix="mtx-gpu-check-"))
    out.mkdir(parents=True, exist_ok=True)
    unknown = set(args.stages.split(",")) - set(STAGES)
    if unknown:
        parser.error(f"--stages: no stage {', '.join(sorted(unknown))} (the stages: {', '.join(STAGES)})")
    stages = [s for s in STAGES if s in args.stages.split(",")]
    budget = args.budget or DEFAULT_BUDGET[args.device]
    sys.exit(run_all(stages, args.device, out.resolve(), budget))


def run_all(stages: list[str], device: str, out: Path, budget: float) -> int:
    """Each stage in a child process with its share of the budget; their lines relayed as they come."""
    started = time.time()
    emit_info("gpu_check.start", device=device, out=str(out), budget_s=budget, stages=stages,
              python=sys.version.split()[0], argv=sys.argv[1:])
    planned = STAGE_SECONDS[device]
    outcomes: dict[str, str] = {}
    for i, stage in enumerate(stages):
        remaining = started + budget - time.time()
        later = sum(planned[s] for s in stages[i + 1 :])
        timeout = min(remaining, max(remaining - later, planned[stage] / 2))
        if timeout < 5:
            outcomes[stage] = "out_of_time"
            emit_info("gpu_check.stage", stage=stage, ok=False, error="no time left in the budget")
            continue
        try:
            outcomes[stage] = run_child(stage, device, out, timeout)
        except KeyboardInterrupt:
            outcomes[stage] = "interrupted"
            emit_info("gpu_check.stage", stage=stage, ok=False, error="interrupted")
            break
    failed = [s for s, outcome in outcomes.items() if outcome != "ok"]
    emit_info("gpu_check.summary", ok=not failed and len(outcomes) == len(stages), device=device,
              stages=outcomes, failed=failed, seconds=time.time() - started, out=str(out))
    return 1 if failed or len(outcomes) != len(stages) else 0


def run_child(stage: str, device: str, out: Path, timeout: float) -> str:
    """Run one stage in a fresh process (its own GPU memory, its own session so a timeout kills everything it
    started), relay its stdout lines as they arrive, and report it: "ok", "failed" or "timeout"."""
    log = out / f"{stage}.log"
    started = time.time()
    command = [sys.executable, str(Path(__file__).resolve()), "--stage", stage, "--device", device, "--out",
               str(out), "--deadline", str(started + timeout)]
    with open(log, "wb") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, env=child_env(), cwd=ROOT,
                                 start_new_session=True)
        reported_failure = threading.Event()
        relay = threading.Thread(target=relay_lines, args=(child.stdout, stage, reported_failure), daemon=True)
        relay.start()
        timed_out = False
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(child)
        except KeyboardInterrupt:
            kill_group(child)
            raise
        if not timed_out:  # what the stage left running (a compile worker, say) would hold its stdout open
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(child.pid, signal.SIGKILL)
        relay.join(timeout=10)
    seconds = time.time() - started
    ok = not timed_out and child.returncode == 0 and not reported_failure.is_set()
    fields: dict[str, Any] = {"stage": stage, "ok": ok, "seconds": seconds, "exit_code": child.returncode,
                              "log": str(log)}
    if timed_out:
        fields["error"] = f"stopped after its {timeout:.0f} s share of the budget"
    elif not ok:
        fields["error"] = "a check failed" if child.returncode in (0, 1) else f"exit code {child.returncode}"
        if tail := log_tail(log):
            fields["log_tail"] = tail
    emit_info("gpu_check.stage", **fields)
    return "ok" if ok else ("timeout" if timed_out else "failed")


def relay_lines(stream, stage: str, reported_failure: threading.Event) -> None:
    """Print each line of a stage's stdout at once; a line that is not JSON (a library printing to stdout)
    is wrapped into one, so that every line of the check's output parses."""
    for raw in stream:
        text = raw.decode("utf-8", errors="replace").rstrip("\n")
        if not text.strip():
            continue
        try:
            record = json.loads(text)
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:
            emit_info("gpu_check.stdout", stage=stage, text=text[:2000])
            continue
        if record.get("ok") is False:
            reported_failure.set()
        print(text, flush=True)


def kill_group(child: subprocess.Popen) -> None:
    """SIGTERM to the stage's whole process group (torchrun's workers, `mtx train`), SIGKILL if it lingers."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, sig)
        try:
            child.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def log_tail(path: Path, lines: int = 15) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
    return ""


def child_env() -> dict[str, str]:
    """The environment of every subprocess: the source tree importable without installing mtx."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    return env


# ====================================================================================== inside a stage's process


class Stage:
    """One stage's checks: each runs under `check`, which reports an exception as a failed line and carries on."""

    def __init__(self, device: str, out: Path, deadline: float) -> None:
        self.device, self.out, self.deadline = device, out, deadline
        self.cuda = device == "cuda"
        self.failures = 0

    def left(self) -> float:
        """Seconds until this stage is stopped."""
        return self.deadline - time.time()

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # reported, counted, and the stage goes on with its next check
            self.fail(name, f"{type(e).__name__}: {e}", traceback.format_exc(limit=-3))

    def fail(self, name: str, error: str, detail: str | None = None) -> None:
        self.failures += 1
        fields = {"ok": False, "error": error[:2000]}
        if detail:
            fields["traceback"] = detail[-2000:]
        emit_info(name, **fields)

    def run(self, command: list[str], log: Path, timeout: float | None = None) -> subprocess.CompletedProcess:
        """A subprocess with the repository on PYTHONPATH, its output appended to `log`; raises on failure."""
        timeout = min(timeout or self.left(), self.left())
        with open(log, "ab") as sink:
            sink.write(f"$ {' '.join(command)}\n".encode())
            sink.flush()
            result = subprocess.run(command, stdout=sink, stderr=sink, env=child_env(), cwd=ROOT, timeout=timeout)
        if result.returncode != 0:
            raise RuntimeError(f"{' '.join(command[2:5])}... exited {result.returncode}; see {log}:\n"
                               f"{log_tail(log, 8)}")
        return result


def run_stage(stage: str, device: str, out: Path, deadline: float) -> int:
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        emit_info(f"gpu_check.{stage}", ok=False, error="--device cuda but PyTorch sees no CUDA GPU "
                  f"(torch {torch.__version__}, built for CUDA {torch.version.cuda})")
        return 1
    context = Stage(device, out, deadline)
    runner: Callable[[Stage], None] = {"cuda_tests": cuda_tests, "profile": profile, "train_speed": train_speed,
                                      "decode_speed": decode_speed, "demo": demo, "translate_speed": translate_speed,
                                      "torchrun": torchrun}[stage]
    with context.check(f"gpu_check.{stage}"):
        runner(context)
    return 1 if context.failures else 0


# ----------------------------------------------------------------------------------------------- cuda_tests


def cuda_tests(stage: Stage) -> None:
    """pytest -m cuda on tests/cuda/test_cuda.py; the counts from its JUnit XML report."""
    report = stage.out / "cuda_tests.xml"
    command = [sys.executable, "-m", "pytest", "-m", "cuda", "-q", "-p", "no:cacheprovider",
               f"--junitxml={report}", str(ROOT / "tests" / "cuda" / "test_cuda.py")]
    started = time.time()
    with open(stage.out / "cuda_tests.pytest.log", "wb") as sink:
        result = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT,
                                timeout=stage.left() - 2)
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    failed_tests = []
    for suite in ElementTree.parse(report).getroot().iter("testsuite"):
        for key in counts:
            counts[key] += int(suite.get(key, 0))
        for case in suite.iter("testcase"):
            if case.find("failure") is not None or case.find("error") is not None:
                failed_tests.append(f"{case.get('classname', '')}::{case.get('name', '')}")
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    # On a GPU every test must run; on a CPU every one is skipped, which is what is checked there.
    ran_as_expected = passed > 0 if stage.cuda else counts["skipped"] == counts["tests"] > 0
    ok = result.returncode == 0 and counts["failures"] == counts["errors"] == 0 and ran_as_expected
    emit_info("gpu_check.cuda_tests", ok=ok, passed=passed, failed=counts["failures"], errors=counts["errors"],
              skipped=counts["skipped"], pytest_exit=result.returncode, seconds=time.time() - started,
              failed_tests=failed_tests[:20], log=str(stage.out / "cuda_tests.pytest.log"))
    if not ok:
        stage.failures += 1


# -------------------------------------------------------------------------------------------------- profile


def profile(stage: Stage) -> None:
    """bench/profiling.py's profiles: training updates of `base` and `big` (bf16 autocast, 37k vocabulary) at
    max_tokens 3584 (the recipes' per-GPU batch on 8 GPUs) and 28672 (on one), then a `base` beam-4 search in
    bf16 (32k vocabulary); the traces under --out. On a CPU: `tiny`, small batches, float32."""
    import torch
    from profiling import profile_decoding, profile_training

    device = torch.device(stage.device)
    if stage.cuda:
        runs = [(preset, max_tokens) for preset in ("base", "big") for max_tokens in (3584, 28672)]
        vocab, precision, steps, decode = 37_000, "bf16", 3, ("base", 32_000, 128, "bf16")
    else:
        runs, vocab, precision, steps, decode = [("tiny", 512)], 1000, "fp32", 2, ("tiny", 1000, 16, "fp32")
    for preset, max_tokens in runs:
        with stage.check(f"gpu_check.profile.train.{preset}.{max_tokens}"):
            profile_training(preset, vocab, max_tokens, device, precision, steps, stage.out)
        free_memory(device)
    preset, vocab, sentences, dtype = decode
    with stage.check(f"gpu_check.profile.decode.{preset}"):
        profile_decoding(preset, vocab, sentences, 28, device, dtype, steps, stage.out)


# ---------------------------------------------------------------------------------------------- train_speed


def train_speed(stage: Stage) -> None:
    """The device and its peak, a measured bf16 matmul, then training speed, MFU and the largest max_tokens.

    Order: eager speed of every preset (the headline), the max_tokens search (cheap), then the compiled speed
    (the compilation itself takes the most time); each part is skipped with a line when time runs short.
    """
    import torch
    from common import peak_bf16_tflops

    from mtx.devices import native_bf16

    device = torch.device(stage.device)
    if stage.cuda:
        name = torch.cuda.get_device_name(device)
        peak, peak_source = peak_bf16_tflops(name)
        free, total = torch.cuda.mem_get_info(device)
        emit_info("gpu_check.env", device=name, gpus=torch.cuda.device_count(), torch=torch.__version__,
                  cuda=torch.version.cuda, memory_gib=total / 2**30, free_gib=free / 2**30,
                  capability=".".join(map(str, torch.cuda.get_device_capability(device))),
                  bf16=native_bf16(device), peak_bf16_tflops=peak, peak_source=peak_source)
        presets, vocab, steps, repeats = ("base", "big"), 37_000, 1, 5
        speed_tokens, search_start, search_cap = 16_384, 4096, 2**20
    else:
        peak, peak_source = None, "a CPU has no specification figure here"
        emit_info("gpu_check.env", device="cpu", threads=torch.get_num_threads(), torch=torch.__version__,
                  peak_bf16_tflops=None, peak_source=peak_source)
        presets, vocab, steps, repeats = ("tiny",), 1000, 1, 2
        speed_tokens, search_start, search_cap = 512, 512, 2048
    with stage.check("gpu_check.matmul_bf16"):
        measure_matmul(device, peak)
    # bf16 autocast as training runs on a GPU; float32 on a CPU, where bf16 matmuls are slow on many cores.
    config = {"vocab": vocab, "precision": "bf16" if stage.cuda else "fp32", "device": stage.device,
              "label_smoothing": LABEL_SMOOTHING}
    # Each measurement builds its own model in a function of its own, so that its memory is free once it returns.
    for preset in presets:
        with stage.check(f"gpu_check.train.{preset}.eager"):
            measure_training(stage, preset, vocab, speed_tokens, steps, repeats, peak, compiled=False, config=config)
        free_memory(device)
    for preset in presets:
        with stage.check(f"gpu_check.train.{preset}.max_tokens"):
            largest_max_tokens(stage, preset, vocab, search_start, search_cap, config)
        free_memory(device)
    compile_seconds = 90.0 if stage.cuda else 20.0  # a guess until the first compilation is timed
    for preset in presets:
        if stage.left() < 1.2 * compile_seconds + 10:
            emit_skip(f"gpu_check.train.{preset}.compiled.tokens_per_s", f"{stage.left():.0f} s left in this stage, "
                      f"too little to compile (about {compile_seconds:.0f} s)", {**config, "preset": preset})
            continue
        with stage.check(f"gpu_check.train.{preset}.compiled"):
            compile_seconds = measure_training(stage, preset, vocab, speed_tokens, steps, repeats, peak,
                                               compiled=True, config=config)
        free_memory(device)


def measure_matmul(device, peak: float | None) -> None:
    """TFLOP/s of a large bf16 matmul (8192³ on a GPU): what the hardware sustains, beside its paper peak."""
    import torch
    from common import synchronize

    n = 8192 if device.type == "cuda" else 512
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        torch.mm(a, b)
    samples = []
    for _ in range(10):
        synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        synchronize(device)
        samples.append(2 * n**3 / (time.perf_counter() - start) / 1e12)
    mean = sum(samples) / len(samples)
    emit("gpu_check.matmul_bf16", {"n": n, "device": device.type}, samples, "TFLOP/s", mean=significant(mean),
         peak_tflops=peak, fraction_of_peak=significant(mean / peak) if peak else None)


def measure_training(stage: Stage, preset: str, vocab: int, max_tokens: int, steps: int, repeats: int,
                     peak: float | None, compiled: bool, config: dict[str, Any]) -> float:
    """Target tokens/s and MFU of bench/train.py's replica of the trainer's update (`Updater`) in the config's
    precision; returns the seconds of the first run (which compiles, when `compiled`).

    `steps` batches from bench/train.py's `spread_batches`; one, as both devices use, compiles once, for one
    shape, so that eager and compiled time the same work."""
    import torch
    from common import build_model, model_config, synchronize, time_interleaved, train_model_flops
    from train import Updater, spread_batches

    from mtx.tokenizer import PAD
    from mtx.train.loss import batch_loss

    device = torch.device(stage.device)
    batches = spread_batches(vocab, max_tokens, steps)
    tokens = sum(b.n_tgt_tokens for b in batches)
    flops = sum(train_model_flops(model_config(preset), vocab, (~b.src_pad).sum(1).tolist(),
                                  (b.tgt_out != PAD).sum(1).tolist()) for b in batches)
    batches = [b.to(device) for b in batches]
    model = build_model(preset, vocab).to(device).train()
    # On a CPU the point is that the path through torch.compile runs, not how fast inductor's C++ build is.
    backend = ("inductor" if stage.cuda else "eager") if compiled else None
    forward = torch.compile(model, backend=backend, dynamic=True) if backend else model  # as the trainer does
    updater = Updater(lambda b: batch_loss(model, b, LABEL_SMOOTHING, run=forward)[0], model, device, autocast(config))
    mode = "compiled" if compiled else "eager"
    cfg = {**config, "preset": preset, "mode": mode, "max_tokens": max_tokens, "steps": steps,
           "tgt_tokens_per_step": round(tokens / len(batches)), "lengths": "15-35"}
    if backend:
        cfg["compile_backend"] = backend
    started = time.perf_counter()
    updater.run(batches)  # the first run compiles (and warms the allocator and cuBLAS up in eager mode)
    synchronize(device)
    first = time.perf_counter() - started
    seconds = time_interleaved({mode: lambda: updater.run(batches)}, repeats, warmup=1, device=device)[mode]
    rates = [tokens / s for s in seconds]
    emit(f"gpu_check.train.{preset}.{mode}.tokens_per_s", cfg, rates, "target tokens/s", first_run_s=significant(first))
    tflops = [flops / s / 1e12 for s in seconds]
    if peak:
        emit(f"gpu_check.train.{preset}.{mode}.mfu", cfg, [t / peak for t in tflops], "fraction of peak",
             peak_tflops=peak, model_tflops=significant(sorted(tflops)[len(tflops) // 2]),
             flops_formula="common.train_model_flops")
    else:
        emit(f"gpu_check.train.{preset}.{mode}.model_tflops", cfg, tflops, "model TFLOP/s", mfu=None,
             flops_formula="common.train_model_flops", why_no_mfu="no dense bf16 peak for this device")
    return first


def largest_max_tokens(stage: Stage, preset: str, vocab: int, start: int, cap: int, config: dict[str, Any]) -> None:
    """Double max_tokens from `start` until an update runs out of GPU memory; the largest that ran.

    Each size gets a batch of the worst length of the speed batches: pairs of 35 tokens (+ EOS), as many as
    fit. Eager mode (compilation would start over at every size). An update's memory is the weights, their
    gradients and Adam's two moments, plus the activations, which grow with the batch. On a CPU there is no
    out-of-memory to find (the machine would swap): the search stops at `cap` and says so.
    """
    import torch
    from common import build_model, random_batch, synchronize
    from train import Updater

    from mtx.train.loss import batch_loss

    device = torch.device(stage.device)
    model = build_model(preset, vocab).to(device).train()
    updater = Updater(lambda b: batch_loss(model, b, LABEL_SMOOTHING)[0], model, device, autocast(config))
    size, largest, out_of_memory, stopped, tried = start, None, None, None, []
    last_seconds = 0.0
    while size <= cap:
        # The next size: two updates (one untimed) of twice the tokens, about 4× the last timed one, plus a margin.
        if 5 * last_seconds + 5 > stage.left():
            stopped = f"time budget ({stage.left():.0f} s left)"
            break
        batch = random_batch(size // 36, vocab, 35, 35, seed=size).to(device)
        oom = False
        try:
            if stage.cuda:
                torch.cuda.reset_peak_memory_stats(device)
            updater.run([batch])  # the first update also allocates Adam's moments
            synchronize(device)
            began = time.perf_counter()
            updater.run([batch])
            synchronize(device)
            last_seconds = time.perf_counter() - began
        except (torch.OutOfMemoryError, RuntimeError) as e:  # some kernels' allocations fail as RuntimeError
            if not isinstance(e, torch.OutOfMemoryError) and "out of memory" not in str(e).lower():
                raise
            oom = True
        if oom:  # outside the except block, so its traceback no longer holds the batch's activations
            out_of_memory = size
            del batch
            updater.optimizer.zero_grad(set_to_none=True)
            free_memory(device)
            break
        entry = {"max_tokens": size, "tgt_tokens": batch.n_tgt_tokens,
                 "tokens_per_s": round(batch.n_tgt_tokens / last_seconds)}
        if stage.cuda:
            entry["peak_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
        tried.append(entry)
        largest = size
        del batch
        free_memory(device)
        size *= 2
    capped = out_of_memory is None and stopped is None
    why_capped = None
    if capped:
        why_capped = "no out-of-memory error to find on a CPU" if not stage.cuda else "the search's upper limit"
    emit_info(f"gpu_check.train.{preset}.max_tokens", ok=largest is not None, largest=largest,
              out_of_memory_at=out_of_memory, capped_at=cap if capped else None, why_capped=why_capped,
              stopped=stopped, mode="eager", lengths=35, tried=tried, **config)
    if largest is None:
        stage.failures += 1


def autocast(config: dict[str, Any]):
    import torch

    return torch.bfloat16 if config["precision"] == "bf16" else None


def free_memory(device) -> None:
    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------------- decode_speed


def decode_speed(stage: Stage) -> None:
    """bench/decode_speed.py: beam-4 target tokens/s of a `base`-shaped model (32k vocabulary) on 3,000 sentences,
    bf16 and fp16, at three batch budgets; CTranslate2 beside it when installed. On a CPU: `tiny`, 60 sentences,
    float32 (which CTranslate2 computes there too) and bf16."""
    import torch
    from decode_speed import measure

    if stage.cuda:
        measure("base", 32_000, 3000, 28, [4096, 16384, 65536], ["bf16", "fp16"], torch.device("cuda"), repeats=3)
    else:
        measure("tiny", 1000, 60, 28, [256, 1024], ["fp32", "bf16"], torch.device("cpu"), repeats=1)


# ----------------------------------------------------------------------------------------------------- demo

# The demo on a GPU is `make demo`'s, in bf16, validated every 50 steps (instead of 250) for a finer
# time-to-BLEU. On a CPU a much smaller one: 4,000 pairs, one layer each side, 160 steps of 2048 tokens, with a
# gate it passes with room to spare; the point there is that every step of the path runs.
DEMO = {
    "cuda": {"gate": 89.0, "average_last": 5, "extra_steps": 20, "set": [
        "train.device=cuda", "train.precision=bf16", "train.validate_every=50"]},
    "cpu": {"gate": 5.0, "average_last": 3, "extra_steps": 4, "set": [
        "train.device=cpu", "train.precision=fp32", "data.source.demo.pairs=4000", "data.source.demo.valid=100",
        "data.source.demo.test=100", "model.layers_enc=1", "model.layers_dec=1", "train.max_tokens=2048",
        "train.lr=3e-3", "train.warmup=40", "train.max_steps=160", "train.validate_every=20",
        "train.valid_max_sentences=50", "train.save_every=10", "train.keep_last=3", "train.log_every=20"]},
}


def demo_overrides(stage: Stage) -> list[str]:
    """The `--set` flags of the demo run (shared by `demo` and `torchrun`, which resumes it)."""
    sets = [f"run_dir={stage.out / 'demo'}", *DEMO[stage.device]["set"]]
    return [flag for value in sets for flag in ("--set", value)]


def mtx_command(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "mtx", *arguments]


def demo(stage: Stage) -> None:
    """prepare → train (time-to-BLEU from metrics.jsonl as it grows) → average → translate → score."""
    settings = DEMO[stage.device]
    run_dir, log = stage.out / "demo", stage.out / "demo.commands.log"
    gate = settings["gate"]
    sets = demo_overrides(stage)
    started = time.time()
    stage.run(mtx_command("prepare", str(DEMO_RECIPE), *sets), log)
    emit_info("gpu_check.demo.prepare", ok=True, seconds=time.time() - started, run_dir=str(run_dir))

    reached = train_watching_bleu(stage, sets, run_dir, gate, stage.out / "demo.train.log")
    emit_info("gpu_check.demo.time_to_bleu", ok=reached is not None, gate=gate,
              seconds=None if reached is None else reached[0], step=None if reached is None else reached[1],
              measured_from="launching `mtx train` (process start, data loading and model set-up included)",
              bleu="valid_bleu of the trainer's validation (greedy)")
    if reached is None:
        stage.failures += 1

    started = time.time()
    average = run_dir / "average.pt"
    stage.run(mtx_command("average", "--dir", str(run_dir / "checkpoints"), "--last", str(settings["average_last"]),
                          "-o", str(average)), log)
    hyp = run_dir / "test.hyp"
    dtype = "bf16" if stage.cuda else "fp32"
    stage.run(mtx_command("translate", "-m", str(average), "-i", str(run_dir / "data" / "test.en"), "-o", str(hyp),
                          "--device", stage.device, "--dtype", dtype), log)
    scored = subprocess.run(mtx_command("score", "-r", str(run_dir / "data" / "test.de"), "-i", str(hyp),
                                        "--metrics", "bleu,chrf", "--json"),
                            capture_output=True, text=True, env=child_env(), cwd=ROOT, timeout=max(stage.left(), 5))
    if scored.returncode != 0:
        raise RuntimeError(f"mtx score exited {scored.returncode}: {scored.stderr[-1000:]}")
    score = json.loads(scored.stdout)
    ok = score["bleu"] >= gate
    emit_info("gpu_check.demo.test_bleu", ok=ok, bleu=score["bleu"], chrf=score.get("chrf"), gate=gate,
              averaged=settings["average_last"], beam=4, dtype=dtype, sentences=len(hyp.read_text().splitlines()),
              seconds=time.time() - started, signature=score.get("signature"))
    if not ok:
        stage.failures += 1


def train_watching_bleu(stage: Stage, sets: list[str], run_dir: Path, gate: float, log: Path
                        ) -> tuple[float, int] | None:
    """Run `mtx train` from scratch (`--restart`: an --out reused from an earlier check would otherwise resume a
    finished run) and time each validation line of metrics.jsonl as it appears (the trainer writes no wall
    time); (seconds, step) of the first whose valid_bleu reaches `gate`, or None."""
    metrics = run_dir / "metrics.jsonl"
    metrics.unlink(missing_ok=True)  # an earlier check's, which `--restart` deletes only once the trainer starts
    started = time.time()
    reached: tuple[float, int] | None = None
    position = 0
    pending = b""
    with open(log, "wb") as sink:
        trainer = subprocess.Popen(mtx_command("train", str(DEMO_RECIPE), *sets, "--restart"), stdout=sink,
                                   stderr=subprocess.STDOUT, env=child_env(), cwd=ROOT)
        try:
            while True:
                finished = trainer.poll() is not None
                if metrics.is_file():
                    with open(metrics, "rb") as f:
                        f.seek(position)
                        chunk = f.read()
                    position += len(chunk)
                    lines = (pending + chunk).split(b"\n")
                    pending = lines.pop()  # an incomplete last line waits for its end
                    for line in lines:
                        event = json.loads(line) if line.strip() else {}
                        if event.get("event") != "valid":
                            continue
                        seconds = time.time() - started
                        emit_info("gpu_check.demo.valid", step=event["step"], valid_bleu=event["valid_bleu"],
                                  valid_loss=event["valid_loss"], seconds=seconds)
                        if reached is None and event["valid_bleu"] >= gate:
                            reached = (seconds, event["step"])
                if finished:
                    break
                if stage.left() < 10:
                    raise TimeoutError("mtx train did not finish within the stage's budget")
                time.sleep(0.25)
        finally:
            if trainer.poll() is None:
                trainer.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    trainer.wait(timeout=10)
                if trainer.poll() is None:
                    trainer.kill()
    if trainer.returncode != 0:
        raise RuntimeError(f"mtx train exited {trainer.returncode}; see {log}:\n{log_tail(log, 8)}")
    emit_info("gpu_check.demo.train", ok=True, seconds=time.time() - started, log=str(log))
    return reached


# ------------------------------------------------------------------------------------------- translate_speed


def translate_speed(stage: Stage) -> None:
    """Beam-4 sentences/s of the demo model on its test set, in-process through mtx.decode.translator's Translator,
    bf16 and fp16; then CTranslate2 on the same weights if it is installed."""
    import torch
    from common import synchronize

    from mtx.checkpoint import load_model
    from mtx.config.recipe import DecodeConfig
    from mtx.decode.translator import Translator, prepare_model
    from mtx.score.metrics import corpus_bleu

    run_dir = stage.out / "demo"
    checkpoint = next((p for p in (run_dir / "average.pt", run_dir / "checkpoints" / "last.pt") if p.is_file()), None)
    if checkpoint is None:
        raise FileNotFoundError(f"no checkpoint in {run_dir}: the demo stage did not train")
    sources = (run_dir / "data" / "test.en").read_text(encoding="utf-8").splitlines()
    refs = (run_dir / "data" / "test.de").read_text(encoding="utf-8").splitlines()
    if not stage.cuda:
        sources, refs = sources[:40], refs[:40]
    device = torch.device(stage.device)
    model, tokenizer, _ = load_model(checkpoint, "cpu")
    decode = DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=50)
    repeats = 3 if stage.cuda else 1
    config = {"checkpoint": checkpoint.name, "sentences": len(sources), "beam": 4, "batch_tokens": 4096,
              "device": stage.device}
    for dtype in ("bf16", "fp16"):
        with stage.check(f"gpu_check.translate.{dtype}"):
            translator = Translator(prepare_model(copy.deepcopy(model), device, dtype), tokenizer, decode, 4096)
            translator.translate(sources[:16])  # warm-up: kernels, allocator
            samples, hyps, tokens = [], [], 0
            for _ in range(repeats):
                before = translator.stats.output_tokens
                synchronize(device)
                began = time.perf_counter()
                hyps = [nbest[0][0] if nbest else "" for nbest in translator.translate(sources)]
                synchronize(device)
                samples.append(time.perf_counter() - began)
                tokens = translator.stats.output_tokens - before
            median = sorted(samples)[len(samples) // 2]
            emit(f"gpu_check.translate.{dtype}.sentences_per_s", {**config, "dtype": dtype, "system": "mtx"},
                 [len(sources) / s for s in samples], "sentences/s", tokens_per_s=round(tokens / median),
                 bleu=round(corpus_bleu(hyps, refs), 2))
            del translator
    with stage.check("gpu_check.translate.ct2"):
        ctranslate2_speed(stage, model, tokenizer, sources, refs, config)


def ctranslate2_speed(stage: Stage, model, tokenizer, sources: list[str], refs: list[str],
                      config: dict[str, Any]) -> None:
    """CTranslate2 on the same weights (converted by mtx.export.ctranslate2), beam 4, in bf16 and fp16
    where this device computes them in CTranslate2 (float32 if neither, as on most CPUs)."""
    from common import peers_missing, token_strings

    from mtx.export.ctranslate2 import convert_to_ctranslate2
    from mtx.score.metrics import corpus_bleu
    from mtx.tokenizer import EOS, normalize_text

    missing = peers_missing("ctranslate2")
    if missing:
        emit_skip("gpu_check.translate.ct2", f"not installed here: {', '.join(missing)} (optional)",
                  {**config, "system": "ctranslate2"})
        return
    import ctranslate2

    if stage.cuda and ctranslate2.get_cuda_device_count() == 0:
        emit_skip("gpu_check.translate.ct2", "this ctranslate2 build sees no CUDA device", config)
        return
    vocab = model.vocab_size
    path = convert_to_ctranslate2(model, token_strings(vocab), str(stage.out / "ct2"))
    strings = token_strings(vocab)
    ids = {token: i for i, token in enumerate(strings)}
    encoded = tokenizer.encode_batch([normalize_text(s) for s in sources])
    batch = [[strings[i] for i in [*row, EOS]] for row in encoded]
    limit = max(len(row) for row in batch) + 50
    supported = ctranslate2.get_supported_compute_types(stage.device)
    wanted = [(compute, dtype) for compute, dtype in (("bfloat16", "bf16"), ("float16", "fp16"))]
    for compute, dtype in wanted:
        if compute not in supported:
            emit_skip(f"gpu_check.translate.ct2.{dtype}.sentences_per_s",
                      f"CTranslate2 computes no {compute} on this {stage.device}", {**config, "system": "ctranslate2"})
    runs = [(compute, dtype) for compute, dtype in wanted if compute in supported] or [("float32", "fp32")]
    for compute_type, dtype in runs:
        translator = ctranslate2.Translator(path, device=stage.device, compute_type=compute_type)

        def translate(inputs: list[list[str]], translator=translator) -> list[str]:
            results = translator.translate_batch(inputs, beam_size=4, length_penalty=0.6,
                                                 max_decoding_length=limit, max_batch_size=4096, batch_type="tokens")
            outputs = [[ids[t] for t in r.hypotheses[0] if ids[t] != EOS] for r in results]
            return tokenizer.decode_batch(outputs)

        translate(batch[:16])
        samples, hyps = [], []
        for _ in range(3 if stage.cuda else 1):
            began = time.perf_counter()
            hyps = translate(batch)
            samples.append(time.perf_counter() - began)
        emit(f"gpu_check.translate.ct2.{dtype}.sentences_per_s",
             {**config, "dtype": dtype, "system": "ctranslate2", "compute_type": compute_type},
             [len(sources) / s for s in samples], "sentences/s", bleu=round(corpus_bleu(hyps, refs), 2))


# -------------------------------------------------------------------------------------------------- torchrun


def torchrun(stage: Stage) -> None:
    """`python -m torch.distributed.run ... -m mtx train` resuming the demo run for a few more steps; exit 0
    and a checkpoint of the final step. NCCL with one process per GPU (mtx joins the process groups under
    torchrun even as its only process); gloo with two processes on a CPU."""
    import torch

    from mtx.checkpoint import step_checkpoints

    run_dir = stage.out / "demo"
    sets = demo_overrides(stage)
    if not (run_dir / "data" / "manifest.json").is_file():  # the demo stage failed early: prepare here
        stage.run(mtx_command("prepare", str(DEMO_RECIPE), *sets), stage.out / "torchrun.commands.log")
    if stage.cuda:
        counts = [1, 2] if torch.cuda.device_count() >= 2 else [1]
        if len(counts) == 1:
            emit_skip("gpu_check.torchrun.2proc", f"{torch.cuda.device_count()} GPU: two processes need two",
                      {"backend": "nccl"})
    else:
        counts = [2]
    for processes in counts:
        with stage.check(f"gpu_check.torchrun.{processes}proc"):
            checkpoints = run_dir / "checkpoints"
            steps = step_checkpoints(checkpoints) if checkpoints.is_dir() else []
            first = steps[-1][0] if steps else 0
            target = first + DEMO[stage.device]["extra_steps"]
            started = time.time()
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                       str(processes), "-m", "mtx", "train", str(DEMO_RECIPE), *sets, "--set",
                       f"train.max_steps={target}"]
            stage.run(command, stage.out / f"torchrun.{processes}proc.log")
            final = checkpoints / f"step_{target}.pt"
            backend = "nccl" if stage.cuda else "gloo"
            ok = final.is_file()
            emit_info(f"gpu_check.torchrun.{processes}proc", ok=ok, processes=processes, backend=backend,
                      from_step=first, to_step=target, checkpoint=str(final) if ok else None,
                      seconds=time.time() - started)
            if not ok:
                stage.failures += 1


if __name__ == "__main__":
    main()
