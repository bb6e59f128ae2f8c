"""The decoding engine: one interface between a model and everything that translates with it.

`mtx translate`, `mtx serve`, `mtx average --tune-lenpen`, distillation's sharded translation and `mtx inspect` all
open an engine once (mtx.decode.engines) and hand it requests (mtx.decode.request), as CTranslate2's
`Translator` takes a model once and options per call, and eole's inference engine serves both `predict` and its
server. An engine owns its model(s),
their preparation (weight layout, int8) and its workers; it is told nothing about files, HTTP or recipes.

Two backends sit beside this module, chosen per call (`--engine`, `decode.engine`):

    torch   mtx's own search (mtx.decode.torch_engine): the reference, with every research option
    ct2     CTranslate2 (mtx.decode.ct2_engine): the same model converted once and cached, faster on CPUs; it
            refuses by name each option it cannot honour exactly (its capability table), never changing what
            an option means and never falling back to the other engine

What an engine returns is the same whichever computed it: `Translation`s (mtx.decode.translation), best first,
with the tokens, their log-probabilities and the doubts a `--format jsonl` line shows. This module imports no
torch and no CTranslate2: the server's process checks requests against `ModelFacts` alone.
"""

from __future__ import annotations

import platform
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from mtx.config.decode import EngineName
from mtx.decode.translation import Scored, Source, Translation, TranslationStats

if TYPE_CHECKING:
    from mtx.decode.facts import ModelFacts
    from mtx.decode.request import Request

Dtype = Literal["auto", "fp32", "bf16", "fp16", "int8"]

class Engine(Protocol):
    """What translates: loaded once per process, given requests.

    Every method may be called from several threads at once (the server's feeding threads): an engine that
    decodes in workers hands each call to a free one. Sentences come as token ids (`Source`), since whoever
    calls has tokenised them already to check their length; `lines` are their indices in the whole input, which
    sampling's draws depend on.
    """

    facts: ModelFacts
    stats: TranslationStats  # what every call so far did, counted together
    name: EngineName
    parallelism: int  # the calls worth making at once (a server's feeding threads): its workers, or translators

    def translate(self, sources: Sequence[Source], request: Request, lines: Sequence[int],
                  prefixes: Sequence[str] | None = None) -> list[list[Translation]]:
        """The n-best translations of each sentence, best first; an empty sentence gets an empty list.
        `prefixes`: a target prefix per sentence ("": none), which its translations start with."""
        ...

    def score(self, sentences: Sequence[str], translations: Sequence[str], request: Request) -> list[Scored]:
        """Each sentence's given translation scored by the model, as the search would score it."""
        ...

    def provenance(self) -> dict[str, str]:
        """What made the outputs: the engine, its version, the compute type, the device and its instruction set."""
        ...

    def pids(self) -> list[int]:
        """The process ids of its workers, for a log; [] where it decodes in the caller's process."""
        ...

    def close(self) -> None:
        """Stop the workers, if any; the engine takes no more calls."""
        ...


def cpu_instructions() -> str:
    """The widest vector instructions of this machine's CPU that matter to int8 and fp32 products (what a
    benchmark figure or an output's provenance is only comparable within)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="ascii", errors="replace").splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        return platform.machine()
    for flag, name in (("avx512_vnni", "AVX-512 VNNI"), ("avx512f", "AVX-512"), ("avx2", "AVX2"),
                       ("avx", "AVX")):
        if flag in flags:
            return name
    return platform.machine()
