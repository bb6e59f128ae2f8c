"""`mtx serve`: through a real HTTP client against servers started on free ports of 127.0.0.1.

The copy-task model (test_translate's) serves. Its answers must equal `mtx translate --format jsonl`'s for the
same options; concurrent requests must each get their own sentences back, having shared batches; a full queue
must refuse at once with 503 and Retry-After and leave the server healthy; a request past its timeout gets 504;
SIGTERM must answer what was in flight and exit 0; bad bodies get 400 or 413 naming the field, never a
traceback. The OpenAPI document states each bound and limit that the server keeps (test_serve_fuzz holds the
server to the whole document); Starlette's own refusals are JSON too; a body short of its Content-Length gets 408
within --timeout; and every line of the log is JSON, uvicorn's and a failed decoding process's traceback included.
The batcher and the metrics are also tested alone, without HTTP. The tests that need the extra mtx[serve] skip
without it; the one that checks its absence is named does not.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import typing
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from support import CHROMIUM, Server, chromium, serving, translate_cli
from typer.testing import CliRunner

from mtx.cli import app
from mtx.serve.batcher import Batcher, Draining, Job, QueueFull
from mtx.serve.metrics import Histogram, Metrics


@pytest.fixture
def start(copy_model: dict, tmp_path: Path) -> Iterator:
    servers: list[Server] = []

    def started(*flags: str, **options) -> Server:
        servers.append(Server(copy_model["checkpoint"], tmp_path / f"serve{len(servers)}.log", *flags, **options))
        return servers[-1]

    yield started
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def expected(copy_model: dict) -> dict:
    """`mtx translate --format jsonl` of the held-out sentences, by option set."""
    runs = {"default": [], "greedy": ["--beam", "1"], "nbest_aligned": ["--nbest", "2", "--alignment"],
            "sampled": ["--sampling", "--beam", "1", "--nbest", "2", "--seed", "7", "--temperature", "1.5"]}
    out = {}
    for name, flags in runs.items():
        result, lines = translate_cli(["-m", str(copy_model["checkpoint"]), "-i", str(copy_model["input"]),
                                       "--format", "jsonl", *flags])
        assert result.exit_code == 0, result.output
        out[name] = [json.loads(line) for line in lines]
    return out


def assert_same(served: dict, expected: dict) -> None:
    """Equal fields, with scores and log-probabilities to float32 rounding: batches of other sentences pad
    differently, which moves the last bits."""
    assert served.keys() == expected.keys()
    for key, value in expected.items():
        if key in ("score", "token_log_probs"):
            assert served[key] == pytest.approx(value, abs=1e-4)
        elif key == "nbest":
            for mine, theirs in zip(served[key], value, strict=True):
                assert_same(mine, theirs)
        else:
            assert served[key] == value, key


# --------------------------------------------------------------------------------------------------- over HTTP


@serving
def test_translations_equal_mtx_translate_for_the_same_options(start, copy_model: dict, expected: dict) -> None:
    server = start()
    text = copy_model["held_out"]
    bodies = {"default": {}, "greedy": {"beam": 1}, "nbest_aligned": {"nbest": 2, "alignment": True},
              "sampled": {"sampling": True, "beam": 1, "nbest": 2, "seed": 7, "temperature": 1.5}}
    for name, options in bodies.items():
        status, _, answer = server.translate({"text": text, **options})
        assert status == 200, answer
        assert len(answer["translations"]) == len(text)
        for served, wanted in zip(answer["translations"], expected[name], strict=True):
            assert_same(served, wanted)
    # A sentence's samples depend on its index in the whole input: line_offset places a request's first one.
    status, _, answer = server.translate({"text": text[5:8], "line_offset": 5, **bodies["sampled"]})
    assert [t["text"] for t in answer["translations"]] == [t["text"] for t in expected["sampled"][5:8]]
    # null is an option left unset: the recipe's.
    status, _, answer = server.translate({"text": text[:2], "beam": None, "topk": None})
    assert status == 200 and [t["text"] for t in answer["translations"]] == [t["text"] for t in
                                                                             expected["default"][:2]]
    # An empty sentence gets the empty translation, as an empty line does.
    status, _, answer = server.translate({"text": ["", text[0]]})
    assert answer["translations"][0] == {"text": "", "score": None, "tokens": [], "token_log_probs": [], "flags": []}
    assert answer["translations"][1]["text"] == expected["default"][0]["text"]


@serving
def test_concurrent_requests_each_get_their_own_results_from_shared_batches(start, copy_model: dict,
                                                                             expected: dict) -> None:
    server = start("--max-wait-ms", "100")
    text, wanted = copy_model["held_out"], [t["text"] for t in expected["default"]]
    greedy = [t["text"] for t in expected["greedy"]]

    def one(index: int) -> tuple[int, str]:
        options = {"beam": 1} if index % 3 == 0 else {}  # two option sets in flight: never mixed in a batch
        status, _, answer = server.translate({"text": [text[index]], **options})
        assert status == 200, answer
        return index, answer["translations"][0]["text"]

    with ThreadPoolExecutor(24) as pool:
        results = list(pool.map(one, list(range(len(text))) * 3))
    for index, translation in results:
        assert translation == (greedy if index % 3 == 0 else wanted)[index]
    metrics = server.get("/metrics")[1].decode()
    batches = float(re.search(r"^mtx_batch_sentences_count (\S+)$", metrics, re.M).group(1))
    sentences = float(re.search(r"^mtx_batch_sentences_sum (\S+)$", metrics, re.M).group(1))
    assert sentences == len(results) and sentences / batches > 1.5  # the requests shared batches


def occupy(server: Server, text: list[str], pool: ThreadPoolExecutor) -> Future:
    """Keep the server's one decoding process busy for a second or more (800 sentences, beam 16; the server must take
    them, --max-sentences 800): sent, and being decoded."""
    busy = pool.submit(server.translate, {"text": text * 20, "beam": 16, "nbest": 16})
    wait_for_metric(server, "mtx_decoding_requests 1")
    return busy


def wait_for_metric(server: Server, line: str) -> None:
    deadline = time.monotonic() + 30
    while line not in server.get("/metrics")[1].decode().splitlines():
        assert time.monotonic() < deadline, f"never saw {line!r}"
        time.sleep(0.01)


@serving
def test_overload_is_refused_at_once_with_503_and_the_server_stays_healthy(start, copy_model: dict,
                                                                             expected: dict) -> None:
    server = start("--max-queue", "2", "--threads", "1", "--max-sentences", "800")
    text = copy_model["held_out"]

    def one(index: int) -> tuple[int, dict, float]:
        started = time.monotonic()
        status, headers, answer = server.translate({"text": text[2 * index: 2 * index + 2]})
        return status, {**headers, **answer}, time.monotonic() - started

    with ThreadPoolExecutor(13) as pool:
        busy = occupy(server, text, pool)  # while it decodes, the queue's 2 sentences are one request's
        results = list(pool.map(one, range(12)))
        assert busy.result()[0] == 200
    refused = [(headers, seconds) for status, headers, seconds in results if status == 503]
    assert len(refused) == 11 and [status for status, _, _ in results].count(200) == 1
    for headers, seconds in refused:
        assert int(headers["retry-after"]) >= 1 and "--max-queue" in headers["error"]
        assert seconds < 0.5  # at once, not after waiting for room
    assert server.get("/health") == (200, b'{"status":"ready"}')
    status, _, answer = server.translate({"text": text[:2]})
    assert status == 200 and [t["text"] for t in answer["translations"]] == [t["text"] for t in
                                                                             expected["default"][:2]]
    assert re.search(r'^mtx_requests_total\{path="/translate",code="503"\} (\d+)$',
                     server.get("/metrics")[1].decode(), re.M).group(1) == "11"


@serving
def test_a_request_past_its_timeout_gets_504_and_its_sentences_are_dropped(start, copy_model: dict) -> None:
    server = start("--timeout", "0.3", "--threads", "1", "--max-sentences", "800")
    with ThreadPoolExecutor(2) as pool:
        busy = occupy(server, copy_model["held_out"], pool)
        started = time.monotonic()
        status, _, answer = server.translate({"text": copy_model["held_out"][:3]})
        assert status == 504 and "--timeout" in answer["error"]
        assert time.monotonic() - started < 1.0
        assert busy.result()[0] == 504  # it too ran out of time; decoded, but too late
    wait_for_metric(server, "mtx_decoding_requests 0")
    # The queued request was dropped when its client gave up: only the busy one's sentences were decoded.
    assert "mtx_sentences_total 800" in server.get("/metrics")[1].decode().splitlines()
    assert server.get("/health")[0] == 200


@serving
def test_sigterm_answers_what_is_in_flight_then_exits_0(start, copy_model: dict, expected: dict) -> None:
    server = start("--threads", "1", "--max-sentences", "800")
    text, wanted = copy_model["held_out"], [t["text"] for t in expected["default"]]
    with ThreadPoolExecutor(7) as pool:
        busy = occupy(server, text, pool)
        pending = [pool.submit(server.translate, {"text": text[i: i + 2]}) for i in range(0, 12, 2)]
        wait_for_metric(server, "mtx_queue_requests 6")
        server.process.send_signal(signal.SIGTERM)  # one request being decoded, six queued
        answers = [future.result() for future in pending]
        assert busy.result()[0] == 200
    for i, (status, _, answer) in zip(range(0, 12, 2), answers, strict=True):
        assert status == 200 and [t["text"] for t in answer["translations"]] == wanted[i: i + 2]
    assert server.process.wait(timeout=60) == 0
    events = [event["event"] for event in server.events()]
    assert events.index("draining") < events.index("stopped") == len(events) - 1
    with pytest.raises(ConnectionError):
        server.request("GET", "/health")


@serving
def test_the_ct2_engine_keeps_the_servers_promises(start, copy_model: dict, expected: dict) -> None:
    """`mtx serve --engine ct2`: greedy answers are `mtx translate`'s (CTranslate2's greedy float32 tokens are
    mtx's), an option it cannot honour exactly is a 400 naming the field, never a changed meaning, /metrics and the
    ready line name the engine, and SIGTERM drains to exit 0."""
    pytest.importorskip("ctranslate2")
    server = start("--engine", "ct2")
    text = copy_model["held_out"]
    status, _, answer = server.translate({"text": text, "beam": 1})
    assert status == 200 and [t["text"] for t in answer["translations"]] == [t["text"] for t in expected["greedy"]]
    assert [t["tokens"] for t in answer["translations"]] == [t["tokens"] for t in expected["greedy"]]
    status, _, answer = server.translate({"text": text[:1], "lenpen_style": "gnmt", "lenpen": 0.6})
    assert status == 400 and answer["field"] == "lenpen_style"
    assert answer["error"].startswith("engine = ct2 cannot honour lenpen_style = gnmt") and "engine = torch" in answer[
        "error"]
    status, _, answer = server.translate({"text": text[:1], "engine": "torch"})
    assert status == 400 and answer["field"] == "engine"  # fixed by the server: not a request's field
    status, metrics = server.get("/metrics")
    assert status == 200 and b'mtx_engine_info{engine="ct2"' in metrics
    ready = [event for event in server.events() if event["event"] == "ready"][0]
    assert ready["engine"] == "ct2" and ready["compute_type"] == "float32"
    assert server.stop() == 0


@pytest.fixture(scope="module")
def limited(copy_model: dict, tmp_path_factory) -> Iterator[Server]:
    """One server with small limits, which every bad body of the parametrized test is sent to."""
    server = Server(copy_model["checkpoint"], tmp_path_factory.mktemp("limited") / "serve.log", "--max-sentences",
                    "8", "--max-chars", "40")
    yield server
    server.stop()


@serving
def test_a_decoding_process_that_dies_is_replaced_and_only_its_batch_is_lost(start, copy_model: dict,
                                                                            expected: dict) -> None:
    server = start("--threads", "1")
    (pid,) = next(event["pids"] for event in server.events() if event["event"] == "ready")
    os.kill(pid, signal.SIGKILL)  # as the kernel's out-of-memory killer would
    status, headers, answer = server.translate({"text": copy_model["held_out"][:2]})
    assert status == 503 and "restarted: retry" in answer["error"] and headers["retry-after"] == "1"
    assert server.get("/health") == (200, b'{"status":"ready"}')
    status, _, answer = server.translate({"text": copy_model["held_out"][:2]})
    assert status == 200 and [t["text"] for t in answer["translations"]] == [t["text"] for t in
                                                                             expected["default"][:2]]
    events = [event["event"] for event in server.events()]
    assert events.index("decoding_process_died") < events.index("decoding_process_restarted")


@serving
def test_decoding_processes_whose_server_was_killed_exit_quietly(start) -> None:
    """SIGKILL leaves the server no time to stop its decoding processes: each finds its pipe closed and exits, without a
    traceback in the log."""
    server = start()
    pids = next(event["pids"] for event in server.events() if event["event"] == "ready")
    server.process.kill()
    server.process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()
              for pid in pids):
        assert time.monotonic() < deadline, f"decoding processes {pids} outlived their server"
        time.sleep(0.05)
    server.assert_log_is_json_lines()


@serving
@pytest.mark.parametrize(("body", "status", "field", "message"), [
    (b'{"text": ["a"', 400, None, "not valid JSON"),
    (b'["a"]', 400, None, "must be a JSON object"),
    (b'{}', 400, "text", "text is missing"),
    (b'{"text": "a b"}', 400, "text", "text: input should be a valid array, not \"a b\""),
    (b'{"text": ["a", 7]}', 400, "text[1]", "valid string"),
    (b'{"text": ["a"], "beam": "4"}', 400, "beam", "valid integer"),
    (b'{"text": ["a"], "beam": 2.5}', 400, "beam", "valid integer"),
    (b'{"text": ["a"], "beams": 4}', 400, "beams", "beams is not an option of POST /translate; the options are text"),
    (b'{"text": ["a"], "beam": 0}', 400, "beam", "beam = 0 must be at least 1"),
    (b'{"text": ["a"], "beam": 2, "nbest": 3}', 400, "nbest", "nbest = 3 must be between 1 and beam (2)"),
    (b'{"text": ["a"], "topk": 5}', 400, "topk", "topk = 5 applies only with sampling"),
    (b'{"text": ["a"], "sampling": true, "beam": 4}', 400, "beam", "give one or the other"),
    (b'{"text": ["a"], "beam": 17}', 400, "beam", "more than this server allows, 16 (--max-beam)"),
    (b'{"text": ["a"], "alignment_layer": 0}', 400, "alignment_layer", "only applies with alignment"),
    (b'{"text": ["a"], "alignment": true, "alignment_layer": 9}', 400, "alignment_layer", "numbered 0 to"),
    (b'{"text": ["a"], "line_offset": -1}', 400, "line_offset", "must be"),
    (b'{"text": ["a"], "shortlist": 5}', 400, "shortlist", "shortlist = 5 needs the checkpoint's lexical table"),
    (json.dumps({"text": ["a"] * 9}).encode(), 413, "text", "at most 8 per request (--max-sentences)"),
    (json.dumps({"text": ["a", "b" * 41]}).encode(), 413, "text[1]", "at most 40 per sentence (--max-chars)"),
])
def test_bad_bodies_get_400_or_413_naming_the_field(limited: Server, body: bytes, status: int, field: str | None,
                                                    message: str) -> None:
    got, _, answer = limited.translate(body)
    assert got == status, answer
    assert message in answer["error"] and answer.get("field") == field
    assert "Traceback" not in json.dumps(answer)


@serving
def test_options_that_leave_a_search_no_token_are_translated_as_mtx_translate_does(listed_copy_model: Path,
                                                                                    tmp_path: Path) -> None:
    """A shortlist of one translation per source token and no frequent ones, no repeated unigram and at least two
    tokens: on characters the model never saw, a hypothesis has nothing left after its first token, not even EOS
    (the length floor). The search lets EOS stay (mtx.decode.search): 200, as `mtx translate` does, never 500."""
    text = ["\U0001d160" * 3, "ЖЖЖ", "one two"]
    options = {"shortlist": 1, "shortlist_frequent": 0, "no_repeat_ngram": 1, "min_len": 2}
    source = tmp_path / "source.txt"
    source.write_text("".join(f"{line}\n" for line in text), encoding="utf-8")
    flags = [f"--{name.replace('_', '-')}={value}" for name, value in options.items()]
    server = Server(listed_copy_model, tmp_path / "serve.log")
    try:
        for search in ({"beam": 4}, {"beam": 1}, {"sampling": True, "beam": 1, "nbest": 2}):
            status, _, answer = server.translate({"text": text, **options, **search})
            assert status == 200, answer
            result, lines = translate_cli(["-m", str(listed_copy_model), "-i", str(source), "--format", "jsonl",
                                           *flags, *(f"--{k}={v}" for k, v in search.items() if k != "sampling"),
                                           *(["--sampling"] if "sampling" in search else [])])
            assert result.exit_code == 0, result.output
            for served, wanted in zip(answer["translations"], map(json.loads, lines), strict=True):
                assert_same(served, wanted)
                assert math.isfinite(served["score"])
    finally:
        server.stop()


def request_schema(server: Server) -> dict:
    """The JSON schema of POST /translate's body, from the server's OpenAPI document."""
    document = json.loads(server.get("/openapi.json")[1])
    return document["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]


def beside(value: float, integer: bool, direction: float) -> float:
    """The next value of the field's type past `value` towards `direction` (±inf)."""
    return value + (1 if direction > 0 else -1) if integer else math.nextafter(value, direction)


