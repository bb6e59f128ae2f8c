"""What the tests share: generated tasks and the models trained on them, scripted models for the search, a
prepared run, fake clocks and scripted validation, servers on free ports, a headless Chromium.

One module, so that no test file imports another; each part says which tests it serves.
"""

from __future__ import annotations

import contextlib
import http.client
import io
import json
import math
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
import yaml
from rich.console import Console
from typer.testing import CliRunner

from mtx.analysis.inspection import CONTINUATION
from mtx.cli import app
from mtx.config.loading import load_recipe
from mtx.config.recipe import ModelConfig, Recipe, resolve_model
from mtx.data.prepare import prepare
from mtx.decode.search import (
    Constraints,
    DecoderCache,
    IncrementalDecoder,
    beam_search,
)
from mtx.errors import MtxError
from mtx.model.transformer import Transformer
from mtx.tokenizer import BOS, EOS, PAD, Tokenizer
from mtx.train.components import Hooks
from mtx.train.trainer import distributed

ROOT = Path(__file__).resolve().parent.parent  # the repository: recipes/, bench/, mtx/


# The reverse-copy task and a prepared run on it, for the trainer's tests.

REVERSE_WORDS = [f"{a}{b}" for a in "bcdfgklmnprstvz" for b in "aeiou"][:40]


def write_pairs(directory: Path, split: str, pairs: int, seed: int, max_words: int = 8) -> list[Path]:
    rng = random.Random(seed)
    sources, targets = [], []
    for _ in range(pairs):
        words = [rng.choice(REVERSE_WORDS) for _ in range(rng.randint(2, max_words))]
        sources.append(" ".join(words))
        targets.append(" ".join(reversed(words)))
    paths = [directory / f"{split}.src", directory / f"{split}.tgt"]
    for path, lines in zip(paths, (sources, targets), strict=True):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def base_recipe(tmp_path: Path, train_pairs: int, valid_pairs: int) -> dict:
    """A tiny model on a reverse-copy corpus, deterministic, CPU, fp32; tests override what they need."""
    text = tmp_path / "text"
    text.mkdir(parents=True, exist_ok=True)
    train = write_pairs(text, "train", train_pairs, seed=1)
    valid = write_pairs(text, "valid", valid_pairs, seed=2)
    return {
        "name": "reverse",
        "run_dir": str(tmp_path / "run"),
        "seed": 1,
        "data": {
            "source": {"files": {"train": [str(p) for p in train], "valid": [str(p) for p in valid]}},
            "filter": {"min_len": 1, "max_len": 50, "max_ratio": 0, "dedup": False},
            "bpe": {"style": "bytelevel", "vocab_size": 300, "min_frequency": 2},  # the bars were set with it
        },
        "model": {"preset": "tiny", "layers_enc": 1, "layers_dec": 1, "d_model": 32, "heads": 4, "d_ff": 64,
                  "dropout": 0.1, "max_positions": 64},
        "train": {"max_tokens": 160, "lr": 3.0e-3, "warmup": 10, "device": "cpu", "precision": "fp32",
                  "max_steps": 20, "save_every": 5, "validate_every": 1000, "log_every": 2, "keep_last": 0},
        "decode": {"beam": 1, "max_len_a": 1.0, "max_len_b": 5},
    }


