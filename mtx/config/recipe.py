"""What a recipe holds: one dataclass per section, each field with its type, default, range and help.

A recipe is the whole description of a run: the data and how it is prepared, the model, how it is trained and
how it decodes. Each field's help text and range live beside it (`setting`, mtx.config.fields), so that
`mtx config --keys`, the checks and the server's schema say what this file says and cannot drift; each section
checks its ranges, then the rules that tie one key to another (`validate`), naming the dotted key of a bad
value. Reading YAML into these classes is mtx.config.loading's job. This module imports no torch:
`mtx config` and recipe errors must be instant.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mtx.config.fields import (
    Bounds,
    ConfigError,
    bounds_problems,
    check,
    check_bounds,
    parse_duration,
    recipe_key,
    setting,
)
from mtx.errors import MtxError

# --------------------------------------------------------------------------------------------------- model

AT_LEAST_1 = Bounds(1)
AT_LEAST_0 = Bounds(0)
RATE = Bounds(0, 1, high_open=True)  # a dropout's or smoothing's share: 1 would leave nothing
POSITIVE = Bounds(0, low_open=True)
# The largest model a recipe may describe: far beyond any Transformer trained (the deepest, DeepNet's, has 1,000
# layers; GPT-3's widest sub-layer 49,152 units), and small enough that every size, count and index stays within
# int64 and float64, so that a slip of a few digits is a message, not an overflow deep inside PyTorch.
LAYERS = Bounds(1, 1000)
WIDTH = Bounds(1, 2**17)
POSITIONS = Bounds(1, 2**20)

FROM_PRESET = "(the preset's)"  # how `mtx config --keys` shows the default of a field the preset fills


@dataclass
class ModelConfig:
    """The Transformer's shape. `preset` fills every field left unset (None) in the recipe."""

    preset: Literal["tiny", "small", "base", "big"] = setting(
        "base", "Table 3 of the paper (base, big) or a size for CPUs (tiny, small); any field below overrides it.")
    layers_enc: int | None = setting(None, "Encoder layers.", bounds=LAYERS)
    layers_dec: int | None = setting(None, "Decoder layers.", bounds=LAYERS)
    d_model: int | None = setting(None, "Width of the residual stream and the embeddings.", bounds=WIDTH)
    heads: int | None = setting(None, "Attention heads per layer; must divide d_model.", bounds=WIDTH)
    d_ff: int | None = setting(None, "Inner width of the feed-forward blocks.", bounds=WIDTH)
    dropout: float | None = setting(
        None, "Dropout on the embeddings and every residual branch (the paper's P_drop).", bounds=RATE)
    attn_dropout: float | None = setting(
        None, "Dropout on the attention weights (the paper: none; T2T: 0.1).", bounds=RATE)
    relu_dropout: float | None = setting(None, "Dropout inside the feed-forward blocks, after the ReLU.", bounds=RATE)
    norm: Literal["post", "pre"] | None = setting(
        None, "post: LayerNorm after each residual sum (the paper); pre: before each sub-layer, plus one at the "
        "end of each stack, which trains deep or large models with less warmup.")
    share_embeddings: bool | None = setting(
        None, "One matrix for the source and target embeddings and the output projection (§3.4); false gives the "
        "source its own.")
    max_positions: int | None = setting(
        None, "The longest source or target sequence in tokens, EOS included: the size of the positional table.",
        bounds=POSITIONS)

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.d_model % self.heads == 0, f"{key}.heads", self.heads, f"must divide d_model ({self.d_model})")


# Table 3 of the paper for base and big; tiny and small are for CPUs, tests and the demo.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(layers_enc=2, layers_dec=2, d_model=128, heads=4, d_ff=512, dropout=0.1),
    "small": dict(layers_enc=3, layers_dec=3, d_model=256, heads=4, d_ff=1024, dropout=0.1),
    "base": dict(layers_enc=6, layers_dec=6, d_model=512, heads=8, d_ff=2048, dropout=0.1),
    "big": dict(layers_enc=6, layers_dec=6, d_model=1024, heads=16, d_ff=4096, dropout=0.3),
}
PRESET_COMMON: dict[str, Any] = dict(
    attn_dropout=0.0, relu_dropout=0.0, norm="post", share_embeddings=True, max_positions=1024
)


