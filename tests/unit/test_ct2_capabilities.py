"""The `ct2` engine's capability table (mtx.decode.ct2_capabilities): it covers every field of a request, and
refuses, naming the flag and the other engine, each value CTranslate2 cannot honour exactly; no torch needed."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mtx.decode.ct2_capabilities import CAPABILITIES, ct2_refusal
from mtx.decode.limits import ModelLimits
from mtx.decode.request import Request

FACTS = SimpleNamespace(limits=ModelLimits(vocab_size=300, max_positions=64, decoder_layers=6))  # aligns with layer 4


def test_the_table_covers_every_field_of_a_request_in_order() -> None:
    assert list(CAPABILITIES) == [field.name for field in dataclasses.fields(Request)]


@pytest.mark.parametrize(("options", "field", "named"), [
    ({"lenpen_style": "gnmt", "lenpen": 0.6}, "lenpen_style", "--lenpen-style gnmt"),
    ({"sampling": True, "beam": 1}, "sampling", "--sampling"),
    ({"shortlist": 20}, "shortlist", "--shortlist 20"),
    ({"beam": 4, "min_len": 3}, "min_len", "--min-len 3"),
    ({"beam": 4, "no_repeat_ngram": 3}, "no_repeat_ngram", "--no-repeat-ngram 3"),
    ({"alignment": True, "alignment_layer": 5}, "alignment_layer", "--alignment-layer 5"),
])
def test_each_refusal_names_its_flag_and_the_torch_engine(options: dict, field: str, named: str) -> None:
    problem = ct2_refusal(Request(**options), FACTS, given=set(options))
    assert problem is not None and problem[0] == field
    assert problem[1].startswith(f"--engine ct2 cannot honour {named}:") and problem[1].endswith(
        "--engine torch does it.")


@pytest.mark.parametrize("options", [
    {}, {"lenpen_style": "gnmt", "lenpen": 0.0}, {"lenpen_style": "gnmt", "lenpen": 0.6, "beam": 1},
    {"beam": 1, "min_len": 3}, {"beam": 1, "no_repeat_ngram": 3},
    {"alignment": True}, {"alignment": True, "alignment_layer": 4}, {"nbest": 4, "beam": 4, "format": "jsonl"},
    {"line_offset": 7, "target_lang": None},
])
def test_what_ctranslate2_does_exactly_is_not_refused(options: dict) -> None:
    assert ct2_refusal(Request(**options), FACTS, given=set(options)) is None


def test_a_value_from_the_recipe_is_said_to_come_from_it() -> None:
    problem = ct2_refusal(Request(lenpen_style="gnmt", lenpen=0.6), FACTS, given=())
    assert problem is not None and "(the checkpoint's recipe sets decode.lenpen_style: gnmt)" in problem[1]


def test_the_table_imports_neither_torch_nor_ctranslate2() -> None:
    code = ("import sys, mtx.decode.ct2_capabilities; "
            "print(sorted({'torch', 'ctranslate2'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout.strip() == "[]"