# What a field's bound is tried with: the options it needs beside it to be valid at all.
COMPANIONS = {"topk": {"sampling": True, "beam": 1}, "topp": {"sampling": True, "beam": 1},
              "temperature": {"sampling": True, "beam": 1}, "nbest": {"beam": 16},
              "alignment_layer": {"alignment": True}}


@serving
def test_the_openapi_document_states_each_bound_and_limit_and_the_server_keeps_them(limited: Server) -> None:
    from mtx.config.fields import bounds_of
    from mtx.decode.request import PER_PROCESS, Request

    schema = request_schema(limited)
    properties = schema["properties"]
    # Each option's range is the one its field declares (mtx.config.fields), a float's open side bounded by the
    # largest finite float; beam and nbest are also capped by --max-beam, text by --max-sentences and --max-chars
    # (this server's: 16, 8 and 40).
    types = typing.get_type_hints(Request)
    for f in (f for f in dataclasses.fields(Request) if f.name not in PER_PROCESS):
        declared = bounds_of(f).json_schema(finite=types[f.name] is float) if bounds_of(f) else {}
        if f.name in ("beam", "nbest"):
            declared["maximum"] = 16
        assert {k: properties[f.name][k] for k in properties[f.name] if "imum" in k} == declared, f.name
    assert properties["text"]["maxItems"] == 8 and properties["text"]["items"]["maxLength"] == 40
    # The model's part: its decoder layers bound alignment_layer.
    (last_layer,) = [rule["properties"]["alignment_layer"]["maximum"] for rule in schema["allOf"]
                     if "maximum" in rule.get("properties", {}).get("alignment_layer", {})]
    bounds = [(name, keyword, value) for name, field in properties.items() for keyword, value in field.items()
              if keyword in ("minimum", "exclusiveMinimum", "maximum")] + [("alignment_layer", "maximum", last_layer)]
    assert len(bounds) >= 14
    for name, keyword, value in bounds:
        kinds = [option.get("type") for option in properties[name].get("anyOf", [properties[name]])]
        integer, outward = "integer" in kinds, math.inf if keyword == "maximum" else -math.inf
        outside = value if keyword == "exclusiveMinimum" else beside(value, integer, outward)
        inside = beside(value, integer, math.inf) if keyword == "exclusiveMinimum" else value
        body = {"text": ["a b"], **COMPANIONS.get(name, {})}
        status, _, answer = limited.translate({**body, name: outside})
        assert status == 400 and answer["field"] == name, (name, outside, answer)
        status, _, answer = limited.translate({**body, name: inside})
        assert status == 200, (name, inside, answer)
    for text, field in ((["a"] * 9, "text"), (["a" * 41], "text[0]")):
        status, _, answer = limited.translate({"text": text})
        assert status == 413 and answer["field"] == field
    assert limited.translate({"text": ["a" * 40] * 8})[0] == 200
    assert limited.translate({"text": ["a"], "beam": 2.0})[0] == 200  # JSON Schema's integer: 2.0 is 2