def resolve_model(model: ModelConfig) -> ModelConfig:
    """The preset's values for every field the recipe left unset."""
    defaults = {**PRESET_COMMON, **PRESETS[model.preset]}
    values = {k: (v if v is not None else defaults[k]) for k, v in dataclasses.asdict(model).items()}
    return ModelConfig(**values)


# ---------------------------------------------------------------------------------------------------- data


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

    train: list[str] = setting(help="[source file, target file] of the training pairs, one sentence per line.")
    valid: list[str] | None = setting(None, "[source file, target file] of the validation pairs.")
    test: list[str] | None = setting(None, "[source file, target file] of the test pairs.")


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

    def validate(self, key: str) -> None:
        super().validate(key)
        check_bounds(self, key)
        if self.name is not None:
            check(bool(re.fullmatch(r"[\w.\-]+", self.name)), f"{key}.name", self.name,
                   "may hold only letters, digits, '.', '_' and '-'")
        if self.tag is not None:
            from mtx.tokenizer import why_not_a_tag  # here: a recipe without tags loads no tokenizer library

            if (problem := why_not_a_tag(self.tag)) is not None:
                check(False, f"{key}.tag", self.tag, problem)

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


@dataclass
class FilterConfig:
    """Training-data cleaning, as Moses' clean-corpus-n.perl does it. Valid/test sets are never filtered."""

    min_len: int = setting(1, "Fewest words a side of a training pair may have.", bounds=AT_LEAST_0)
    max_len: int = setting(250, "Most words a side of a training pair may have.", bounds=AT_LEAST_1)
    max_ratio: float = setting(1.5, "Largest ratio of the longer side's words to the shorter's; 0 disables it.",
                               bounds=Bounds(0, note="0 disables it"))
    dedup: bool = setting(True, "Drop exact duplicate training pairs.")

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.max_len >= self.min_len, f"{key}.max_len", self.max_len, "must be ≥ min_len")


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
class DataConfig:
    """The corpora and how `mtx prepare` turns them into token splits."""

    source: SourceConfig | None = setting(
        None, "Where the sentence pairs come from (hf, files, tsv or demo): one corpus; or data.sources.")
    sources: list[CorpusConfig] | None = setting(
        None, "Several corpora, each a source as data.source takes it with an optional name, tag and weight; "
        "their training pairs are concatenated, their valid and test sets too.")
    src_lang: str = setting("en", "The source language's code; it names files (data/test.en).")
    tgt_lang: str = setting("de", "The target language's code.")
    filter: FilterConfig = setting(help="How training pairs are cleaned.", factory=FilterConfig)
    bpe: BpeConfig = setting(help="The subword vocabulary.", factory=BpeConfig)

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
            named.append(dataclasses.replace(corpus, name=name))
        return named

    def corpus_key(self, index: int) -> str:
        """The dotted key of the corpus `index` of `corpora`, for messages: data.source or data.sources[i]."""
        return "data.source" if self.sources is None else f"data.sources[{index}]"

    @property
    def tags(self) -> list[str]:
        """The corpora's distinct tags, in recipe order: the vocabulary's special tokens after the fixed four."""
        return list(dict.fromkeys(corpus.tag for corpus in self.corpora if corpus.tag is not None))

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
            value = getattr(self, name)
            check(bool(re.fullmatch(r"[A-Za-z][\w\-]*", value)), f"{key}.{name}", value,
                   "must be a language code such as en or de")
        check(self.src_lang != self.tgt_lang, f"{key}.tgt_lang", self.tgt_lang, "must differ from src_lang")
        if self.tags and self.bpe.from_ is None:  # every tag takes a token, and unigram pieces for its characters
            from mtx.tokenizer import smallest_vocab_size  # here: a recipe without tags loads no tokenizer library

            bpe, smallest = self.bpe, smallest_vocab_size(self.bpe.style, self.bpe.model, self.tags)
            check(bpe.vocab_size >= smallest, f"{key}.bpe.vocab_size", bpe.vocab_size,
                   f"is too small for the {len(self.tags)} tags of {key}.sources: a {bpe.style} {bpe.model} "
                   f"vocabulary with them needs at least {smallest} tokens. Raise it to {smallest} or more, or "
                   "use fewer tags")


