"""`make gpu-check DEVICE=cpu`: the GPU check, small, end to end on a CPU, so that it cannot rot between the rare
runs on a GPU machine. The script, not its figures, is under test: every stage runs and reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT

pytestmark = pytest.mark.slow

STAGES = ("cuda_tests", "profile", "train_speed", "decode_speed", "demo", "translate_speed", "torchrun")


def test_gpu_check_runs_every_stage_on_a_cpu(tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    # A budget above the default leaves room for a busy machine: the stages' shares only cap them.
    result = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py"), "--device", "cpu", "--out",
                             str(tmp_path), "--budget", "440"],
                            capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    lines = result.stdout.splitlines()
    records = [json.loads(line) for line in lines]  # every line is one JSON object
    assert all(isinstance(r, dict) and "name" in r for r in records)
    assert result.returncode == 0, "\n".join(lines[-20:]) + result.stderr[-2000:]

    names = {r["name"] for r in records}
    stages = {r["stage"]: r for r in records if r["name"] == "gpu_check.stage"}
    assert list(stages) == list(STAGES)
    assert all(r["ok"] for r in stages.values())
    assert records[0]["name"] == "gpu_check.start" and records[-1]["name"] == "gpu_check.summary"
    assert records[-1]["ok"] is True and records[-1]["failed"] == []
    assert not [r for r in records if r.get("ok") is False]

    cuda_tests = next(r for r in records if r["name"] == "gpu_check.cuda_tests")
    assert cuda_tests["passed"] == cuda_tests["failed"] == cuda_tests["errors"] == 0 and cuda_tests["skipped"] > 0
    assert {"gpu_check.env", "gpu_check.matmul_bf16", "gpu_check.train.tiny.eager.tokens_per_s",
            "gpu_check.train.tiny.compiled.tokens_per_s", "gpu_check.train.tiny.max_tokens",
            "gpu_check.demo.prepare", "gpu_check.demo.valid", "gpu_check.demo.time_to_bleu", "gpu_check.demo.test_bleu",
            "gpu_check.translate.bf16.sentences_per_s", "gpu_check.translate.fp16.sentences_per_s",
            "gpu_check.torchrun.2proc", "profile.train.tiny.512.summary", "profile.train.tiny.512.top_kernels",
            "profile.decode.tiny.beam4.fp32.summary", "profile.decode.tiny.beam4.fp32.top_kernels",
            "decode_speed.mtx.fp32.tokens_per_s", "decode_speed.mtx.bf16.tokens_per_s"} <= names
    assert any(name.startswith("gpu_check.translate.ct2") for name in names)  # measured, or skipped and why
    assert any(name.startswith("decode_speed.ct2") for name in names)
    for record in records:
        if record["name"].startswith("profile.") and record["name"].endswith(".summary"):
            assert Path(record["trace"]).is_file() and Path(record["trace"]).parent == tmp_path
            assert record["categories"]["matmul"]["ms_per_step"] > 0
    search = next(r for r in records if r["name"] == "gpu_check.train.tiny.max_tokens")
    assert search["largest"] == search["capped_at"] == 2048
    time_to_bleu = next(r for r in records if r["name"] == "gpu_check.demo.time_to_bleu")
    assert time_to_bleu["seconds"] > 0
    torchrun = next(r for r in records if r["name"] == "gpu_check.torchrun.2proc")
    assert torchrun["backend"] == "gloo" and Path(torchrun["checkpoint"]).is_file()