@serving
def test_refusals_outside_translate_are_json_errors_too(limited: Server) -> None:
    status, headers, body = limited.request("GET", "/translate")
    assert status == 405 and headers["allow"] == "POST" and "only POST" in json.loads(body)["error"]
    for method, path in (("POST", "/nothing"), ("GET", "/docs/static/nothing.js")):
        status, headers, body = limited.request(method, path)
        assert status == 404 and headers["content-type"] == "application/json"
        assert f"{path} is not a path of this server" in json.loads(body)["error"]


@serving
def test_a_body_short_of_its_length_gets_408_a_client_gone_is_logged_499_and_every_log_line_is_json(start) -> None:
    server = start("--timeout", "2")
    head = (b"POST /translate HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"text": [')
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        started = time.monotonic()
        client.sendall(head)  # 10 bytes of 100, and then nothing
        answer = b""
        while chunk := client.recv(4096):  # the server closes the connection after answering
            answer += chunk
        assert time.monotonic() - started < 6
    head_lines, _, body = answer.partition(b"\r\n\r\n")
    assert head_lines.startswith(b"HTTP/1.1 408") and "--timeout" in json.loads(body)["error"]
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(head)
        time.sleep(0.2)  # the server is reading the body when the client leaves
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as client:
        client.sendall(b"GARBAGE\r\n\r\n")  # not HTTP: uvicorn refuses it, and says so in its log
        assert client.recv(4096).startswith(b"HTTP/1.1 400")
    assert server.get("/health")[0] == 200
    timed_out, gone = server.requests_logged("/translate", 2)
    assert timed_out["status"] == 408 and gone["status"] == 499 and "closed the connection" in gone["error"]
    assert any(e["event"] == "uvicorn" and e["level"] == "warning" for e in server.events())
    server.assert_log_is_json_lines()


def failing_decoding_process(connection, *arguments) -> None:
    """A decoding process (`serve_calls`) whose translator raises on the sentence "boom": a fault that arises
    inside that process. It patches the translator there, in the process it runs in."""
    from mtx.decode.translator import Translator
    from mtx.decode.workers import serve_calls

    translate_tokens = Translator.translate_tokens

    def translate_or_fail(self, sources, *rest, **named):
        if any(ids is not None and self.tokenizer.decode(ids) == "boom" for ids in sources):
            raise ZeroDivisionError("boom in the decoding process")
        return translate_tokens(self, sources, *rest, **named)

    Translator.translate_tokens = translate_or_fail
    serve_calls(connection, *arguments)


@serving
def test_a_decoding_process_s_error_is_logged_with_its_own_traceback(start, copy_model: dict) -> None:
    folders = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]  # this file's and support's
    program = (f"import sys; sys.path[:0] = {folders!r}; import test_serve, mtx.decode.workers as workers; "
               "workers.serve_calls = test_serve.failing_decoding_process; from mtx.cli import main; main()")
    server = start(python=("-c", program))
    status, _, answer = server.translate({"text": ["boom"]})
    assert status == 500 and answer == {"error": "internal error (ZeroDivisionError: boom in the decoding process)."}
    logged = server.requests_logged("/translate", 1)[0]["error"]
    assert "in translate_or_fail" in logged and "in serve_calls" in logged  # the decoding process's frames
    assert logged.index("in translate_or_fail") < logged.index("in call")  # then the server's
    status, _, answer = server.translate({"text": copy_model["held_out"][:1]})
    assert status == 200  # the decoding process lives on
    server.assert_log_is_json_lines()


