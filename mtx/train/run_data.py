"""The prepared data of a run as the trainer takes it: checked against the recipe, cut into batches it can hold.

mtx.data.prepared reads the files back; this module decides what the trainer makes of them. A pair longer than the
model's position table or the token budget of a batch cannot be trained on, so it is left out of every batch
(with a warning for the training split) rather than failing the run at the batch that holds it.

The corpora of a recipe (`data.sources`) follow one another in the train split, each a contiguous range that the
manifest's per-corpus counts give. A corpus of weight w is seen w times an epoch: its range is repeated w times
before the batches are made. With `data.temperature` T instead, an epoch keeps the corpora's total size and gives
each corpus a share ∝ size^(1/T) (`temperature_shares`), repeating a small corpus and subsampling a large one. The
weights and temperature are the recipe's, read here, not the manifest's, so that new ones need no new
`mtx prepare`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mtx.config.recipe import DataConfig, Recipe
from mtx.data.batching import PairSource, make_batches, pair_costs, pairs_within
from mtx.data.prepared import TokenSplit, load_split
from mtx.data.vocabulary import read_tokenizer, vocabulary_file
from mtx.errors import MtxError

# The most training pairs an epoch may hold, weights applied. Every training process keeps the epoch's index and
# batches in memory, a few numbers a pair, which past a billion pairs no machine holds; no corpus comes near it,
# so a weight that passes it is a slip.
MOST_PAIRS_AN_EPOCH = 1_000_000_000


@dataclass
class ValidSet:
    """The valid split: its pairs the model can hold, batched, for the valid loss; its text, for BLEU."""

    split: TokenSplit
    batches: list[np.ndarray]
    sources: list[str]  # train.valid_max_sentences source lines of each pair, spread over it, decoded for BLEU
    refs: list[str]  # their references
    pairs: list[str]  # each source line's language pair (en-de), from its corpus; [] if the corpora share one


def check_data_matches_recipe(recipe: Recipe, manifest: dict[str, Any], data_dir: Path) -> None:
    """Refuse data prepared for another vocabulary, language pair or corpora (their names and tags, target-language
    tags included, which change the source tokens): a model trained on it would not be the recipe's model, and the
    mismatch would otherwise surface only as a wrong result. The corpora's weights may differ: the trainer applies
    the recipe's."""
    data, bpe = recipe.data, manifest["bpe"]
    differences = []
    if (manifest["src_lang"], manifest["tgt_lang"]) != (data.src_lang, data.tgt_lang):
        differences.append(f"for {manifest['src_lang']}→{manifest['tgt_lang']} (the recipe asks for "
                           f"{data.src_lang}→{data.tgt_lang})")
    if bpe.get("from") != data.bpe.from_:
        differences.append(f"with {_vocabulary(bpe.get('from'))} (the recipe asks for {_vocabulary(data.bpe.from_)})")
    elif data.bpe.from_ is None and bpe["vocab_size_requested"] != data.bpe.vocab_size:
        differences.append(f"with data.bpe.vocab_size = {bpe['vocab_size_requested']} (the recipe asks for "
                           f"{data.bpe.vocab_size})")
    elif data.bpe.from_ is None and _kind(bpe) != (data.bpe.style, data.bpe.model):
        differences.append(f"with a {' '.join(_kind(bpe))} vocabulary (the recipe asks for {data.bpe.style} "
                           f"{data.bpe.model})")
    elif data.bpe.from_ is not None and _vocabulary_changed(data, manifest):
        differences.append(f"with the tokenizer that data.bpe.from = {data.bpe.from_} held then, and holds no more")
    wanted = [(corpus.name, data.source_prefix(corpus)) for corpus in data.corpora]
    prepared = ([(corpus["name"], _prefix(corpus)) for corpus in manifest["corpora"]] if "corpora" in manifest
                else [(wanted[0][0], "")])  # prepared before mtx knew several corpora: one, untagged
    if prepared != wanted:
        differences.append(f"from the corpora {_listed(prepared)} (the recipe has {_listed(wanted)})")
    if differences:
        raise MtxError(f"The data in {data_dir} was prepared {'; and '.join(differences)}: run "
                       "`mtx prepare RECIPE` again with this recipe.")


