"""`mtx prepare`: a recipe's data section → a run's `data/` folder (its layout and reader: mtx.data.prepared).

The pipeline streams, so memory stays flat from the 10k-pair demo to WMT14 En-Fr's 40M pairs:

1. clean   — decode, normalize, filter each training pair (worker processes, a chunk at a time) and append
             the survivors to a work file, with an 8-byte hash per pair; valid/test are only normalized
             and land in `{split}.{lang}` as the references BLEU is computed against.
2. dedup   — the first occurrence of every hash is kept (one sorted array of hashes, 8 bytes a pair).
3. learn   — a joint byte-level BPE on an evenly spaced sample of the kept training text (mtx.data.vocabulary),
             unless `data.bpe.from` names a vocabulary to encode with.
4. encode  — the fast batch encoder in worker processes; each split side becomes a flat token array
             (`{split}.{side}.tokens`, uint16 when the vocabulary fits) and int64 offsets
             (`{split}.{side}.offsets`, one more than pairs), both read back with np.memmap. Training pairs
             with a side longer than the model's `max_positions` in BPE tokens (EOS included) are dropped
             here (fairseq's size filter), since the trainer cannot hold them; only here are the BPE lengths
             known, so the BPE learnt in step 3 may still have seen those pairs. Valid/test are never filtered.
5. lexicon — only with `data.lexicon.learn`: the lexical translation table of the training pairs, or of an
             evenly spread sample of `data.lexicon.pairs` of them (mtx.data.lexicon), `lexicon.npz`, which
             decoding shortlists are made of. It is learnt on its own: a data folder that is up to date but
             lacks it, or holds one of other `data.lexicon` settings, gets it learnt without the steps above.
             Without `learn` no lexicon work is done, and a table already in the folder is left as it is.

A recipe with several corpora (`data.sources`) has each cleaned and filtered on its own, into its own work files,
and counted on its own in the manifest; dedup runs across them (the first occurrence, in corpus order, wins, and
a duplicate counts against the corpus it is found in). Each split holds the corpora that have it one after the
other, so a corpus is a contiguous range of the train split, which the manifest's per-corpus counts give: the
trainer repeats a range for a corpus' weight (mtx.train.run_data). A tagged corpus' sources begin with its tag
tokens (`DataConfig.source_prefix`: the target-language tag of a model of several target languages, then the
corpus' own tag): in valid/test's text, as `tag + " "` before each source line (what BLEU and `mtx translate`
read); in the training pairs, added when they are encoded, so that dedup and the BPE see the untagged text. Each
corpus is cleaned for its own languages (`data.sources[i].src_lang`, `tgt_lang`).

A source with gold word alignments (the demo corpus) also gets `{split}.align` beside valid/test's text: one
Pharaoh line per pair, line by line with `{split}.{lang}`, as nothing drops valid/test pairs; with several
corpora, only if each corpus of that split has them.

Everything is written under `data.partial/` and renamed to `data/` at the very end, so an interrupted run
leaves nothing a later run would trust. `manifest.json` (mtx.data.manifest) fingerprints the recipe's data
section (without the corpora's weights), the model's `max_positions` and the input files (data.bpe.from's too),
and re-running with all unchanged is a no-op, unless the reader's check of the files
(mtx.data.prepared.check_split_files) finds them damaged: then they are prepared again.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from itertools import islice
from multiprocessing import get_context
from pathlib import Path
from typing import Any, TextIO

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from mtx.config.data import DataConfig, LexiconConfig
from mtx.config.model import resolve_model
from mtx.config.recipe import Recipe
from mtx.data.cleaning import PairCleaner, unidentifiable
from mtx.data.corpora import CHUNK_PAIRS, SPLITS, RawPair, SplitStream, open_corpora
from mtx.data.lexicon import Lexicon, learn_lexicon, sample_size
from mtx.data.manifest import FILTERS, build_manifest, describe_drops, fingerprint, origins, print_summary, up_to_date
from mtx.data.prepared import SIDES, load_manifest, load_split
from mtx.data.vocabulary import borrowed_tokenizer, learn_tokenizer
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer, normalize_text

# Pairs as the encoder reads them: cleaned text files, which of their pairs to keep (None: all), what to put before
# each source (its tags and a space after each; "": nothing, or the text has it): a corpus' training pairs, or a
# valid or test split.
TextPart = tuple[tuple[Path, Path], np.ndarray | None, str]


def prepare(recipe: Recipe, workers: int | None = None, console: Console | None = None) -> dict[str, Any]:
    """Build (or reuse) `recipe.run_path / "data"` and return its manifest.

    Besides the data section, only `model.max_positions` matters here: training pairs the model cannot hold
    are dropped, so that one long line (an unspaced string, a script BPE splits finely) cannot stop training.
    """
    console = console or Console(stderr=True)
    workers = workers or _available_cores()
    data, max_positions = recipe.data, resolve_model(recipe.model).max_positions
    data_dir, partial = recipe.run_path / "data", recipe.run_path / "data.partial"
    borrowed = borrowed_tokenizer(data)  # data.bpe.from read, and the tags checked against it, before any work
    _check_identifiable(data)
    stamp = fingerprint(data, max_positions)
    if up_to_date(data_dir, stamp):
        if not data.lexicon.learn or lexicon_is_current(data_dir, data.lexicon):
            console.print(f"{data_dir} is up to date (same data recipe and input files): nothing to do.")
        else:
            with _progress(console) as progress:
                learn_data_lexicon(data_dir, data.lexicon, progress)
        return load_manifest(data_dir)

    with console.status("opening the corpora (checking files, counting lines, drawing the demo corpus)"):
        corpora = open_corpora(data)  # checks files, alignment and dataset names before any long work
    started = time.monotonic()
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "work").mkdir(parents=True)
    try:
        with _progress(console) as progress:
            manifest = _build_data_folder(data, max_positions, corpora, borrowed, partial, workers, progress)
            manifest.update(stamp, seconds=round(time.monotonic() - started, 1))
            shutil.rmtree(partial / "work")
            _write_json(partial / "manifest.json", manifest)
            if data.lexicon.learn:
                learn_data_lexicon(partial, data.lexicon, progress)
        _replace_dir(partial, data_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    print_summary(console, manifest, data_dir)
    return manifest


def _check_identifiable(data: DataConfig) -> None:
    """With data.filter.language_id, refuse a corpus language that identification does not know, naming its key."""
    if not data.filter.language_id:
        return
    PairCleaner(data.filter, data.src_lang, data.tgt_lang)  # names the extra mtx[langid] if it is missing
    for i, corpus in enumerate(data.corpora):
        for side in ("src_lang", "tgt_lang"):
            lang = getattr(corpus, side)
            if (problem := unidentifiable(lang)) is not None:
                own = data.sources is not None and getattr(data.sources[i], side) is not None
                raise MtxError(f"{data.corpus_key(i) if own else 'data'}.{side} = {lang!r} {problem}.")


def _build_data_folder(data: DataConfig, max_positions: int, corpora: list[dict[str, SplitStream]],
                       borrowed: Tokenizer | None, out: Path, workers: int, progress: Progress) -> dict[str, Any]:
    """Write every split's text and token files and the tokenizer into `out`; the manifest describing them."""
    named = data.corpora
    eval_splits = [split for split in SPLITS[1:] if any(split in streams for streams in corpora)]
    texts = {split: (out / f"{split}.{data.src_lang}", out / f"{split}.{data.tgt_lang}") for split in eval_splits}
    with _pool(workers) as pool:
        cleaners = [PairCleaner(data.filter, corpus.src_lang, corpus.tgt_lang) for corpus in named]
        counts, keeps = _clean_train([streams["train"] for streams in corpora], cleaners, out, pool, workers, progress)
        read = {split: _clean_eval(split, corpora, [data.source_prefix(c) for c in named], texts[split], pool,
                                   workers, progress)
                for split in eval_splits}
    for split in eval_splits:
        _write_gold_alignments(split, [streams.get(split) for streams in corpora], read[split], out)

    parts: list[TextPart] = [(_work_files(out, i), keep, data.source_prefix(corpus))
                              for i, (keep, corpus) in enumerate(zip(keeps, named, strict=True))]
    kept = sum(int(keep.sum()) for keep in keeps)
    sample = min(kept, data.bpe.max_lines)
    kept_pairs = (pair for texts, keep, _ in parts for pair in _kept_pairs(texts, keep))
    tokenizer = borrowed or learn_tokenizer(data, kept_pairs, kept, sample, progress)
    tokenizer.save(out / "tokenizer.json")

    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
    with _pool(workers, (_init_encoder, (tokenizer.to_str(),))) as pool:
        train, too_long = _encode_split("train", parts, kept, max_positions, dtype, out, pool, workers, progress)
        for corpus_counts, dropped in zip(counts, too_long, strict=True):
            corpus_counts["max_positions"] = dropped
        if train["pairs"] == 0:
            raise MtxError(
                f"No training pairs are left after filtering {origins(corpora, 'train')}: "
                f"{describe_drops(sum(counts, Counter()))}. Every pair the other filters kept has a side longer "
                f"than model.max_positions = {max_positions} BPE tokens (EOS included): raise "
                "model.max_positions, or check the files."
            )
        splits = {"train": train}
        for split in eval_splits:
            pairs = sum(c["read"] for c in read[split] if c is not None)
            splits[split], _ = _encode_split(split, [(texts[split], None, "")], pairs, None, dtype, out, pool,
                                             workers, progress)
            splits[split]["invalid_utf8_replaced"] = sum(c["invalid_utf8"] for c in read[split] if c is not None)
    return build_manifest(data, corpora, tokenizer, dtype, sample, counts, read, max_positions, splits)