def write_recipe(tmp_path: Path, raw: dict, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return path


def prepared(tmp_path: Path, train_pairs: int = 300, valid_pairs: int = 20) -> Path:
    """The recipe file of a run whose data/ is prepared."""
    path = write_recipe(tmp_path, base_recipe(tmp_path, train_pairs, valid_pairs))
    prepare(load_recipe(path), workers=1, console=Console(file=io.StringIO()))
    return path


def recipe(path: Path, *overrides: str, **train: object) -> Recipe:
    """The recipe at `path` with dotted KEY=VALUE overrides and train.KEY=VALUE ones."""
    return load_recipe(path, [*overrides, *(f"train.{k}={json.dumps(v)}" for k, v in train.items())])


# A headless Chromium for the tests of the HTML pages mtx writes (mtx inspect, mtx report), and a PNG reader.

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def chromium(*args: str, folder: Path) -> subprocess.CompletedProcess:
    """Chromium run headless on `args`, with a profile of its own under `folder`."""
    command = [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", f"--user-data-dir={folder / 'profile'}",
               "--hide-scrollbars", "--force-device-scale-factor=1", "--virtual-time-budget=5000", *args]
    return subprocess.run(command, capture_output=True, timeout=120, check=True)


class Browser:
    """A headless Chromium driven through the DevTools protocol on a pipe (--remote-debugging-pipe: commands in on
    file descriptor 3, answers out on 4, each a JSON message ended by a NUL byte), for what a page does after it
    has loaded, such as a search that runs in a Web Worker, which --dump-dom's virtual time does not wait for."""

    def __init__(self, folder: Path, *flags: str) -> None:
        commands_in, self._commands = os.pipe()
        self._answers, answers_out = os.pipe()

        def on_three_and_four() -> None:  # in the child, before exec: where --remote-debugging-pipe looks
            os.dup2(commands_in, 3)
            os.dup2(answers_out, 4)

        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--remote-debugging-pipe",
             f"--user-data-dir={folder / 'profile'}", *flags, "about:blank"],
            pass_fds=(3, 4), preexec_fn=on_three_and_four, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(commands_in)
        os.close(answers_out)
        self._unread, self._last_id = b"", 0
        target = self._call("Target.createTarget", None, url="about:blank")["targetId"]
        self._session = self._call("Target.attachToTarget", None, targetId=target, flatten=True)["sessionId"]

    def _call(self, method: str, session: str | None, **params: object) -> dict:
        self._last_id += 1
        message = {"id": self._last_id, "method": method, "params": params,
                   **({"sessionId": session} if session else {})}
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        while True:  # events arrive between answers: skip them
            while b"\0" not in self._unread:
                chunk = os.read(self._answers, 1 << 16)
                assert chunk, "Chromium closed its DevTools pipe"
                self._unread += chunk
            raw, self._unread = self._unread.split(b"\0", 1)
            answer = json.loads(raw)
            if answer.get("id") == self._last_id:
                assert "error" not in answer, answer["error"]
                return answer["result"]

    def open(self, url: str) -> None:
        self._call("Page.navigate", self._session, url=url)

    def evaluate(self, expression: str) -> object:
        return self._call("Runtime.evaluate", self._session, expression=expression, returnByValue=True)["result"].get(
            "value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> object:
        """The value of `expression` in the page once it is truthy; None if it never is within `timeout` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if value := self.evaluate(expression):
                return value
            time.sleep(0.2)
        return None

    def close(self) -> None:
        with contextlib.suppress(AssertionError, OSError):  # it may be gone already
            self._call("Browser.close", None)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self._commands)
        os.close(self._answers)


def png_pixels(png: bytes) -> tuple[int, int, list[bytes]]:
    """(width, height, rows of RGB(A) bytes) of an 8-bit RGB or RGBA PNG, unfiltered (PNG spec §9)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    position, chunks, header = 8, [], b""
    while position < len(png):
        length, kind = struct.unpack(">I4s", png[position:position + 8])
        body = png[position + 8:position + 8 + length]
        header = body if kind == b"IHDR" else header
        chunks += [body] if kind == b"IDAT" else []
        position += 12 + length
    width, height, depth, color = struct.unpack(">IIBB", header[:10])
    assert depth == 8 and color in (2, 6)
    step = 3 if color == 2 else 4
    raw, rows, previous = zlib.decompress(b"".join(chunks)), [], bytes(width * step)
    for y in range(height):
        line = raw[y * (width * step + 1):(y + 1) * (width * step + 1)]
        kind, data, out = line[0], line[1:], bytearray(width * step)
        for i, value in enumerate(data):
            left = out[i - step] if i >= step else 0
            up, corner = previous[i], previous[i - step] if i >= step else 0
            if kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                value += left if pa <= pb and pa <= pc else up if pb <= pc else corner
            else:
                value += (0, left, up, (left + up) // 2)[kind]
            out[i] = value & 0xFF
        rows.append(bytes(out))
        previous = out
    return width, height, rows


# The copy task: a tiny model that copies its input, trained once per process, and `mtx translate` in-process.

COPY_WORDS = ["red", "green", "blue", "cat", "dog", "bird", "one", "two", "three", "house", "tree", "river"]


COPY_MAX_POSITIONS = 64


def sentences(n: int, rng: random.Random) -> list[str]:
    return [" ".join(rng.choice(COPY_WORDS) for _ in range(rng.randint(2, 7))) for _ in range(n)]


def train_copy_model(pairs: list[list[int]], vocab_size: int, steps: int = 250, **options) -> Transformer:
    """A few hundred Adam steps of teacher-forced cross-entropy: enough to copy word sequences exactly. `options`:
    model options on top of the copy model's shape (e.g. activation="swish")."""
    torch.manual_seed(0)
    rng = random.Random(1)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=64, heads=4, d_ff=128, layers_enc=2, layers_dec=1,
                                    dropout=0.0, max_positions=COPY_MAX_POSITIONS, **options))
    model = Transformer(cfg, vocab_size)
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3, betas=(0.9, 0.98))
    warmup = 20
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min((s + 1) / warmup,
                                                                          (steps - s) / (steps - warmup)))
    for _ in range(steps):
        batch = [pairs[rng.randrange(len(pairs))] for _ in range(64)]
        src = torch.nn.utils.rnn.pad_sequence([torch.tensor([*ids, EOS]) for ids in batch], batch_first=True)
        tgt_in = torch.nn.utils.rnn.pad_sequence([torch.tensor([BOS, *ids]) for ids in batch], batch_first=True)
        logits = model.output_logits(model(src, src == PAD, tgt_in))
        loss = F.cross_entropy(logits.flatten(0, 1), src.flatten(), ignore_index=PAD)  # the target is the source
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()