def _kind(bpe: dict[str, Any]) -> tuple[str, str]:
    """The style and model of a manifest's learnt vocabulary: byte-level BPE if it was prepared before styles."""
    return bpe.get("style", "bytelevel"), bpe.get("model", "bpe")


def _vocabulary_changed(data: DataConfig, manifest: dict[str, Any]) -> bool:
    """Whether data.bpe.from now holds another tokenizer than the data is encoded with; not if it is gone (the
    data holds its own copy, and that is the one a fine-tuned model must read)."""
    if not Path(data.bpe.from_).exists():
        return False
    return read_tokenizer(vocabulary_file(data)).sha256 != manifest["tokenizer_sha256"]


def _vocabulary(source: str | None) -> str:
    return "a vocabulary learnt on its text" if source is None else f"the vocabulary of data.bpe.from = {source}"


def _prefix(corpus: dict[str, Any]) -> str:
    """The tags a prepared corpus' sources start with, each followed by a space: its own tag alone if it was
    prepared before target-language tags."""
    return corpus.get("prefix", corpus["tag"] + " " if corpus["tag"] else "")


def _listed(corpora: list[tuple[str, str]]) -> str:
    return ", ".join(name + (f" tagged {prefix.strip()}" if prefix else "") for name, prefix in corpora)


def training_batches(recipe: Recipe, manifest: dict[str, Any], split: PairSource, say: Callable[[str], None]
                     ) -> list[np.ndarray]:
    """The training batches, leaving out (and counting, in a warning) pairs that no batch or no position table
    can hold, and each corpus' pairs repeated for its weight.

    `mtx prepare` drops pairs longer than model.max_positions, so what is left here comes from data prepared
    for another model, or a train.max_tokens below a pair's cost: a warning, never a refusal, unless
    nothing is left to train on.
    """
    max_tokens = recipe.train.max_tokens
    limit = min(recipe.model.max_positions, max_tokens)
    fits = pairs_within(split.src_lens, split.tgt_lens, limit)
    pairs, fitting = len(fits), int(np.count_nonzero(fits))
    if fitting == 0:
        shortest = int(pair_costs(split.src_lens, split.tgt_lens).min())
        raise MtxError(
            f"No training pair fits: the shortest needs {shortest} tokens (its longer side plus EOS), "
            f"more than train.max_tokens = {max_tokens} or model.max_positions = "
            f"{recipe.model.max_positions}. Raise them, or run `mtx prepare RECIPE` again."
        )
    if fitting < pairs:
        say(f"warning: {pairs - fitting:,} of {pairs:,} training pairs are longer than "
            f"{limit} tokens (the smaller of train.max_tokens and model.max_positions) and are left out. "
            "Run `mtx prepare RECIPE` again to drop them from the data, or raise those limits.")
    corpora, temperature = recipe.data.corpora, recipe.data.temperature
    if temperature is None and all(corpus.weight == 1 for corpus in corpora):
        return make_batches(split.src_lens, split.tgt_lens, max_tokens, recipe.seed, keep=fits)
    sizes = _corpus_sizes(manifest)
    if temperature is None:
        weights = [corpus.weight for corpus in corpora]
        _check_epoch_size(recipe.data, sizes)
        index = _weighted_index(sizes, weights)
        say("an epoch of training pairs, by corpus and weight: " + ", ".join(
            f"{corpus.name} {size:,} × {corpus.weight}" for corpus, size in zip(corpora, sizes, strict=True))
            + f" = {len(index):,}")
    else:
        shares = temperature_shares(sizes, temperature)
        index = _sampled_index(sizes, shares, recipe.seed)
        say(f"an epoch of training pairs, by corpus at temperature {temperature:g}: " + ", ".join(
            f"{corpus.name} {size:,} → {round(share * len(index)):,} ({share:.1%})"
            for corpus, size, share in zip(corpora, sizes, shares, strict=True)) + f" = {len(index):,}")
    batches = make_batches(split.src_lens[index], split.tgt_lens[index], max_tokens, recipe.seed, keep=fits[index])
    return [index[batch] for batch in batches]