def lexicon_is_current(data_dir: Path, settings: LexiconConfig) -> bool:
    """Whether `data_dir` holds a lexical table learnt with `settings`: its iterations and width, and from as many
    training pairs as `settings.pairs` lets it read (a table that does not record them was learnt from all)."""
    lexicon = Lexicon.load(data_dir)
    if lexicon is None or (lexicon.iterations, lexicon.width) != (settings.iterations, settings.width):
        return False
    split_pairs = len(load_split(data_dir, "train"))
    return (split_pairs if lexicon.pairs is None else lexicon.pairs) == sample_size(split_pairs, settings.pairs)


def learn_data_lexicon(data_dir: Path, settings: LexiconConfig, progress: Progress) -> None:
    """Learn the lexical table of `data_dir`'s training split (mtx.data.lexicon) into it."""
    split = load_split(data_dir, "train")
    vocab_size = Tokenizer.from_file(data_dir / "tokenizer.json").vocab_size
    pairs = sample_size(len(split), settings.pairs)
    read = f"{pairs:,} pairs" + ("" if pairs == len(split) else f" of {len(split):,}, evenly spread")
    task = progress.add_task(f"lexical table (IBM Model 1, {settings.iterations} iterations, {read})",
                             total=(settings.iterations + 2) * pairs)
    learn_lexicon(split, vocab_size, settings.width, settings.iterations, settings.pairs,
                  lambda pairs: progress.advance(task, pairs)).save(data_dir)


