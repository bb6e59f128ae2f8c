"""`mtx prepare`: a recipe's data section → a run's `data/` folder (its layout and reader: mtx.data.prepared).

The pipeline streams, so memory stays flat from the 10k-pair demo to WMT14 En-Fr's 40M pairs:

1. clean   — decode, normalize, filter each training pair (worker processes, a chunk at a time) and append
             the survivors to a work file, with an 8-byte hash per pair; valid/test are only normalized
             and land in `{split}.{lang}` as the references BLEU is computed against.
2. dedup   — the first occurrence of every hash is kept (one sorted array of hashes, 8 bytes a pair).
3. learn   — a joint byte-level BPE on an evenly spaced sample of the kept training text (mtx.tokenizer).
4. encode  — the fast batch encoder in worker processes; each split side becomes a flat token array
             (`{split}.{side}.tokens`, uint16 when the vocabulary fits) and int64 offsets
             (`{split}.{side}.offsets`, one more than pairs), both read back with np.memmap. Training pairs
             with a side longer than the model's `max_positions` in BPE tokens (EOS included) are dropped
             here (fairseq's size filter), since the trainer cannot hold them; only here are the BPE lengths
             known, so the BPE learnt in step 3 may still have seen those pairs. Valid/test are never filtered.

A source with gold word alignments (the demo corpus) also gets `{split}.align` beside valid/test's text: one
Pharaoh line per pair, line by line with `{split}.{lang}`, as nothing drops valid/test pairs.

Everything is written under `data.partial/` and renamed to `data/` at the very end, so an interrupted run
leaves nothing a later run would trust. `manifest.json` fingerprints the recipe's data section, the model's
`max_positions` and the input files, and re-running with all unchanged is a no-op, unless the reader's check
of the files (mtx.data.prepared.check_split_files) finds them damaged: then they are prepared again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, ProcessPoolExecutor
from contextlib import ExitStack, contextmanager
from multiprocessing import get_context
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from mtx import __version__
from mtx.config.recipe import BpeConfig, DataConfig, FilterConfig, Recipe, resolve_model, strip_nones
from mtx.data.corpora import CHUNK_PAIRS, RawPair, SplitStream, input_files, open_source
from mtx.data.prepared import FORMAT, SIDES, check_split_files, load_manifest
from mtx.errors import MtxError
from mtx.tokenizer import Tokenizer, normalize_text

FILTERS = ("invalid_utf8", "malformed", "empty", "length", "ratio", "duplicate", "max_positions")  # in order


def prepare(recipe: Recipe, workers: int | None = None, console: Console | None = None) -> dict[str, Any]:
    """Build (or reuse) `recipe.run_path / "data"` and return its manifest.

    Besides the data section, only `model.max_positions` matters here: training pairs the model cannot hold
    are dropped, so that one long line (an unspaced string, a script BPE splits finely) cannot stop training.
    """
    console = console or Console(stderr=True)
    workers = workers or _available_cores()
    data, max_positions = recipe.data, resolve_model(recipe.model).max_positions
    data_dir, partial = recipe.run_path / "data", recipe.run_path / "data.partial"
    fingerprint = _fingerprint(data, max_positions)
    if _up_to_date(data_dir, fingerprint):
        console.print(f"{data_dir} is up to date (same data recipe and input files): nothing to do.")
        return load_manifest(data_dir)

    with console.status("opening the source (checking files, counting lines, drawing the demo corpus)"):
        streams = open_source(data)  # checks files, alignment and dataset names before any long work
    started = time.monotonic()
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "work").mkdir(parents=True)
    try:
        with _progress(console) as progress:
            manifest = _build_data_folder(data, max_positions, streams, partial, workers, progress)
        manifest.update(fingerprint, seconds=round(time.monotonic() - started, 1))
        shutil.rmtree(partial / "work")
        _write_json(partial / "manifest.json", manifest)
        _replace_dir(partial, data_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    _print_summary(console, manifest, data_dir)
    return manifest


def _build_data_folder(data: DataConfig, max_positions: int, streams: dict[str, SplitStream], out: Path,
                       workers: int, progress: Progress) -> dict[str, Any]:
    """Write every split's text and token files and the tokenizer into `out`; the manifest describing them."""
    texts = {split: _text_files(data, split, out) for split in streams}
    with _pool(workers) as pool:
        counts, keep = _clean_train(streams["train"], data.filter, texts["train"], pool, workers, progress)
        eval_counts = {split: _clean_split(stream, None, texts[split], pool, workers, progress)[0]
                       for split, stream in streams.items() if split != "train"}
    for split, cleaned in eval_counts.items():
        _write_gold_alignments(streams[split], cleaned, out)

    sample = min(int(keep.sum()), data.bpe.max_lines)
    tokenizer = _learn_bpe(data.bpe, _bpe_lines(texts["train"], keep, sample), out, progress)

    dtype = "uint16" if tokenizer.vocab_size <= 1 << 16 else "uint32"
    with _pool(workers, (_init_encoder, (tokenizer.to_str(),))) as pool:
        train, counts["max_positions"] = _encode_split("train", texts["train"], keep, int(keep.sum()), max_positions,
                                                       dtype, out, pool, workers, progress)
        if train["pairs"] == 0:
            raise MtxError(
                f"No training pairs are left after filtering {streams['train'].origin}: "
                f"{_describe_drops(counts)}. Every pair the other filters kept has a side longer than "
                f"model.max_positions = {max_positions} BPE tokens (EOS included): raise "
                "model.max_positions, or check the files."
            )
        splits = {"train": train}
        for split, cleaned in eval_counts.items():
            splits[split], _ = _encode_split(split, texts[split], None, cleaned["read"], None, dtype, out, pool,
                                             workers, progress)
            splits[split]["invalid_utf8_replaced"] = cleaned["invalid_utf8"]
    return _manifest(data, streams, tokenizer, dtype, sample, counts, max_positions, splits)


