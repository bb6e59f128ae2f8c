"""What CTranslate2 does with each field of a request: one table, `CAPABILITIES`, checked by `ct2_refusal`.

Every field of `Request` (mtx.decode.request, DecodeConfig's fields among them) has a row: the argument of
`translate_batch` or `score_batch` that honours it, or the condition under which CTranslate2 cannot give what
`--engine torch` gives, and why. A request that meets such a condition is refused before any work, naming the
field: never a silent fallback to the other engine, never a changed meaning. A test holds the table to cover
every field, so a new option cannot be forgotten here.

What was checked against CTranslate2 4.8.5, on the copy-task model converted by mtx.decode.ct2_folder (float32,
every test sentence; tests/integration/test_ct2_engine.py keeps each one):

- Its beam score is log P(Y) / |Y|^α with |Y| counting EOS, as mtx's fairseq penalty: equal to mtx's scores and
  the same beam choices. It has no other form, so the gnmt penalty ((5 + |Y|) / 6)^α is refused with a beam (at
  α = 0 both are 1, and greedy search ranks no hypotheses, which it honours).
- Its logits processors (the ban of EOS before `min_decoding_length`, of repeated n-grams, of PAD and BOS) act
  on the logits before the softmax, so the other tokens' probabilities are renormalised, where mtx's search sets
  banned log-probabilities to -inf and keeps the others as they are. The most probable token is the same either
  way: greedy search gives mtx's tokens with min_len and no_repeat_ngram. Beam search compares rows whose
  renormalisation differs, and chose other translations than mtx's on several test sentences: min_len and
  no_repeat_ngram with a beam are refused. PAD and BOS hold a trained model's least probability, too little to
  change a choice.
- A target prefix's log-probability is left out of the score its beam search ranks by (the hypotheses' total
  over their length counts only what follows the prefix), which changes the ranking of hypotheses of different
  lengths unless α = 0; greedy search is unaffected. The engine refuses prefixes with a beam and α > 0.
- `max_decoding_length` counts tokens before EOS, as mtx's limit does, but a hypothesis that reaches it ends
  without EOS, scored without EOS's log-probability, where mtx forces EOS and counts it. The tokens are the
  same; only beam search's ranking among hypotheses cut at the limit can differ, which the limits a·n + b of
  real decoding rarely reach. The limit is one per call, so the engine calls it with sentences of one limit.
- `min_decoding_length` counts tokens before EOS, as min_len does; `no_repeat_ngram_size` bans as mtx does (the
  greedy tokens are equal for n = 1, 2, 3).
- Sampling draws from CTranslate2's own generator, which cannot reproduce mtx's draws (a function of the seed
  and the line's index, whatever the batch): refused. A shortlist (`use_vmap`) takes the union of a batch's
  sentences' candidates (mozilla/translations#977), so a sentence's translation would depend on its batch-mates:
  refused. Attention comes from the layer the folder was converted with, all its heads averaged: the default
  aligning layer, any other refused.

Ensembles (several -m) are refused when the engine opens (mtx.decode.ct2_engine): CTranslate2 decodes one model.
No model is refused for its options (mtx.config.model's activation, output bias, embedding scale and position
layout, which imported MarianMT models use): CTranslate2's spec holds each, and the conversion writes them
(mtx.decode.ct2_folder), so a model with them decodes to torch's greedy tokens (tests/integration/test_ct2_engine.py).
This module imports neither torch nor CTranslate2: the server checks requests with it.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mtx.config.decode import flag_name
from mtx.decode.request import default_alignment_layer

if TYPE_CHECKING:
    from mtx.decode.facts import ModelFacts
    from mtx.decode.request import Request

# A row's condition: why CTranslate2 cannot honour the request's value of the field, None where it can.
Condition = Callable[["Request", "ModelFacts"], "str | None"]


def _always(request: Request, facts: ModelFacts) -> None:
    return None


@dataclass(frozen=True)
class Capability:
    """How CTranslate2 honours one request field (`how`), and when it cannot (`refused`)."""

    how: str
    refused: Condition = _always


def _gnmt(request: Request, facts: ModelFacts) -> str | None:
    """gnmt with α above 0 and a beam: CTranslate2 ranks by fairseq's penalty only. Greedy search ranks nothing,
    and the scores shown are mtx's own, from the tokens' log-probabilities."""
    if request.lenpen_style == "gnmt" and request.lenpen != 0 and request.beam > 1:
        return "CTranslate2 divides log P(Y) by |Y|^α only, not by the paper's ((5 + |Y|) / 6)^α"
    return None


def _renormalised_with_beam(what: str) -> Condition:
    def refused(request: Request, facts: ModelFacts) -> str | None:
        """Above 0 with a beam above 1: CTranslate2 renormalises the tokens it leaves, so its beam ranks
        otherwise (greedy search is exact)."""
        if request.beam > 1 and getattr(request, what) > 0:
            return (f"with {flag_name('beam')} {request.beam}, CTranslate2 bans tokens before its softmax, "
                    "renormalising the others, so its beam search ranks hypotheses otherwise than mtx's (greedy "
                    f"search, {flag_name('beam')} 1, gives the same tokens)")
        return None

    return refused


def _sampling(request: Request, facts: ModelFacts) -> str | None:
    """Always: CTranslate2's draws cannot be mtx's (a function of the seed and the line's index)."""
    if request.sampling:
        return ("CTranslate2 draws from its own random generator, which cannot reproduce mtx's draws (a function "
                f"of {flag_name('seed')} and each line's index, whatever the batch)")
    return None


def _shortlist(request: Request, facts: ModelFacts) -> str | None:
    """Above 0: CTranslate2's vmap takes a batch's union, so a sentence's output would depend on its batch."""
    if request.shortlist:
        return ("CTranslate2's vocabulary map takes the union of a batch's shortlists, so a sentence's translation "
                "would depend on the sentences batched with it (mozilla/translations#977)")
    return None


def _alignment_layer(request: Request, facts: ModelFacts) -> str | None:
    """Any layer but the default: the folder holds the attention of the layer it was converted with."""
    layer = default_alignment_layer(facts.limits.decoder_layers)
    if request.alignment and request.alignment_layer not in (None, layer):
        return (f"CTranslate2 returns the attention of one layer, chosen when the model is converted: layer {layer}, "
                "the default")
    return None


SAMPLING_ONLY = "read only with sampling, which is refused"

CAPABILITIES: dict[str, Capability] = {
    "beam": Capability("translate_batch(beam_size=beam); 1 is CTranslate2's greedy search, as mtx's"),
    "lenpen": Capability("length_penalty=lenpen: log P(Y) / |Y|^α, |Y| counting EOS, as mtx's"),
    "lenpen_style": Capability("fairseq is CTranslate2's only penalty", _gnmt),
    "max_len_a": Capability("max_decoding_length = each sentence's output limit (ModelLimits.output_limit), "
                            "one call per limit"),
    "max_len_b": Capability("with max_len_a, max_decoding_length"),
    "min_len": Capability("min_decoding_length=min_len (tokens before EOS, as mtx's)",
                          _renormalised_with_beam("min_len")),
    "nbest": Capability("num_hypotheses=nbest"),
    "no_repeat_ngram": Capability("no_repeat_ngram_size=no_repeat_ngram", _renormalised_with_beam("no_repeat_ngram")),
    "sampling": Capability("sampling_topk, sampling_topp, sampling_temperature", _sampling),
    "topk": Capability(SAMPLING_ONLY),
    "topp": Capability(SAMPLING_ONLY),
    "temperature": Capability(SAMPLING_ONLY),
    "seed": Capability(SAMPLING_ONLY),
    "shortlist": Capability("use_vmap", _shortlist),
    "shortlist_frequent": Capability("read only with shortlist, which is refused"),
    "engine": Capability("chooses CTranslate2, and this table"),
    "target_lang": Capability("the target tag before each source, put there by ModelFacts.encode for both engines"),
    "split_sentences": Capability("mtx cuts the lines and joins the translations around the engine "
                                  "(mtx.documents): CTranslate2 translates the sentences"),
    "alignment": Capability("return_attention=True: the aligning layer's attention, all heads averaged, pooled to "
                            "words by mtx.decode.alignment"),
    "alignment_layer": Capability("the layer the folder is converted with", _alignment_layer),
    "line_offset": Capability("read only by sampling's draws"),
    "format": Capability("jsonl: each token's log-probability from score_batch over the outputs, and the doubts "
                         "from them"),
    "markup": Capability("mtx takes the markup out and projects it around the engine (mtx.documents), through the "
                         "alignments of return_attention=True, those of the default aligning layer, as the torch "
                         "engine's"),
}


def ct2_refusal(request: Request, facts: ModelFacts, given: Collection[str] = (),
                spell: Callable[[str], str] = flag_name, separator: str = " ") -> tuple[str, str] | None:
    """The first field of `request` that CTranslate2 cannot honour exactly, as (field, a message naming it as
    `spell` and `separator` write a name and its value, `mtx translate`'s flag by default, and saying that the
    torch engine does it); None where it honours them all. `given`: the fields the user set, on top of the
    checkpoint's recipe, so that a value that comes from the recipe is said to come from there."""
    for name, capability in CAPABILITIES.items():
        why = capability.refused(request, facts)
        if why is None:
            continue
        value = getattr(request, name)
        asked = spell(name) if isinstance(value, bool) else f"{spell(name)}{separator}{value}"
        recipe_value = str(value).lower() if isinstance(value, bool) else value  # as YAML writes it
        origin = "" if name in given else f" (the checkpoint's recipe sets decode.{name}: {recipe_value})"
        engine = spell("engine") + separator
        return name, f"{engine}ct2 cannot honour {asked}{origin}: {why}. {engine}torch does it."
    return None


def ct2_prefix_refusal(request: Request) -> str | None:
    """Why CTranslate2 cannot honour target prefixes (`--prefix`, a file rather than a field) with `request`, or
    None: its beam search ranks by a score that leaves the prefix's log-probability out, which orders hypotheses
    of different lengths otherwise than mtx's unless α = 0; greedy search is exact."""
    if request.beam > 1 and request.lenpen != 0:
        return (f"--engine ct2 cannot honour --prefix with --beam {request.beam} and --lenpen {request.lenpen}: "
                "CTranslate2 leaves the prefix's log-probability out of the score its beam search ranks by, so it "
                "ranks hypotheses of different lengths otherwise than mtx (greedy search, --beam 1, or --lenpen 0 is "
                "exact). --engine torch does it.")
    return None
