"""Scoring translations: sacreBLEU's BLEU, chrF and TER, and the paper's tokenized BLEU.

sacreBLEU scores detokenized text with a fixed, published tokenization, so its numbers can be compared across
papers; its signature says exactly how a number was made. The paper (Vaswani et al., 2017) reported tokenized
BLEU instead, computed by tensor2tensor's `get_ende_bleu.sh`: Moses `tokenizer.perl -l de`, then hyphenated
compounds split as `rich ##AT##-##AT## text`, then `multi-bleu.perl`. `--paper-bleu` reproduces that pipeline
without Perl, so our figures can be set next to the paper's 27.3 / 28.4.

Nothing here imports torch: `mtx score` must start at once, and the trainer reuses `corpus_bleu` as is.
"""

from __future__ import annotations

import difflib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from mtx.errors import MtxError

METRICS = ("bleu", "chrf", "ter")
TOKENIZERS = ("13a", "intl", "zh", "none")

# How many times the paired bootstrap resamples the test set: sacreBLEU's own default. Its seed comes from
# the SACREBLEU_SEED environment variable (12345 unless set), so a comparison gives the same p-value every run.
BOOTSTRAP_SAMPLES = 1000

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


def corpus_bleu(hyps: list[str], refs: list[list[str]] | list[str], tokenize: str = "13a") -> float:
    """sacreBLEU's corpus BLEU (0-100) of detokenized hypotheses: what the trainer logs as valid BLEU.

    `refs` is one list of reference lines, or a list of reference streams (one list per reference set).
    """
    streams = _reference_streams(refs)
    _check_tokenizer(tokenize)
    _check_line_counts([("hypotheses", hyps)] + [(f"reference {k + 1}", s) for k, s in enumerate(streams)])
    return BLEU(tokenize=tokenize).corpus_score(hyps, streams).score


def score(
    hyps: list[str],
    refs_streams: list[list[str]],
    metrics: Sequence[str] = ("bleu",),
    tokenize: str = "13a",
    paper_bleu: bool = False,
    baseline: list[str] | None = None,
) -> dict[str, Any]:
    """Score hypotheses against one or more reference streams; the result is what `mtx score --json` prints.

    BLEU is always computed, as the headline number; chrF and TER are added when asked for. With `baseline`
    (another system's lines for the same source), each metric also gets a paired-bootstrap p-value for
    "this system and the baseline differ".
    """
    metric_names = _check_metrics(metrics)
    _check_tokenizer(tokenize)
    streams = _reference_streams(refs_streams)
    named = [("hypotheses", hyps)] + [(f"reference {k + 1}", s) for k, s in enumerate(streams)]
    if baseline is not None:
        named.append(("baseline hypotheses", baseline))
    _check_line_counts(named)

    scorers = _make_scorers(metric_names, tokenize)
    results = {name: scorer.corpus_score(hyps, streams) for name, scorer in scorers.items()}
    bleu = results["bleu"]
    result: dict[str, Any] = {
        "bleu": bleu.score,
        "signature": str(scorers["bleu"].get_signature()),
        "bp": bleu.bp,
        "ratio": bleu.ratio,
        "precisions": bleu.precisions,
        "sys_len": bleu.sys_len,
        "ref_len": bleu.ref_len,
        "n_sentences": len(hyps),
        "n_refs": len(streams),
    }
    for name in metric_names[1:]:
        result[name] = results[name].score
    result["signatures"] = {name: str(scorer.get_signature()) for name, scorer in scorers.items()}
    if paper_bleu:
        result["paper_bleu"], result["signatures"]["paper_bleu"] = _paper_bleu(hyps, streams)
    if baseline is not None:
        result["baseline"] = _paired_bootstrap(hyps, baseline, streams, metric_names, tokenize)
    return result


def _make_scorers(metric_names: Sequence[str], tokenize: str) -> dict[str, BLEU | CHRF | TER]:
    """Fresh sacreBLEU metric objects with sacreBLEU's defaults, so our signatures match its command line."""
    constructors = {"bleu": lambda: BLEU(tokenize=tokenize), "chrf": CHRF, "ter": TER}
    return {name: constructors[name]() for name in metric_names}


def _paper_bleu(hyps: list[str], streams: list[list[str]]) -> tuple[float, str]:
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


def _paired_bootstrap(
    hyps: list[str], baseline: list[str], streams: list[list[str]], metric_names: Sequence[str], tokenize: str
) -> dict[str, Any]:
    """Paired bootstrap resampling (Koehn, 2004) of this system against the baseline, by sacreBLEU."""
    from sacrebleu.significance import PairedTest

    scorers = _make_scorers(metric_names, tokenize)
    test = PairedTest(
        [("baseline", baseline), ("system", hyps)],
        dict(zip(metric_names, scorers.values(), strict=True)),
        references=streams,
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )
    signatures, table = test()
    # sacreBLEU names its columns after the scores ("BLEU", "chrF2", "TER"), in the order of our metrics.
    columns = [column for column in table if column != "System"]
    summary: dict[str, Any] = {"n_samples": BOOTSTRAP_SAMPLES, "p_value": {}}
    for name, column in zip(metric_names, columns, strict=True):
        baseline_result, system_result = table[column]
        summary[name] = baseline_result.score
        # sacreBLEU counts resampled differences strictly above the observed one, so a system that scores
        # exactly like the baseline (identical output, say) would get p = 1/(n+1) and look "significant".
        # An observed difference of zero is no evidence of a difference: its p-value is 1.
        same = baseline_result.score == system_result.score
        summary["p_value"][name] = 1.0 if same else system_result.p_value
    summary["signature"] = str(signatures[columns[0]])
    return summary


