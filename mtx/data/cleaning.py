"""The cleaning filters of `mtx prepare` beyond Moses' length and ratio rules: what crawled corpora are full of.

Each filter looks at one training pair, after normalisation, and names itself when it rejects the pair; `mtx
prepare` counts the pairs each one drops, per corpus, in the manifest and its summary (mtx.data.manifest.FILTERS,
in the order they run here). Each is a key of `data.filter` (mtx.config.data.FilterConfig), most of them off
unless asked for, and each reads the pair alone, so that cleaning streams in the worker processes with flat
memory however large the corpus (OpusCleaner's and Bicleaner's hard rules work the same way).

    copy          the sides are the same once case, punctuation, symbols and spaces are set aside: untranslated
                  copies, and pairs that differ only by punctuation (the noise that harms a model most: Khayrallah
                  and Koehn, 2018)
    numbers       the sides hold different numbers (their digit runs, so 1,000 and 1.000 are the same number)
    placeholders  the sides hold different placeholders: printf's %s, %d, %1$s; {0}, {name}; $1
    urls          the sides hold different URLs or e-mail addresses
    non_letters   a side is mostly digits, symbols or markup: too few letters among its characters
    repeats       a side repeats a word many times in a row ("the the the the")
    long_word     a side holds a "word" longer than any word: a hash, base64, text glued without spaces
    script        too many of a side's letters are outside its language's script (for the languages listed
                  in LANGUAGES_OF_SCRIPT)
    language      language identification (py3langid, mtx[langid]) finds another language far likelier than
                  the one the recipe says a side is in

Placeholders, numbers, URLs and addresses are compared as multisets: a translation may reorder them, not drop,
add or change one.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

from mtx.config.data import FilterConfig
from mtx.errors import require_extra

# The languages (ISO 639-1) written in each script, the script named by the first word of its letters' Unicode
# names; a language not listed is not checked by the `script` filter.
LANGUAGES_OF_SCRIPT = {
    "LATIN": "af az bs ca cs cy da de en eo es et eu fi fr ga gl hr hu id is it la lb lt lv ms mt nb nl nn no pl pt "
             "ro sk sl sq sr sv sw tl tr vi",
    "CYRILLIC": "be bg bs kk ky mk mn ru sr tg uk", "GREEK": "el", "HEBREW": "he yi", "ARABIC": "ar fa ps ur",
    "CJK": "ja ko zh", "HIRAGANA": "ja", "KATAKANA": "ja", "HANGUL": "ko", "DEVANAGARI": "hi mr ne",
    "BENGALI": "bn", "TAMIL": "ta", "THAI": "th", "GEORGIAN": "ka", "ARMENIAN": "hy",
}
SCRIPTS: dict[str, frozenset[str]] = {
    lang: frozenset(script for script, languages in LANGUAGES_OF_SCRIPT.items() if lang in languages.split())
    for lang in {lang for languages in LANGUAGES_OF_SCRIPT.values() for lang in languages.split()}
}

# The name each filter counts its drops under (mtx.data.manifest.FILTERS), in the order `PairCleaner` runs them.
REASONS = ("copy", "numbers", "placeholders", "urls", "non_letters", "repeats", "long_word", "script", "language")

# The patterns run on every line of a crawl, hostile ones included (10^5 characters without a space), so each is
# linear in the line's length: a match can start only where the pattern's first character is (%, {, $, h, w or
# the start of a run of address characters), and from there it scans one run of characters that the next start
# does not scan again.
_NOT_WORD = re.compile(r"[\W_]+")  # what `copy` sets aside: punctuation, symbols, spaces
_DIGITS = re.compile(r"\d+")
# printf's conversions without the space flag, which would read "50 % der" as the placeholder "% d". The width
# starts with 1-9 (a 0 there is a flag), so that flags and width never share a digit: "%000…" is read one way.
_PLACEHOLDER = re.compile(r"%(?:\d+\$)?[-+#0]*(?:[1-9]\d*)?(?:\.\d+)?[sdifuxXeEgGcpo%@]|\{[\w.:-]*\}|\$\d+")
# An address starts where a run of its characters starts (the lookbehind): tried from every letter of a long run,
# the pattern would scan the rest of the run each time.
_URL_OR_ADDRESS = re.compile(r"(?:https?://|www\.)[^\s<>\"']+[^\s<>\"'.,;:!?)]"
                             r"|(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")


@dataclass(frozen=True)
class PairCleaner:
    """The filters of `data.filter` that the recipe turned on, for a corpus of `src_lang` → `tgt_lang`: called
    on a normalised pair, the name of the first filter that rejects it, or None. Picklable, so that the worker
    processes of `mtx prepare` each get one."""

    filt: FilterConfig
    src_lang: str
    tgt_lang: str

    def __post_init__(self) -> None:
        if self.filt.language_id:
            require_extra("langid", ["py3langid"], "data.filter.language_id")

    def __call__(self, src: str, tgt: str) -> str | None:
        f = self.filt
        if f.copies and is_copy(src, tgt):
            return "copy"
        if f.numbers and _differ(_DIGITS, src, tgt):
            return "numbers"
        if f.placeholders and _differ(_PLACEHOLDER, src, tgt):
            return "placeholders"
        if f.urls and _differ(_URL_OR_ADDRESS, src, tgt):
            return "urls"
        if f.min_letters > 0 and min(letter_share(src), letter_share(tgt)) < f.min_letters:
            return "non_letters"
        if f.max_repeats > 0 and max(longest_run(src), longest_run(tgt)) > f.max_repeats:
            return "repeats"
        if f.max_word_len > 0 and max(longest_word(src), longest_word(tgt)) > f.max_word_len:
            return "long_word"
        if f.max_foreign_script < 1 and self._foreign_script(src, tgt):
            return "script"
        if f.language_id and self._other_language(src, tgt):
            return "language"
        return None

    def _foreign_script(self, src: str, tgt: str) -> bool:
        limit = self.filt.max_foreign_script
        return any(lang in SCRIPTS and foreign_share(text, SCRIPTS[lang]) > limit
                   for text, lang in ((src, self.src_lang), (tgt, self.tgt_lang)))

    def _other_language(self, src: str, tgt: str) -> bool:
        ratio = self.filt.language_id_ratio
        return any(language_likelihood(text, lang) < ratio for text, lang in ((src, self.src_lang),
                                                                             (tgt, self.tgt_lang)))


def is_copy(src: str, tgt: str) -> bool:
    """The two sides are the same once case, punctuation, symbols and spaces are set aside (and not empty then)."""
    bare = _NOT_WORD.sub("", src.casefold())
    return bool(bare) and bare == _NOT_WORD.sub("", tgt.casefold())


def _differ(pattern: re.Pattern, src: str, tgt: str) -> bool:
    """The two sides' matches of `pattern` differ as multisets (a translation may reorder them)."""
    return sorted(pattern.findall(src)) != sorted(pattern.findall(tgt))


