"""`mtx score`: hypothesis and reference files in, a table (or one JSON object) of scores with signatures out.

Files are read as sacreBLEU's command line reads them, so the same files give the same figures there and here.
`--min-bleu` makes it a gate for CI: exit 1 below the bar. Nothing here imports torch: `mtx score` must start
at once.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from mtx.errors import MtxError
from mtx.score.metrics import check_line_counts
from mtx.score.metrics import score as score_lines


def score(
    references: Annotated[
        list[Path],
        typer.Option("-r", "--ref", metavar="REF", help="A reference file, one line per sentence; repeat for more."),
    ],
    input_: Annotated[
        Path | None,
        typer.Option("-i", "--input", metavar="HYP", help="Hypotheses, one line per sentence [default: stdin]."),
    ] = None,
    metrics: Annotated[
        str, typer.Option("--metrics", metavar="LIST", help="Comma-separated: bleu, chrf, ter.")
    ] = "bleu",
    tokenize: Annotated[
        str, typer.Option("--tokenize", metavar="13a|intl|zh|none", help="The BLEU tokenizer.")
    ] = "13a",
    paper_bleu: Annotated[
        bool, typer.Option("--paper-bleu", help="Also the paper's tokenized En-De BLEU (Moses + ##AT##).")
    ] = False,
    json_: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    min_bleu: Annotated[
        float | None,
        typer.Option("--min-bleu", metavar="X", help="Exit 1 if BLEU (the paper's, with --paper-bleu) is below X."),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option("--baseline", metavar="OTHER_HYP", help="Another system's output: paired bootstrap p-values."),
    ] = None,
) -> None:
    """Score translations with sacreBLEU (BLEU, chrF, TER), each score with its signature.

    Example: mtx translate -m avg.pt -i newstest2014.en | mtx score -r newstest2014.de --paper-bleu --min-bleu 25
    """
    if min_bleu is not None and not 0 <= min_bleu <= 100:  # NaN too: every BLEU would pass a gate of NaN
        raise MtxError(f"--min-bleu {min_bleu:g} is not a BLEU score: give one between 0 and 100.")
    result = score_files(references, input_, metrics.split(","), tokenize, paper_bleu, baseline)
    if json_:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        print_table(result)
    if min_bleu is not None:
        check_min_bleu(result, min_bleu)


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
    check_line_counts(named)
    return score_lines(hyps, [lines for _, lines in refs], metrics, tokenize, paper_bleu, baseline)


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
