"""Where parallel text comes from: each corpus of a recipe becomes, per split, a stream of raw sentence pairs.

A stream yields chunks (lists) of pairs so that cleaning and encoding can be shipped to worker processes a
chunk at a time, and so memory holds a few chunks, never a corpus. Plain-text sources yield undecoded
bytes: deciding what to do with a line that is not UTF-8 is the cleaner's job (count and drop in training
data, replace in valid/test), and decoding in the workers keeps the reading process light.

Problems a user can fix — a missing file, files whose line counts differ, an unknown dataset — are found
here, for every corpus before any long work starts, and reported as MtxError naming the corpus' recipe key
(data.source, or data.sources[i] of a recipe with several corpora).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any

from mtx.config.data import DataConfig, FilesSource, HfSource, SourceConfig, TsvSource
from mtx.errors import MtxError

SPLITS = ("train", "valid", "test")
CHUNK_PAIRS = 10_000
# The flag of a line `mtx translate --score-reference` could not score, the model being unable to hold its source
# or its translation whole, and the reason keep_best counts such pairs under in the manifest.
TOO_LONG_TO_SCORE = "too_long_to_score"

Side = bytes | str | None  # None: the line could not be split into source and target (malformed TSV)
RawPair = tuple[Side, Side]


@dataclass
class SplitStream:
    """One split of the corpus, ready to be read (possibly again) in chunks."""

    split: str
    origin: str  # what the pairs come from, for messages and the manifest
    total: int | None  # pairs, when known without reading them
    chunks: Callable[[], Iterator[list[RawPair]]]
    alignments: list[str] | None = None  # a gold word alignment per pair (Pharaoh), where the source has one
    dropped_before: dict[str, int] = field(default_factory=dict)  # pairs the source itself leaves out, by filter


def open_corpora(data: DataConfig) -> list[dict[str, SplitStream]]:
    """Each corpus' splits that exist, in recipe order: every corpus opened before any is read."""
    return [open_source(corpus, data.corpus_key(i), data.src_lang, data.tgt_lang)
            for i, corpus in enumerate(data.corpora)]


def open_source(source: SourceConfig, key: str, src_lang: str, tgt_lang: str) -> dict[str, SplitStream]:
    """The splits of the source at recipe key `key` that exist (train always; valid and test when it has them)."""
    if source.files is not None:
        return _files_source(source.files, key)
    if source.tsv is not None:
        return _tsv_source(source.tsv, key)
    if source.hf is not None:
        return _hf_source(source.hf, key, src_lang, tgt_lang)
    from mtx.data.demo import demo_splits

    return {  # the grammar's gold alignments of the held-out splits, to measure a model's alignments against
        split: SplitStream(split, f"mtx demo corpus ({split})", len(pairs),
                           _chunked_list([(pair.en, pair.de) for pair in pairs]),
                           None if split == "train" else [pair.alignment for pair in pairs])
        for split, pairs in demo_splits(source.demo, f"{key}.demo").items()
    }


def input_files(data: DataConfig) -> list[Path]:
    """The local files the corpora read: their sizes and times tell whether prepared data is stale."""
    return [file for corpus in data.corpora for file in _source_files(corpus)]


def _source_files(source: SourceConfig) -> list[Path]:
    if source.files is not None:
        return [Path(p) for split in SPLITS for p in (getattr(source.files, split) or [])]
    if source.tsv is not None:
        return [Path(p) for split in SPLITS if (p := getattr(source.tsv, split))]
    if source.hf is not None and Path(source.hf.path).is_dir():
        return sorted(p for p in Path(source.hf.path).rglob("*") if p.is_file())
    return []


# ------------------------------------------------------------------------------------------ plain files


def count_lines(path: Path) -> int:
    """Lines in a file, counting a last line without a newline, in 1 MiB blocks."""
    lines, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            lines += block.count(b"\n")
            last = block[-1:]
    return lines + (last != b"\n")


def _existing(path: str, key: str) -> Path:
    file = Path(path)
    if not file.is_file():
        raise MtxError(
            f"{key}: file {path} does not exist (relative paths start at the working directory "
            f"{Path.cwd()}). Fix the path in the recipe or pass --set {key}=..."
        )
    return file


def _lines(path: Path) -> Iterator[bytes]:
    """Lines without their newline, split on b"\\n" only (U+2028 and friends stay inside a line)."""
    with open(path, "rb") as f:
        for line in f:
            yield line.rstrip(b"\n")


