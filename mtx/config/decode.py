"""The recipe's `decode:` section, which is also `mtx translate`'s options and `mtx serve`'s request fields: how
to search or sample, each field with its default, range and help.

Each field is declared once, with its help and range, and everything else is made from it: the recipe key
`decode.beam`, the flag `--beam` (mtx.decode.command generates `mtx translate`'s flags from the fields), the
request field `beam` (mtx.serve.app), the line of `mtx config --keys`. So a field's help is written to serve all
three readers: it names other options by their field names (`max_len_a`), which read the same in each. The rules
between fields are `DecodeConfig.first_problem`'s, which takes the spelling of the place a value came from, so
that one rule has one phrasing wherever it is broken. This module imports no torch: `mtx config` and recipe
errors must be instant.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Literal

from mtx.config.fields import AT_LEAST_0, AT_LEAST_1, POSITIVE, Bounds, ConfigError, bounds_problems, setting
from mtx.errors import MtxError

LengthPenaltyStyle = Literal["gnmt", "fairseq"]
EngineName = Literal["torch", "ct2"]  # the decoding engines (mtx.decode.engine)
# The decoding options only sampling reads, each by the value that leaves it unset: elsewhere they must have it.
SAMPLING_ONLY: dict[str, Any] = {"topk": None, "topp": 1.0, "temperature": 1.0}
# The largest length penalty α: lp = |Y|^α of a 1,024-token output is 2^100 at α = 10, well inside float32's range
# (2^128), as is a log-probability divided by it; a larger α overflows lp, or underflows every score to 0.
MAX_LENPEN = 10.0
# The valid sentences α is chosen on, at most, spread evenly over the split: one beam search over them is what
# choosing costs. As many as the quality grid's whole valid split, where far fewer chose as well
# (bench/lenpen_sample.py, bench/README.md).
TUNE_SENTENCES = 2000


@dataclass(frozen=True)
class DecodeConfig:
    """How to search: beam 4, at most input + 50 tokens (the paper's); lp = |Y|, which beat the paper's
    ((5 + |Y|) / 6)^0.6 on every seed of bench/quality.py (bench/README.md); the WMT14 recipes keep the paper's.

    One set of options for both users: the recipe's `decode:` section, which validation BLEU decodes with
    (at `train.valid_beam`), and `mtx translate`, whose flags (one per field) override the checkpoint's recipe
    field by field. So the errors can name a field either way: as a recipe key (`validate`) or as its flag
    (`validate_flags`).
    """

    beam: int = setting(4, "Beam size; 1 is greedy search.", bounds=AT_LEAST_1)
    lenpen: float = setting(
        1.0, "Length penalty α: a hypothesis scores log P(Y|X) / lp(|Y|), |Y| counting EOS. At most 10: beyond, lp "
        "outgrows the range of the search's float32 scores, which then cannot tell hypotheses apart (the paper: "
        "0.6 with gnmt; 0 to 2 is the range people tune).", bounds=Bounds(0, MAX_LENPEN))
    lenpen_style: LengthPenaltyStyle = setting("fairseq", "lp(|Y|) = |Y|^α (fairseq: with α = 1, the mean "
                                               "log-probability a token) or ((5 + |Y|) / 6)^α (gnmt: the paper's).")
    max_len_a: float = setting(1.0, "Output at most a · source tokens + b tokens (EOS not counted): this is a, "
                               "max_len_b is b.", bounds=AT_LEAST_0)
    max_len_b: int = setting(50, "Output at most a · source tokens + b tokens (EOS not counted): this is b, "
                             "max_len_a is a.", bounds=AT_LEAST_1)
    min_len: int = setting(0, "Output at least this many tokens before EOS.", bounds=AT_LEAST_0)
    nbest: int = setting(1, "Translations kept per sentence, best first, at most beam (with sampling: samples per "
                         "sentence, any number).", bounds=AT_LEAST_1)
    no_repeat_ngram: int = setting(
        0, "Never produce an n-gram of this size twice in one translation (fairseq's, CTranslate2's remedy for "
        "loops); 0: allowed.", bounds=Bounds(0, note="0: allowed"))
    sampling: bool = setting(
        False, "Draw each token from the model's distribution instead of searching (back-translation, Edunov et al. "
        "2018); nbest draws that many samples. A line's samples depend on seed, its index in the input and the "
        "model only, not on the batch size, the threads or the device.")
    topk: int | None = setting(None, "With sampling: draw from the k most probable tokens only; unset: from all.",
                               bounds=Bounds(1, note="leave it unset to draw from all"))
    topp: float = setting(
        1.0, "With sampling: draw from the fewest most probable tokens whose probabilities sum to at least p "
        "(nucleus sampling); 1: all.", bounds=Bounds(0, 1, low_open=True))
    temperature: float = setting(
        1.0, "With sampling: divide the log-probabilities by T before drawing: below 1 sharper, above 1 flatter.",
        bounds=POSITIVE)
    seed: int = setting(1, "With sampling: the seed of the draws.")
    shortlist: int = setting(
        0, "Search each sentence over a shortlist of target tokens (Marian's --shortlist, CTranslate2's vmap), "
        "faster: this many likeliest translations of each of its source tokens by the checkpoint's lexical table "
        "(data.lexicon), the shortlist_frequent most frequent target tokens, EOS, and the tokens of its prefix or "
        "of the translation scored; 0: the whole vocabulary, 20 a good start. Sampling draws from the shortlist too.",
        bounds=Bounds(0, note="0: the whole vocabulary"))
    shortlist_frequent: int = setting(
        100, "With shortlist: the most frequent target tokens in every sentence's shortlist.", bounds=AT_LEAST_0)
    engine: EngineName = setting(
        "torch", "What decodes: torch, mtx's own search, the reference, with every option; ct2, CTranslate2 (the "
        "extra mtx[ct2]), faster on CPUs, the checkpoint converted once and cached beside it. ct2 refuses, naming "
        "it, each option it cannot honour exactly (the gnmt length penalty, sampling, shortlist, min_len and "
        "no_repeat_ngram with a beam, another alignment_layer, ensembles): engine torch does them.")
    target_lang: str | None = setting(
        None, "For a model of several target languages (data.target_tag): translate into this one, by putting its "
        "tag (<2de>) before every sentence that does not start with a target tag of its own. Unset: each sentence's "
        "own tag decides.")
    split_sentences: bool = setting(
        False, "Read each line as a paragraph: cut it into sentences (sentencex, the extra mtx[documents], by the "
        "rules of the recipe's data.src_lang), translate them, and join the translations with the whitespace "
        "between them kept: one output line per input line still. A model trained on sentences stops early on a "
        "paragraph of several (the decoding guide's figures). Not with nbest above 1 or alignment.")

    @classmethod
    def of_checkpoint(cls, checkpoint: dict[str, Any], **overrides: Any) -> DecodeConfig:
        """The settings of a checkpoint's stored recipe (`decode:`), with `overrides` (the flags a user set)
        on top. A field the recipe lacks, as one written before the field existed, takes the paper's default,
        and a key mtx no longer knows is passed over, so every checkpoint still translates."""
        stored = (checkpoint.get("recipe") or {}).get("decode") or {}
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in stored.items() if k in known}, **overrides})

    def validate(self, key: str) -> None:
        """As the recipe section `key`: `decode.beam = 0 must be at least 1.`"""
        self._validate(lambda name: f"{key}.{name}", " = ", ConfigError)

    def validate_flags(self, vocabulary: int | None = None, given: Collection[str] = (),
                       lexicon_width: int | None = None, target_languages: Collection[str] | None = None) -> None:
        """As command-line flags: `--beam 0 must be at least 1.`, `--max-len-a -1.0 must be at least 0.`;
        `given`: the flags the user set (see `first_problem`)."""
        self._validate(flag_name, " ", MtxError, vocabulary, given, lexicon_width, target_languages)

    def _validate(self, spell: Callable[[str], str], separator: str, error: type[MtxError],
                  vocabulary: int | None = None, given: Collection[str] = (), lexicon_width: int | None = None,
                  target_languages: Collection[str] | None = None) -> None:
        problem = self.first_problem(spell, separator, vocabulary, given, lexicon_width, target_languages)
        if problem is not None:
            raise error(problem[1])

    def first_problem(self, spell: Callable[[str], str], separator: str, vocabulary: int | None = None,
                      given: Collection[str] = (), lexicon_width: int | None = None,
                      target_languages: Collection[str] | None = None) -> tuple[str, str] | None:
        """The first value the search cannot honour, as (its field's name, a message naming the field as `spell`
        writes names: a recipe key, a flag, a request's JSON field); None if every value is fine. `vocabulary`:
        the model's size, where one is at hand, which no beam may exceed. `given`: the fields the user chose
        (flags, a request's fields) on top of the recipe's; sampling with a beam is refused only where the beam
        was chosen, as a recipe that samples holds a beam all the same (unused). `lexicon_width`: the translations
        per source token the checkpoint's lexical table holds (0: it has none), where it is at hand, which no
        shortlist may exceed. `target_languages`: the languages the model translates into
        (mtx.decode.target_lang), where at hand, which target_lang must be one of."""
        def problem(name: str, what: str) -> tuple[str, str]:
            return name, f"{spell(name)}{separator}{getattr(self, name)!r} {what}."

        for name, choices in literal_choices(type(self)).items():
            if getattr(self, name) not in choices:
                return problem(name, f"is not one of {', '.join(choices)}")
        for name, what in bounds_problems(self):
            return problem(name, what)
        if vocabulary is not None and self.beam > vocabulary:
            return problem("beam", f"is more than the model's {vocabulary:,} vocabulary tokens: beams are distinct "
                           "continuations, so there cannot be more")
        if self.shortlist and lexicon_width == 0:
            return problem("shortlist", "needs the checkpoint's lexical table, and it has none: its data was "
                           "prepared without one. Translate without it, or set data.lexicon.learn: true in its "
                           "recipe, run `mtx prepare` again (it learns only the table) and train from that data")
        if lexicon_width is not None and self.shortlist > lexicon_width:
            return problem("shortlist", f"is more than the {lexicon_width} translations per source token the "
                           "checkpoint's lexical table holds (data.lexicon.width)")
        if target_languages is not None and self.target_lang not in (None, *target_languages):
            return problem("target_lang", "is not a target language of this model, which translates into "
                           + ", ".join(target_languages))
        if not self.sampling and self.nbest > self.beam:
            return problem("nbest", f"must be between 1 and {spell('beam')} ({self.beam})")
        if not self.sampling:
            for name, unset in SAMPLING_ONLY.items():
                if getattr(self, name) != unset:
                    return problem(name, f"applies only with {spell('sampling')}")
        if self.sampling and "beam" in given and self.beam != 1:
            sampling, beam, nbest = spell("sampling"), spell("beam"), spell("nbest")
            return "beam", (f"{sampling} draws each token, {beam}{separator}{self.beam} searches: give one or the "
                            f"other (with {sampling}, {nbest}{separator}N draws N samples).")
        return None


@functools.cache
def literal_choices(config: type) -> dict[str, tuple[str, ...]]:
    """The values each field typed as a Literal takes (`lenpen_style`: gnmt, fairseq), of the dataclass `config`:
    read from its annotations once, as resolving them is far slower than any check that uses them (a server checks
    every request)."""
    hints = typing.get_type_hints(config)
    return {f.name: typing.get_args(hints[f.name]) for f in dataclasses.fields(config)
            if typing.get_origin(hints[f.name]) is Literal}


def flag_name(name: str) -> str:
    """A field's name as `mtx translate` spells its flag: `max_len_a` → `--max-len-a`."""
    return "--" + name.replace("_", "-")