# --------------------------------------------------------------------------------------------------- train


@dataclass
class TrainConfig:
    """How `mtx train` trains: batches, the optimiser and its schedule, precision, budgets, checkpoints, logs."""

    max_tokens: int = setting(
        4096, "Padded token slots per GPU per micro-batch: sentences × max(source, target length + 1), as "
        "fairseq counts them.", bounds=AT_LEAST_1)
    update_freq: int = setting(1, "Micro-batches whose gradients are accumulated into one update.", bounds=AT_LEAST_1)
    update_tokens: int | None = setting(
        None, "Padded token slots per update over all GPUs (max_tokens × GPUs × update_freq): with it, each "
        "session cuts its micro-batches (up to max_tokens per GPU) and sets update_freq from its number of "
        "processes, fewest micro-batches first, so a recipe makes the same updates on 1 GPU or 8. null: "
        "max_tokens and update_freq as given.", bounds=AT_LEAST_1)
    lr_schedule: Literal["inverse_sqrt", "noam"] = setting(
        "inverse_sqrt", "noam: the paper's d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), lr a scale factor; "
        "inverse_sqrt: fairseq's linear warmup to lr, then ∝ 1/√step.")
    lr: float = setting(7.0e-4, "The peak learning rate for inverse_sqrt; a scale factor for noam (the paper: 1).",
                        bounds=POSITIVE)
    warmup: int = setting(4000, "Warmup updates.", bounds=AT_LEAST_0)
    betas: list[float] = setting(help="Adam's β1 and β2 (the paper: 0.9, 0.98).", factory=lambda: [0.9, 0.98])
    eps: float = setting(1.0e-9, "Adam's ε, added to the denominator.", bounds=POSITIVE)
    weight_decay: float = setting(0.0, "Decoupled weight decay (AdamW); the paper has none.", bounds=AT_LEAST_0)
    label_smoothing: float = setting(0.1, "ε_ls of the label-smoothed cross-entropy (§5.4).", bounds=RATE)
    clip_norm: float = setting(0.0, "Clip the gradients' global norm to this; 0 disables clipping.",
                               bounds=Bounds(0, note="0 disables it"))
    precision: Literal["auto", "fp32", "bf16", "fp16"] = setting(
        "auto", "auto: bf16 autocast on GPUs that have it, fp16 with a gradient scaler on older ones, fp32 on CPU.")
    compile: bool = setting(
        False, "torch.compile the model, with dynamic shapes (one graph for every batch shape, one more for "
        "batches whose sources are not padded).")
    device: Literal["auto", "cpu", "cuda"] = setting("auto", "auto: this rank's GPU if there is one, else the CPU.")
    max_steps: int = setting(100_000, "Stop after this many updates.", bounds=AT_LEAST_1)
    max_epochs: int | None = setting(None, "Stop after this many passes over the training data.", bounds=AT_LEAST_1)
    max_time: str | None = setting(
        None, "Stop after this much training time, summed over resumes: \"12h\", \"90m\", \"3600s\".")
    save_every: int = setting(1000, "Write a step checkpoint every this many updates.", bounds=AT_LEAST_1)
    save_every_minutes: float | None = setting(
        None, "Also write one when this many minutes have passed since the last (the paper: every 10 minutes).",
        bounds=POSITIVE)
    keep_last: int = setting(5, "Step checkpoints kept, the newest; 0 keeps all.", bounds=Bounds(0, note="0 keeps all"))
    validate_every: int = setting(1000, "Compute the valid loss and BLEU every this many updates.", bounds=AT_LEAST_1)
    valid_beam: int = setting(1, "Beam of the validation's decoding; 1 is greedy.", bounds=AT_LEAST_1)
    valid_max_sentences: int | None = setting(None, "Decode only the first N valid sentences for BLEU.",
                                              bounds=AT_LEAST_1)
    patience: int | None = setting(None, "Stop after this many validations without a better valid BLEU.",
                                   bounds=AT_LEAST_1)
    log_every: int = setting(100, "Log the training loss, learning rate and speed every this many updates.",
                             bounds=AT_LEAST_1)
    bleu_milestones: list[float] = setting(
        help="Valid BLEU levels whose first reaching is logged as a milestone (time to BLEU), e.g. [20, 25, 27].",
        factory=list)
    tensorboard: bool = setting(
        False, "Also write TensorBoard event files to runs/<name>/tensorboard/ (needs mtx[tensorboard]).")
    dist_timeout: str = setting(
        "30m", "How long ranks wait for one another (for rank 0's checkpoint write, say) before giving up.")
    init_from: str | None = setting(
        None, "Fine-tune: start a new run from this checkpoint's weights (its EMA weights if it has them). The "
        "model section must match it, or is taken from it when the recipe has none; the data must be encoded "
        "with its tokenizer (data.bpe.from). A run that has checkpoints of its own resumes from them instead.")
    init_from_state: bool = setting(
        False, "With init_from: also continue its optimizer, schedule, step and data position (it must be a "
        "step checkpoint that holds training state); false starts them fresh.")
    bpe_dropout: float = setting(
        0.0, "BPE-dropout (Provilkov et al. 2020): each epoch, training sentences are segmented anew with each "
        "merge dropped at this rate, reproducibly from (seed, epoch, pair); valid, test and translation never "
        "drop. 0: off; 0.1 is the paper's. Needs a BPE vocabulary.",
        bounds=Bounds(0, 1, high_open=True, note="the rate at which merges are dropped; 0: off, 0.1 is the paper's"))
    bpe_dropout_workers: int = setting(
        0, "Processes that segment training batches for BPE-dropout, for a GPU that one core cannot keep fed "
        "(bench/README.md: what one core segments per second); 0: the thread that collates batches does it.",
        bounds=Bounds(0, note="0: the collation thread segments"))
    ema_decay: float | None = setting(
        None, "Keep an exponential moving average of the weights with this decay (e.g. 0.9999), which "
        "validation, best.pt, mtx average, translate and export then use; null: none. The decay of update t "
        "is min(ema_decay, (1 + t) / (10 + t)), so that early weights fade in short runs.",
        bounds=Bounds(0, 1, low_open=True, high_open=True, note="e.g. 0.9999, or null: no moving average"))

    def validate(self, key: str) -> None:
        check_bounds(self, key)
        check(self.update_tokens is None or self.update_freq == 1, f"{key}.update_freq", self.update_freq,
               "must be left at 1 with train.update_tokens, which sets it from the number of processes")
        check(self.lr_schedule != "noam" or self.warmup >= 1, f"{key}.warmup", self.warmup,
               "must be at least 1 for the noam schedule")
        check(len(self.betas) == 2 and all(0 <= b < 1 for b in self.betas), f"{key}.betas", self.betas,
               "must be two numbers in [0, 1)")
        levels = self.bleu_milestones
        check(all(0 < level <= 100 for level in levels) and levels == sorted(set(levels)), f"{key}.bleu_milestones",
               levels, "must be BLEU levels in (0, 100], ascending without repeats, e.g. [20, 25, 27]")
        if self.max_time is not None:
            parse_duration(self.max_time, f"{key}.max_time")
        check(parse_duration(self.dist_timeout, f"{key}.dist_timeout") > 0, f"{key}.dist_timeout",
               self.dist_timeout, "must be a positive duration")
        check(self.init_from is not None or not self.init_from_state, f"{key}.init_from_state",
               self.init_from_state, "applies only with train.init_from")


