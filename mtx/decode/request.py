"""One request to an engine: `Request`, the decoding options with the options of what is returned.

A request is the recipe's `decode:` section (mtx.config.decode.DecodeConfig: how to search or sample, which engine)
and, on top of it, what a call wants back: word alignments, the index of its first line, the output format. From
its fields alone come `mtx translate`'s flags (mtx.decode.command), the server's request fields (mtx.serve.app:
every field but those a process fixes once, `PER_PROCESS`) and, for its `DecodeConfig` part, the recipe's keys.
So a new option is one field here or there, plus its use in the search (or in the CTranslate2 capability table).

Its rules are written once, in `Request.problem_with`: those between fields (DecodeConfig's), those against the
model (`ModelFacts`: its vocabulary, decoder layers, lexical table and target languages), each phrased in the
spelling of the place the value came from: a flag (`--beam 0`), a request's field (`beam = 0`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from mtx.config.decode import DecodeConfig, flag_name
from mtx.config.fields import Bounds, setting
from mtx.errors import MtxError

if TYPE_CHECKING:
    from mtx.decode.facts import ModelFacts

OutputFormat = Literal["text", "jsonl"]
Markup = Literal["none", "html", "markdown"]  # how a line is marked up (mtx.documents)

# The fields a process decides once, for every request it serves: `mtx serve --engine`, and its answers are
# always JSON. The server's requests leave them out; `mtx translate` takes them as flags like the others.
PER_PROCESS = ("engine", "format")


@dataclass(frozen=True)
class Request(DecodeConfig):
    """How to translate one call's sentences: the search (DecodeConfig's fields) and what to return."""

    alignment: bool = setting(
        False, "Add each translation's word alignment, from the cross-attention the search carries along each "
        "hypothesis: [source, target] word indices, 0-based, one link per target word (Moses' and Marian's "
        "convention); as text, each translation followed by ' ||| ' and 'source-target' pairs (Pharaoh format), "
        "an empty input line giving ' ||| ' (with nbest > 1: an empty line).")
    alignment_layer: int | None = setting(
        None, "With alignment: the decoder layer (0-based) whose cross-attention, heads averaged, aligns; unset: the "
        "last layer of a decoder of one or two layers, else the penultimate.", bounds=Bounds(0))
    line_offset: int = setting(
        0, "The index of the first sentence in the text it was cut from, so that a shard's samples are those the "
        "whole text would get: sampling's draws depend on each sentence's index (split -l L; shard k takes "
        "line_offset k·L).", bounds=Bounds(0))
    format: OutputFormat = setting(
        "text", "text: the translation; with nbest > 1, the n best as 'score<TAB>text' pairs joined by tabs. "
        "jsonl: one JSON object per input line instead: text, score, tokens (the subwords, then </s>), "
        "token_log_probs (one per token), flags (why the translation deserves a human look: loop, length_ratio, "
        "copied, low_log_prob; truncated: its source was cut to the model's positions), with alignment "
        "alignment ([source, target] pairs), with nbest > 1 nbest (a list of such objects).")

    markup: Markup = setting(
        "none", "The markup of each line: none (plain text); html (an HTML or XML fragment); markdown. The markup "
        "is taken out, the text translated, and each tag put back around the target words aligned to the words it "
        "wrapped, every tag exactly once and properly nested, attributes untouched; void tags, comments, code, "
        "<script>, translate=\"no\" and Markdown code spans and images are kept verbatim. Cuts sentences at block "
        "edges (<p>, list items). Not with nbest above 1 or alignment.")

    @classmethod
    def of(cls, facts: ModelFacts, options: Mapping[str, Any]) -> Request:
        """The model's recipe's options (`facts.defaults`, its tuned α included) with `options`, the ones a user
        set (flags, a request's fields), on top."""
        return cls(**{**dataclasses.asdict(facts.defaults), **options})

    @property
    def details(self) -> bool:
        """Whether each translation's tokens, their log-probabilities and its doubts are wanted (jsonl), which an
        engine that does not have them for free (CTranslate2) computes only then."""
        return self.format == "jsonl"

    def problem_with(self, facts: ModelFacts, spell: Callable[[str], str] = flag_name, separator: str = " ",
                     given: Collection[str] = ()) -> tuple[str, str] | None:
        """The first value that cannot be honoured with this model, as (its field's name, a message naming the
        field as `spell` writes names); None if every value is fine. `given`: the fields the user chose, on top of
        the recipe's (DecodeConfig.first_problem)."""
        problem = self.first_problem(spell, separator, facts.limits.vocab_size, given, facts.lexicon_width,
                                     facts.targets.languages)
        if problem is not None:
            return problem
        if self.split_sentences or self.markup != "none":
            mode = spell("split_sentences") if self.split_sentences else f"{spell('markup')}{separator}{self.markup}"
            if self.nbest > 1:
                return "nbest", (f"{spell('nbest')}{separator}{self.nbest} does not go with {mode}: a line is "
                                 "translated as one text, sentence by sentence, so it has one translation.")
            if self.alignment:
                return "alignment", (f"{spell('alignment')} does not go with {mode}: the word alignments are of "
                                     "each sentence, not of the line (jsonl gives each sentence's text).")
        try:
            self.aligning_layer(facts.limits.decoder_layers, spell, separator)
        except MtxError as e:
            return "alignment_layer", str(e)
        return None

    def check(self, facts: ModelFacts, given: Collection[str] = ()) -> None:
        """`problem_with` as an MtxError naming the flag: what `mtx translate` and the other commands raise."""
        problem = self.problem_with(facts, given=given)
        if problem is not None:
            raise MtxError(problem[1])

    def aligning_layer(self, decoder_layers: int, spell: Callable[[str], str] = flag_name, separator: str = " "
                       ) -> int | None:
        """The decoder layer that aligns (None: no alignments), for a model of `decoder_layers` decoder layers:
        alignment_layer, or its default (`aligning_layer`, whose errors this raises)."""
        return aligning_layer(self.alignment, self.alignment_layer, decoder_layers, spell, separator)


# A request's own fields, which no recipe holds: a flag left unset takes the field's default, not the recipe's.
CALL_ONLY = frozenset(f.name for f in dataclasses.fields(Request)) - {f.name for f in dataclasses.fields(DecodeConfig)}


def default_alignment_layer(decoder_layers: int) -> int:
    """The last decoder layer (0-based) of a decoder of one or two layers; the penultimate of a deeper one.

    In a two-layer decoder the first layer's cross-attention reads the source before the decoder has built
    much of the target's context, and it spreads its attention: the second layer's, heads averaged, matches
    the demo's gold alignments far better (bench/alignment.py). In deeper decoders Garg et al. (2019, "Jointly
    Learning to Align and Translate with Transformer Models") found the penultimate layer to align best: the
    last one attends to whatever helps predict the next word, which is not always the word being translated.
    """
    return decoder_layers - 1 if decoder_layers <= 2 else decoder_layers - 2


def aligning_layer(alignment: bool, asked: int | None, decoder_layers: int, spell: Callable[[str], str] = flag_name,
                   separator: str = " ") -> int | None:
    """The decoder layer whose cross-attention aligns (None: no alignments), given whether alignments are asked
    for, the layer asked for (None: `default_alignment_layer`) and the model's count of decoder layers.

    The one rule of `mtx translate --alignment-layer`, the translator and the server's `alignment_layer`: a
    layer only with alignments, and one the model has. An MtxError otherwise, every one of them the fault of
    `alignment_layer`, named as `spell` and `separator` write a name and its value (a flag: `--alignment-layer 9`;
    a request's field: `alignment_layer = 9`).
    """
    if not alignment:
        if asked is not None:
            raise MtxError(f"{spell('alignment_layer')} only applies with {spell('alignment')}.")
        return None
    if asked is None:
        return default_alignment_layer(decoder_layers)
    if not 0 <= asked < decoder_layers:
        raise MtxError(f"{spell('alignment_layer')}{separator}{asked} is not a layer of this model, whose decoder "
                       f"layers are numbered 0 to {decoder_layers - 1}.")
    return asked