def _text_files(data: DataConfig, split: str, out: Path) -> tuple[Path, Path]:
    """Where a split's cleaned text goes: valid/test's stays, as BLEU's references; train's is only work."""
    if split == "train":
        return out / "work" / "train.src", out / "work" / "train.tgt"
    return out / f"{split}.{data.src_lang}", out / f"{split}.{data.tgt_lang}"


def _write_gold_alignments(stream: SplitStream, cleaned: Counter, out: Path) -> None:
    """`{split}.align`, the source's gold alignment of each pair, where it has them (the demo corpus)."""
    if stream.alignments is None:
        return
    assert cleaned["read"] == len(stream.alignments) and not cleaned["malformed"], "alignments out of step"
    _write_lines_to(out / f"{stream.split}.align", stream.alignments)


def _learn_bpe(bpe: BpeConfig, lines: Iterator[str], out: Path, progress: Progress) -> Tokenizer:
    task = progress.add_task(f"learning BPE ({bpe.vocab_size:,} tokens)", total=None)
    tokenizer = Tokenizer.train(lines, bpe.vocab_size, bpe.min_frequency)
    tokenizer.save(out / "tokenizer.json")
    progress.update(task, total=1, completed=1)
    return tokenizer


def _manifest(data: DataConfig, streams: dict[str, SplitStream], tokenizer: Tokenizer, dtype: str, sample: int,
              counts: Counter, max_positions: int, splits: dict[str, dict[str, int]]) -> dict[str, Any]:
    """What was prepared from what, and what each filter dropped (the fingerprint is added by `prepare`)."""
    remaining, after = {}, counts["read"]
    for name in FILTERS:
        after -= counts[name]
        remaining[name] = after
    return {
        "mtx_version": __version__,
        "format": FORMAT,
        "source": {"kind": data.source.kind, **{s: streams[s].origin for s in streams}},
        "src_lang": data.src_lang,
        "tgt_lang": data.tgt_lang,
        "vocab_size": tokenizer.vocab_size,
        "token_dtype": dtype,
        "tokenizer_sha256": tokenizer.sha256,
        "bpe": {"vocab_size_requested": data.bpe.vocab_size, "min_frequency": data.bpe.min_frequency,
                "sampled_pairs": sample},
        "filter": {"read": counts["read"], "dropped": {n: counts[n] for n in FILTERS},
                   "remaining": remaining, "kept": splits["train"]["pairs"], "max_positions": max_positions},
        "splits": splits,
    }


# ------------------------------------------------------------------------------------------------ clean


