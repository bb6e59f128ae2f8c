"""`mtx score` and mtx.score: sacreBLEU's numbers exactly, the paper's tokenized BLEU, and clean user errors."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mtx.errors import MtxError
from mtx.score import corpus_bleu, paper_tokenize, print_table, score, score_files

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


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def mtx_score(*args: str | Path, stdin: str | bytes | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "SACREBLEU_SEED": "12345"}
    data = stdin.encode() if isinstance(stdin, str) else stdin
    return subprocess.run(
        [sys.executable, "-m", "mtx", "score", *map(str, args)], input=data, capture_output=True, env=env, timeout=60
    )


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
    ],
)
def test_paper_tokenize_follows_moses(line: str, tokens: str) -> None:
    assert paper_tokenize(line) == tokens


def test_min_bleu_gate(files: dict[str, Path]) -> None:
    passed = mtx_score("-r", files["ref"], "-i", files["hyp"], "--min-bleu", "10")
    failed = mtx_score("-r", files["ref"], "-i", files["hyp"], "--min-bleu", "90")

    assert passed.returncode == 0, passed.stderr.decode()
    assert b"BLEU signature: nrefs:1|case:mixed|eff:no|tok:13a" in passed.stdout
    assert failed.returncode == 1
    assert b"BLEU" in failed.stdout  # the score is still printed
    assert b"below --min-bleu 90" in failed.stderr
    assert b"Traceback" not in failed.stderr


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
        "import mtx.score\n"
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