def _corpus_sizes(manifest: dict[str, Any]) -> list[int]:
    """The training pairs of each corpus, in the order they follow one another in the train split."""
    if "corpora" not in manifest:  # prepared before mtx knew several corpora: one
        return [manifest["splits"]["train"]["pairs"]]
    return [corpus["splits"]["train"]["pairs"] for corpus in manifest["corpora"]]


def _check_epoch_size(data: DataConfig, sizes: list[int]) -> None:
    """Refuse weights that make an epoch of more than `MOST_PAIRS_AN_EPOCH` pairs, naming the corpus that weighs
    most, before any memory is taken: every rank holds the whole epoch, the index of each pair it repeats and
    its batches, so such an epoch would end the run in an allocation the machine cannot make."""
    corpora = data.corpora
    epoch = sum(size * corpus.weight for corpus, size in zip(corpora, sizes, strict=True))
    if epoch <= MOST_PAIRS_AN_EPOCH:
        return
    heaviest = max(range(len(corpora)), key=lambda i: sizes[i] * corpora[i].weight)
    corpus = corpora[heaviest]
    raise MtxError(
        f"{data.corpus_key(heaviest)}.weight = {corpus.weight:,} makes an epoch of {epoch:,} training pairs ("
        + ", ".join(f"{c.name} {size:,} × {c.weight:,}" for c, size in zip(corpora, sizes, strict=True))
        + f"), more than the {MOST_PAIRS_AN_EPOCH:,} an epoch may hold: every training process keeps the "
        "whole epoch in memory. Lower that weight, or every corpus' weight in proportion: a weight says how "
        "often its corpus is seen beside the others, and weights 1 and 10 mix two corpora as 10 and 100 do."
    )


def temperature_shares(sizes: list[int], temperature: float) -> list[float]:
    """Each corpus' share of an epoch under temperature sampling: p_i ∝ (n_i / Σn)^(1/T) (Arivazhagan et al.
    2019, fairseq's multilingual sampling, NLLB's T = 5). T = 1 keeps the sizes' shares; a larger T moves every
    share towards 1/k; an empty corpus gets none."""
    total = sum(sizes)
    powered = [(size / total) ** (1.0 / temperature) if size else 0.0 for size in sizes]
    return [p / sum(powered) for p in powered]


def _sampled_index(sizes: list[int], shares: list[float], seed: int) -> np.ndarray:
    """The index of every training pair of an epoch of Σn pairs, each corpus holding its share: its whole range
    as many times as the share covers it, then the rest drawn without replacement from it (seeded), in corpus
    order. So a small corpus is repeated and a large one is subsampled, as the shares ask."""
    starts, total = np.cumsum([0, *sizes[:-1]]), sum(sizes)
    dtype = np.int32 if total < 2**31 else np.int64
    rng, parts = np.random.default_rng(seed), []
    for start, size, share in zip(starts, sizes, shares, strict=True):
        wanted = round(share * total)
        if size == 0 or wanted == 0:
            continue
        whole, rest = divmod(wanted, size)
        corpus = np.arange(start, start + size, dtype=dtype)
        parts += [np.tile(corpus, whole), np.sort(rng.choice(corpus, size=rest, replace=False))]
    return np.concatenate(parts)