def _work_files(out: Path, corpus: int) -> tuple[Path, Path]:
    """Where a corpus' cleaned training text goes: work, which the encoder and the BPE read, then deleted."""
    return out / "work" / f"train.{corpus}.src", out / "work" / f"train.{corpus}.tgt"


def _write_gold_alignments(split: str, streams: list[SplitStream | None], read: list[Counter | None], out: Path
                           ) -> None:
    """`{split}.align`, the gold alignment of each pair, where every corpus of the split has them (the demo's)."""
    present = [(stream, counts) for stream, counts in zip(streams, read, strict=True) if stream is not None]
    if any(stream.alignments is None for stream, _ in present):
        return
    assert all(c["read"] == len(s.alignments) and not c["malformed"] for s, c in present), "alignments out of step"
    _write_lines_to(out / f"{split}.align", [line for stream, _ in present for line in stream.alignments])


# ------------------------------------------------------------------------------------------------ clean


def _clean_train(streams: list[SplitStream], cleaners: list[PairCleaner], out: Path, pool: Executor | None,
                 workers: int, progress: Progress) -> tuple[list[Counter], list[np.ndarray]]:
    """Clean each corpus' training split into its work files, each by its cleaner (the corpus' languages), then
    dedup them together: (counts by filter, a mask of the pairs kept), per corpus. A duplicate of a pair of an
    earlier corpus counts against the later."""
    counts, hashes = [], []
    for i, (stream, cleaner) in enumerate(zip(streams, cleaners, strict=True)):
        with _writing(_work_files(out, i)) as writers:
            corpus_counts, corpus_hashes = _clean_split(stream, cleaner, writers, "", pool, workers, progress)
        counts.append(corpus_counts)
        hashes.append(corpus_hashes)
    keep = (_first_occurrences(np.concatenate(hashes)) if cleaners[0].filt.dedup
            else np.ones(sum(map(len, hashes)), dtype=bool))
    keeps = np.split(keep, np.cumsum([len(h) for h in hashes])[:-1])
    for corpus_counts, corpus_keep in zip(counts, keeps, strict=True):
        corpus_counts["duplicate"] = len(corpus_keep) - int(corpus_keep.sum())
    if not keep.any():
        raise MtxError(
            f"No training pairs are left after filtering {'; '.join(stream.origin for stream in streams)}: "
            f"{describe_drops(sum(counts, Counter()))}. Check the files and data.filter."
        )
    return counts, keeps


