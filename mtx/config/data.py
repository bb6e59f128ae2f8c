"""The recipe's `data:` section: where the sentence pairs come from (one corpus or several), how training pairs
are cleaned, and the subword vocabulary `mtx prepare` learns or takes.

Each kind of source is its own dataclass, and `SourceConfig` holds exactly one of them. This module imports no
torch, nor the tokenizer library unless a recipe has tags to check: `mtx config` and recipe errors must be
instant.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from mtx.config.fields import AT_LEAST_0, AT_LEAST_1, POSITIVE, Bounds, ConfigError, check, check_bounds, setting


@dataclass
class HfSource:
    """A Hugging Face dataset: a hub id (`wmt/wmt14`) or a local path (`save_to_disk` folder, parquet dir)."""

    path: str = setting(help="A hub id such as wmt/wmt14, or a local save_to_disk folder or folder of parquet files.")
    name: str | None = setting(None, "The dataset's configuration, e.g. de-en.")
    revision: str | None = setting(None, "A hub revision (branch, tag or commit) to pin the data to.")
    splits: dict[str, str] = setting(
        help="The dataset's split for each of mtx's train, valid and test.",
        factory=lambda: {"train": "train", "valid": "validation", "test": "test"})


@dataclass
class FilesSource:
    """Aligned plain-text files per split: `[source_file, target_file]`, one sentence per line."""

    train: list[str] = setting(help="[source file, target file] of the training pairs, one sentence per line. A "
                               "target file ending in .jsonl is read as mtx translate --format jsonl writes it (a "
                               "teacher's translations): its text, and its per-token log-probability for keep_best.")
    valid: list[str] | None = setting(None, "[source file, target file] of the validation pairs.")
    test: list[str] | None = setting(None, "[source file, target file] of the test pairs.")
    keep_best: float = setting(
        1.0, "With a .jsonl target file of training pairs: keep this fraction of them, those whose translation has "
        "the highest mean log-probability a token (the teacher's confidence, as in sequence-level distillation's "
        "filtering); the others are dropped and counted as teacher_confidence. Pairs too long for the model to score "
        "(flag too_long_to_score) are dropped first and counted apart; an empty line's empty translation ranks "
        "last. 1: keep every pair.",
        bounds=Bounds(0, 1, low_open=True))

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.keep_best == 1 or str(self.train[-1]).endswith(".jsonl"), f"{key}.keep_best", self.keep_best,
              "needs a .jsonl target file of training pairs (mtx translate --format jsonl), whose scores it reads")


@dataclass
class TsvSource:
    """One tab-separated file per split: source<TAB>target per line."""

    train: str = setting(help="The training pairs: source<TAB>target on each line.")
    valid: str | None = setting(None, "The validation pairs, as train.")
    test: str | None = setting(None, "The test pairs, as train.")


@dataclass
class DemoSource:
    """The built-in, generated English→German corpus (mtx/data/demo/)."""

    pairs: int = setting(40000, "Training pairs to generate.", bounds=AT_LEAST_1)
    valid: int = setting(500, "Validation pairs.", bounds=AT_LEAST_0)
    test: int = setting(500, "Test pairs.", bounds=AT_LEAST_0)
    seed: int = setting(1, "The generator's seed: the same seed gives the same corpus.")
    domain: Literal["all", "numbers", "general"] = setting(
        "all", "Which sentences to keep, in every split: numbers: those whose English holds a number, a date or a "
        "clock time; general: the others; all: both. Two corpora of one seed and different domains share no "
        "sentence (a general corpus and a small in-domain one, for domain adaptation).")

    def validate(self, key: str) -> None:
        check_bounds(self, key)


@dataclass
class SourceConfig:
    """Where the sentence pairs come from: exactly one of the four kinds."""

    hf: HfSource | None = setting(None, "A Hugging Face dataset, from the hub or a local folder.")
    files: FilesSource | None = setting(None, "Aligned plain-text files.")
    tsv: TsvSource | None = setting(None, "Tab-separated files.")
    demo: DemoSource | None = setting(None, "The built-in generated English→German corpus (offline).")

    @property
    def kind(self) -> str:
        return next(k for k in ("hf", "files", "tsv", "demo") if getattr(self, k) is not None)

    def validate(self, key: str) -> None:
        chosen = [k for k in ("hf", "files", "tsv", "demo") if getattr(self, k) is not None]
        if len(chosen) != 1:
            raise ConfigError(
                f"{key} must name exactly one of hf, files, tsv, demo (found {len(chosen)}: "
                f"{', '.join(chosen) or 'none'})."
            )
        if self.files is not None:
            for split in ("train", "valid", "test"):
                pair = getattr(self.files, split)
                if pair is not None and len(pair) != 2:
                    raise ConfigError(
                        f"{key}.files.{split} must be a list of two files [source, target], got {pair!r}."
                    )


@dataclass
class CorpusConfig(SourceConfig):
    """One corpus of `data.sources`: a source as `data.source` takes it, with a name, a tag and a weight."""

    name: str | None = setting(
        None, "The corpus' name in the manifest and the logs [default: from the source: demo, a file's stem, the "
        "dataset's last path component and config].")
    tag: str | None = setting(
        None, "A token put before every source sentence of this corpus, e.g. <bt> for back-translations: one "
        "reserved token of the vocabulary, never split, never in a translation. One word, and none of the "
        "vocabulary's own pieces: not <pad> <s> </s> <unk>, a byte token <0x00>…<0xFF>, a single character, or "
        "a word holding a word mark (▁, Ġ). Corpora may share a tag.")
    weight: int = setting(
        1, "Each training pair of the corpus is seen this many times an epoch (fairseq's upsample_primary). "
        "Applied by `mtx train`, so changing it needs no new `mtx prepare`.", bounds=AT_LEAST_1)
    src_lang: str | None = setting(
        None, "The corpus' source language, for a model of several pairs [default: data.src_lang].")
    tgt_lang: str | None = setting(
        None, "The corpus' target language, for a model of several pairs; a model of several target languages needs "
        "data.target_tag [default: data.tgt_lang].")

    def validate(self, key: str) -> None:
        super().validate(key)
        check_bounds(self, key)
        if self.name is not None:
            check(bool(re.fullmatch(r"[\w.\-]+", self.name)), f"{key}.name", self.name,
                   "may hold only letters, digits, '.', '_' and '-'")
        if self.tag is not None:
            check_tag(f"{key}.tag", self.tag)
        for name in ("src_lang", "tgt_lang"):
            if getattr(self, name) is not None:
                check_language_code(f"{key}.{name}", getattr(self, name))

    def derived_name(self) -> str:
        """A name from the source, for a corpus the recipe gives none: demo, the training file's stem, or the
        dataset's last path component and its config."""
        if self.demo is not None:
            name = "demo"
        elif self.files is not None:
            name = Path(self.files.train[0]).stem
        elif self.tsv is not None:
            name = Path(self.tsv.train).stem
        else:
            name = Path(self.hf.path).name + (f"-{self.hf.name}" if self.hf.name else "")
        return re.sub(r"[^\w.\-]+", "_", name) or "corpus"