@serving
def test_ctrl_c_drains_without_stopping_the_decoding_processes_first(start, copy_model: dict) -> None:
    server = start("--threads", "1", "--max-sentences", "800", session=True)
    with ThreadPoolExecutor(2) as pool:
        busy = occupy(server, copy_model["held_out"], pool)
        os.killpg(server.process.pid, signal.SIGINT)  # as a terminal sends Ctrl-C: to every process of the group
        assert busy.result()[0] == 200
    assert server.process.wait(timeout=60) == 0
    server.assert_log_is_json_lines()


@serving
def test_limits_in_tokens_and_bytes_and_the_request_log(start, copy_model: dict, tmp_path: Path) -> None:
    server = start("--max-sentences", "4", "--max-chars", "100000")
    # Longer than the model's positions in tokens (the copy model reads 64): refused, not truncated.
    status, _, answer = server.translate({"text": ["a", " ".join(["sun"] * 300)]})
    assert status == 413 and answer["field"] == "text[1]" and "split it" in answer["error"]
    # A body larger than any acceptable request is refused from its Content-Length, before it is read.
    status, _, body = server.request("POST", "/translate", b"x" * (4 * 100_016 * 12 + 2**16 + 1))
    assert status == 413 and b"--max-sentences" in body
    # One JSON line per request, with its latency.
    server.translate({"text": copy_model["held_out"][:2]})
    requests = server.requests_logged("/translate", 3)
    assert [(e["status"], e.get("sentences")) for e in requests][-3:] == [(413, 2), (413, None), (200, 2)]
    assert all(e["ms"] > 0 and e["method"] == "POST" and e["client"].startswith("127.0.0.1:") for e in requests)
    assert "Traceback" not in server.log()