def _clean_eval(split: str, corpora: list[dict[str, SplitStream]], prefixes: list[str],
                texts: tuple[Path, Path], pool: Executor | None, workers: int, progress: Progress
                ) -> list[Counter | None]:
    """Normalize a valid or test split, corpus after corpus, into the text files BLEU and `mtx translate` read,
    a tagged corpus' source lines beginning with its `prefixes` entry (its tags); the counts per corpus (None: it
    has no such split)."""
    read: list[Counter | None] = []
    with _writing(texts) as writers:
        for streams, prefix in zip(corpora, prefixes, strict=True):
            stream = streams.get(split)
            read.append(None if stream is None else
                        _clean_split(stream, None, writers, prefix, pool, workers, progress)[0])
    return read


@contextmanager
def _writing(texts: tuple[Path, Path]) -> Iterator[tuple[TextIO, TextIO]]:
    with open(texts[0], "w", encoding="utf-8", newline="\n") as src, \
            open(texts[1], "w", encoding="utf-8", newline="\n") as tgt:
        yield src, tgt


def _clean_split(stream: SplitStream, cleaner: PairCleaner | None, writers: tuple[TextIO, TextIO], prefix: str,
                 pool: Executor | None, workers: int, progress: Progress) -> tuple[Counter, np.ndarray]:
    """Normalize a split into its two text files, in chunks on the workers; (counts, one hash per kept pair).

    With a cleaner (training data) rejected pairs are dropped and counted by reason; without one (valid/test)
    every pair is kept and `counts["invalid_utf8"]` counts those repaired with U+FFFD. Each source line begins
    with `prefix` (a corpus' tags, each followed by a space).
    """
    counts: Counter = Counter({name: 0 for name in FILTERS})
    for name, dropped in stream.dropped_before.items():  # pairs the source left out before they were read here
        counts.update({"read": dropped, name: dropped})
    hashes = []
    verb = "cleaning" if cleaner is not None else "reading"
    task = progress.add_task(f"{verb} {stream.split} ({stream.origin})", total=stream.total)
    jobs = ((chunk, cleaner) for chunk in stream.chunks())
    for srcs, tgts, chunk_hashes, chunk_counts in _ordered_map(_clean_chunk, jobs, pool, workers):
        _write_lines(writers[0], [prefix + src for src in srcs] if prefix else srcs)
        _write_lines(writers[1], tgts)
        hashes.append(chunk_hashes)
        counts.update(chunk_counts)
        progress.advance(task, chunk_counts["read"])
    return counts, np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)