def check_tag(key: str, tag: str) -> None:
    """Refuse a tag the vocabulary cannot hold as one special token (mtx.tokenizer.why_not_a_tag says why)."""
    from mtx.tokenizer import why_not_a_tag  # here: a recipe without tags loads no tokenizer library

    if (problem := why_not_a_tag(tag)) is not None:
        check(False, key, tag, problem)


def check_language_code(key: str, code: str) -> None:
    """Refuse what cannot be a language code: codes name files (data/test.en) and target tags (<2de>)."""
    check(bool(re.fullmatch(r"[A-Za-z][\w\-]*", code)), key, code, "must be a language code such as en or de")


SHARE = Bounds(0, 1)  # a share of a side's characters, or a probability


@dataclass
class FilterConfig:
    """Training-data cleaning, as Moses' clean-corpus-n.perl does it. Valid/test sets are never filtered."""

    min_len: int = setting(1, "Fewest words a side of a training pair may have.", bounds=AT_LEAST_0)
    max_len: int = setting(250, "Most words a side of a training pair may have.", bounds=AT_LEAST_1)
    max_ratio: float = setting(1.5, "Largest ratio of the longer side's words to the shorter's; 0 disables it.",
                               bounds=Bounds(0, note="0 disables it"))
    dedup: bool = setting(True, "Drop exact duplicate training pairs.")
    # The filters of crawled corpora (mtx.data.cleaning), each counted in the manifest under the name it gives;
    # each is off by default (CLEANING_KEYS), so that data prepared before they existed stays up to date.
    copies: bool = setting(
        False, "Drop pairs whose sides are the same once case, punctuation, symbols and spaces are set aside: "
        "untranslated copies and pairs that differ only by punctuation (counted as copy).")
    numbers: bool = setting(
        False, "Drop pairs whose sides hold different numbers, compared as digit runs (1,000 = 1.000).")
    placeholders: bool = setting(
        False, "Drop pairs whose sides hold different placeholders: %s, %d, %1$s, {0}, {name}, $1.")
    urls: bool = setting(False, "Drop pairs whose sides hold different URLs or e-mail addresses.")
    min_letters: float = setting(
        0.0, "Fewest letters a side may have, as a share of its characters other than spaces: 0.5 drops sides of "
        "mostly digits, symbols or markup (counted as non_letters); 0 disables it.", bounds=SHARE)
    max_repeats: int = setting(
        0, "Most times a word may follow itself in a row (\"the the the\" is 3); 0 disables it.", bounds=AT_LEAST_0)
    max_word_len: int = setting(
        0, "Most characters a word may have: 50 drops hashes, base64 and text glued without spaces (counted as "
        "long_word); 0 disables it.", bounds=AT_LEAST_0)
    max_foreign_script: float = setting(
        1.0, "Largest share of a side's letters outside its language's script (its corpus' src_lang, tgt_lang; "
        "languages whose script mtx knows: mtx/data/cleaning.py) before the pair is dropped (counted as script); 1 "
        "disables it.",
        bounds=SHARE)
    language_id: bool = setting(
        False, "Identify each side's language (py3langid, pip install 'mtx[langid]') and drop the pair when another "
        "language is far likelier than its corpus' src_lang / tgt_lang (language_id_ratio; counted as language). "
        "Sides of 4 or more words are judged well, of 1-3 words less so: docs/guides/data.md.")
    language_id_ratio: float = setting(
        0.05, "With language_id: drop a pair when a side's language is less likely than this times the likeliest "
        "language; higher catches more short lines in other languages and drops more clean short lines.",
        bounds=SHARE)

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.max_len >= self.min_len, f"{key}.max_len", self.max_len, "must be ≥ min_len")