def letter_share(text: str) -> float:
    """Letters among the characters that are not spaces (1 for a text of spaces alone)."""
    chars = [c for c in text if not c.isspace()]
    return sum(c.isalpha() for c in chars) / len(chars) if chars else 1.0


def longest_run(text: str) -> int:
    """The most times a word follows itself in a row."""
    longest, run, previous = 0, 0, None
    for word in text.split():
        run = run + 1 if word == previous else 1
        longest, previous = max(longest, run), word
    return longest


def longest_word(text: str) -> int:
    return max((len(word) for word in text.split()), default=0)


@functools.lru_cache(maxsize=65536)
def script_of(char: str) -> str:
    """The script of a letter, as the first word of its Unicode name ("LATIN", "CYRILLIC", "CJK", ...)."""
    return unicodedata.name(char, "UNKNOWN").split(" ", 1)[0]


def foreign_share(text: str, scripts: frozenset[str]) -> float:
    """The share of `text`'s letters outside `scripts` (0 for a text without letters)."""
    letters = [c for c in text if c.isalpha()]
    return sum(script_of(c) not in scripts for c in letters) / len(letters) if letters else 0.0


@functools.cache
def _identifier():
    """py3langid's identifier with its bundled model, probabilities normalised (one per worker process)."""
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def language_likelihood(text: str, lang: str) -> float:
    """How likely `text` is to be in `lang` against the language py3langid finds likeliest: the ratio of their
    probabilities, 1 when `lang` is the likeliest. Among all the languages py3langid knows, not a few the recipe
    names: a short German line is often likeliest Dutch or Danish, yet rarely far less likely German, while a
    line in another language is, once it has a few words (bench/README.md, "Language identification compared").
    Asking whether another language is *confidently* found would pass every short line, whose probabilities
    spread over the languages that share its words."""
    ranked = _identifier().rank(text)
    top = ranked[0][1]
    return next((probability for found, probability in ranked if found == lang), 0.0) / top if top > 0 else 1.0


def unidentifiable(lang: str) -> str | None:
    """Why language identification cannot check a side in `lang`, as the end of a sentence naming it; None if it
    can. py3langid names the languages it knows by their ISO 639-1 codes; a side in another would be "another
    language" whenever identification is sure, and almost every pair would be dropped."""
    known = sorted(_identifier().labels)
    if lang in known:
        return None
    return (f"is not one of the {len(known)} languages py3langid identifies ({', '.join(known)}), so "
            "data.filter.language_id would drop almost every pair: use its ISO 639-1 code, or turn language_id off")
