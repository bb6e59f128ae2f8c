"""Scoring translations: sacreBLEU's BLEU, chrF and TER, the paper's tokenized BLEU, paired bootstrap tests.

sacreBLEU scores detokenized text with a fixed, published tokenization, so its numbers can be compared across
papers; its signature says exactly how a number was made. The paper (Vaswani et al., 2017) reported tokenized
BLEU instead, computed by tensor2tensor's `get_ende_bleu.sh`: Moses `tokenizer.perl -l de`, then hyphenated
compounds split as `rich ##AT##-##AT## text`, then `multi-bleu.perl`. `--paper-bleu` reproduces that pipeline
without Perl, so our figures can be set next to the paper's 27.3 / 28.4.

Nothing here imports torch: `mtx score` must start at once, and the trainer reuses `corpus_bleu` as is.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from sacrebleu.metrics import BLEU, CHRF, TER

from mtx.errors import MtxError
from mtx.score.paper_bleu import tokenized_paper_bleu

METRICS = ("bleu", "chrf", "ter")
TOKENIZERS = ("13a", "intl", "zh", "none")

# How many times the paired bootstrap resamples the test set: sacreBLEU's own default. Its seed comes from
# the SACREBLEU_SEED environment variable (12345 unless set), so a comparison gives the same p-value every run.
BOOTSTRAP_SAMPLES = 1000

def corpus_bleu(hyps: list[str], refs: list[list[str]] | list[str], tokenize: str = "13a") -> float:
    """sacreBLEU's corpus BLEU (0-100) of detokenized hypotheses.

    `refs` is one list of reference lines, or a list of reference streams (one list per reference set).
    """
    return corpus_bleu_and_ratio(hyps, refs, tokenize)[0]


def corpus_bleu_and_ratio(hyps: list[str], refs: list[list[str]] | list[str], tokenize: str = "13a"
                          ) -> tuple[float, float]:
    """BLEU and its length ratio (the hypotheses' tokens ÷ the references', sacreBLEU's `ratio`): what the
    trainer logs at each validation, where outputs that run short show first."""
    streams = _reference_streams(refs)
    _check_tokenizer(tokenize)
    check_line_counts([("hypotheses", hyps)] + [(f"reference {k + 1}", s) for k, s in enumerate(streams)])
    scored = BLEU(tokenize=tokenize).corpus_score(hyps, streams)
    return scored.score, scored.ratio


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
    check_line_counts(named)

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
        result["paper_bleu"], result["signatures"]["paper_bleu"] = tokenized_paper_bleu(hyps, streams)
    if baseline is not None:
        result["baseline"] = _paired_bootstrap(hyps, baseline, streams, metric_names, tokenize)
    return result


def _make_scorers(metric_names: Sequence[str], tokenize: str) -> dict[str, BLEU | CHRF | TER]:
    """Fresh sacreBLEU metric objects with sacreBLEU's defaults, so our signatures match its command line."""
    constructors = {"bleu": lambda: BLEU(tokenize=tokenize), "chrf": CHRF, "ter": TER}
    return {name: constructors[name]() for name in metric_names}


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


def check_line_counts(named_streams: list[tuple[str, Sequence[str]]]) -> None:
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