# FilterConfig's keys of mtx.data.cleaning: at their defaults they leave the data as it was before they existed.
CLEANING_KEYS = ("copies", "numbers", "placeholders", "urls", "min_letters", "max_repeats", "max_word_len",
                 "max_foreign_script", "language_id", "language_id_ratio")


@dataclass
class BpeConfig:
    """The subword vocabulary: a joint one learnt on the training data, or one taken from elsewhere."""

    style: Literal["bytelevel", "metaspace"] = setting(
        "metaspace", "metaspace: SentencePiece's convention (\"▁\" before each word, characters as symbols, "
        "bytes only for characters the vocabulary lacks); bytelevel: GPT-2's (bytes as symbols, punctuation split "
        "from words). Both are lossless and never produce <unk>.")
    model: Literal["bpe", "unigram"] = setting(
        "bpe", "bpe: merges learnt by frequency (Sennrich et al.); unigram: a unigram language model over pieces "
        "(Kudo 2018, SentencePiece's default), metaspace only.")
    vocab_size: int = setting(
        37000, "Tokens in the vocabulary, specials included (the paper: 37k En-De, 32k En-Fr); above the least "
        "with many tags. A metaspace vocabulary spends 256 of them on its byte tokens, so near the minimum it "
        "learns few pieces and spells most characters by their bytes, more tokens a sentence than a byte-level "
        "one of that size: a size for tests and toy corpora. At most 2^20: the largest vocabularies in use hold "
        "a few hundred thousand tokens, and the subword trainer allocates for the size asked.",
        bounds=Bounds(300, 2**20))
    joint: bool = setting(
        True, "One vocabulary learnt on both languages (the paper's shared source-target BPE); must be true.")
    max_lines: int = setting(
        10_000_000, "Training lines per language, evenly spaced, that the merges are learnt on (for huge corpora).",
        bounds=AT_LEAST_1)
    min_frequency: int = setting(2, "Fewest occurrences of a pair of symbols for it to become a merge.",
                                 bounds=Bounds(0, 2**32))
    from_: str | None = setting(
        None, "Take the vocabulary from here instead of learning one: a tokenizer.json, a prepared run's data/ "
        "folder or an mtx checkpoint (to fine-tune it, or to share its vocabulary). The keys above are then "
        "ignored, and every tag of data.sources must be a special token of that tokenizer.", key="from")

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.style == "metaspace" or self.model == "bpe", f"{key}.model", self.model,
               "needs data.bpe.style: metaspace (a byte-level vocabulary is BPE)")
        check(
            self.joint,
            f"{key}.joint",
            self.joint,
            "must be true: mtx shares one vocabulary between source, target and output (three-way tying)",
        )