def copy_task(held_out: int, **options) -> tuple[Transformer, Tokenizer, list[str]]:
    """The copy model trained on 3,000 sentences of `COPY_WORDS`, its tokenizer, and `held_out` sentences it has not
    seen (the same model and, of equal counts, the same sentences every time); `options` as `train_copy_model`'s."""
    rng = random.Random(0)
    train, unseen = sentences(3000, rng), sentences(held_out, rng)
    tokenizer = Tokenizer.train(train, vocab_size=300, style="bytelevel")  # the task's bars were set with it
    return train_copy_model(tokenizer.encode_batch(train), tokenizer.vocab_size, **options), tokenizer, unseen


def translate_cli(args: list[str], stdin: bytes | None = None):
    """Run `mtx translate` in this process: (result, stdout lines). A user error comes back as the MtxError."""
    result = CliRunner().invoke(app, ["translate", *args], input=stdin)
    if result.exception is not None and not isinstance(result.exception, MtxError | SystemExit):
        raise result.exception
    return result, result.stdout_bytes.decode("utf-8").split("\n")[:-1]


def split_alignments(lines: list[str]) -> tuple[list[str], list[list[tuple[int, int]]]]:
    """--alignment output lines → their texts and their (source, target) links."""
    texts, links = [], []
    for line in lines:
        text, pharaoh = line.split(" ||| ")
        texts.append(text)
        links.append([tuple(int(i) for i in link.split("-")) for link in pharaoh.split()])
    return texts, links


# Scripted models with hand-computed probabilities, for the search.

SCRIPTED_VOCAB = 6


