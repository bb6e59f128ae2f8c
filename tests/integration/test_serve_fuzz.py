"""`mtx serve` under an API fuzzer: Schemathesis, over the server's own OpenAPI document.

The document promises what the server does: every request it admits is translated (Schemathesis' check
positive_data_acceptance), every request it does not is refused with 4xx (negative_data_rejection), no request
gets a 500 (not_a_server_error), and every answer has a documented status, content type, headers and body
(status_code_conformance, content_type_conformance, response_headers_conformance, response_schema_conformance).
Schemathesis runs every check it has on the requests it draws from the document, valid ones and invalid ones
(its examples, coverage and fuzzing phases, a bounded number of each); the extremes the document admits (the
largest finite numbers, the smallest positive ones, integers of hundreds of digits) are sent on purpose too.
Then the server must still be healthy, with a log of JSON lines only. The checkpoint served carries a lexical
table, so that shortlists are admitted and drawn with the rest: with few candidates, the other options can forbid
every token of a search (mtx.decode.search keeps EOS allowed then), which one of the extremes does on purpose.

The one rule no schema can state, a sentence's length in tokens, is kept out of reach by the server's limits: at
most 5 characters a sentence, which the copy model's byte-level vocabulary spells in at most 61 tokens (one
character is at most 12 bytes once normalized, plus the line's leading space), within its 63 positions.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from support import Server, serving

schemathesis = pytest.importorskip("schemathesis")
jsonschema_rs = pytest.importorskip("jsonschema_rs")  # Schemathesis' own validator

# Small limits keep every admitted request quick to decode; --timeout is below Schemathesis' 10 s wait.
FLAGS = ("--max-sentences", "4", "--max-chars", "5", "--max-beam", "4", "--timeout", "8")
SAMPLING = {"sampling": True, "beam": 1}
# Values at the edges of what the document admits, each of which must be translated.
EXTREMES = [
    {"lenpen": 10.0, "lenpen_style": "fairseq"}, {"lenpen": 0.0}, {"max_len_a": sys.float_info.max},
    {"max_len_a": 0.0, "max_len_b": 1}, {"max_len_b": 10**400}, {"min_len": 10**400}, {"no_repeat_ngram": 10**400},
    {"no_repeat_ngram": 1}, {"seed": -(10**400), **SAMPLING}, {"line_offset": 10**400, **SAMPLING},
    {"temperature": 1e300, **SAMPLING}, {"temperature": sys.float_info.max, **SAMPLING},
    {"temperature": 5e-324, **SAMPLING}, {"topp": 5e-324, **SAMPLING}, {"topk": 10**400, **SAMPLING},
    {"topk": 1, "topp": 5e-324, "temperature": 5e-324, "nbest": 4, **SAMPLING}, {"beam": 4, "nbest": 4},
    {"alignment": True, "alignment_layer": 0, "nbest": 4, "beam": 4},
    *({"shortlist": 1, "shortlist_frequent": 0, "no_repeat_ngram": 1, "min_len": 2, **search}
      for search in ({"beam": 4}, {"beam": 1}, SAMPLING)),
]


@pytest.fixture(scope="module")
def fuzzed(listed_copy_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = Server(listed_copy_model, Path(tmp_path_factory.mktemp("fuzzed")) / "serve.log", *FLAGS)
    yield server
    server.stop()


@pytest.fixture
def api(fuzzed: Server):
    schema = schemathesis.openapi.from_url(f"http://127.0.0.1:{fuzzed.port}/openapi.json")
    schema.config.generation.update(modes=list(schemathesis.GenerationMode), deterministic=True)
    schema.config.phases.update(phases=["examples", "coverage", "fuzzing"])
    # 413 is this server's refusal of too many sentences or too long ones (docs/guides/serving.md's table of answers).
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    return schema


documented = schemathesis.pytest.from_fixture("api")


@pytest.fixture(autouse=True)
def node_id_for_schemathesis(request: pytest.FixtureRequest) -> None:
    """Schemathesis 4.32's lazy schemas read and write the test item's `_nodeid`, which pytest 9.1 no longer
    has (it keeps `nodeid` elsewhere): the attribute they expect, so that they run."""
    request.node._nodeid = request.node.nodeid


@serving
@documented.parametrize()
@settings(max_examples=150, deadline=timedelta(seconds=10), suppress_health_check=list(HealthCheck))
def test_every_answer_is_the_one_the_openapi_document_promises(case) -> None:
    case.call_and_validate()


@serving
@pytest.mark.parametrize("options", EXTREMES, ids=lambda options: ",".join(options))
def test_the_extremes_the_document_admits_are_translated(api, options: dict) -> None:
    operation = api["/translate"]["POST"]
    body = {"text": ["a b", "\U0001d160" * 5, ""], **options}
    assert jsonschema_rs.validator_for(operation.body[0].definition["schema"]).is_valid(body)
    response = operation.Case(body=body, media_type="application/json").call_and_validate()
    assert response.status_code == 200 and len(response.json()["translations"]) == 3


@serving
def test_the_server_is_healthy_after_the_fuzzer(fuzzed: Server) -> None:
    assert fuzzed.get("/health") == (200, b'{"status":"ready"}')
    requests = [e for e in fuzzed.events() if e["event"] == "request" and e["path"] == "/translate"]
    assert len(requests) > 100 and all(e["status"] != 500 for e in requests)
    fuzzed.assert_log_is_json_lines()
