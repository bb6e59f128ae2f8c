"""What a prepared data/ folder says about itself in its manifest.json, and how `mtx prepare` knows it is current.

The manifest records what was prepared from what: the corpora and their origins per split, each filter's drops
in all and per corpus (a corpus' training pairs follow the previous corpus' in the train split, so its range is
the running sum of the kept counts), the vocabulary and the token files' counts, which mtx.data.prepared checks
the files against. The fingerprint is what the data depends on; a folder whose manifest holds the same one, and
whose files pass the reader's check, is up to date, and preparing it again is a no-op.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from mtx import __version__
from mtx.config.data import CLEANING_KEYS, CorpusConfig, DataConfig, FilterConfig
from mtx.config.recipe import as_mapping, strip_nones
from mtx.data.cleaning import REASONS as CLEANING
from mtx.data.corpora import TOO_LONG_TO_SCORE, SplitStream, input_files
from mtx.data.prepared import FORMAT, check_split_files, load_manifest
from mtx.data.vocabulary import vocabulary_file
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer

# In order. TOO_LONG_TO_SCORE and teacher_confidence: keep_best's, before them all (mtx.data.corpora); CLEANING:
# mtx.data.cleaning's filters, off unless a recipe asks for them.
FILTERS = (TOO_LONG_TO_SCORE, "teacher_confidence", "invalid_utf8", "malformed", "empty", "length", "ratio",
           *CLEANING, "duplicate", "max_positions")


def build_manifest(data: DataConfig, corpora: list[dict[str, SplitStream]], tokenizer: Tokenizer, dtype: str,
              sample: int, counts: list[Counter], read: dict[str, list[Counter | None]], max_positions: int,
              splits: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What was prepared from what, and what each filter dropped, in all and per corpus (the fingerprint is
    added by `prepare`). The corpora are listed in the order their pairs follow one another in every split."""
    named = data.corpora
    kinds = {corpus.kind for corpus in named}
    bpe = ({"from": data.bpe.from_} if data.bpe.from_ is not None else
           {"style": data.bpe.style, "model": data.bpe.model, "vocab_size_requested": data.bpe.vocab_size,
            "min_frequency": data.bpe.min_frequency, "sampled_pairs": sample})
    return {
        "mtx_version": __version__,
        "format": FORMAT,
        "source": {"kind": kinds.pop() if len(kinds) == 1 else "mixed", **{s: origins(corpora, s) for s in splits}},
        "corpora": [_corpus_entry(corpus, data.source_prefix(corpus), streams, corpus_counts,
                                  {s: read[s][i] for s in read})
                    for i, (corpus, streams, corpus_counts) in enumerate(zip(named, corpora, counts, strict=True))],
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "vocab_size": tokenizer.vocab_size,
        "token_dtype": dtype,
        "tokenizer_sha256": tokenizer.sha256,
        "bpe": bpe,
        "filter": {**_filter_counts(sum(counts, Counter())), "max_positions": max_positions},
        "splits": splits,
    }


def _corpus_entry(corpus: CorpusConfig, prefix: str, streams: dict[str, SplitStream], counts: Counter,
                  read: dict[str, Counter | None]) -> dict[str, Any]:
    """A corpus in the manifest: its origin and pairs per split it has (train's are those kept), its filter
    counts, its languages, its tag, the tags its sources start with (`prefix`), and its weight as prepared (`mtx
    train` takes the weight from the recipe)."""
    filtered = _filter_counts(counts)
    pairs = {"train": filtered["kept"], **{split: c["read"] for split, c in read.items() if c is not None}}
    return {"name": corpus.name, "kind": corpus.kind, "src_lang": corpus.src_lang, "tgt_lang": corpus.tgt_lang,
            "tag": corpus.tag, "prefix": prefix, "weight": corpus.weight,
            "splits": {split: {"origin": streams[split].origin, "pairs": pairs[split]} for split in streams},
            "filter": filtered}


def _filter_counts(counts: Counter) -> dict[str, Any]:
    """Training pairs read, dropped by each filter, remaining after each, kept."""
    remaining, after = {}, counts["read"]
    for name in FILTERS:
        after -= counts[name]
        remaining[name] = after
    return {"read": counts["read"], "dropped": {n: counts[n] for n in FILTERS}, "remaining": remaining,
            "kept": after}


def origins(corpora: list[dict[str, SplitStream]], split: str) -> str:
    return "; ".join(streams[split].origin for streams in corpora if split in streams)


def describe_drops(counts: Counter) -> str:
    drops = ", ".join(f"{counts[n]:,} {n.replace('_', ' ')}" for n in FILTERS if counts[n])
    return f"{counts['read']:,} read" + (f"; dropped {drops}" if drops else "")