def _files_source(files: FilesSource, source_key: str) -> dict[str, SplitStream]:
    streams = {}
    for split in SPLITS:
        pair = getattr(files, split)
        if pair is None:
            continue
        key = f"{source_key}.files.{split}"
        src, tgt = (_existing(p, key) for p in pair)
        src_count, tgt_count = count_lines(src), count_lines(tgt)
        if src_count != tgt_count:
            raise MtxError(
                f"{key}: {src} has {src_count:,} lines but {tgt} has {tgt_count:,}. The two files must be "
                "aligned line by line (sentence i of one translates sentence i of the other)."
            )

        if tgt.suffix == ".jsonl":
            streams[split] = _translated(split, src, tgt, src_count, files.keep_best if split == "train" else 1.0)
            continue

        def chunks(src: Path = src, tgt: Path = tgt) -> Iterator[list[RawPair]]:
            return _chunks(zip(_lines(src), _lines(tgt), strict=True))

        streams[split] = SplitStream(split, f"{src} + {tgt}", src_count, chunks)
    return streams


def _translated(split: str, src: Path, translations: Path, total: int, keep_best: float) -> SplitStream:
    """Source lines and a teacher's translations of them (`mtx translate --format jsonl`): each line's text, of its
    best translation with --nbest. With `keep_best` below 1, round(keep_best · total) of the pairs, those ranked
    highest by `_confidence`, ties kept in file order. The pairs the model could not score (too long for it) are
    dropped first, whatever the fraction, and counted as `too_long_to_score`; the rest of those left out, as
    `teacher_confidence`."""
    keep, unscored = None, 0
    if keep_best < 1:
        import numpy as np

        scores = np.fromiter((_confidence(line, translations, n) for n, line in enumerate(_lines(translations), 1)),
                             dtype=np.float64, count=total)
        scored = np.flatnonzero(~np.isnan(scores))
        unscored = total - len(scored)
        keep = np.zeros(total, dtype=bool)
        keep[scored[np.argsort(-scores[scored], kind="stable")[:round(keep_best * total)]]] = True

    def chunks() -> Iterator[list[RawPair]]:
        pairs = ((source, _best(_parsed(line, translations, n))["text"])
                 for n, (source, line) in enumerate(zip(_lines(src), _lines(translations), strict=True), 1)
                 if keep is None or keep[n - 1])
        return _chunks(pairs)

    kept = total if keep is None else int(keep.sum())
    return SplitStream(split, f"{src} + {translations}", kept, chunks, dropped_before={} if keep is None else {
        TOO_LONG_TO_SCORE: unscored, "teacher_confidence": total - kept - unscored})


def _confidence(line: bytes, path: Path, number: int) -> float:
    """What keep_best ranks a pair by, from line `number` of the jsonl file `path`: the mean log-probability a token
    of its (best) translation, EOS's included.

    Two lines mtx writes have no such mean. A line flagged too_long_to_score (`mtx translate --score-reference`:
    the model could not hold the pair whole) has no log-probabilities: NaN, and keep_best drops it first. An empty
    source line has an empty translation of no tokens, not even EOS (nothing was translated): -inf, below every
    translation, since the pair teaches nothing and the cleaning filters drop it anyway (`min_len`, `empty`);
    ranked rather than refused, as it is a line of mtx's own output.
    """
    value = _parsed(line, path, number)
    best = _best(value)
    log_probs = best.get("token_log_probs")
    if log_probs is None and TOO_LONG_TO_SCORE in (value.get("flags") or ()):
        return float("nan")
    if log_probs == [] and best["text"] == "":
        return float("-inf")
    if not isinstance(log_probs, list) or not log_probs:
        raise MtxError(f"{path}, line {number}: it has no token_log_probs, which keep_best ranks the translations by; "
                       "translate with mtx translate --format jsonl.")
    mean = sum(log_probs) / len(log_probs)
    return float("-inf") if math.isnan(mean) else mean  # a NaN log-probability (Python's json reads NaN) ranks last


def _parsed(line: bytes, path: Path, number: int) -> dict[str, Any]:
    """A jsonl line as `mtx translate --format jsonl` writes it: a JSON object whose translation (`_best`) has a
    text; refused, naming the line, otherwise."""
    try:
        value = json.loads(line)
        if isinstance(_best(value).get("text"), str):
            return value
    except (ValueError, AttributeError, KeyError, IndexError, TypeError):
        pass
    raise MtxError(f"{path}, line {number}: not a translation as mtx translate --format jsonl writes one (a JSON "
                   "object with text, score, tokens and token_log_probs). Translate with --format jsonl, or give a "
                   "plain-text target file.")


def _best(value: dict[str, Any]) -> dict[str, Any]:
    """A jsonl line's translation: the line itself, or the first of its n-best list (an empty line's is empty)."""
    return value["nbest"][0] if value.get("nbest") else value


def _tsv_source(tsv: TsvSource, source_key: str) -> dict[str, SplitStream]:
    streams = {}
    for split in SPLITS:
        if getattr(tsv, split) is None:
            continue
        path = _existing(getattr(tsv, split), f"{source_key}.tsv.{split}")

        def chunks(path: Path = path, split: str = split) -> Iterator[list[RawPair]]:
            return _chunks(_tsv_pairs(path, strict=split != "train"))

        streams[split] = SplitStream(split, str(path), count_lines(path), chunks)
    return streams


