"""The resident memory of `mtx serve`'s processes: the server's own, which checks requests, and its decoding
processes', which hold the weights.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/serve_memory.py [--checkpoint runs/demo/average.pt]
        [--preset base] [--tree DIR]

A server's process reads each request, checks it against the model's limits and queues it; only its decoding
processes translate. So the weights belong in the decoding processes alone, and the server's process should
cost what Python, the web stack and a tokenizer cost, whatever the model's size. This builds a checkpoint of the
`--preset` shape (random weights: memory does not depend on their values) with the tokenizer and recipe of
`--checkpoint`, starts `python -m mtx serve` on it (one decoding process of one thread, a free port of
127.0.0.1), waits until /health says ready, reads the resident set (VmRSS, /proc) of the server's process and of
each decoding process, answers one request to show both are working, and stops the server with SIGTERM.

`--tree` runs another checkout's mtx (its folder first on PYTHONPATH), to compare a change with what came
before it in the same run. One JSON line on stdout: the weights' size and the resident MiB of each process.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import torch

from mtx.checkpoint import load_checkpoint, make_checkpoint, save_checkpoint
from mtx.config.model import ModelConfig, resolve_model
from mtx.model.transformer import Transformer

ROOT = Path(__file__).resolve().parent.parent


def shaped_checkpoint(source: Path, preset: str, out: Path) -> int:
    """A checkpoint of a `preset` model with `source`'s tokenizer and recipe, at `out`; its weights' bytes."""
    checkpoint = load_checkpoint(source, mmap=True)
    config = resolve_model(ModelConfig(preset=preset))
    model = Transformer(config, checkpoint["vocab_size"])
    recipe = {**checkpoint["recipe"], "model": {"preset": preset}}
    save_checkpoint(make_checkpoint(model, checkpoint["tokenizer"], recipe, step=0), out)
    return sum(t.numel() * t.element_size() for t in model.state_dict().values())


def resident_mib(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.M).group(1)) / 1024


def children(pid: int) -> list[int]:
    """The processes `pid` started (the decoding processes, and multiprocessing's resource tracker)."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(child) for child in text]
    return found


def command_line(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def wait_ready(server: subprocess.Popen, log: Path, seconds: float = 300) -> int:
    """The port the server listens on, once /health says ready."""
    deadline, port = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the server exited ({server.returncode}):\n{log.read_text()[-3000:]}")
        if port is None:
            for line in log.read_text().splitlines():
                if '"listening"' in line:
                    port = int(json.loads(line)["url"].rsplit(":", 1)[1])
        if port is not None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
                    if json.loads(answer.read())["status"] == "ready":
                        return port
            except OSError:
                pass
        time.sleep(0.2)
    raise SystemExit(f"the server was not ready within {seconds:g} s:\n{log.read_text()[-3000:]}")


def translate_one(port: int) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/translate", method="POST",
                                     data=json.dumps({"text": ["The old friends tidy up his kitchen."]}).encode())
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["translations"][0]["text"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "runs/demo/average.pt",
                        help="whose tokenizer and recipe the measured model takes (make demo writes this one)")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--tree", type=Path, default=ROOT, help="the mtx source tree to serve with")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model_file, log = Path(scratch) / f"{args.preset}.pt", Path(scratch) / "serve.log"
        weights = shaped_checkpoint(args.checkpoint, args.preset, model_file)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(args.tree.resolve()),
                                                           *filter(None, [os.environ.get("PYTHONPATH")])])}
        with log.open("w") as log_file:
            server = subprocess.Popen([sys.executable, "-m", "mtx", "serve", "-m", str(model_file), "--port", "0",
                                       "--threads", "1", "--device", "cpu"], stderr=log_file, env=env,
                                      cwd=args.tree)  # `python -m` puts its folder first on the path
        try:
            port = wait_ready(server, log)
            text = translate_one(port)
            decoding = [pid for pid in children(server.pid) if "resource_tracker" not in command_line(pid)]
            line = {"name": "serve.memory", "preset": args.preset, "tree": str(args.tree.resolve()),
                    "weights_mib": round(weights / 2**20, 1), "server_mib": round(resident_mib(server.pid), 1),
                    "decoding_processes_mib": [round(resident_mib(pid), 1) for pid in decoding],
                    "translation": text}
        finally:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
    print(json.dumps(line), flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