def _clean_train(stream: SplitStream, filt: FilterConfig, texts: tuple[Path, Path], pool: Executor | None,
                 workers: int, progress: Progress) -> tuple[Counter, np.ndarray]:
    """Clean the training split, then dedup it: (counts by filter, a mask of the pairs kept)."""
    counts, hashes = _clean_split(stream, filt, texts, pool, workers, progress)
    keep = _first_occurrences(hashes)
    counts["duplicate"] = len(keep) - int(keep.sum()) if filt.dedup else 0
    if not filt.dedup:
        keep[:] = True
    if int(keep.sum()) == 0:
        raise MtxError(
            f"No training pairs are left after filtering {stream.origin}: "
            f"{_describe_drops(counts)}. Check the files and data.filter (min_len, max_len, max_ratio)."
        )
    return counts, keep


def _clean_split(stream: SplitStream, filt: FilterConfig | None, texts: tuple[Path, Path], pool: Executor | None,
                 workers: int, progress: Progress) -> tuple[Counter, np.ndarray]:
    """Normalize a split into its two text files, in chunks on the workers; (counts, one hash per kept pair).

    With a filter (training data) rejected pairs are dropped and counted by reason; without one (valid/test)
    every pair is kept and `counts["invalid_utf8"]` counts those repaired with U+FFFD.
    """
    counts: Counter = Counter({name: 0 for name in FILTERS})
    hashes = []
    verb = "cleaning" if filt is not None else "reading"
    task = progress.add_task(f"{verb} {stream.split} ({stream.origin})", total=stream.total)
    with open(texts[0], "w", encoding="utf-8", newline="\n") as src_out, \
            open(texts[1], "w", encoding="utf-8", newline="\n") as tgt_out:
        jobs = ((chunk, filt) for chunk in stream.chunks())
        for srcs, tgts, chunk_hashes, chunk_counts in _ordered_map(_clean_chunk, jobs, pool, workers):
            _write_lines(src_out, srcs)
            _write_lines(tgt_out, tgts)
            hashes.append(chunk_hashes)
            counts.update(chunk_counts)
            progress.advance(task, chunk_counts["read"])
    return counts, np.concatenate(hashes) if hashes else np.zeros(0, dtype=np.uint64)