def _tsv_pairs(path: Path, strict: bool) -> Iterator[RawPair]:
    """source<TAB>target per line. A line without exactly one tab is (None, None) in training data, which
    the cleaner counts as malformed; in valid/test every line matters, so it is an error."""
    for number, line in enumerate(_lines(path), 1):
        fields = line.split(b"\t")  # safe on bytes: a tab byte never occurs inside a UTF-8 sequence
        if len(fields) == 2:
            yield fields[0], fields[1]
        elif strict:
            raise MtxError(
                f"{path}, line {number}: expected source<TAB>target but found {len(fields)} tab-separated "
                "field(s). Valid and test lines are never dropped, so fix or remove this line."
            )
        else:
            yield None, None


# ------------------------------------------------------------------------------------- Hugging Face


def _hf_source(hf: HfSource, key: str, src_lang: str, tgt_lang: str) -> dict[str, SplitStream]:
    import datasets

    datasets.disable_progress_bars()
    where = f"{hf.path}" + (f" (config {hf.name})" if hf.name else "")
    try:
        if _is_saved_to_disk(Path(hf.path)):
            loaded = datasets.load_from_disk(hf.path)
            if isinstance(loaded, datasets.Dataset):
                loaded = datasets.DatasetDict(train=loaded)
        else:
            loaded = datasets.load_dataset(hf.path, hf.name, revision=hf.revision, streaming=True)
    except (ConnectionError, FileNotFoundError, ValueError, OSError) as e:
        raise MtxError(
            f"{key}.hf: could not load the dataset {where}: {e}. Give a hub id such as wmt/wmt14 "
            "(with network access or a filled datasets cache) or a local folder (save_to_disk output or "
            "parquet files), and a config name the dataset has (e.g. de-en)."
        ) from None
    if hf.splits.get("train") not in loaded:
        raise MtxError(
            f"{key}.hf.splits.train = {hf.splits.get('train')!r}: the dataset {where} has no such "
            f"split (it has: {', '.join(loaded)}). Map mtx's train split to one of them."
        )
    streams = {}
    for split in SPLITS:
        name = hf.splits.get(split)
        if name is None or name not in loaded:
            continue
        dataset = loaded[name]
        columns = _columns(dataset, key, where, src_lang, tgt_lang)
        total = len(dataset) if isinstance(dataset, datasets.Dataset) else _declared_rows(dataset, name)

        def chunks(dataset: Any = dataset, columns: tuple[str, ...] = columns) -> Iterator[list[RawPair]]:
            return _hf_chunks(dataset, columns, src_lang, tgt_lang)

        streams[split] = SplitStream(split, f"{where} [{name}]", total, chunks)
    return streams


def _is_saved_to_disk(path: Path) -> bool:
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _columns(dataset: Any, key: str, where: str, src_lang: str, tgt_lang: str) -> tuple[str, ...]:
    """WMT's layout, a `translation` column of {lang: text}, or one column per language."""
    features = dataset.features or {}
    if "translation" in features:
        langs = getattr(features["translation"], "languages", None) or list(features["translation"])
        missing = [lang for lang in (src_lang, tgt_lang) if lang not in langs]
        if missing:
            raise MtxError(
                f"data.src_lang/tgt_lang: the dataset {where} has no {', '.join(missing)} in its translation "
                f"column (it has: {', '.join(langs)}). Set data.src_lang and data.tgt_lang to those."
            )
        return ("translation",)
    if src_lang in features and tgt_lang in features:
        return (src_lang, tgt_lang)
    raise MtxError(
        f"{key}.hf: the dataset {where} has neither a translation column nor columns named "
        f"{src_lang!r} and {tgt_lang!r} (it has: {', '.join(features) or 'no declared columns'})."
    )


def _declared_rows(dataset: Any, name: str) -> int | None:
    splits = getattr(dataset.info, "splits", None) or {}
    return splits[name].num_examples if name in splits else None


def _hf_chunks(dataset: Any, columns: tuple[str, ...], src_lang: str, tgt_lang: str) -> Iterator[list[RawPair]]:
    for batch in dataset.iter(batch_size=CHUNK_PAIRS):
        if columns == ("translation",):
            yield [(row.get(src_lang) or "", row.get(tgt_lang) or "") for row in batch["translation"]]
        else:
            yield [(s or "", t or "") for s, t in zip(batch[src_lang], batch[tgt_lang], strict=True)]


# ---------------------------------------------------------------------------------------------- chunks


def _chunks(pairs: Iterator[RawPair]) -> Iterator[list[RawPair]]:
    while chunk := list(islice(pairs, CHUNK_PAIRS)):
        yield chunk


def _chunked_list(pairs: list[tuple[str, str]]) -> Callable[[], Iterator[list[RawPair]]]:
    def chunks() -> Iterator[list[RawPair]]:
        return (pairs[i : i + CHUNK_PAIRS] for i in range(0, len(pairs), CHUNK_PAIRS))

    return chunks