@dataclass
class ScriptedState(DecoderCache):
    """What the scripted model remembers: each sentence's source, each row's prefix. Like the real cache, it
    keeps the rows grouped by sentence and reorders the sentences only when told which ones stay."""

    sentence: torch.Tensor  # (B,) the source's first token, per sentence
    prefix: torch.Tensor  # (N, step), N a multiple of B
    step: int = 0

    def reorder(self, rows: torch.Tensor, sentences: torch.Tensor | None = None) -> ScriptedState:
        return ScriptedState(self.sentence if sentences is None else self.sentence[sentences], self.prefix[rows],
                             self.step)

    def row_sentences(self) -> list[int]:
        return self.sentence.repeat_interleave(len(self.prefix) // len(self.sentence)).tolist()


class ScriptedModel(IncrementalDecoder[ScriptedState]):
    """A model whose next-token distribution is `distribution(source's first token, prefix)`. It names the
    protocols search is typed against, so a type checker holds it to them as it holds
    mtx.model.transformer.Transformer."""

    def __init__(self, distribution: Callable[[int, tuple[int, ...]], dict[int, float]]) -> None:
        self.distribution = distribution
        self.steps = 0

    def encode(self, src: torch.Tensor, src_pad: torch.Tensor) -> torch.Tensor:
        return src[:, 0]

    def init_state(self, memory: torch.Tensor, src_pad: torch.Tensor, max_len: int) -> ScriptedState:
        return ScriptedState(memory, memory.new_zeros(len(memory), 0))

    def decode_step(self, prev: torch.Tensor, state: ScriptedState) -> tuple[torch.Tensor, ScriptedState]:
        self.steps += 1
        state.prefix = torch.cat([state.prefix, prev.unsqueeze(1)], dim=1) if state.step else state.prefix
        state.step += 1
        log_probs = torch.full((len(prev), SCRIPTED_VOCAB), -torch.inf)
        for row, (sentence, prefix) in enumerate(zip(state.row_sentences(), state.prefix.tolist(), strict=True)):
            for token, p in self.distribution(sentence, tuple(prefix)).items():
                log_probs[row, token] = math.log(p)
        return log_probs, state


def scripted_sources(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n one-token sources whose token tells the scripted model which sentence it is."""
    src = torch.arange(n).unsqueeze(1) + 10
    return src, src == PAD


def scripted_decode(model: ScriptedModel, n: int = 1, max_len: int = 10, min_len: int = 0, **options):
    src, src_pad = scripted_sources(n)
    return beam_search(model, src, src_pad, Constraints(torch.full((n,), max_len), min_len), **options)


# A tiny Transformer.

TINY_VOCAB = 50


def tiny_model(norm: str = "post", share: bool = True, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=32, heads=4, d_ff=64, norm=norm,
                                    share_embeddings=share, max_positions=64))
    return Transformer(cfg, TINY_VOCAB).eval()


# Sentence pairs for the batching tests.

class Pairs:
    """An in-memory split with the interface of mtx.data.prepared.TokenSplit."""

    def __init__(self, sources: list[list[int]], targets: list[list[int]]) -> None:
        self._src, self._tgt = sources, targets
        self.src_lens = np.array([len(s) for s in sources], dtype=np.int64)
        self.tgt_lens = np.array([len(t) for t in targets], dtype=np.int64)

    def __len__(self) -> int:
        return len(self._src)

    def src(self, i: int) -> np.ndarray:
        return np.array(self._src[i], dtype=np.int64)

    def tgt(self, i: int) -> np.ndarray:
        return np.array(self._tgt[i], dtype=np.int64)


# The trainer's runs: their files, events, a fake clock and scripted validation BLEU.

class MemorySplit:
    """Sentence pairs of token ids held in memory, read as mtx.data.prepared.TokenSplit is read by a pass over
    the whole split or a sample of it (`len`, `block`, `rows`): for tests of what learns from a prepared split."""

    def __init__(self, pairs: list[tuple[list[int], list[int]]]) -> None:
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.pairs)

    def block(self, side: str, start: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        sentences = [pair[0 if side == "src" else 1] for pair in self.pairs[start:end]]
        offsets = np.cumsum([0, *map(len, sentences)]).astype(np.int64)
        return np.array([t for s in sentences for t in s], dtype=np.int64), offsets

    def rows(self, side: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return MemorySplit([self.pairs[i] for i in indices]).block(side, 0, len(indices))


def copy_lexicon(tokenizer: Tokenizer, vocab_size: int, sentences: list[str], width: int = 10):
    """The lexical table (5 EM iterations) of `sentences` copied: each token its own translation, as the copy
    task's training pairs would teach it."""
    from mtx.data.lexicon import learn_lexicon

    ids = tokenizer.encode_batch(sentences)
    return learn_lexicon(MemorySplit([(s, s) for s in ids]), vocab_size, width, 5)


def run_files(path: Path) -> tuple[Path, Path]:
    run = load_recipe(path).run_path
    return run / "checkpoints", run / "metrics.jsonl"


TIMING = ("tokens_per_s", "seconds", "gpu_seconds", "gpu_hours")  # the fields that depend on the wall clock


def events(metrics: Path, kind: str) -> list[dict]:
    """Logged events of one kind, without the fields that depend on timing: a resumed run logs the rest alike."""
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [{k: v for k, v in row.items() if k != "event" and k not in TIMING} for row in rows
            if row["event"] == kind]


class FakeClock:
    """A clock for a run where every optimizer update takes `per_update` seconds: `hooks` hands it to the
    trainer, its checkpoint keeper and its log, and times each update with it."""

    def __init__(self, per_update: float) -> None:
        self.offset, self.per_update = 0.0, per_update

    def __call__(self) -> float:
        return time.monotonic() + self.offset

    def timed_update(self, state, batches, update) -> bool:
        stepped = update()
        self.offset += self.per_update
        return stepped

    @property
    def hooks(self) -> Hooks:
        return Hooks(clock=self, around_update=self.timed_update)


def scripted_bleu(scores: list[float]):
    """A valid BLEU (mtx.train.components.Hooks.valid_bleu) that follows `scores`, one per validation, with a
    length ratio of BLEU / 20; the valid loss is computed for real."""
    remaining = iter(scores)

    def scripted() -> tuple[float, float]:
        bleu = next(remaining)
        return bleu, bleu / 20

    return scripted


# Two gloo processes as torchrun would start them.

NO_DROPOUT = "model.dropout=0.0"  # dropout masks differ by rank by design; without dropout the runs must agree


WINDOW = 30  # torchrun's default --shutdown-timeout: seconds between its SIGTERM and its SIGKILL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(worker, *args: object) -> None:
    """Two gloo ranks running `worker(rank, world, port, *args)`, as torchrun would start them."""
    mp.spawn(worker, args=(2, free_port(), *args), nprocs=2, join=True)


def join_group(rank: int, world: int, port: int) -> distributed.Context:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    torch.set_num_threads(1)
    return distributed.setup("cpu")


# Word labels of attention maps.

def words_of(labels: list[str]) -> str:
    """The text that labels spell: a word per label that starts one, continuations joined to it; a token that is
    a space alone (␣) shows where a word's space was cut from it."""
    text = ""
    for label in labels:
        if label.startswith(CONTINUATION):
            text += label[len(CONTINUATION):].replace("…", "")
        elif label not in ("<s>", "</s>", "␣"):
            text += " " + label
    return text.strip()


# A real `mtx serve` on a free port of 127.0.0.1.

serving = pytest.mark.skipif(any(__import__("importlib").util.find_spec(m) is None
                                 for m in ("fastapi", "uvicorn", "fastapi_swagger")),
                             reason="needs the extra mtx[serve]")


class Server:
    """`mtx serve` in a subprocess on a free port, its JSON log in a file. `python`: the interpreter's arguments
    that run mtx; `session`: a process group of its own (for a Ctrl-C sent to it, as a terminal sends one)."""

    def __init__(self, checkpoint: Path, log: Path, *flags: str, python: tuple[str, ...] = ("-m", "mtx"),
                 session: bool = False) -> None:
        self.log_path, self.log_file = log, open(log, "wb")  # noqa: SIM115 - the server's stderr while it lives
        self.process = subprocess.Popen(
            [sys.executable, *python, "serve", "-m", str(checkpoint), "--port", "0", "--threads", "2", *flags],
            stdout=subprocess.DEVNULL, stderr=self.log_file, env={**os.environ, "OMP_WAIT_POLICY": "PASSIVE"},
            start_new_session=session)
        deadline = time.monotonic() + 120
        while (url := self._listening()) is None:
            assert self.process.poll() is None and time.monotonic() < deadline, self.log()
            time.sleep(0.05)
        self.port = int(url.rsplit(":", 1)[1])
        while self.get("/health")[0] != 200:
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.05)

    def _listening(self) -> str | None:
        for event in self.events():
            if event.get("event") == "listening":
                return event["url"]
        return None

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def events(self) -> list[dict]:
        return [json.loads(line) for line in self.log().splitlines() if line.startswith("{") and line.endswith("}")]

    def requests_logged(self, path: str, count: int) -> list[dict]:
        """The log's lines of requests to `path`, once there are `count` of them: each is written just after its
        answer went out."""
        deadline = time.monotonic() + 10
        while len(logged := [e for e in self.events() if e["event"] == "request" and e["path"] == path]) < count:
            assert time.monotonic() < deadline, self.log()
            time.sleep(0.02)
        return logged

    def assert_log_is_json_lines(self) -> None:
        """Every line the server wrote on standard error, its workers' and uvicorn's included, is a JSON object."""
        for line in self.log().splitlines():
            try:
                assert isinstance(json.loads(line), dict), line
            except json.JSONDecodeError:
                raise AssertionError(f"not a JSON line: {line!r}\n{self.log()}") from None

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict | None = None) -> tuple[int, dict, bytes]:
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            connection.request(method, path, body=body, headers=headers or {})
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            status, _, body = self.request("GET", path)
        except ConnectionError:
            return 0, b""
        return status, body

    def translate(self, body: dict | bytes) -> tuple[int, dict, dict]:
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        status, headers, answer = self.request("POST", "/translate", raw, {"Content-Type": "application/json"})
        return status, headers, json.loads(answer)

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=60)
        finally:
            if self.process.poll() is None:
                self.process.kill()
            self.log_file.close()