def fingerprint(data: DataConfig, max_positions: int) -> dict[str, Any]:
    """What the prepared data depends on: the data section, the model's max_positions (the token-length filter;
    no other model or train setting) and the input files, data.bpe.from's included.

    Not the corpora's weights or temperature, which `mtx train` applies (a new weight needs no new data), nor the
    lexicon's settings (`mtx prepare` learns the table again on its own, the splits as they are), nor the BPE's
    settings when data.bpe.from replaces them; and a demo source's domain only where it is not "all", the
    vocabulary's style and model only where they are not byte-level BPE, a files source's keep_best only below 1,
    and each cleaning filter's key only where it is not its default (off), so that recipes written before domains,
    styles, keep_best and the cleaning filters existed keep their fingerprint, and their prepared data stays up to
    date.
    """
    section = strip_nones(as_mapping(data))
    del section["lexicon"]
    section.pop("temperature", None)  # applied by `mtx train`, as the weights are
    for corpus in section.get("sources", []):
        del corpus["weight"]
    for source in [section.get("source"), *section.get("sources", [])]:
        if source is not None and source.get("demo", {}).get("domain") == "all":
            del source["demo"]["domain"]
        if source is not None and source.get("files", {}).get("keep_best") == 1:
            del source["files"]["keep_best"]
    defaults = {f.name: f.default for f in dataclasses.fields(FilterConfig)}
    for key in CLEANING_KEYS:
        # language_id_ratio stays while language_id is on, even at its default: it names the rule of issue 56,
        # which replaced a threshold, so data filtered by the old rule is not taken as up to date
        kept_for_its_rule = key == "language_id_ratio" and data.filter.language_id
        if section["filter"][key] == defaults[key] and not kept_for_its_rule:
            del section["filter"][key]
    if section["bpe"]["style"] == "bytelevel":
        del section["bpe"]["style"], section["bpe"]["model"]  # validation holds unigram to metaspace
    if data.bpe.from_ is not None:
        section["bpe"] = {"from": data.bpe.from_}
    borrowed = vocabulary_file(data)
    files = input_files(data) + ([borrowed] if borrowed else [])
    return {
        "recipe_sha256": hashlib.sha256(json.dumps({**section, "model.max_positions": max_positions},
                                                   sort_keys=True).encode()).hexdigest(),
        "inputs": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in files if p.is_file()],
    }


def up_to_date(data_dir: Path, fingerprint: dict[str, Any]) -> bool:
    """Whether `data_dir` was prepared from the same recipe and inputs and its files pass the reader's check."""
    try:
        manifest = load_manifest(data_dir)
    except (MtxError, json.JSONDecodeError):
        return False
    if manifest.get("format") != FORMAT or any(manifest.get(k) != v for k, v in fingerprint.items()):
        return False
    try:
        for split in manifest["splits"]:
            check_split_files(data_dir, split, manifest)
    except MtxError:  # damaged: rebuild it, as the reader's message promises
        return False
    if manifest["source"]["kind"] == "demo" and not all((data_dir / f"{split}.align").is_file()
                                                         for split in manifest["splits"] if split != "train"):
        return False  # prepared before mtx wrote the demo's gold alignments
    return (data_dir / "tokenizer.json").is_file()


def print_summary(console: Console, manifest: dict[str, Any], data_dir: Path) -> None:
    filters = Table(title="training data filters", title_justify="left")
    for column in ("step", "dropped", "pairs left"):
        filters.add_column(column, justify="left" if column == "step" else "right")
    stats = manifest["filter"]
    filters.add_row("read", "", f"{stats['read']:,}")
    for name in FILTERS:
        if name in CLEANING and not stats["dropped"][name]:  # off, or nothing to drop: not worth a row
            continue
        step = f"over {stats['max_positions']:,} tokens" if name == "max_positions" else name.replace("_", " ")
        filters.add_row(step, f"{stats['dropped'][name]:,}", f"{stats['remaining'][name]:,}")
    splits = Table(title=f"{data_dir} (vocabulary {manifest['vocab_size']:,}, {manifest['token_dtype']})",
                   title_justify="left")
    for column in ("split", "pairs", f"{manifest['src_lang']} tokens", f"{manifest['tgt_lang']} tokens",
                   "tokens/sentence"):
        splits.add_column(column, justify="left" if column == "split" else "right")
    for split, info in manifest["splits"].items():
        per = (info["src_tokens"] + info["tgt_tokens"]) / max(2 * info["pairs"], 1)
        splits.add_row(split, f"{info['pairs']:,}", f"{info['src_tokens']:,}", f"{info['tgt_tokens']:,}",
                       f"{per:.1f}")
    console.print(filters)
    for corpus in manifest["corpora"] if len(manifest["corpora"]) > 1 else []:
        tag = f", tagged {corpus['tag']}" if corpus["tag"] else ""
        console.print(f"  {corpus['name']}: {corpus['filter']['kept']:,} of {corpus['filter']['read']:,} training "
                      f"pairs kept{tag}, weight {corpus['weight']}")
    console.print(splits)
    console.print(f"prepared in {manifest['seconds']:.1f}s")