@dataclass
class LexiconConfig:
    """The lexical translation table `mtx prepare` learns from the training pairs (mtx.data.lexicon), which
    decoding shortlists are made of (decode.shortlist), and only those: it is learnt only when asked for, as it
    costs prepare more time and memory than the rest of it on short corpora. It is learnt on its own after the
    token splits, so a change here learns it again and leaves the splits as they are."""

    learn: bool = setting(
        False, "Learn the table in `mtx prepare`, which a shortlist needs (mtx translate --shortlist, "
        "decode.shortlist, mtx serve's shortlist, mtx export --shortlist); off, prepare does no lexicon work. "
        "Turned on for a prepared folder, prepare learns only the table.")
    pairs: int | None = setting(
        200_000, "The most training pairs the table is learnt from, evenly spread over the split (every n/N-th pair, "
        "the same each run), which bounds its time and memory whatever the corpus size; a smaller sample gives "
        "rare tokens fewer translations (docs/guides/decoding.md). Unset: every pair.",
        bounds=Bounds(1, note="leave it unset to learn from every pair"))
    iterations: int = setting(
        5, "EM iterations of IBM Model 1 over the training pairs; 0: co-occurrence counts, what EM starts from "
        "(faster, and a shortlist then needs more tokens for the same coverage: bench/README.md).",
        bounds=Bounds(0, 100))
    width: int = setting(
        100, "Target tokens kept per source token, best first: the most decode.shortlist can ask for.",
        bounds=Bounds(1, 1000))

    def validate(self, key: str) -> None:
        check_bounds(self, key)