class Probe:
    """What a test worker answers calls with (mtx.decode.workers): its pid and threads, an error, a death."""

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def work(self, i: int) -> tuple[int, int, int]:
        return i * i + self.offset, torch.get_num_threads(), os.getpid()

    def fail(self, i: int) -> int:
        raise ValueError(f"item {i}")

    def die(self, i: int) -> int:
        os._exit(9)

    def sleep(self, seconds: float) -> int:
        os.write(1, f"{os.getpid()}\n".encode())  # one write: the pids of two workers never interleave
        time.sleep(seconds)
        return os.getpid()


def load_probe(offset: int) -> Probe:
    """A worker's `load`: one thread, as a worker of the torch engine on a CPU has."""
    torch.set_num_threads(1)
    return Probe(offset)


# MarianMT (OPUS-MT) tokenizer folders built here, with SentencePiece models trained on the demo corpus: for the
# imported tokenizer's tests (mtx.spm_tokenizer) and, with a model's weights beside them, mtx import's.

def marian_tokenizer_folder(directory: Path, pairs: int = 1000, source_pieces: int = 200, target_pieces: int = 250,
                            languages: tuple[str, ...] = (), seed: int = 1) -> Path:
    """A MarianMT tokenizer folder in `directory`, made as OPUS-MT's are and saved by transformers'
    MarianTokenizer: source.spm (English) and target.spm (German), SentencePiece unigram models with the nmt_nfkc
    rule trained on `pairs` demo pairs, and vocab.json, "</s>" 0 and "<unk>" 1, then the pieces of both models,
    then the codes `>>{lang}<<` of `languages` (a multilingual model's), "<pad>" last. The same arguments make
    the same files."""
    import io

    import sentencepiece
    from transformers import MarianTokenizer

    from mtx.data.demo import sample_pairs

    directory.mkdir(parents=True, exist_ok=True)
    demo = sample_pairs(pairs, seed)
    models = {}
    for name, lines, size in (("source.spm", [p.en for p in demo], source_pieces),
                              ("target.spm", [p.de for p in demo], target_pieces)):
        model = io.BytesIO()
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=model, vocab_size=size, model_type="unigram",
            normalization_rule_name="nmt_nfkc", character_coverage=1.0, num_threads=1, minloglevel=2)
        models[name] = model.getvalue()
        (directory / name).write_bytes(models[name])
    vocab = {"</s>": 0, "<unk>": 1}
    for model in models.values():
        processor = sentencepiece.SentencePieceProcessor(model_proto=model)
        for i in range(processor.get_piece_size()):
            if not (processor.is_control(i) or processor.is_unknown(i)):
                vocab.setdefault(processor.id_to_piece(i), len(vocab))
    for lang in languages:
        vocab[f">>{lang}<<"] = len(vocab)
    vocab["<pad>"] = len(vocab)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    MarianTokenizer(source_spm=str(directory / "source.spm"), target_spm=str(directory / "target.spm"),
                    vocab=str(directory / "vocab.json"), source_lang="en", target_lang="de").save_pretrained(directory)
    return directory


# ----------------------------------------------------------------------------------------------- the documentation


def docs_hooks():
    """docs/hooks.py, the site's generators, imported as MkDocs imports it (it is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def snippet(argument: str) -> str:
    """What a page's `--8<-- "FILE[:SECTION]"` line includes, as pymdownx.snippets does (base path: the
    repository): the whole file, or the lines between its `[start:SECTION]` and `[end:SECTION]` markers (sections
    may nest); a section that is not there fails, as the strict build does."""
    import re

    path, _, section = argument.partition(":")
    text = (ROOT / path).read_text(encoding="utf-8")
    if not section:
        return text
    start = re.search(rf"\[start:{re.escape(section)}\][^\n]*\n", text)
    end = None if start is None else re.search(rf"\n[^\n]*\[end:{re.escape(section)}\]", text[start.end():])
    assert start is not None and end is not None, f"{path} has no section {section}"
    return text[start.end(): start.end() + end.start()]