def _clean_chunk(pairs: list[RawPair], filt: FilterConfig | None
                 ) -> tuple[list[str], list[str], np.ndarray, Counter]:
    """Normalize a chunk; with a filter (training data) also drop what it rejects, counting each reason.

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
            if filt is not None:
                continue
            src, tgt = _decode(raw_src, "replace"), _decode(raw_tgt, "replace")
        src, tgt = normalize_text(src), normalize_text(tgt)
        if filt is not None:
            reason = _rejection(src, tgt, filt)
            if reason:
                counts[reason] += 1
                continue
            digests.append(hashlib.blake2b(f"{src}\t{tgt}".encode(), digest_size=8).digest())
        srcs.append(src)
        tgts.append(tgt)
    return srcs, tgts, np.frombuffer(b"".join(digests), dtype=np.uint64), counts


def _decode(side: bytes | str, errors: str) -> str:
    return side if isinstance(side, str) else side.decode("utf-8", errors=errors)


def _rejection(src: str, tgt: str, filt: FilterConfig) -> str | None:
    """Why clean-corpus-n.perl would drop this pair, or None. Lengths are in whitespace-separated words."""
    if not src or not tgt:
        return "empty"
    src_words, tgt_words = src.count(" ") + 1, tgt.count(" ") + 1
    if not (filt.min_len <= src_words <= filt.max_len and filt.min_len <= tgt_words <= filt.max_len):
        return "length"
    if filt.max_ratio and max(src_words, tgt_words) / min(src_words, tgt_words) > filt.max_ratio:
        return "ratio"
    return None


def _first_occurrences(hashes: np.ndarray) -> np.ndarray:
    """A mask keeping the first pair of every distinct hash: memory is a sort of 8-byte keys, not a set."""
    keep = np.zeros(len(hashes), dtype=bool)
    keep[np.unique(hashes, return_index=True)[1]] = True
    return keep


def _describe_drops(counts: Counter) -> str:
    drops = ", ".join(f"{counts[n]:,} {n.replace('_', ' ')}" for n in FILTERS if counts[n])
    return f"{counts['read']:,} read" + (f"; dropped {drops}" if drops else "")


# ---------------------------------------------------------------------------------------------- encode


def _bpe_lines(texts: tuple[Path, Path], keep: np.ndarray, sample: int) -> Iterator[str]:
    """Source and target lines of `sample` kept pairs, evenly spaced through the corpus."""
    total = int(keep.sum())
    rank = 0
    for (src, tgt), kept in zip(_read_pairs(texts), keep, strict=True):
        if not kept:
            continue
        if (rank * sample) // total != ((rank + 1) * sample) // total:
            yield src
            yield tgt
        rank += 1


def _read_pairs(texts: tuple[Path, Path]) -> Iterator[tuple[str, str]]:
    with open(texts[0], encoding="utf-8", newline="\n") as src, \
            open(texts[1], encoding="utf-8", newline="\n") as tgt:
        for s, t in zip(src, tgt, strict=True):
            yield s.rstrip("\n"), t.rstrip("\n")


def _encode_split(split: str, texts: tuple[Path, Path], keep: np.ndarray | None, pairs: int,
                  max_positions: int | None, dtype: str, out: Path, pool: Executor | None, workers: int,
                  progress: Progress) -> tuple[dict[str, int], int]:
    """Encode a split's kept pairs into its token and offset files; (its counts, pairs dropped as too long).

    With `max_positions` (training data only) a pair with a side longer than that, EOS included, is dropped.
    """
    task = progress.add_task(f"encoding {split}", total=pairs)
    dropped = 0
    totals = {"pairs": 0, "src_tokens": 0, "tgt_tokens": 0}
    with ExitStack() as stack:
        files = {side: (stack.enter_context(open(out / f"{split}.{side}.tokens", "wb")),
                        stack.enter_context(open(out / f"{split}.{side}.offsets", "wb")))
                 for side in SIDES}
        for _, offsets in files.values():
            np.zeros(1, dtype=np.int64).tofile(offsets)
        jobs = ((chunk, dtype, max_positions) for chunk in _kept_chunks(texts, keep))
        for encoded, too_long in _ordered_map(_encode_chunk, jobs, pool, workers):
            for side, (ids, lens) in zip(SIDES, encoded, strict=True):
                tokens, offsets = files[side]
                ids.tofile(tokens)
                (totals[f"{side}_tokens"] + np.cumsum(lens, dtype=np.int64)).tofile(offsets)
                totals[f"{side}_tokens"] += int(lens.sum())
            totals["pairs"] += len(lens)
            dropped += too_long
            progress.advance(task, len(lens) + too_long)
    return totals, dropped


def _kept_chunks(texts: tuple[Path, Path], keep: np.ndarray | None) -> Iterator[tuple[list[str], list[str]]]:
    srcs: list[str] = []
    tgts: list[str] = []
    for i, (src, tgt) in enumerate(_read_pairs(texts)):
        if keep is not None and not keep[i]:
            continue
        srcs.append(src)
        tgts.append(tgt)
        if len(srcs) == CHUNK_PAIRS:
            yield srcs, tgts
            srcs, tgts = [], []
    if srcs:
        yield srcs, tgts


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
    ids = [_encoder.encode_batch(texts) for texts in chunk]
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


def _fingerprint(data: DataConfig, max_positions: int) -> dict[str, Any]:
    """What the prepared data depends on: the data section, the model's max_positions (the token-length filter;
    no other model or train setting) and the input files."""
    section = json.dumps({**strip_nones(dataclasses.asdict(data)), "model.max_positions": max_positions},
                         sort_keys=True)
    return {
        "recipe_sha256": hashlib.sha256(section.encode()).hexdigest(),
        "inputs": [[str(p), p.stat().st_size, p.stat().st_mtime_ns] for p in input_files(data) if p.is_file()],
    }


def _up_to_date(data_dir: Path, fingerprint: dict[str, Any]) -> bool:
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


# ------------------------------------------------------------------------------------------- reporting


def _progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console)


def _print_summary(console: Console, manifest: dict[str, Any], data_dir: Path) -> None:
    filters = Table(title="training data filters", title_justify="left")
    for column in ("step", "dropped", "pairs left"):
        filters.add_column(column, justify="left" if column == "step" else "right")
    stats = manifest["filter"]
    filters.add_row("read", "", f"{stats['read']:,}")
    for name in FILTERS:
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
    console.print(splits)
    console.print(f"prepared in {manifest['seconds']:.1f}s")