@dataclass
class DataConfig:
    """The corpora and how `mtx prepare` turns them into token splits."""

    source: SourceConfig | None = setting(
        None, "Where the sentence pairs come from (hf, files, tsv or demo): one corpus; or data.sources.")
    sources: list[CorpusConfig] | None = setting(
        None, "Several corpora, each a source as data.source takes it with an optional name, tag and weight; "
        "their training pairs are concatenated, their valid and test sets too.")
    src_lang: str = setting("en", "The source language's code; it names files (data/test.en).")
    tgt_lang: str = setting("de", "The target language's code.")
    target_tag: str | None = setting(
        None, "For one model of several target languages: a tag put before every source sentence that names its "
        "pair's target language, spelled with {lang}: <2{lang}> gives <2de> and <2fr> (an imported multilingual "
        "MarianMT model's is >>{lang}<<, its >>fra<< codes). `mtx translate --target-lang` "
        "and `mtx serve`'s target_lang add it; a line that starts with one picks its own. None: no such tag.")
    temperature: float | None = setting(
        None, "Draw each epoch's training pairs from the corpora in proportion to size^(1/T) (fairseq's and NLLB's "
        "temperature sampling): 1 keeps the corpora's sizes, 5 (NLLB's) lifts small ones towards a uniform share. "
        "An epoch keeps the corpora's total size. Applied by `mtx train`, in place of the weights, which must then "
        "be 1. None: the weights decide.", bounds=POSITIVE)
    filter: FilterConfig = setting(help="How training pairs are cleaned.", factory=FilterConfig)
    bpe: BpeConfig = setting(help="The subword vocabulary.", factory=BpeConfig)
    lexicon: LexiconConfig = setting(help="The lexical table decoding shortlists are made of.",
                                     factory=LexiconConfig)

    @property
    def corpora(self) -> list[CorpusConfig]:
        """The corpora in recipe order, every one named: `data.source` is one corpus, untagged, of weight 1. A
        derived name taken by an earlier corpus or by an explicit name gets a suffix: demo, demo-2, demo-3."""
        if self.sources is None:
            kinds = {f.name: getattr(self.source, f.name) for f in dataclasses.fields(SourceConfig)}
            listed = [CorpusConfig(**kinds)]
        else:
            listed = self.sources
        taken = {corpus.name for corpus in listed if corpus.name is not None}
        named = []
        for corpus in listed:
            name = corpus.name
            if name is None:
                base = name = corpus.derived_name()
                suffix = 1
                while name in taken:
                    suffix += 1
                    name = f"{base}-{suffix}"
                taken.add(name)
            named.append(dataclasses.replace(corpus, name=name, src_lang=corpus.src_lang or self.src_lang,
                                             tgt_lang=corpus.tgt_lang or self.tgt_lang))
        return named

    def corpus_key(self, index: int) -> str:
        """The dotted key of the corpus `index` of `corpora`, for messages: data.source or data.sources[i]."""
        return "data.source" if self.sources is None else f"data.sources[{index}]"

    @property
    def target_languages(self) -> list[str]:
        """The languages the corpora translate into, in recipe order: what decode.target_lang may name."""
        return list(dict.fromkeys(corpus.tgt_lang for corpus in self.corpora))

    @property
    def target_tags(self) -> dict[str, str]:
        """Each target language of the corpora, in recipe order, with its tag; empty without data.target_tag."""
        if self.target_tag is None:
            return {}
        return {lang: self.target_tag.replace("{lang}", lang) for lang in self.target_languages}

    def source_prefix(self, corpus: CorpusConfig) -> str:
        """What starts each source sentence of a corpus of `corpora`: its target-language tag, then its own tag,
        each followed by a space; "" for neither."""
        tags = [self.target_tags.get(corpus.tgt_lang), corpus.tag]
        return "".join(tag + " " for tag in tags if tag is not None)

    @property
    def tags(self) -> list[str]:
        """The distinct tags, target-language tags first, then the corpora's, in recipe order: the vocabulary's
        special tokens after the fixed four."""
        return list(dict.fromkeys([*self.target_tags.values(),
                                   *(corpus.tag for corpus in self.corpora if corpus.tag is not None)]))

    def validate(self, key: str) -> None:
        if self.source is None and self.sources is None:
            raise ConfigError(f"{key}.source is missing: set {key}.source (one corpus) or {key}.sources (a list of "
                              "corpora).")
        if self.source is not None and self.sources is not None:
            raise ConfigError(f"{key}.source and {key}.sources are both set: keep {key}.source for one corpus, or "
                              f"move it into the list {key}.sources.")
        if self.sources is not None:
            check(len(self.sources) >= 1, f"{key}.sources", self.sources, "must list at least one corpus")
            seen = set()
            for i, corpus in enumerate(self.sources):
                check(corpus.name not in seen, f"{key}.sources[{i}].name", corpus.name,
                       "names an earlier corpus too: each corpus needs its own name")
                if corpus.name is not None:
                    seen.add(corpus.name)
        for name in ("src_lang", "tgt_lang"):  # they name files: data/test.en, data/test.de
            check_language_code(f"{key}.{name}", getattr(self, name))
        check(self.src_lang != self.tgt_lang, f"{key}.tgt_lang", self.tgt_lang, "must differ from src_lang")
        check_bounds(self, key)
        self._check_pairs(key)
        if self.tags and self.bpe.from_ is None:  # every tag takes a token, and unigram pieces for its characters
            from mtx.tokenizer import smallest_vocab_size  # here: a recipe without tags loads no tokenizer library

            bpe, smallest = self.bpe, smallest_vocab_size(self.bpe.style, self.bpe.model, self.tags)
            check(bpe.vocab_size >= smallest, f"{key}.bpe.vocab_size", bpe.vocab_size,
                   f"is too small for the {len(self.tags)} tags of {key}.sources: a {bpe.style} {bpe.model} "
                   f"vocabulary with them needs at least {smallest} tokens. Raise it to {smallest} or more, or "
                   "use fewer tags")

    def _check_pairs(self, key: str) -> None:
        """The rules of several language pairs: each corpus' sides differ; a model of several target languages is
        told which to produce by a target tag, whose spelling names the language once and makes a tag of each; and
        the weights and a temperature do not both set the corpora's shares."""
        corpora = self.corpora
        for i, corpus in enumerate(corpora):
            if corpus.src_lang == corpus.tgt_lang:
                check(False, f"{self.corpus_key(i)}.tgt_lang", corpus.tgt_lang,
                      f"must differ from the corpus' source language ({corpus.src_lang})")
        targets = self.target_languages
        if self.target_tag is None:
            if len(targets) > 1:
                raise ConfigError(
                    f"The corpora of {key}.sources translate into {len(targets)} languages ({', '.join(targets)}), "
                    f"and nothing tells the model which to produce: set {key}.target_tag, e.g. <2{{lang}}>, to "
                    "put each pair's target language before its source sentences.")
        else:
            check(self.target_tag.count("{lang}") == 1, f"{key}.target_tag", self.target_tag,
                  "must hold {lang} once, where each target language's code goes: e.g. <2{lang}>")
            for lang, tag in self.target_tags.items():
                check_tag(f"{key}.target_tag", tag)
                clash = next((i for i, corpus in enumerate(corpora) if corpus.tag == tag), None)
                if clash is not None:
                    check(False, f"{self.corpus_key(clash)}.tag", tag,
                          f"is also the target tag of {lang} ({key}.target_tag = {self.target_tag!r}): choose another")
        if self.temperature is not None:
            heavy = next((i for i, corpus in enumerate(corpora) if corpus.weight != 1), None)
            if heavy is not None:
                check(False, f"{self.corpus_key(heavy)}.weight", corpora[heavy].weight,
                      f"and {key}.temperature both set the corpora's shares: keep one (weights 1 with a temperature)")