def _weighted_index(sizes: list[int], weights: list[int]) -> np.ndarray:
    """The index of every training pair of an epoch, a corpus' range repeated for its weight, in corpus order."""
    starts = np.cumsum([0, *sizes[:-1]])
    dtype = np.int32 if sum(sizes) < 2**31 else np.int64
    return np.concatenate([np.tile(np.arange(start, start + size, dtype=dtype), weight)
                           for start, size, weight in zip(starts, sizes, weights, strict=True)])


def load_valid_set(recipe: Recipe, manifest: dict[str, Any], data_dir: Path) -> ValidSet | None:
    """The valid split, if the data has one. Its batches take every pair the model can hold, a batch growing
    past train.max_tokens for a pair that needs it, so that the valid loss is over the same pairs whatever the
    token budget."""
    cfg = recipe.train
    has_valid = has_valid_split(manifest)
    if cfg.patience is not None and not has_valid:
        raise MtxError("train.patience is set but the prepared data has no valid split to validate on: add "
                       "one to data.source and run `mtx prepare` again, or unset train.patience.")
    if not has_valid:
        return None
    split = load_split(data_dir, "valid")
    usable = pairs_within(split.src_lens, split.tgt_lens, recipe.model.max_positions)
    budget = max(cfg.max_tokens, int(pair_costs(split.src_lens, split.tgt_lens)[usable].max(initial=1)))
    batches = make_batches(split.src_lens, split.tgt_lens, budget, recipe.seed, keep=usable)
    return ValidSet(split, batches, *valid_text(recipe.data, manifest, data_dir, cfg.valid_max_sentences))


def has_valid_split(manifest: dict[str, Any]) -> bool:
    """Whether the prepared data (its manifest) has a valid split with pairs in it."""
    return manifest["splits"].get("valid", {}).get("pairs", 0) > 0


def valid_text(data: DataConfig, manifest: dict[str, Any], data_dir: Path, most: int | None = None
               ) -> tuple[list[str], list[str], list[str]]:
    """The valid split's source lines as the model reads them (target tags included), their references and each
    one's language pair ([] if the corpora share one): all of them, or `most` of each pair spread evenly over
    it (`spread_lines`)."""
    sources, refs = ((data_dir / f"valid.{lang}").read_text(encoding="utf-8").splitlines()
                     for lang in (data.src_lang, data.tgt_lang))
    pairs = valid_pairs(data, manifest)
    lines = spread_lines(pairs or [""] * len(sources), most)
    return [sources[i] for i in lines], [refs[i] for i in lines], [pairs[i] for i in lines] if pairs else []


def spread_lines(pairs: list[str], most: int | None) -> list[int]:
    """The lines BLEU decodes: `most` of each language pair's (all: None), evenly spaced over its lines, in order.
    Spread rather than the first `most`: a valid set is often several documents end to end, and its first lines
    would be one document's, of one length and style, and measure a length ratio the whole set does not have
    (bench/README.md)."""
    by_pair: dict[str, list[int]] = {}
    for i, pair in enumerate(pairs):
        by_pair.setdefault(pair, []).append(i)
    lines = []
    for own in by_pair.values():
        taken = len(own) if most is None else min(most, len(own))
        lines += [own[k * len(own) // taken] for k in range(taken)]
    return sorted(lines)


def valid_pairs(data: DataConfig, manifest: dict[str, Any]) -> list[str]:
    """The language pair (en-de) of each valid sentence, in order: the valid split holds the corpora that have one,
    one after the other (mtx.data.prepare). [] if all the corpora are of one pair: validation then reports it
    once."""
    corpora = data.corpora
    if len({(corpus.src_lang, corpus.tgt_lang) for corpus in corpora}) == 1:
        return []
    return [f"{corpus.src_lang}-{corpus.tgt_lang}"
            for corpus, prepared in zip(corpora, manifest["corpora"], strict=True)
            for _ in range(prepared["splits"].get("valid", {}).get("pairs", 0))]
