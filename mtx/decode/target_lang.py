"""Which language a model of several target languages translates into: a tag before the source says it.

A model trained with `data.target_tag` (e.g. `<2{lang}>`) saw every source sentence start with the tag of its
pair's target language (`<2de>`, `<2fr>`), as in Johnson et al. 2017's multilingual NMT, fairseq's multilingual
tasks and NLLB; it learnt to produce the language the tag names. So choosing the target language is putting its
tag first: `mtx translate --target-lang`, `mtx serve`'s `target_lang` field and the recipe's `decode.target_lang`
do it for every sentence, and a sentence that starts with a target tag of the model already keeps its own, so one
input can mix directions. The tags are the vocabulary's special tokens (mtx.tokenizer), one id each.

A multilingual MarianMT model imported by `mtx import` (OPUS-MT's en-ROMANCE, say) reads the same thing in its
own spelling: a language code such as `>>fra<<` first, which its stored recipe's `data.target_tag: ">>{lang}<<"`
spells; it translates into every language whose code its vocabulary holds (mtx.spm_tokenizer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mtx.spm_tokenizer import SpmPairTokenizer
from mtx.tokenizer import Tokenizer


@dataclass(frozen=True)
class TargetLanguages:
    """The target languages a model translates into, and the tag of each where it has several."""

    tags: dict[str, str]  # each target language's tag (data.target_tags); empty for a model of one
    languages: list[str]  # data.target_languages: what decode.target_lang may name (DecodeConfig.first_problem)

    @classmethod
    def of_checkpoint(cls, checkpoint: dict[str, Any], tokenizer: Tokenizer | SpmPairTokenizer | None = None
                      ) -> TargetLanguages:
        """The target languages of a checkpoint's stored recipe (`data:`). A recipe from before data.target_tag
        existed has one, its tgt_lang. An imported MarianMT model's (its `tokenizer` an SpmPairTokenizer) are the
        languages whose tag, spelled by data.target_tag, its vocabulary holds, in the vocabulary's order."""
        from mtx.config.loading import recipe_from_dict  # here: recipes load only for a model of several

        data = (checkpoint.get("recipe") or {}).get("data") or {}
        if data.get("target_tag") is None:
            return cls({}, [data.get("tgt_lang", "de")])
        if isinstance(tokenizer, SpmPairTokenizer):  # the recipe `mtx import` stores has no corpus to load
            spelling = data["target_tag"]
            languages = [lang for tag in tokenizer.tags if (lang := language_of(spelling, tag))]
            return cls({lang: spelling.replace("{lang}", lang) for lang in languages}, languages)
        config = recipe_from_dict(checkpoint["recipe"]).data
        return cls(config.target_tags, config.target_languages)

    def tagged(self, texts: Sequence[str], lang: str | None) -> list[str]:
        """The normalised `texts` as the model reads them for `lang`: its tag first, unless a text starts with a
        target tag of its own (or is empty, or the model has one target language, or `lang` is None)."""
        tag = self.tags.get(lang) if lang is not None else None
        if tag is None:
            return list(texts)
        own = set(self.tags.values())
        return [text if not text or text.partition(" ")[0] in own else f"{tag} {text}" for text in texts]


def language_of(target_tag: str, tag: str) -> str | None:
    """The language `tag` names in the spelling `target_tag` ("fra" for ">>fra<<" and ">>{lang}<<"), or None if
    `tag` is not spelled so."""
    before, _, after = target_tag.partition("{lang}")
    if len(tag) > len(before) + len(after) and tag.startswith(before) and tag.endswith(after):
        return tag[len(before):len(tag) - len(after)]
    return None