def _reference_streams(refs: list[list[str]] | list[str]) -> list[list[str]]:
    """Accept one reference stream (a list of lines) or several (a list of such lists)."""
    if refs and isinstance(refs[0], str):
        return [list(refs)]
    return [list(stream) for stream in refs]


def _check_metrics(metrics: Sequence[str]) -> list[str]:
    """Normalize the metric names, BLEU first and each once, or say which name is wrong."""
    names = [name.strip().lower() for name in metrics if name.strip()]
    for name in names:
        if name not in METRICS:
            close = difflib.get_close_matches(name, METRICS, n=1)
            hint = f" Did you mean '{close[0]}'?" if close else ""
            raise MtxError(f"unknown metric '{name}' in --metrics.{hint} Choose from {', '.join(METRICS)}.")
    return [name for name in METRICS if name == "bleu" or name in names]


def _check_tokenizer(tokenize: str) -> None:
    if tokenize not in TOKENIZERS:
        raise MtxError(
            f"unknown BLEU tokenizer '{tokenize}' in --tokenize. Choose from {', '.join(TOKENIZERS)} "
            "(13a, sacreBLEU's default, is what WMT reports)."
        )


def _check_line_counts(named_streams: list[tuple[str, Sequence[str]]]) -> None:
    """Every stream must have one line per source sentence, or the scores would silently pair wrong lines."""
    first_name, first = named_streams[0]
    for name, stream in named_streams[1:]:
        if len(stream) != len(first):
            raise MtxError(
                f"{first_name} have {len(first)} lines but {name} has {len(stream)}. Scoring pairs lines by "
                "position, so both must come from the same test set, one line per sentence (an empty "
                "translation is an empty line)."
            )
    if not first:
        raise MtxError(f"nothing to score: {first_name} and references are empty.")


def read_lines(path: Path | None) -> list[str]:
    """Read a UTF-8 text file (standard input when `path` is None) as sacreBLEU's command line does.

    Lines are split on newlines only and lose their trailing whitespace, as in sacreBLEU, so the same files
    give the same score there and here.
    """
    name = "standard input" if path is None else str(path)
    if path is None:
        if sys.stdin.isatty():
            sys.stderr.write("reading hypotheses from standard input (end with Ctrl-D)\n")
        data = sys.stdin.buffer.read()
    else:
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise MtxError(f"{name} does not exist. Check the path given to -r / -i / --baseline.") from None
        except OSError as e:
            raise MtxError(f"cannot read {name}: {e.strerror}.") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line_number = data.count(b"\n", 0, e.start) + 1
        raise MtxError(
            f"{name} line {line_number} is not valid UTF-8 (byte 0x{data[e.start]:02x}). mtx reads text as "
            "UTF-8: convert the file, e.g. `iconv -f latin1 -t utf-8`, or fix that line."
        ) from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.rstrip() for line in lines]


def score_files(
    ref_paths: Sequence[Path],
    hyp_path: Path | None = None,
    metrics: Sequence[str] = ("bleu",),
    tokenize: str = "13a",
    paper_bleu: bool = False,
    baseline_path: Path | None = None,
) -> dict[str, Any]:
    """`mtx score`: read the files, check that their line counts agree (naming the files), and score."""
    refs = [(str(path), read_lines(path)) for path in ref_paths]
    hyps = read_lines(hyp_path)
    named = [(f"hypotheses ({hyp_path or 'standard input'})", hyps)] + refs
    baseline = None if baseline_path is None else read_lines(baseline_path)
    if baseline is not None:
        named.append((f"baseline {baseline_path}", baseline))
    _check_line_counts(named)
    return score(hyps, [lines for _, lines in refs], metrics, tokenize, paper_bleu, baseline)


def check_min_bleu(result: dict[str, Any], min_bleu: float) -> None:
    """The CI gate: fail when BLEU (the paper's tokenized BLEU if it was computed) is below `min_bleu`."""
    name, value = ("paper BLEU", result["paper_bleu"]) if "paper_bleu" in result else ("BLEU", result["bleu"])
    if value < min_bleu:
        raise MtxError(
            f"{name} {value:.2f} is below --min-bleu {min_bleu:g}. The scores are printed above; "
            "improve the system or lower the gate."
        )


def print_table(result: dict[str, Any]) -> None:
    """A table for people, each score's signature under it, and the baseline comparison when there is one.

    Signatures go below the table rather than in a column: they are long, and a wrapped signature cannot be
    copied into a paper.
    """
    from rich.console import Console
    from rich.table import Table

    labels = {"bleu": "BLEU", "chrf": "chrF2", "ter": "TER", "paper_bleu": "BLEU (paper, tokenized)"}
    baseline = result.get("baseline")
    table = Table(title=f"{result['n_sentences']} sentences, {result['n_refs']} reference(s)", title_justify="left")
    table.add_column("metric")
    table.add_column("score", justify="right")
    if baseline:
        table.add_column("baseline", justify="right")
        table.add_column("p-value", justify="right")
    for name in result["signatures"]:
        row = [labels[name], f"{result[name]:.2f}"]
        if baseline:
            compared = name in baseline["p_value"]
            row += [f"{baseline[name]:.2f}", f"{baseline['p_value'][name]:.4f}"] if compared else ["", ""]
        table.add_row(*row)
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    precisions = "/".join(f"{p:.1f}" for p in result["precisions"])
    console.print(
        f"BLEU n-gram precisions {precisions}, brevity penalty {result['bp']:.3f}, ratio {result['ratio']:.3f}, "
        f"hypothesis length {result['sys_len']}, reference length {result['ref_len']}"
    )
    for name, signature in result["signatures"].items():
        console.print(f"{labels[name]} signature: {signature}")
    if baseline:
        console.print(f"paired bootstrap signature: {baseline['signature']}")
