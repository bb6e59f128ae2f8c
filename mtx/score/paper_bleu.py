"""The paper's BLEU: tokenized BLEU as tensor2tensor's `get_ende_bleu.sh` computes it, without Perl.

Vaswani et al. (2017) reported BLEU on tokenized text: Moses `tokenizer.perl -l de`, then hyphenated compounds
split as `rich ##AT##-##AT## text`, then `multi-bleu.perl`. sacreBLEU figures of the same output are usually
0.5–1 lower; this reproduces the pipeline, so that mtx's figures can be set next to the paper's 27.3 / 28.4.
"""

from __future__ import annotations

import re

from sacrebleu.metrics import BLEU

# Words that a following period does not end, from Moses' German list (nonbreaking_prefix.de), abridged to
# what news text needs: initials, German ordinals ("am 3. Oktober"), Roman numerals, common abbreviations.
_GERMAN_ABBREVIATIONS = """
    Abs Abt Adr Anm Aufl Bd Bde Bsp Bzw Ca Chr Co Dipl Dr Frl Gebr Hr Hrsg Ing Inh Jh Jhd Jr Kap Kfm Mio Mrd
    Mr Mrs Ms Jan Feb Mär Apr Jun Jul Aug Sep Sept Okt Nov Dez Prof Sr St Str Tel Vol abzgl allg bzgl bzw ca
    engl evtl geb gegr ggf inkl insb jhd kath lt max min mind od orig rd sog usw vgl zzgl
"""
_ROMAN_NUMERALS = "I II III IV V VI VII VIII IX X XI XII XIII XIV XV XVI XVII XVIII XIX XX"
_GERMAN_NONBREAKING = frozenset(
    [chr(c) for c in range(ord("A"), ord("Z") + 1)]
    + [chr(c) for c in range(ord("a"), ord("z") + 1)]
    + ["Ä", "Ö", "Ü", "ä", "ö", "ü"]
    + [str(n) for n in range(1, 100)]
    + _ROMAN_NUMERALS.split()
    + _GERMAN_ABBREVIATIONS.split()
)
# Prefixes that a period does not end only when a number follows: "Nr. 5" but "... die Nr. Eins".
_GERMAN_NONBREAKING_BEFORE_NUMBERS = frozenset(["Art", "Nr", "No", "pp"])

_MOSES_SPECIAL = re.compile(r"([^\w\s.'`,\-]|_)")
_DOT_RUN = re.compile(r"\.{2,}")
_DOT_RUN_PLACEHOLDER = re.compile(r"((?:DOT)+)MULTI")
_COMPOUND_HYPHEN = re.compile(r"(\S)-(\S)")


def paper_tokenize(line: str) -> str:
    """Tokenize a German line the way the paper's BLEU did: Moses `tokenizer.perl -l de`, then `##AT##`.

    The steps follow tokenizer.perl (default, non-aggressive mode) rule by rule: separate every character
    that is not alphanumeric or one of . ' ` , - ; keep runs of dots together; split commas except inside
    numbers; split every apostrophe (German has no English-style contractions); split a word's final period
    unless the word is a known abbreviation, already contains a period, or the next word is lower-case.
    Two deliberate differences, neither of which moves BLEU: the XML escaping (& -> &amp;, ...) is skipped,
    since it renames tokens one for one on both sides; and the abbreviation list is abridged (see above).
    The last step is t2t's `s{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g`, which counts a compound's hyphen as a word.
    """
    text = re.sub(r"[\x00-\x1f]", "", re.sub(r"\s+", " ", line)).strip()
    text = _MOSES_SPECIAL.sub(r" \1 ", text)
    # Dot runs ("...") become a placeholder so that the comma and period rules below leave them alone.
    text = _DOT_RUN.sub(lambda run: f" {'DOT' * len(run.group())}MULTI ", text)
    text = re.sub(r"(\D),", r"\1 , ", text)
    text = re.sub(r",(\D)", r" , \1", text)
    text = re.sub(r"(\d),$", r"\1 ,", text)
    text = text.replace("'", " ' ")
    words = text.split()
    text = " ".join(_split_final_period(words, i) for i in range(len(words)))
    text = _DOT_RUN_PLACEHOLDER.sub(lambda run: "." * (len(run.group(1)) // 3), text)
    return _COMPOUND_HYPHEN.sub(r"\1 ##AT##-##AT## \2", text)


def _split_final_period(words: list[str], i: int) -> str:
    """Moses' rule for a word ending in a period: is it the end of a sentence or an abbreviation?"""
    word = words[i]
    if len(word) < 2 or not word.endswith("."):
        return word
    stem = word[:-1]
    next_word = words[i + 1] if i + 1 < len(words) else None
    if next_word is None:
        return f"{stem} ."
    keeps_period = (
        ("." in stem and any(c.isalpha() for c in stem))
        or stem in _GERMAN_NONBREAKING
        or next_word[0].islower()
        or (stem in _GERMAN_NONBREAKING_BEFORE_NUMBERS and next_word[0].isdigit())
    )
    return word if keeps_period else f"{stem} ."


def tokenized_paper_bleu(hyps: list[str], streams: list[list[str]]) -> tuple[float, str]:
    """multi-bleu.perl's BLEU on paper-tokenized text, and a signature that says so.

    sacreBLEU with tokenize='none' splits on whitespace like multi-bleu.perl, clips n-gram counts against
    the most frequent reference occurrence and takes the closest (then shortest) reference length, as
    multi-bleu.perl does; smoothing 'none' makes a zero n-gram precision give BLEU 0, as there.
    """
    scorer = BLEU(tokenize="none", smooth_method="none")
    tokenized_refs = [[paper_tokenize(line) for line in stream] for stream in streams]
    bleu = scorer.corpus_score([paper_tokenize(line) for line in hyps], tokenized_refs)
    signature = scorer.get_signature()
    signature.update("tok", "mtx-paper-moses-de+atat")
    return bleu.score, str(signature)
