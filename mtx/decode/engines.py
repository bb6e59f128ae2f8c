"""Choosing an engine by name: what `--engine`, `decode.engine` and `mtx serve --engine` reach.

Each backend lives beside the interface (mtx.decode.engine): torch (mtx.decode.torch_engine) and ct2
(mtx.decode.ct2_engine). A request is checked against its engine's capabilities (`refusal`) from the request and
the checkpoints' metadata alone, before anything loads, so a refused option costs nothing and writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from pathlib import Path

from mtx.config.decode import EngineName, flag_name
from mtx.decode.engine import Dtype, Engine
from mtx.decode.facts import ModelFacts
from mtx.decode.request import Request
from mtx.errors import MtxError


def refusal(request: Request, facts: ModelFacts, given: Collection[str] = (), spell: Callable[[str], str] = flag_name,
            separator: str = " ", prefixes: bool = False) -> tuple[str, str] | None:
    """The first field of `request` its engine (`request.engine`) cannot honour exactly, as (field, message naming
    it as `spell` and `separator` write a name and its value: a flag by default, a request's field for the server);
    None where it can. Checked from the request and the checkpoints' metadata, before anything loads. `given`: the
    fields the user set, on top of the recipe's; `prefixes`: the call gives target prefixes (--prefix)."""
    if request.engine == "ct2":
        from mtx.decode.ct2_capabilities import ct2_prefix_refusal, ct2_refusal

        if prefixes and (refused := ct2_prefix_refusal(request)) is not None:
            return "prefix", refused
        return ct2_refusal(request, facts, given, spell, separator)
    return None


def open_engine(name: EngineName, checkpoints: Sequence[Path], *, device: str, dtype: Dtype, threads: int,
                batch_tokens: int, log: Callable[[str], None], in_process: bool = True,
                events: Callable[..., None] | None = None) -> Engine:
    """The engine `name` over the checkpoints (several: an ensemble), loaded and ready for requests.

    `threads`: the CPU threads it may use; `log`: where it says what it does (a conversion); `in_process`: whether
    this process may hold the model (a server's process holds none: only its workers do); `events`: the log of
    its workers' deaths and restarts (the server's JSON lines), as keyword arguments."""
    if batch_tokens < 1:
        raise MtxError(f"--batch-tokens {batch_tokens} must be at least 1.")
    if name == "ct2":
        from mtx.decode.ct2_engine import open_ct2_engine

        return open_ct2_engine(checkpoints, device=device, dtype=dtype, threads=threads, batch_tokens=batch_tokens,
                               log=log)
    from mtx.decode.torch_engine import open_torch_engine

    return open_torch_engine(checkpoints, device=device, dtype=dtype, threads=threads, batch_tokens=batch_tokens,
                             in_process=in_process, **({"log": events} if events is not None else {}))