def _clean_chunk(pairs: list[RawPair], cleaner: PairCleaner | None
                 ) -> tuple[list[str], list[str], np.ndarray, Counter]:
    """Normalize a chunk; with a cleaner (training data) also drop what it rejects, counting each reason.

    Without one (valid/test) nothing is dropped: undecodable bytes become U+FFFD and are counted.
    """
    counts: Counter = Counter(read=len(pairs))
    srcs, tgts, digests = [], [], []
    for raw_src, raw_tgt in pairs:
        if raw_src is None or raw_tgt is None:
            counts["malformed"] += 1
            continue
        try:
            src, tgt = _decode(raw_src, "strict"), _decode(raw_tgt, "strict")
        except UnicodeDecodeError:
            counts["invalid_utf8"] += 1
            if cleaner is not None:
                continue
            src, tgt = _decode(raw_src, "replace"), _decode(raw_tgt, "replace")
        src, tgt = normalize_text(src), normalize_text(tgt)
        if cleaner is not None:
            reason = _rejection(src, tgt, cleaner)
            if reason:
                counts[reason] += 1
                continue
            digests.append(hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest())
        srcs.append(src)
        tgts.append(tgt)
    return srcs, tgts, np.frombuffer(b"".join(digests), dtype=np.uint64), counts


def _decode(side: bytes | str, errors: str) -> str:
    return side if isinstance(side, str) else side.decode("utf-8", errors=errors)


def _rejection(src: str, tgt: str, cleaner: PairCleaner) -> str | None:
    """Why this pair is dropped, or None: clean-corpus-n.perl's rules first (lengths in whitespace-separated
    words), then the filters of crawled corpora the recipe turned on (mtx.data.cleaning)."""
    if not src or not tgt:
        return "empty"
    filt = cleaner.filt
    src_words, tgt_words = src.count(" ") + 1, tgt.count(" ") + 1
    if not (filt.min_len <= src_words <= filt.max_len and filt.min_len <= tgt_words <= filt.max_len):
        return "length"
    if filt.max_ratio and max(src_words, tgt_words) / min(src_words, tgt_words) > filt.max_ratio:
        return "ratio"
    return cleaner(src, tgt)


def _first_occurrences(hashes: np.ndarray) -> np.ndarray:
    """A mask keeping the first pair of every distinct hash: memory is a sort of 8-byte keys, not a set."""
    keep = np.zeros(len(hashes), dtype=bool)
    keep[np.unique(hashes, return_index=True)[1]] = True
    return keep


# ---------------------------------------------------------------------------------------------- encode


def _read_pairs(texts: tuple[Path, Path]) -> Iterator[tuple[str, str]]:
    with open(texts[0], encoding="utf-8", newline="\n") as src, \
            open(texts[1], encoding="utf-8", newline="\n") as tgt:
        for s, t in zip(src, tgt, strict=True):
            yield s.rstrip("\n"), t.rstrip("\n")


def _kept_pairs(texts: tuple[Path, Path], keep: np.ndarray | None) -> Iterator[tuple[str, str]]:
    """The pairs of the text files that `keep` marks (None: all)."""
    for i, pair in enumerate(_read_pairs(texts)):
        if keep is None or keep[i]:
            yield pair


def _encode_split(split: str, parts: list[TextPart], pairs: int, max_positions: int | None, dtype: str, out: Path,
                  pool: Executor | None, workers: int, progress: Progress) -> tuple[dict[str, int], list[int]]:
    """Encode a split's kept pairs, part after part (corpus after corpus), into its token and offset files; (its
    counts, the pairs of each part dropped as too long).

    With `max_positions` (training data only) a pair with a side longer than that, EOS included, is dropped.
    """
    task = progress.add_task(f"encoding {split}", total=pairs)
    dropped = []
    totals = {"pairs": 0, "src_tokens": 0, "tgt_tokens": 0}
    with ExitStack() as stack:
        files = {side: (stack.enter_context(open(out / f"{split}.{side}.tokens", "wb")),
                        stack.enter_context(open(out / f"{split}.{side}.offsets", "wb")))
                 for side in SIDES}
        for _, offsets in files.values():
            np.zeros(1, dtype=np.int64).tofile(offsets)
        for texts, keep, prefix in parts:
            dropped.append(0)
            jobs = ((chunk, dtype, max_positions) for chunk in _kept_chunks(texts, keep, prefix))
            for encoded, too_long in _ordered_map(_encode_chunk, jobs, pool, workers):
                for side, (ids, lens) in zip(SIDES, encoded, strict=True):
                    tokens, offsets = files[side]
                    ids.tofile(tokens)
                    (totals[f"{side}_tokens"] + np.cumsum(lens, dtype=np.int64)).tofile(offsets)
                    totals[f"{side}_tokens"] += int(lens.sum())
                totals["pairs"] += len(lens)
                dropped[-1] += too_long
                progress.advance(task, len(lens) + too_long)
    return totals, dropped