# -------------------------------------------------------------------------------------------------- decode


LengthPenaltyStyle = Literal["gnmt", "fairseq"]
# The decoding options only sampling reads, each by the value that leaves it unset: elsewhere they must have it.
SAMPLING_ONLY: dict[str, Any] = {"topk": None, "topp": 1.0, "temperature": 1.0}
# The largest length penalty α: lp = |Y|^α of a 1,024-token output is 2^100 at α = 10, well inside float32's range
# (2^128), as is a log-probability divided by it; a larger α overflows lp, or underflows every score to 0.
MAX_LENPEN = 10.0


@dataclass
class DecodeConfig:
    """How to search: beam 4, at most input + 50 tokens (the paper's); lp = |Y|, which beat the paper's
    ((5 + |Y|) / 6)^0.6 on every seed of bench/quality.py (bench/README.md); the WMT14 recipes keep the paper's.

    One set of options for both users: the recipe's `decode:` section, which validation BLEU decodes with
    (at `train.valid_beam`), and `mtx translate`, whose flags override the checkpoint's recipe field by field.
    So the errors can name a field either way: as a recipe key (`validate`) or as its flag (`validate_flags`).
    """

    beam: int = setting(4, "Beam size; 1 is greedy search.", bounds=AT_LEAST_1)
    lenpen: float = setting(
        1.0, "Length penalty α: a hypothesis scores log P(Y|X) / lp(|Y|), |Y| counting EOS. At most 10: beyond, lp "
        "outgrows the range of the search's float32 scores, which then cannot tell hypotheses apart (the paper: "
        "0.6 with gnmt; 0 to 2 is the range people tune).", bounds=Bounds(0, MAX_LENPEN))
    lenpen_style: LengthPenaltyStyle = setting("fairseq", "lp(|Y|) = |Y|^α (fairseq: with α = 1, the mean "
                                               "log-probability a token) or ((5 + |Y|) / 6)^α (gnmt: the paper's).")
    max_len_a: float = setting(1.0, "Output at most a · source tokens + b tokens (EOS not counted).",
                               bounds=AT_LEAST_0)
    max_len_b: int = setting(50, "See max_len_a.", bounds=AT_LEAST_1)
    min_len: int = setting(0, "Output at least this many tokens before EOS.", bounds=AT_LEAST_0)
    nbest: int = setting(1, "Translations kept per sentence, best first, at most beam (with sampling: samples per "
                         "sentence, any number).", bounds=AT_LEAST_1)
    no_repeat_ngram: int = setting(
        0, "Never produce an n-gram of this size twice in one translation (fairseq's, CTranslate2's remedy for "
        "loops); 0: allowed.", bounds=Bounds(0, note="0: allowed"))
    sampling: bool = setting(
        False, "Draw each token from the model's distribution instead of searching (back-translation, Edunov et al. "
        "2018). A line's samples depend on seed, its index in the input and the model only.")
    topk: int | None = setting(None, "With sampling: draw from the k most probable tokens only [default: all].",
                               bounds=Bounds(1, note="leave it unset to draw from all"))
    topp: float = setting(
        1.0, "With sampling: draw from the fewest most probable tokens whose probabilities sum to at least p "
        "(nucleus sampling); 1: all.", bounds=Bounds(0, 1, low_open=True))
    temperature: float = setting(
        1.0, "With sampling: divide the log-probabilities by T before drawing: below 1 sharper, above 1 flatter.",
        bounds=POSITIVE)
    seed: int = setting(1, "With sampling: the seed of the draws.")

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

    def validate_flags(self, vocabulary: int | None = None) -> None:
        """As command-line flags: `--beam 0 must be at least 1.`, `--max-len-a -1.0 must be at least 0.`"""
        self._validate(lambda name: "--" + name.replace("_", "-"), " ", MtxError, vocabulary)

    def _validate(self, spell: Callable[[str], str], separator: str, error: type[MtxError],
                  vocabulary: int | None = None) -> None:
        if (problem := self.first_problem(spell, separator, vocabulary)) is not None:
            raise error(problem[1])

    def first_problem(self, spell: Callable[[str], str], separator: str,
                      vocabulary: int | None = None) -> tuple[str, str] | None:
        """The first value the search cannot honour, as (its field's name, a message naming the field as `spell`
        writes names: a recipe key, a flag, a request's JSON field); None if every value is fine. `vocabulary`:
        the model's size, where one is at hand, which no beam may exceed."""
        def problem(name: str, what: str) -> tuple[str, str]:
            return name, f"{spell(name)}{separator}{getattr(self, name)!r} {what}."

        styles = typing.get_args(LengthPenaltyStyle)
        if self.lenpen_style not in styles:
            return problem("lenpen_style", f"is not one of {', '.join(styles)}")
        for name, what in bounds_problems(self):
            return problem(name, what)
        if vocabulary is not None and self.beam > vocabulary:
            return problem("beam", f"is more than the model's {vocabulary:,} vocabulary tokens: beams are distinct "
                           "continuations, so there cannot be more")
        if not self.sampling and self.nbest > self.beam:
            return problem("nbest", f"must be between 1 and {spell('beam')} ({self.beam})")
        if not self.sampling:
            for name, unset in SAMPLING_ONLY.items():
                if getattr(self, name) != unset:
                    return problem(name, f"applies only with {spell('sampling')}")
        return None