@serving
def test_health_metrics_and_openapi(start) -> None:
    server = start()
    assert server.get("/health") == (200, b'{"status":"ready"}')
    status, metrics = server.get("/metrics")
    lines = metrics.decode().splitlines()
    for name, kind in (("mtx_requests_total", "counter"), ("mtx_sentences_total", "counter"),
                       ("mtx_queue_sentences", "gauge"), ("mtx_batch_sentences", "histogram"),
                       ("mtx_request_duration_seconds", "histogram")):
        assert f"# TYPE {name} {kind}" in lines
    assert all(line.startswith("#") or re.fullmatch(r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? \S+', line)
               for line in lines)
    schema = json.loads(server.get("/openapi.json")[1])
    request = schema["paths"]["/translate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"text", "beam", "lenpen", "nbest", "sampling", "alignment"} <= set(request["properties"])
    assert set(schema["paths"]) == {"/translate", "/health", "/metrics"}


@serving
@pytest.mark.skipif(CHROMIUM is None, reason="needs a chromium binary")
def test_the_openapi_page_renders_in_a_browser_without_a_network(start, tmp_path: Path) -> None:
    server = start()
    status, page = server.get("/docs")
    assert status == 200
    assert not re.search(rb'(src|href)="(https?:)?//', page)  # every script and style from this server
    # Swagger UI renders each endpoint and the schemas of the answers (its last --virtual-time-budget counts).
    dom = chromium("--virtual-time-budget=30000", "--dump-dom", f"http://127.0.0.1:{server.port}/docs",
                   folder=tmp_path).stdout.decode()
    for path in ("/translate", "/health", "/metrics"):
        assert f'data-path="{path}"' in dom
    assert "SentenceTranslation" in dom and "Unable to render" not in dom


@serving
def test_a_checkpoint_that_cannot_load_exits_1_with_the_reason(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint")
    done = subprocess.run([sys.executable, "-m", "mtx", "serve", "-m", str(bad), "--port", "0"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 1 and "The model could not be loaded" in done.stderr and str(bad) in done.stderr
    assert "Traceback" not in done.stderr


@serving
@pytest.mark.parametrize("flags", [("--timeout", "nan"), ("--timeout", "inf"), ("--max-wait-ms", "nan"),
                                   ("--max-wait-ms", "-1")])
def test_a_wait_or_timeout_that_bounds_nothing_is_refused(copy_model: dict, flags: tuple[str, str]) -> None:
    """NaN passes every comparison's negation: `timeout <= 0` let --timeout nan through to every request."""
    done = subprocess.run([sys.executable, "-m", "mtx", "serve", "-m", str(copy_model["checkpoint"]), "--port", "0",
                           *flags], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "must be a finite number ≥ 0 and --timeout" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@serving
def test_a_port_in_use_is_a_user_error(start, copy_model: dict) -> None:
    server = start()
    result = CliRunner().invoke(app, ["serve", "-m", str(copy_model["checkpoint"]), "--port", str(server.port)])
    assert result.exit_code == 1 and f"Cannot listen on 127.0.0.1:{server.port}" in str(result.exception)


@serving
def test_the_listening_socket_lets_asyncio_send_answers_at_once() -> None:
    """asyncio turns Nagle's algorithm off only on sockets that say IPPROTO_TCP; with it on, every answer after the
    first on a keep-alive connection waited for the client's delayed acknowledgement (40 ms on Linux)."""
    from mtx.serve.command import bind

    sock = bind("127.0.0.1", 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_without_the_extra_the_command_names_it_and_exits_1(copy_model: dict) -> None:
    program = ("import sys; sys.modules['fastapi'] = None; from mtx.cli import main; sys.argv = ['mtx', 'serve', "
               f"'-m', {str(copy_model['checkpoint'])!r}]; main()")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "needs fastapi" in done.stderr and "pip install 'mtx[serve]'" in done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------------- without HTTP


class Recording:
    """A decoder that answers each sentence with itself reversed, fails for options "fail", and records the
    batches it was given."""

    def __init__(self, delay: float = 0.0) -> None:
        self.calls: list = []
        self.delay = delay

    def __call__(self, sentences: list[str], options: object, lines: list[int]) -> list[list]:
        self.calls.append((list(sentences), list(lines), options))
        time.sleep(self.delay)
        if options == "fail":
            raise RuntimeError("broken")
        return [[sentence[::-1]] for sentence in sentences]


def batcher(decoder: Recording, **settings) -> Batcher:
    """A batcher of one feeding thread, not started: the tests queue requests first, so what it gathers is known."""
    return Batcher([decoder], **{"batch_tokens": 100, "max_wait": 0.2, "max_queue": 50, "metrics": Metrics(),
                                 **settings})


def job(sentences: list[str], options: object, cost: int = 10) -> Job:
    return Job(sentences, list(range(len(sentences))), options, cost)


def test_the_server_process_holds_no_weights_and_tokenises_each_sentence_once(copy_model: dict) -> None:
    """Only the decoding processes load the model: the server's own process reads what the checkpoint says of
    itself (its weights mapped and dropped unread), checks requests against that and the tokenizer, and hands
    the decoding process each sentence's token ids."""
    import gc

    import torch

    from mtx.serve.service import Limits, TranslationService

    def tensors() -> dict[int, torch.Tensor]:
        gc.collect()
        return {id(o): o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)}

    before = tensors()
    service = TranslationService([copy_model["checkpoint"]], engine="torch", device="cpu", dtype="auto", threads=1,
                                 batch_tokens=4096,
                                 max_wait=0.005, max_queue=64, limits=Limits(8, 1000, 4, 30.0))
    service.load()
    try:
        assert service.status == "ready", service.failure
        sentences = [copy_model["held_out"][0], "", copy_model["held_out"][1]]
        job = service.job(sentences, {"beam": 2})
        held = [tensor for key, tensor in tensors().items() if key not in before]
        assert sum(tensor.numel() for tensor in held) == 0
        assert job.sentences == service.facts.encode(sentences) and job.sentences[1] is None
        answer = service.batcher.submit(job).result(timeout=60)
        assert [len(nbest) for nbest in answer] == [1, 0, 1]
    finally:
        service.drain()


def test_the_batcher_gathers_requests_with_equal_options_within_the_token_budget() -> None:
    decoder = Recording()
    queue = batcher(decoder, batch_tokens=30)
    futures = [queue.submit(job(s, options)) for s, options in (
        (["a1"], "A"), (["b1"], "B"), (["a2", "a3"], "A"), (["a4"], "A"), (["a5"], "A"))]
    queue.start()
    assert [f.result(timeout=10) for f in futures] == [[["1a"]], [["1b"]], [["2a"], ["3a"]], [["4a"]], [["5a"]]]
    queue.close()
    # The first batch: A's first three requests (cost 30), B never among them; then B's; then A's last.
    assert [(sentences, options) for sentences, _, options in decoder.calls] == [
        (["a1", "a2", "a3", "a4"], "A"), (["b1"], "B"), (["a5"], "A")]
    assert decoder.calls[0][1] == [0, 0, 1, 0]  # each sentence's index within its own request


def test_a_lone_request_is_decoded_at_once_and_others_are_waited_for() -> None:
    decoder = Recording()
    queue = batcher(decoder, max_wait=2.0)
    queue.start()
    started = time.monotonic()
    assert queue.submit(job(["alone"], "A")).result(timeout=10) == [["enola"]]
    assert time.monotonic() - started < 1.0  # no gathering window: nobody else was in the server
    slow = batcher(Recording(delay=0.5), max_wait=0.3)
    slow.start()
    first = slow.submit(job(["first"], "A"))
    wait_until(lambda: slow.depth()[2] == 1)
    # While the first is decoded, two more arrive: once free, the feeding thread sees others and waits for more.
    second, third = slow.submit(job(["second"], "A")), slow.submit(job(["third"], "A"))
    time.sleep(0.6)
    fourth = slow.submit(job(["fourth"], "A"))
    for future in (first, second, third, fourth):
        future.result(timeout=10)
    slow.close()
    assert [sentences for sentences, _, _ in slow.decoders[0].calls] == [["first"], ["second", "third", "fourth"]]


def wait_until(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.005)


def test_the_batcher_refuses_past_its_queue_and_drains_on_close() -> None:
    queue = batcher(Recording(), max_queue=3, max_wait=5.0)
    first = queue.submit(job(["x", "y"], "A"))
    second = queue.submit(job(["z"], "A"))
    with pytest.raises(QueueFull) as refused:
        queue.submit(job(["w"], "A"))
    assert refused.value.retry_after >= 1
    queue.start()
    queue.close()  # the feeding thread is gathering (for 5 s): it decodes what is queued at once and stops
    assert first.result(timeout=0) == [["x"], ["y"]] and second.result(timeout=0) == [["z"]]
    with pytest.raises(Draining):
        queue.submit(job(["v"], "A"))
    # A request larger than the queue's bound is taken when it is alone.
    alone = batcher(Recording(), max_queue=3)
    alone.start()
    assert alone.submit(job(list("abcdefg"), "A")).result(timeout=10) == [[c] for c in "abcdefg"]
    alone.close()


def test_a_cancelled_request_is_not_decoded_and_an_error_reaches_every_request_of_its_batch() -> None:
    decoder = Recording()
    queue = batcher(decoder)
    gone, kept = queue.submit(job(["gone"], "A")), queue.submit(job(["kept"], "A"))
    failing = [queue.submit(job([s], "fail")) for s in ("p", "q")]
    assert gone.cancel()  # its client gave up waiting
    queue.start()
    assert kept.result(timeout=10) == [["tpek"]]
    for future in failing:
        with pytest.raises(RuntimeError, match="broken"):
            future.result(timeout=10)
    assert queue.submit(job(["after"], "A")).result(timeout=10) == [["retfa"]]  # the feeding thread lives on
    queue.close()
    assert [sentences for sentences, _, _ in decoder.calls] == [["kept"], ["p", "q"], ["after"]]


def test_metrics_histograms_are_cumulative_and_the_exposition_counts_everything() -> None:
    histogram = Histogram((1, 4, 16))
    for value in (1, 2, 3, 16, 17, 100):
        histogram.observe(value)
    assert histogram.lines("h") == ['h_bucket{le="1"} 1', 'h_bucket{le="4"} 3', 'h_bucket{le="16"} 4',
                                    'h_bucket{le="+Inf"} 6', "h_sum 139", "h_count 6"]
    metrics = Metrics()
    metrics.request_done("/translate", 200, 0.02)
    metrics.request_done("/translate", 503, 0.001)
    metrics.request_done("/health", 200, None)
    metrics.batch_decoded(5, [0.003, 0.004])
    text = metrics.exposition((2, 5, 0)).splitlines()
    assert 'mtx_requests_total{path="/translate",code="503"} 1' in text
    assert "mtx_request_duration_seconds_count 2" in text and "mtx_queue_sentences 5" in text
    assert 'mtx_batch_sentences_bucket{le="4"} 0' in text and 'mtx_batch_sentences_bucket{le="8"} 1' in text
    assert "mtx_queue_wait_seconds_count 2" in text and "mtx_sentences_total 5" in text
    assert math.isclose(float(next(line for line in text if line.startswith("mtx_request_duration_seconds_sum"))
                              .split()[1]), 0.021)