def _kept_chunks(texts: tuple[Path, Path], keep: np.ndarray | None, prefix: str
                 ) -> Iterator[tuple[list[str], list[str]]]:
    """The kept pairs in chunks of sources and targets; a tagged corpus' sources begin with `prefix`, its tags
    each followed by a space, which the encoder turns into the tags' ids."""
    pairs = _kept_pairs(texts, keep)
    while chunk := list(islice(pairs, CHUNK_PAIRS)):
        yield [prefix + src for src, _ in chunk], [tgt for _, tgt in chunk]


_encoder: Tokenizer | None = None  # set in each worker process (or the main one) by _init_encoder


def _init_encoder(tokenizer_json: str) -> None:
    global _encoder
    _encoder = Tokenizer.from_str(tokenizer_json)


def _encode_chunk(chunk: tuple[list[str], list[str]], dtype: str, max_positions: int | None
                  ) -> tuple[list[tuple[np.ndarray, np.ndarray]], int]:
    """Per side: the kept pairs' ids concatenated, and each sentence's length; and how many pairs were dropped.

    With `max_positions` a pair is dropped when either side plus its EOS is longer: the worker knows the
    lengths, so the filter costs no second pass.
    """
    assert _encoder is not None, "_init_encoder must run first"
    ids = [_encoder.encode_batch(texts, target=side == "tgt") for side, texts in zip(SIDES, chunk, strict=True)]
    lens = [np.fromiter((len(x) for x in side), dtype=np.int64, count=len(side)) for side in ids]
    fits = np.ones(len(lens[0]), dtype=bool)
    if max_positions is not None:
        fits = np.maximum(*lens) + 1 <= max_positions
    encoded = []
    for side_ids, side_lens in zip(ids, lens, strict=True):
        kept = side_lens[fits]
        flat = np.fromiter((t for x, ok in zip(side_ids, fits, strict=True) if ok for t in x), dtype=dtype,
                           count=int(kept.sum()))
        encoded.append((flat, kept))
    return encoded, len(fits) - int(fits.sum())


# ----------------------------------------------------------------------------------------- parallelism


def _available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextmanager
def _pool(workers: int, init: tuple[Callable[..., None], tuple[Any, ...]] | None = None
          ) -> Iterator[Executor | None]:
    """Worker processes for more than one worker; None means "run in this process".

    Each worker uses one core: the tokenizer's own Rust thread pool is switched off, in the workers and —
    while the pool is in use — in this process, so `--workers N` means N busy cores.
    """
    initializer, initargs = init or (None, ())
    with _tokenizers_parallelism(False):
        if workers == 1:
            if initializer:
                initializer(*initargs)
            yield None
            return
        pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=initializer,
                                   initargs=initargs)
        try:
            yield pool
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _tokenizers_parallelism(enabled: bool) -> Iterator[None]:
    before = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if enabled else "false"
    try:
        yield
    finally:
        if before is None:
            del os.environ["TOKENIZERS_PARALLELISM"]
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = before


def _ordered_map(fn: Callable[..., Any], jobs: Iterable[tuple[Any, ...]], pool: Executor | None,
                 workers: int) -> Iterator[Any]:
    """`fn(*job)` for every job, in order, with at most two jobs per worker in flight (bounded memory)."""
    if pool is None:
        yield from (fn(*job) for job in jobs)
        return
    pending: deque = deque()
    for job in jobs:
        pending.append(pool.submit(fn, *job))
        if len(pending) >= 2 * workers:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


# ------------------------------------------------------------------------------------ files, manifest


def _write_lines(handle: Any, lines: list[str]) -> None:
    if lines:
        handle.write("\n".join(lines) + "\n")


def _write_lines_to(path: Path, lines: list[str]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as handle:
        _write_lines(handle, lines)


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _replace_dir(new: Path, target: Path) -> None:
    """Swap `new` in for `target` with renames, so `target` is either the old data or the complete new."""
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    new.rename(target)
    shutil.rmtree(old, ignore_errors=True)


# ------------------------------------------------------------------------------------------- reporting


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


