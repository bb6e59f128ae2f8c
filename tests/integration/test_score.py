"""`mtx score` and mtx.score.metrics: sacreBLEU's numbers exactly, the paper's tokenized BLEU, and clean user errors."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sacrebleu.metrics import BLEU

from mtx.errors import MtxError
from mtx.score.command import check_min_bleu, print_table, score_files
from mtx.score.metrics import corpus_bleu, score
from mtx.score.paper_bleu import paper_tokenize

SACREBLEU = str(Path(sys.executable).parent / "sacrebleu")

REFERENCES = [
    "Die Pro-Kopf-Ausgaben stiegen 2013 um 3,5 Prozent.",
    '"Wir sind sehr zufrieden", sagte Dr. Müller am 3. Oktober in Berlin-Mitte.',
    "Das Hotel liegt im Zentrum, nur fünf Minuten vom Bahnhof entfernt.",
    "Warte... was hast du gesagt?",
    "Der Preis beträgt 12,50 € (inkl. MwSt.).",
    "Sie hat es nicht gewusst.",
]
REFERENCES_2 = [
    "Die Ausgaben pro Kopf stiegen 2013 um 3,5 Prozent.",
    '"Wir sind zufrieden", sagte Dr. Müller am 3. Oktober in Berlin.',
    "Das Hotel befindet sich im Zentrum, fünf Minuten vom Bahnhof.",
    "Moment... was hast du gesagt?",
    "Der Preis liegt bei 12,50 € (inkl. MwSt.).",
    "Das wusste sie nicht.",
]
HYPOTHESES = [
    "Die Pro-Kopf-Ausgaben stiegen im Jahr 2013 um 3,5 Prozent.",
    '"Wir sind zufrieden", sagte Dr. Müller am 3. Oktober in Berlin.   ',
    "Das Hotel ist im Zentrum, fünf Minuten vom Bahnhof entfernt.",
    "Warte ... was hast du gesagt?",
    "",
    "Sie wusste es nicht.",
]

# Chinese has no spaces between words: sacreBLEU's zh tokenizer splits it into characters, 13a leaves each
# sentence nearly one token, so the two tokenizers give far apart scores here.
ZH_REFERENCES = ["我们明天去北京开会。", "这本书非常有意思。", "他昨天没有来上班，因为他生病了。"]
ZH_HYPOTHESES = ["我们明天到北京去开会。", "这本书很有意思。", "他昨天没来上班，因为他病了。"]

# How far above or below a score the gate tests set --min-bleu: far less than the fixture's scores differ by
# (BLEU, chrF, the paper's BLEU), far more than floating-point noise.
GATE_MARGIN = 0.01

# print_table's output for the result in test_the_table_shows_every_score_its_baseline_and_signatures.
TABLE = """\
3 sentences, 2 reference(s)
┏━━━━━━━━━━━━━━━━━━━━━━━━━┳━━━━━━━━┳━━━━━━━━━━┳━━━━━━━━━┓
┃ metric                  ┃  score ┃ baseline ┃ p-value ┃
┡━━━━━━━━━━━━━━━━━━━━━━━━━╇━━━━━━━━╇━━━━━━━━━━╇━━━━━━━━━┩
│ BLEU                    │   5.12 │     4.00 │  0.0123 │
│ chrF2                   │  41.50 │    40.00 │  1.0000 │
│ TER                     │ 100.00 │          │         │
│ BLEU (paper, tokenized) │   6.00 │          │         │
└─────────────────────────┴────────┴──────────┴─────────┘
BLEU n-gram precisions 40.0/12.5/5.0/2.5, brevity penalty 0.900, ratio 0.905, hypothesis length 19, reference length 21
BLEU signature: nrefs:2|tok:13a
chrF2 signature: nrefs:2|c:6
TER signature: nrefs:2|t:tercom
BLEU (paper, tokenized) signature: paper
paired bootstrap signature: bs:1000
"""


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def mtx_score(*args: str | Path, stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    """`mtx score ARGS` through `mtx.cli.main` in this process, as the `mtx` script runs it: its exit code,
    standard output and error. In-process, so that what it runs is the package under test (mutation testing
    included); `test_score_starts_without_torch_or_datasets` runs a real process."""
    from unittest import mock

    from mtx import cli

    data = stdin.encode() if isinstance(stdin, str) else (stdin or b"")
    out, err = io.TextIOWrapper(io.BytesIO(), encoding="utf-8"), io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    fake_stdin = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8")
    argv = ["mtx", "score", *map(str, args)]
    with mock.patch.dict(os.environ, {"SACREBLEU_SEED": "12345", "NO_COLOR": "1"}), \
            mock.patch.object(sys, "argv", argv), mock.patch.object(sys, "stdin", fake_stdin), \
            mock.patch.dict(cli._state, debug=False), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main()
            code = 0
        except SystemExit as exited:
            code = exited.code if isinstance(exited.code, int) else (0 if exited.code is None else 1)
    out.flush(), err.flush()
    return subprocess.CompletedProcess(argv, code, out.buffer.getvalue(), err.buffer.getvalue())


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    return {
        "ref": write_lines(tmp_path / "ref.de", REFERENCES),
        "ref2": write_lines(tmp_path / "ref2.de", REFERENCES_2),
        "hyp": write_lines(tmp_path / "hyp.de", HYPOTHESES),
    }


@pytest.mark.parametrize(("tokenize", "ref_names"), [("13a", ["ref"]), ("intl", ["ref", "ref2"]), ("none", ["ref2"])])
def test_scores_equal_the_sacrebleu_command_line(files: dict[str, Path], tokenize: str, ref_names: list[str]) -> None:
    refs = [files[name] for name in ref_names]
    theirs = subprocess.run(
        [SACREBLEU, *map(str, refs), "-i", str(files["hyp"]), "-m", "bleu", "chrf", "ter", "--tokenize", tokenize]
        + ["-f", "json", "-w", "6"],
        capture_output=True,
        check=True,
        text=True,
        timeout=60,
    )
    expected = {entry["name"]: entry for entry in json.loads(theirs.stdout)}
    ref_args = [arg for ref in refs for arg in ("-r", ref)]
    ours = mtx_score(*ref_args, "-i", files["hyp"], "--metrics", "bleu,chrf,ter", "--tokenize", tokenize, "--json")
    assert ours.returncode == 0, ours.stderr.decode()
    result = json.loads(ours.stdout)
    for name, sacrebleu_name in [("bleu", "BLEU"), ("chrf", "chrF2"), ("ter", "TER")]:
        assert float(f"{result[name]:.6f}") == expected[sacrebleu_name]["score"]
        assert result["signatures"][name] == expected[sacrebleu_name]["signature"]
    assert result["signature"] == expected["BLEU"]["signature"]


def test_paper_bleu_matches_a_hand_computation() -> None:
    """The paper's tokenized BLEU on two sentences, counted by hand.

    After Moses-style tokenization and ##AT## compound splitting:
      hyp 1 (10): Er kam am 3. Oktober nach Berlin ##AT##-##AT## Mitte .
      ref 1 (11): Er kam am 3. Oktober in Berlin ##AT##-##AT## Mitte an .
      hyp 2 (9):  " Das ist gut " , sagte sie .
      ref 2 (10): " Das ist sehr gut " , sagte sie .
    ("3." stays whole: a German ordinal; the final period and the quotes and comma are split off.)

    Matched n-grams, sentence 1 + sentence 2:
      1-grams: 9/10 (all but "nach")                        + 9/9                                 = 18/19
      2-grams: 6/9 (Er kam, kam am, am 3., 3. Oktober,       + 7/8 (all but "ist gut")             = 13/17
               Berlin ##AT##, ##AT## Mitte)
      3-grams: 4/8 (Er kam am, kam am 3., am 3. Oktober,     + 5/7 (" Das ist, gut " ,, " , sagte, = 9/15
               Berlin ##AT## Mitte)                               , sagte sie, sagte sie .)
      4-grams: 2/7 (Er kam am 3., kam am 3. Oktober)         + 3/6 (gut " , sagte, " , sagte sie,  = 5/13
                                                                   , sagte sie .)
    Lengths: hypotheses 19, references 21, so the brevity penalty is exp(1 - 21/19).
    BLEU = 100 * exp(1 - 21/19) * (18/19 * 13/17 * 9/15 * 5/13) ** (1/4) = 57.5549...
    """
    hyps = ["Er kam am 3. Oktober nach Berlin-Mitte.", '"Das ist gut", sagte sie.']
    refs = ["Er kam am 3. Oktober in Berlin-Mitte an.", '"Das ist sehr gut", sagte sie.']
    expected = 100 * math.exp(1 - 21 / 19) * (18 / 19 * 13 / 17 * 9 / 15 * 5 / 13) ** 0.25

    result = score(hyps, [refs], paper_bleu=True)

    assert result["paper_bleu"] == pytest.approx(expected, abs=1e-9)
    assert "tok:mtx-paper-moses-de+atat" in result["signatures"]["paper_bleu"]
    assert paper_tokenize(hyps[0]) == "Er kam am 3. Oktober nach Berlin ##AT##-##AT## Mitte ."
    assert paper_tokenize(refs[1]) == '" Das ist sehr gut " , sagte sie .'


@pytest.mark.parametrize(
    ("line", "tokens"),
    [
        ("Die Pro-Kopf-Ausgaben stiegen.", "Die Pro ##AT##-##AT## Kopf ##AT##-##AT## Ausgaben stiegen ."),
        ("Es kostet 3,5 Millionen, oder?", "Es kostet 3,5 Millionen , oder ?"),
        ("Warte... was?", "Warte ... was ?"),
        ("Dr. Müller kam z.B. nach Hause.", "Dr. Müller kam z.B. nach Hause ."),
        ("Er sagte: 'Nein.'", "Er sagte : ' Nein . '"),
        ("Es gibt Nr. 5 und die Nr. Eins.", "Es gibt Nr. 5 und die Nr . Eins ."),
        ("Kosten (ca. 5 %) & mehr", "Kosten ( ca. 5 % ) & mehr"),
        ("  viel   Platz\t", "viel Platz"),
        ("viel\tPlatz", "viel Platz"),  # whitespace becomes a space before control characters are dropped
        ("Ein\x07 Test.", "Ein Test ."),
        ("Er kam,5 Tage", "Er kam , 5 Tage"),  # a comma after a non-digit splits, whatever follows it
        ("Seit 2013,sagte er", "Seit 2013 , sagte er"),  # and one before a non-digit
        ("Es waren 5,", "Es waren 5 ,"),  # and one that ends the line after a digit
        ("Es kam Dr. Müller", "Es kam Dr. Müller"),  # the last word but one still looks at the next word
        ("Das gilt z.B. Berlin.", "Das gilt z.B. Berlin ."),  # a period inside the word keeps the final one
        # tokenizer.perl splits the last word's period even after a non-breaking prefix (sacremoses does not)
        ("Er nahm Plan B.", "Er nahm Plan B ."),
    ],
)
def test_paper_tokenize_follows_moses(line: str, tokens: str) -> None:
    assert paper_tokenize(line) == tokens


def test_min_bleu_gate_passes_at_the_bleu_and_fails_just_above_it(files: dict[str, Path]) -> None:
    """`--min-bleu X` fails only when BLEU is below X (SPEC): a BLEU equal to X passes, X a hundredth above
    the BLEU fails. chrF is scored too and lies far from BLEU, so a gate that read chrF would pass where it
    must fail; a gate that compared with <= would fail at equality."""
    result = score_files([files["ref"]], files["hyp"], metrics=("bleu", "chrf"))
    bleu = result["bleu"]
    assert result["chrf"] - bleu > 10 * GATE_MARGIN  # a gate on chrF decides differently here
    above = bleu + GATE_MARGIN

    check_min_bleu(result, bleu)
    check_min_bleu(result, bleu - GATE_MARGIN)
    with pytest.raises(MtxError, match=re.escape(f"BLEU {bleu:.2f} is below --min-bleu {above:g}.")) as caught:
        check_min_bleu(result, above)
    assert not str(caught.value).startswith("paper")

    gate = ("-r", files["ref"], "-i", files["hyp"], "--metrics", "bleu,chrf", "--min-bleu")
    at_bleu, above_bleu = mtx_score(*gate, repr(bleu)), mtx_score(*gate, repr(above))

    assert at_bleu.returncode == 0, at_bleu.stderr.decode()
    assert b"BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in at_bleu.stdout
    assert above_bleu.returncode == 1
    assert b"chrF2" in above_bleu.stdout  # the scores are still printed
    assert f"BLEU {bleu:.2f} is below --min-bleu {above:g}.".encode() in above_bleu.stderr
    assert b"Traceback" not in above_bleu.stderr


@pytest.mark.parametrize("gate", ["nan", "-1", "100.5", "inf"])
def test_a_min_bleu_that_is_no_bleu_score_is_refused_before_scoring(files: dict[str, Path], gate: str) -> None:
    """A gate of NaN would let every BLEU through (no comparison with NaN is true): CI would never fail."""
    result = mtx_score("-r", files["ref"], "-i", files["hyp"], "--min-bleu", gate)
    assert result.returncode == 1 and b"is not a BLEU score: give one between 0 and 100" in result.stderr
    assert result.stdout == b"" and b"Traceback" not in result.stderr


def test_min_bleu_gates_the_paper_bleu_with_paper_bleu(files: dict[str, Path]) -> None:
    """With --paper-bleu the gate reads the paper's tokenized BLEU, which is above sacreBLEU's here: a gate
    at exactly the paper's BLEU passes, where one that read sacreBLEU's BLEU (or failed on equality) would
    fail; a hundredth above the paper's BLEU fails, and the message says which BLEU fell short."""
    result = score_files([files["ref"]], files["hyp"], paper_bleu=True)
    paper, bleu = result["paper_bleu"], result["bleu"]
    assert paper - bleu > 10 * GATE_MARGIN  # a gate on sacreBLEU's BLEU decides differently here
    above = paper + GATE_MARGIN

    check_min_bleu(result, paper)
    check_min_bleu(result, paper - GATE_MARGIN)
    with pytest.raises(MtxError, match=re.escape(f"paper BLEU {paper:.2f} is below --min-bleu {above:g}.")):
        check_min_bleu(result, above)
    # The paper's BLEU rules in either direction: not the higher of the two, nor the lower.
    with pytest.raises(MtxError, match="paper BLEU"):
        check_min_bleu({**result, "bleu": above + 1}, above)

    gate = ("-r", files["ref"], "-i", files["hyp"], "--paper-bleu", "--min-bleu")
    at_paper, above_paper = mtx_score(*gate, repr(paper)), mtx_score(*gate, repr(above))

    assert at_paper.returncode == 0, at_paper.stderr.decode()
    assert above_paper.returncode == 1
    assert b"BLEU (paper, tokenized)" in above_paper.stdout
    assert f"paper BLEU {paper:.2f} is below --min-bleu {above:g}.".encode() in above_paper.stderr
    assert b"Traceback" not in above_paper.stderr


def test_tokenize_zh_scores_chinese_as_sacrebleu_does(tmp_path: Path) -> None:
    """`--tokenize zh` reaches sacreBLEU: the score and signature are sacreBLEU's own BLEU(tokenize='zh'),
    which on this text is far from what the default 13a tokenizer gives."""
    expected = BLEU(tokenize="zh")
    expected_score = expected.corpus_score(ZH_HYPOTHESES, [ZH_REFERENCES]).score
    assert expected_score - BLEU(tokenize="13a").corpus_score(ZH_HYPOTHESES, [ZH_REFERENCES]).score > 20
    ref = write_lines(tmp_path / "ref.zh", ZH_REFERENCES)
    hyp = write_lines(tmp_path / "hyp.zh", ZH_HYPOTHESES)

    out = mtx_score("-r", ref, "-i", hyp, "--tokenize", "zh", "--json")

    assert out.returncode == 0, out.stderr.decode()
    result = json.loads(out.stdout)
    assert result["bleu"] == expected_score
    assert result["signature"] == str(expected.get_signature()) and "|tok:zh|" in result["signature"]
    assert score(ZH_HYPOTHESES, [ZH_REFERENCES], tokenize="zh")["bleu"] == expected_score
    assert corpus_bleu(ZH_HYPOTHESES, ZH_REFERENCES, tokenize="zh") == expected_score


def test_json_is_one_object_with_numbers_and_signatures(files: dict[str, Path]) -> None:
    out = mtx_score("-r", files["ref"], "-i", files["hyp"], "--metrics", "ter,chrf", "--paper-bleu", "--json")

    assert out.returncode == 0, out.stderr.decode()
    result = json.loads(out.stdout)
    for key in ("bleu", "chrf", "ter", "paper_bleu", "bp", "ratio"):
        assert isinstance(result[key], float), key
    assert result["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|")
    assert set(result["signatures"]) == {"bleu", "chrf", "ter", "paper_bleu"}
    assert len(result["precisions"]) == 4
    assert (result["n_sentences"], result["n_refs"]) == (len(HYPOTHESES), 1)
    assert result["sys_len"] > 0 and result["ref_len"] > 0


def test_multiple_references_take_the_best_match() -> None:
    hyps = ["the cat sat on the mat", "a dog barked loudly"]
    first = ["a cat was sitting on a mat", "the dog barked"]
    second = ["the cat sat on the mat", "a dog barked loudly"]

    assert corpus_bleu(hyps, first) < 50
    assert corpus_bleu(hyps, [first, second]) == pytest.approx(100)
    assert corpus_bleu(hyps, [first]) == corpus_bleu(hyps, first)
    assert score(hyps, [first, second])["n_refs"] == 2


def test_reads_hypotheses_from_standard_input(files: dict[str, Path]) -> None:
    from_stdin = mtx_score("-r", files["ref"], "--json", stdin=files["hyp"].read_bytes())

    assert from_stdin.returncode == 0, from_stdin.stderr.decode()
    assert json.loads(from_stdin.stdout) == score_files([files["ref"]], files["hyp"])


def test_line_count_mismatch_names_both_counts_and_files(files: dict[str, Path], tmp_path: Path) -> None:
    short = write_lines(tmp_path / "short.de", HYPOTHESES[:4])
    empty = write_lines(tmp_path / "empty.de", [])

    out = mtx_score("-r", files["ref"], "-i", short)
    out_empty = mtx_score("-r", files["ref"], "-i", empty)

    assert out.returncode == 1
    message = out.stderr.decode()
    assert "4 lines" in message and "short.de" in message
    assert f"has {len(REFERENCES)}" in message and "ref.de" in message
    assert out_empty.returncode == 1 and b"0 lines" in out_empty.stderr


@pytest.mark.parametrize("count", [len(HYPOTHESES) - 2, len(HYPOTHESES) + 1], ids=["shorter", "longer"])
def test_baseline_line_count_mismatch_names_the_files_and_counts(files: dict[str, Path], tmp_path: Path,
                                                                 count: int) -> None:
    """A baseline from another test set (or a truncated one) would pair wrong lines in the bootstrap: exit 1
    before any scoring, with a message naming the hypothesis and baseline files and both line counts."""
    baseline = write_lines(tmp_path / "baseline.de", (HYPOTHESES * 2)[:count])

    out = mtx_score("-r", files["ref"], "-i", files["hyp"], "--baseline", baseline)

    assert out.returncode == 1
    message = out.stderr.decode()
    expected = f"hypotheses ({files['hyp']}) have {len(HYPOTHESES)} lines but baseline {baseline} has {count}."
    assert expected in message
    assert "Traceback" not in message and out.stdout == b""
    with pytest.raises(MtxError, match=f"baseline {re.escape(str(baseline))} has {count}"):
        score_files([files["ref"]], files["hyp"], baseline_path=baseline)
    with pytest.raises(MtxError, match=f"have {len(HYPOTHESES)} lines but baseline hypotheses has {count}"):
        score(HYPOTHESES, [REFERENCES], baseline=(HYPOTHESES * 2)[:count])


def test_invalid_utf8_names_the_file_and_line(files: dict[str, Path], tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.de"
    latin1.write_bytes("Zeile eins\nGr\xfc\xdfe\n".encode("latin-1"))

    as_hypotheses = mtx_score("-r", files["ref"], "-i", latin1)
    as_reference = mtx_score("-r", latin1, "-i", files["hyp"])

    for out in (as_hypotheses, as_reference):
        assert out.returncode == 1
        assert b"latin1.de line 2 is not valid UTF-8" in out.stderr
        assert b"Traceback" not in out.stderr


def test_missing_file_and_bad_values_are_user_errors(files: dict[str, Path], tmp_path: Path) -> None:
    missing = mtx_score("-r", tmp_path / "nope.de", "-i", files["hyp"])
    bad_metric = mtx_score("-r", files["ref"], "-i", files["hyp"], "--metrics", "bleu,chrff")

    assert missing.returncode == 1 and b"nope.de does not exist" in missing.stderr
    assert bad_metric.returncode == 1 and b"Did you mean 'chrf'?" in bad_metric.stderr


def test_library_errors_are_mtx_errors() -> None:
    with pytest.raises(MtxError, match="13a, intl, zh, none"):
        score(["a"], [["a"]], tokenize="moses")
    with pytest.raises(MtxError, match="hypotheses have 1 lines but reference 1 has 2"):
        corpus_bleu(["a"], ["a", "b"])
    with pytest.raises(MtxError, match="nothing to score"):
        corpus_bleu([], [])


def test_baseline_paired_bootstrap(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
    refs = [" ".join(words[i % 12 :] + words[: i % 12]) for i in range(30)]
    worse = [" ".join(reversed(line.split())) for line in refs]
    ref = write_lines(tmp_path / "ref.txt", refs)
    system = write_lines(tmp_path / "system.txt", refs)
    baseline = write_lines(tmp_path / "baseline.txt", worse)

    against_worse = mtx_score("-r", ref, "-i", system, "--baseline", baseline, "--json")
    against_itself = score(refs, [refs], metrics=("bleu", "chrf"), baseline=refs)

    assert against_worse.returncode == 0, against_worse.stderr.decode()
    different = json.loads(against_worse.stdout)["baseline"]
    assert different["p_value"]["bleu"] < 0.01
    assert different["bleu"] < 50 and different["n_samples"] == 1000
    assert "seed:12345" in different["signature"]
    # A system is not significantly different from itself.
    assert against_itself["baseline"]["p_value"] == {"bleu": 1.0, "chrf": 1.0}
    print_table(against_itself)
    assert "p-value" in capsys.readouterr().out


def test_score_starts_without_torch_or_datasets() -> None:
    probe = (
        "import runpy, sys\n"
        "import mtx.score.metrics\n"
        "sys.argv = ['mtx', 'score', '--help']\n"
        "try:\n"
        "    runpy.run_module('mtx', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(m for m in ('torch', 'datasets') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60)

    assert "Example: mtx" in out.stdout
    assert out.stdout.strip().endswith("[]")


def test_the_table_shows_every_score_its_baseline_and_signatures(capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """What a person reads, exactly: labels, two decimals right-aligned, the baseline and p-value columns (blank
    for a metric the bootstrap did not compare), the title on the left, and each signature on a line of its
    own below, where it can be copied whole."""
    result = {"n_sentences": 3, "n_refs": 2, "bleu": 5.125, "chrf": 41.5, "ter": 100.0, "paper_bleu": 6.0,
              "precisions": [40.0, 12.5, 5.0, 2.5], "bp": 0.9, "ratio": 0.905, "sys_len": 19, "ref_len": 21,
              "signatures": {"bleu": "nrefs:2|tok:13a", "chrf": "nrefs:2|c:6", "ter": "nrefs:2|t:tercom",
                             "paper_bleu": "paper"},
              "baseline": {"bleu": 4.0, "chrf": 40.0, "p_value": {"bleu": 0.0123, "chrf": 1.0},
                           "signature": "bs:1000"}}
    monkeypatch.setenv("COLUMNS", "120")  # the width of a terminal; nothing wraps
    print_table(result)
    assert capsys.readouterr().out == TABLE


def test_paper_bleu_is_unsmoothed_like_multi_bleu() -> None:
    """The paper's BLEU came from multi-bleu.perl, which does not smooth: with no 4-gram in common it is 0,
    where sacreBLEU's default (exponential smoothing) gives a small positive score."""
    result = score(["Der Hund schläft im Haus ."], [["Der Hund schläft nicht im Garten ."]], paper_bleu=True)
    assert result["paper_bleu"] == 0.0 and result["bleu"] > 0.0


def test_the_baseline_is_scored_by_paired_bootstrap_with_the_same_tokenizer() -> None:
    """--baseline with --tokenize zh: the baseline's BLEU is sacreBLEU's zh BLEU of the baseline, and the test
    is the paired bootstrap (not approximate randomization, sacreBLEU's default) with 1000 resamples."""
    baseline = [line.replace("开会", "") for line in ZH_HYPOTHESES]
    result = score(ZH_HYPOTHESES, [ZH_REFERENCES], metrics=("bleu", "chrf"), tokenize="zh", baseline=baseline)
    expected = BLEU(tokenize="zh").corpus_score(baseline, [ZH_REFERENCES]).score
    assert result["baseline"]["bleu"] == pytest.approx(expected, abs=1e-9)
    assert result["baseline"]["bleu"] != pytest.approx(BLEU().corpus_score(baseline, [ZH_REFERENCES]).score)
    assert "|bs:1000|" in result["baseline"]["signature"] and "tok:zh" in result["baseline"]["signature"]
    assert set(result["baseline"]["p_value"]) == {"bleu", "chrf"}


def test_read_lines_splits_as_sacrebleu_and_names_what_it_cannot_read(tmp_path: Path, monkeypatch) -> None:
    """Newlines only split lines; each line loses its trailing whitespace (\\r included) but keeps its leading
    one; a final newline ends the last line rather than adding an empty one. Each failure is a message that
    names the file (or standard input) and, for bad UTF-8, the line."""
    from mtx.score.command import read_lines

    text = tmp_path / "text.de"
    text.write_bytes(b"  eins \r\nzwei\x0bdrei\n\nvier\n\n")
    assert read_lines(text) == ["  eins", "zwei\x0bdrei", "", "vier", ""]
    text.write_bytes(b"eins\nzwei")
    assert read_lines(text) == ["eins", "zwei"]

    text.write_bytes(b"\neins\n\xff zwei\n")
    with pytest.raises(MtxError) as error:
        read_lines(text)
    assert str(error.value) == (f"{text} line 3 is not valid UTF-8 (byte 0xff). mtx reads text as UTF-8: convert "
                                "the file, e.g. `iconv -f latin1 -t utf-8`, or fix that line.")
    with pytest.raises(MtxError) as error:
        read_lines(tmp_path / "nope.de")
    assert str(error.value) == f"{tmp_path / 'nope.de'} does not exist. Check the path given to -r / -i / --baseline."
    with pytest.raises(MtxError) as error:
        read_lines(tmp_path)
    assert str(error.value) == f"cannot read {tmp_path}: Is a directory."

    class Terminal(io.TextIOWrapper):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdin", Terminal(io.BytesIO(b"\xc3\n")))
    prompt = io.StringIO()
    monkeypatch.setattr(sys, "stderr", prompt)
    with pytest.raises(MtxError, match=r"^standard input line 1 is not valid UTF-8 \(byte 0xc3\)"):
        read_lines(None)
    assert prompt.getvalue() == "reading hypotheses from standard input (end with Ctrl-D)\n"


def test_score_returns_what_was_asked_with_sacrebleus_signatures() -> None:
    """BLEU always, first; the other metrics when asked; the paper's BLEU only when asked; each score with the
    signature sacreBLEU gives its own scorer, BLEU's also under `signature`."""
    from sacrebleu.metrics import CHRF, TER

    hyps, refs = HYPOTHESES, [REFERENCES]
    chrf_only = score(hyps, refs, metrics=("chrf",))
    assert list(chrf_only["signatures"]) == ["bleu", "chrf"] and "paper_bleu" not in chrf_only
    result = score(hyps, refs, metrics=("ter", "chrf", "bleu"), tokenize="intl")
    assert list(result["signatures"]) == ["bleu", "chrf", "ter"]
    for name, scorer in (("bleu", BLEU(tokenize="intl")), ("chrf", CHRF()), ("ter", TER())):
        assert result[name] == pytest.approx(scorer.corpus_score(hyps, refs).score, abs=1e-9)
        assert result["signatures"][name] == str(scorer.get_signature())
    assert result["signature"] == result["signatures"]["bleu"] and "tok:intl" in result["signature"]


def test_unknown_metrics_and_mismatched_lines_are_named_exactly() -> None:
    with pytest.raises(MtxError) as error:
        score(["a"], [["a"]], metrics=("bleu", "chrff"))
    assert str(error.value) == "unknown metric 'chrff' in --metrics. Did you mean 'chrf'? Choose from bleu, chrf, ter."
    with pytest.raises(MtxError) as error:
        score(["a"], [["a"]], metrics=("rouge",))
    assert str(error.value) == "unknown metric 'rouge' in --metrics. Choose from bleu, chrf, ter."
    cases = [
        (dict(hyps=["a", "b"], refs_streams=[["a", "b"], ["a"]]), "hypotheses have 2 lines but reference 2 has 1."),
        (dict(hyps=["a", "b"], refs_streams=[["a"]]), "hypotheses have 2 lines but reference 1 has 1."),
        (dict(hyps=["a"], refs_streams=[["a"]], baseline=["a", "b"]),
         "hypotheses have 1 lines but baseline hypotheses has 2."),
    ]
    for arguments, start in cases:
        with pytest.raises(MtxError) as error:
            score(**arguments)
        assert str(error.value).startswith(start + " Scoring pairs lines by position")


def test_the_gate_says_which_bleu_failed_and_what_to_do() -> None:
    with pytest.raises(MtxError) as error:
        check_min_bleu({"bleu": 25.004}, 27)
    assert str(error.value) == ("BLEU 25.00 is below --min-bleu 27. The scores are printed above; improve the "
                                "system or lower the gate.")


def test_hypotheses_from_standard_input_are_named_so_in_a_count_mismatch(files: dict[str, Path]) -> None:
    result = mtx_score("-r", files["ref"], stdin="eine Zeile\n")
    assert result.returncode == 1
    assert f"hypotheses (standard input) have 1 lines but {files['ref']} has 6." in result.stderr.decode()