# -------------------------------------------------------------------------------------------------- recipe


@dataclass
class Recipe:
    """A run: its name, seed and data, the model, how it trains and how it decodes."""

    name: str = setting(help="The run's name; the run directory is runs/<name> unless run_dir says otherwise.")
    data: DataConfig = setting(help="The corpus and how it is prepared.")
    seed: int = setting(1, "The seed of initialisation, batch order and dropout: the same seed, the same run.")
    run_dir: str | None = setting(None, "The run directory, relative to the working directory [default: runs/<name>].")
    model: ModelConfig = setting(help="The Transformer's shape.", factory=lambda: resolve_model(ModelConfig()))
    train: TrainConfig = setting(help="How the model is trained.", factory=TrainConfig)
    decode: DecodeConfig = setting(
        help="How validation and `mtx translate` search (the flags of mtx translate override it).",
        factory=DecodeConfig)

    @property
    def run_path(self) -> Path:
        return Path(self.run_dir) if self.run_dir else Path("runs") / self.name

    def validate(self, key: str) -> None:
        check(bool(re.fullmatch(r"[\w.\-]+", self.name)), "name", self.name,
               "may hold only letters, digits, '.', '_' and '-' (it names the run directory)")
        check(self.train.bpe_dropout == 0 or self.data.bpe.from_ is not None or self.data.bpe.model == "bpe",
               "train.bpe_dropout", self.train.bpe_dropout,
               "needs a BPE vocabulary, and data.bpe.model is unigram: drop merges of a BPE, or set it to 0")

    def to_dict(self) -> dict[str, Any]:
        return strip_nones(as_mapping(self))


def as_mapping(value: Any) -> Any:
    """A recipe or a section of one as the YAML mapping a recipe writes: `dataclasses.asdict`, but every field
    under its recipe key (`recipe_key`: `from`, not `from_`), so that a dumped recipe loads back."""
    if dataclasses.is_dataclass(value):
        return {recipe_key(f): as_mapping(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: as_mapping(v) for k, v in value.items()}
    if isinstance(value, list):
        return [as_mapping(v) for v in value]
    return value


def strip_nones(value: Any) -> Any:
    """Drop unset optional keys, so a printed recipe loads back as the same recipe and a data fingerprint does
    not change when a key is added with an unset default."""
    if isinstance(value, dict):
        return {k: strip_nones(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [strip_nones(v) for v in value]
    return value
