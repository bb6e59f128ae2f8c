"""`mtx translate` and its core: a tiny copy-task model trained here, decoded through the library and the CLI."""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import (
    COPY_WORDS,
    copy_task,
    load_probe,
    split_alignments,
    translate_cli,
)

import mtx.decode.search
import mtx.decode.torch_engine
from mtx.checkpoint import make_checkpoint, save_checkpoint
from mtx.config.recipe import DecodeConfig
from mtx.decode.command import Companion, is_a_file, read_ahead, read_windows
from mtx.decode.output import score_writer, search_writer
from mtx.decode.search import Constraints, Hypothesis, LengthPenalty, search
from mtx.decode.torch_engine import workers_for
from mtx.decode.translation import Translation
from mtx.decode.translator import Translator, prepare_model, translate_sentences
from mtx.decode.workers import WorkerDied, WorkerPool
from mtx.errors import MtxError
from mtx.model.int8 import Int8Linear
from mtx.tokenizer import EOS, PAD

COPY_DECODE = DecodeConfig(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=5)  # the copy checkpoint's recipe


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> dict:
    """A copy-task checkpoint (and a twin whose recipe caps outputs at one token), its tokenizer, held-out set."""
    model, tokenizer, held_out = copy_task(40)
    folder = tmp_path_factory.mktemp("copy")
    decode = dict(beam=4, lenpen=0.6, max_len_a=1.0, max_len_b=5)
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), {"decode": decode}, 250), folder / "copy.pt")
    capped = {"decode": {**decode, "max_len_a": 0.0, "max_len_b": 1}}
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), capped, 250), folder / "capped.pt")
    (folder / "held_out.txt").write_text("".join(f"{s}\n" for s in held_out), encoding="utf-8")
    return dict(model=model, tokenizer=tokenizer, held_out=held_out, folder=folder, checkpoint=folder / "copy.pt")


def test_held_out_set_is_translated_correctly(trained: dict) -> None:
    result, lines = translate_cli(["-m", str(trained["checkpoint"]), "-i", str(trained["folder"] / "held_out.txt")])
    assert result.exit_code == 0
    assert lines == trained["held_out"]
    assert "40 sentences" in result.stderr and "sentences/s" in result.stderr


def test_translate_sentences_matches_cli_and_restores_train_mode(trained: dict) -> None:
    model = trained["model"].train()
    got = translate_sentences(model, trained["tokenizer"], trained["held_out"], COPY_DECODE, batch_tokens=40)
    assert got == trained["held_out"]
    assert model.training
    model.eval()


def test_lines_keep_count_and_order(trained: dict) -> None:
    """Empty and blank lines, Unicode and a line longer than max_positions: one line out per line in, in order."""
    held_out = trained["held_out"]
    long_line = " ".join(COPY_WORDS * 20)  # 240 words, far beyond 64 positions
    lines = [held_out[0], "", "   ", "Grüße 🙂 漢字 e\u0301 \u2028 x", held_out[1], long_line, "", held_out[2], "\t"]
    stdin = "".join(f"{line}\n" for line in lines).encode("utf-8")
    result, out = translate_cli(["-m", str(trained["checkpoint"]), "--batch-tokens", "30"], stdin)
    assert result.exit_code == 0
    assert len(out) == len(lines)
    assert [out[i] for i in (0, 4, 7)] == held_out[:3]
    assert [out[i] for i in (1, 2, 6, 8)] == ["", "", "", ""]
    assert "1 sentences were longer than the model's 64 positions" in result.stderr


def test_only_blank_lines_give_blank_lines(trained: dict) -> None:
    """A window with nothing to decode (a pipe that has sent only blank lines so far) makes no batch at all."""
    result, out = translate_cli(["-m", str(trained["checkpoint"])], b"\n \n\t\n")
    assert result.exit_code == 0 and out == ["", "", ""]


def test_last_line_without_newline_and_crlf(trained: dict) -> None:
    held_out = trained["held_out"]
    stdin = f"{held_out[0]}\r\n{held_out[1]}".encode()
    _, out = translate_cli(["-m", str(trained["checkpoint"])], stdin)
    assert out == held_out[:2]


def test_stdin_pipe_streams_and_equals_input_file(trained: dict, tmp_path: Path) -> None:
    """Through a real pipe: the first translation arrives while standard input is still open, and the whole
    output equals that of -i with -o."""
    held_out = trained["held_out"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "mtx", "translate", "-m", str(trained["checkpoint"])],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        process.stdin.write(f"{held_out[0]}\n".encode())
        process.stdin.flush()
        ready, _, _ = select.select([process.stdout], [], [], 60)
        assert ready, "no output while the input was still open"
        first = process.stdout.readline().decode()
        rest, errors = process.communicate("".join(f"{s}\n" for s in held_out[1:]).encode(), timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, errors.decode()
    piped = first + rest.decode()
    assert piped.splitlines() == held_out
    result, _ = translate_cli(["-m", str(trained["checkpoint"]), "-i", str(trained["folder"] / "held_out.txt"),
                               "-o", str(tmp_path / "out.txt")])
    assert result.exit_code == 0
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == piped


def test_nbest_lines(trained: dict) -> None:
    held_out = trained["held_out"][:5]
    stdin = "".join(f"{s}\n" for s in [held_out[0], "", *held_out[1:]]).encode()
    result, out = translate_cli(["-m", str(trained["checkpoint"]), "--nbest", "3"], stdin)
    assert result.exit_code == 0
    assert out[1] == ""
    for line, expected in zip([out[0], *out[2:]], held_out, strict=True):
        fields = line.split("\t")
        assert len(fields) == 6
        scores = [float(s) for s in fields[0::2]]
        assert scores == sorted(scores, reverse=True)
        assert fields[1] == expected


def test_recipe_decode_defaults_and_flags(trained: dict) -> None:
    """Unset flags take the checkpoint's decode settings (here: at most one token); a flag overrides them."""
    stdin = f"{trained['held_out'][0]}\n".encode()
    _, capped = translate_cli(["-m", str(trained["folder"] / "capped.pt")], stdin)
    assert len(trained["tokenizer"].encode(capped[0])) <= 1
    _, free = translate_cli(["-m", str(trained["folder"] / "capped.pt"), "--max-len-b", "5", "--max-len-a", "1"],
                            stdin)
    assert free == trained["held_out"][:1]


def test_recipe_lenpen_style_and_nbest_are_defaults_too(trained: dict, tmp_path: Path) -> None:
    """A recipe's lenpen_style and nbest reach the search as its other decode settings do: a checkpoint whose
    recipe sets them prints what the flags print on one whose recipe does not (an older recipe, without them)."""
    decode = {"beam": 4, "lenpen": 1.5, "lenpen_style": "fairseq", "max_len_a": 1.0, "max_len_b": 5, "nbest": 3}
    checkpoint = tmp_path / "fairseq.pt"
    save_checkpoint(make_checkpoint(trained["model"], trained["tokenizer"].to_str(), {"decode": decode}, 250),
                    checkpoint)
    stdin = "".join(f"{s}\n" for s in trained["held_out"][:4]).encode()
    _, from_recipe = translate_cli(["-m", str(checkpoint)], stdin)
    _, from_flags = translate_cli(["-m", str(trained["checkpoint"]), "--lenpen", "1.5", "--lenpen-style", "fairseq",
                                   "--nbest", "3"], stdin)
    _, gnmt = translate_cli(["-m", str(trained["checkpoint"]), "--lenpen", "1.5", "--lenpen-style", "gnmt",
                             "--nbest", "3"], stdin)
    assert from_recipe == from_flags != gnmt
    assert all(len(line.split("\t")) == 6 for line in from_recipe)


def test_invalid_utf8(trained: dict) -> None:
    held_out = trained["held_out"]
    stdin = f"{held_out[0]}\n{held_out[1]}\n".encode() + b"caf\xe9\n" + f"{held_out[2]}\n".encode()
    result, out = translate_cli(["-m", str(trained["checkpoint"])], stdin)
    assert result.exit_code == 1
    assert "standard input, line 3: invalid UTF-8" in str(result.exception)
    assert "--errors replace" in str(result.exception)
    assert out == held_out[:2]  # the lines before the bad one were translated and written
    result, out = translate_cli(["-m", str(trained["checkpoint"]), "--errors", "replace"], stdin)
    assert result.exit_code == 0
    assert len(out) == 4 and out[3] == held_out[2]


@pytest.fixture
def translators(monkeypatch) -> list[Translator]:
    """The Translators that `mtx translate` builds during the test: the model and options it decodes with."""
    made: list[Translator] = []

    class Recorded(Translator):
        def __post_init__(self) -> None:
            super().__post_init__()
            made.append(self)

    monkeypatch.setattr(mtx.decode.torch_engine, "Translator", Recorded)  # the engine makes one per call
    return made


def test_int8_decodes_with_int8_linear_layers(trained: dict, translators: list[Translator]) -> None:
    """--dtype int8 must reach the model the search runs: every nn.Linear, the tied output projection included,
    becomes an int8 one (mtx.model.int8). The translations barely change, so the lines alone would also pass
    with the flag ignored."""
    held_out = trained["held_out"]
    args = ["-m", str(trained["checkpoint"]), "-i", str(trained["folder"] / "held_out.txt"), "--device", "cpu"]
    result, int8 = translate_cli([*args, "--dtype", "int8", "--threads", "1"])
    assert result.exit_code == 0
    [translator] = translators
    assert isinstance(translator.models[0].output_proj, Int8Linear)
    assert not any(isinstance(m, torch.nn.Linear) for m in translator.models[0].modules())
    assert sum(a == b for a, b in zip(int8, held_out, strict=True)) >= 0.9 * len(held_out)
    # Each input row quantised on its own (mtx.model.int8), so a sentence's int8 arithmetic depends on its batch
    # only through float32's rounding in attention over padded positions. What that guarantees on every CPU (AVX2,
    # AVX-512, VNNI kernels alike), and so what is asserted:
    # - the same batches on 1 or 2 threads: the same kernels on the same rows, so the same scores, bit for bit;
    # - alone or in a padded batch: the same tokens, and the same scores to float32's rounding for almost every
    #   sentence. Not for all: a last-bit difference can carry an activation across an int8 rounding boundary,
    #   moving it by a whole level (1/127 of its row's largest value), and such a sentence's score by far more
    #   than a rounding. One scale per batch, which this replaced, would move every sentence's score.
    jsonl = [*args, "--dtype", "int8", "--format", "jsonl"]
    one_by_one, one_thread, two_threads = ([json.loads(line) for line in translate_cli([*jsonl, *flags])[1]]
                                           for flags in (["--threads", "1", "--batch-tokens", "1"],
                                                         ["--threads", "1"], ["--threads", "2"]))
    assert [line["score"] for line in one_thread] == [line["score"] for line in two_threads]
    assert [line["tokens"] for line in one_by_one] == [line["tokens"] for line in two_threads]
    alone, batched = ([line["score"] for line in lines] for lines in (one_by_one, two_threads))
    rounding_only = [a == pytest.approx(b, abs=1e-5) for a, b in zip(alone, batched, strict=True)]
    assert sum(rounding_only) >= 0.9 * len(alone)
    assert alone == pytest.approx(batched, rel=0.1)  # a level's move, never a different translation's score


def test_beam_one_decodes_by_greedy_search(trained: dict, monkeypatch) -> None:
    """--beam 1 is greedy search, which copies the held-out set as beam 4 does: the copies alone could not
    tell the two apart, so greedy search's calls are counted."""
    calls = []
    real = mtx.decode.search.greedy_search

    def counted(*args, **kwargs) -> list[list[Hypothesis]]:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(mtx.decode.search, "greedy_search", counted)
    args = ["-m", str(trained["checkpoint"]), "-i", str(trained["folder"] / "held_out.txt")]
    _, greedy = translate_cli([*args, "--beam", "1"])
    assert greedy == trained["held_out"]
    assert calls


def test_int8_quantizes_the_output_projection_too(trained: dict) -> None:
    """int8 gives the tied output projection an int8 copy of the embedding matrix; lookups stay float32."""
    fp32 = trained["model"]
    int8 = prepare_model(copy.deepcopy(fp32), torch.device("cpu"), "int8")
    assert isinstance(int8.output_proj, Int8Linear)
    assert not any(isinstance(m, torch.nn.Linear) for m in int8.modules())  # the other projections too
    assert int8.tgt_embed.weight.dtype == torch.float32
    torch.testing.assert_close(int8.tgt_embed.weight, fp32.tgt_embed.weight)
    h = torch.randn(16, fp32.cfg.d_model, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        exact, approximate = fp32.output_logits(h), int8.output_logits(h)
    assert (approximate - exact).abs().max() < 0.05 * exact.abs().max()
    held_out = trained["held_out"]
    translated = translate_sentences(int8, trained["tokenizer"], held_out, COPY_DECODE)
    assert sum(a == b for a, b in zip(translated, held_out, strict=True)) >= 0.9 * len(held_out)


@pytest.mark.parametrize(("flags", "message"), [
    (["--beam", "2", "--nbest", "3"], "--nbest 3 must be between 1 and --beam (2)"),
    (["--dtype", "int4"], "--dtype 'int4' is not one of auto, fp32, bf16, fp16, int8"),
    (["--lenpen-style", "wu"], "--lenpen-style 'wu' is not one of gnmt, fairseq"),
    (["--beam", "0"], "--beam 0 must be at least 1"),
    (["--max-len-a", "-1"], "--max-len-a -1.0 must be at least 0"),
    (["-i", "missing.txt"], "Input file missing.txt does not exist"),
    (["--beam", "100000"], "--beam 100000 is more than the model's"),
    (["--threads", "100000"], "--threads 100000 must be between 1 and 4 × this machine's"),
    (["--threads", "0"], "--threads 0 must be between 1 and 4 × this machine's"),
    (["--batch-tokens", "0"], "--batch-tokens 0 must be at least 1"),
    (["--device", "cuda"], "--device = 'cuda' but PyTorch sees no CUDA GPU here"),
    (["--alignment-layer", "0"], "--alignment-layer only applies with --alignment"),
    (["--alignment", "--alignment-layer", "1"],
     "--alignment-layer 1 is not a layer of this model, whose decoder layers are numbered 0 to 0"),
])
def test_bad_flags_are_user_errors(trained: dict, flags: list[str], message: str, monkeypatch) -> None:
    """Exit 1 with a message naming the flag. PyTorch is made to see no GPU, so that `--device cuda` is the
    same error on every machine."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result, _ = translate_cli(["-m", str(trained["checkpoint"]), *flags], b"")
    assert result.exit_code == 1
    assert message in str(result.exception)


def test_output_that_is_the_input_file_is_refused(trained: dict, tmp_path: Path) -> None:
    """Opening -o for writing would empty the input before a line of it is read: the input file, named as
    such or through a symbolic link, is refused as -o with exit 1 and left as it was."""
    source = tmp_path / "in.txt"
    original = (trained["folder"] / "held_out.txt").read_bytes()
    source.write_bytes(original)
    (tmp_path / "link.txt").symlink_to(source)
    for output in (source, tmp_path / "link.txt"):
        result, lines = translate_cli(["-m", str(trained["checkpoint"]), "-i", str(source), "-o", str(output)])
        assert result.exit_code == 1 and lines == []
        assert f"-o {output} is also the input file" in str(result.exception)
        assert source.read_bytes() == original


def search_directly(trained: dict, sentences: list[str], penalty: LengthPenalty, min_len: int = 0,
                    **options) -> list[list[tuple[str, float]]]:
    """The decoded n-best lists that `search` itself gives each sentence, with the output limit of the
    checkpoint's recipe (a = 1, b = 5): what the command must print when given the same options."""
    tokenizer, results = trained["tokenizer"], []
    for ids in tokenizer.encode_batch(sentences):
        src = torch.tensor([[*ids, EOS]])
        constraints = Constraints(torch.tensor([len(ids) + 5]), min_len)
        [nbest] = search(trained["model"], src, src == PAD, constraints, penalty, **options)
        results.append([(tokenizer.decode(h.tokens), h.score) for h in nbest])
    return results


def parse_nbest(line: str) -> list[tuple[str, float]]:
    fields = line.split("\t")
    return [(text, float(score)) for score, text in zip(fields[0::2], fields[1::2], strict=True)]


def test_lenpen_and_lenpen_style_reach_the_search(trained: dict) -> None:
    """--lenpen α and --lenpen-style set the score log P / lp(|Y|): each setting's n-best lists (texts and
    scores) are those `search` gives with the same options. The copy's log-probability is negative and each
    step here, α from 0 to 1.5 and then fairseq's |Y|^α for GNMT's ((5 + |Y|) / 6)^α, divides it by more, so
    its score rises at each: a flag lost on the way would leave the scores of another setting."""
    sentences = trained["held_out"][:6]
    stdin = "".join(f"{s}\n" for s in sentences).encode()
    best = []
    for lenpen, style in (("0", "gnmt"), ("1.5", "gnmt"), ("1.5", "fairseq")):
        result, lines = translate_cli(["-m", str(trained["checkpoint"]), "--nbest", "4", "--lenpen", lenpen,
                                       "--lenpen-style", style], stdin)
        assert result.exit_code == 0
        got = [parse_nbest(line) for line in lines]
        expected = search_directly(trained, sentences, LengthPenalty(float(lenpen), style), beam=4, nbest=4)
        assert [[text for text, _ in n] for n in got] == [[text for text, _ in n] for n in expected]
        assert [score for n in got for _, score in n] == pytest.approx(
            [score for n in expected for _, score in n], abs=2e-4)  # printed with four decimals
        assert [n[0][0] for n in got] == sentences  # the copy is the best in every setting
        best.append([n[0][1] for n in got])
    for raw, gnmt, fairseq in zip(*best, strict=True):
        assert raw < gnmt < fairseq < 0


def test_min_len_makes_every_output_at_least_that_long(trained: dict) -> None:
    """--min-len 5 forbids EOS before five tokens: the sentences of fewer words, which the model would copy
    and end, get longer outputs, those of five or more are still copied, and all are what `search` gives
    with min_len=5."""
    sentences, tokenizer = trained["held_out"][:8], trained["tokenizer"]
    lengths = [len(tokenizer.encode(s)) for s in sentences]
    assert min(lengths) < 5 <= max(lengths)
    stdin = "".join(f"{s}\n" for s in sentences).encode()
    result, lines = translate_cli(["-m", str(trained["checkpoint"]), "--min-len", "5"], stdin)
    assert result.exit_code == 0
    assert lines == [n[0][0] for n in search_directly(trained, sentences, LengthPenalty(0.6), min_len=5, beam=4)]
    assert all(len(tokenizer.encode(line)) >= 5 for line in lines)
    assert [line for line, n in zip(lines, lengths, strict=True) if n >= 5] == [
        s for s, n in zip(sentences, lengths, strict=True) if n >= 5]


def test_a_search_too_large_for_memory_is_refused_before_it_starts(trained: dict, monkeypatch) -> None:
    """The decoder cache and scores a batch needs are estimated before anything is allocated: with 8 MiB
    "available", beam 4 fits and beam 200 does not."""
    monkeypatch.setattr(mtx.decode.translator, "available_memory", lambda device: 8 * 2**20)
    args = ["-m", str(trained["checkpoint"]), "-i", str(trained["folder"] / "held_out.txt"), "--threads", "1"]
    result, lines = translate_cli([*args, "--beam", "4", "--batch-tokens", "200"])
    assert result.exit_code == 0 and len(lines) == len(trained["held_out"])
    result, lines = translate_cli([*args, "--beam", "200", "--batch-tokens", "200"])
    assert result.exit_code == 1 and lines == []
    assert "Beam 200 needs about" in str(result.exception) and "lower --beam or --batch-tokens" in str(
        result.exception)


def test_the_memory_of_aligning_is_counted_before_the_search_starts(trained: dict, monkeypatch) -> None:
    """Aligning a long translation holds every head's weights over source and target: with memory for the
    search but not for that, a translation that aligns is refused before it starts, and a plain one runs."""
    sentence = " ".join(trained["held_out"][:3])
    decode = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5)
    plain = Translator(trained["model"].eval(), trained["tokenizer"], decode)
    aligned = Translator(trained["model"], trained["tokenizer"], decode, alignment_layer=0)
    source = len(trained["tokenizer"].encode(sentence)) + 1
    limit = plain.output_limit(source - 1)
    search_bytes, aligning_bytes = plain._batch_bytes(1, source, limit), aligned._batch_bytes(1, source, limit)
    assert aligning_bytes > search_bytes
    monkeypatch.setattr(mtx.decode.translator, "available_memory", lambda device: (search_bytes + aligning_bytes) // 2)
    assert plain.translate([sentence])[0][0].text  # a translation, not a refusal
    with pytest.raises(MtxError, match=r"Beam 1 needs about .* MiB .* \(or for aligning them\), but only"):
        aligned.translate([sentence])


def test_half_precision_keeps_layernorm_and_positions_in_float32(trained: dict) -> None:
    """bf16 and fp16 inference (run here on the CPU, as a GPU runs it): half-precision matrices, float32
    LayerNorms and positional table, and the held-out set still copied exactly."""
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        model = prepare_model(copy.deepcopy(trained["model"]), torch.device("cpu"), dtype)
        assert model.tgt_embed.weight.dtype == model.decoder_layers[0].ffn.fc1.weight.dtype == torch_dtype
        assert model.positions.dtype == torch.float32
        norms = [m for m in model.modules() if isinstance(m, torch.nn.LayerNorm)]
        assert norms and all(m.weight.dtype == torch.float32 for m in norms)
        held_out = trained["held_out"]
        translated = translate_sentences(model, trained["tokenizer"], held_out, COPY_DECODE)
        assert translated == held_out, dtype


def test_read_ahead_windows_are_bounded_and_errors_come_last() -> None:
    def lines():
        yield from (str(i) for i in range(10))
        raise MtxError("bad line 11")

    got = []
    with pytest.raises(MtxError, match="bad line 11"):
        for window in read_ahead(lines(), window=4):
            assert 1 <= len(window) <= 4
            got.extend(window)
    assert got == [str(i) for i in range(10)]


def test_workers_spread_over_cpu_threads() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert workers_for(cpu, 2) == (2, 1)  # two batches at a time, one thread each
    assert workers_for(cpu, 1) == (1, 1)  # one thread: no worker, batches decoded here
    assert workers_for(cpu, 4) == (4, 1)
    assert workers_for(cpu, 32) == (8, 4)  # at most MAX_WORKERS batches at a time
    assert workers_for(cuda, 8) == (1, 8)


def test_a_worker_pool_keeps_order_sets_threads_raises_and_restarts() -> None:
    """Calls go to workers started once (their pids the same from call to call), whose `load` set their threads,
    and come back in order; an error in a worker is raised here with the worker's traceback as its cause, and a
    worker that dies is a WorkerDied naming it, after which a new one answers."""
    before = torch.get_num_threads()
    pool = WorkerPool(3, load_probe, 7)
    try:
        results = pool.map("work", [(i,) for i in range(20)])
        assert [r[0] for r in results] == [i * i + 7 for i in range(20)]
        assert {r[1] for r in results} == {1} and torch.get_num_threads() == before
        assert {r[2] for r in results} <= set(pool.pids()) and os.getpid() not in pool.pids()
        with pytest.raises(ValueError, match="item") as raised:
            pool.map("fail", [(1,), (2,)])
        assert "in decoding process" in str(raised.value.__cause__)
        with pytest.raises(WorkerDied, match="stopped .* it was restarted: retry") as died:
            pool.call("die", 1)
        assert died.value.restarted and pool.call("work", 3)[0] == 16
    finally:
        pool.close()


def test_batches_decoded_side_by_side_equal_one_at_a_time(trained: dict) -> None:
    """Several batches at once (small batches, two workers) give the strings and scores of one batch at a time in
    this process. The workers are started once, and serve every later call."""
    from mtx.decode.engines import open_engine
    from mtx.decode.request import Request

    results = []
    for threads in (1, 2):
        engine = open_engine("torch", [trained["checkpoint"]], device="cpu", dtype="fp32", threads=threads,
                             batch_tokens=40, log=lambda text: None)
        try:
            request = Request.of(engine.facts, {})
            sources = engine.facts.encode(trained["held_out"])
            results.append(engine.translate(sources, request, range(len(sources))))
            pids = engine.pids()
            assert len(pids) == (2 if threads == 2 else 0)
            if pids:
                engine.translate(sources[:8], request, range(8))
                assert engine.pids() == pids
        finally:
            engine.close()
    one_at_a_time, side_by_side = results
    assert [n[0][0] for n in side_by_side] == [n[0][0] for n in one_at_a_time]
    for a, b in zip(side_by_side, one_at_a_time, strict=True):
        assert a[0][1] == b[0][1]


def diagonal_share(links: list[list[tuple[int, int]]]) -> float:
    every = [link for line in links for link in line]
    return sum(source == target for source, target in every) / len(every)


def test_alignment_follows_the_plain_translation_and_is_the_diagonal_of_a_copy(trained: dict) -> None:
    """--alignment: each line is the plain translation, " ||| " and one link per target word, in target order.
    The model copies, so target word i is source word i: the default layer's links are the diagonal (all
    but a few). Line count and order are kept, and an empty line gives the separator alone."""
    held_out = trained["held_out"]
    lines = [held_out[0], "", *held_out[1:], "  "]
    stdin = "".join(f"{line}\n" for line in lines).encode()
    _, plain = translate_cli(["-m", str(trained["checkpoint"])], stdin)
    result, aligned = translate_cli(["-m", str(trained["checkpoint"]), "--alignment", "--batch-tokens", "60"], stdin)
    assert result.exit_code == 0 and len(aligned) == len(lines)
    assert aligned[1] == aligned[-1] == " ||| "
    texts, links = split_alignments(aligned)
    assert texts == plain
    for text, line_links in zip(texts, links, strict=True):
        assert [target for _, target in line_links] == list(range(len(text.split())))
    assert diagonal_share(links) >= 0.9


def test_each_nbest_entry_gets_its_own_alignment(trained: dict) -> None:
    held_out = trained["held_out"][:5]
    stdin = "".join(f"{s}\n" for s in [held_out[0], "", *held_out[1:]]).encode()
    _, plain = translate_cli(["-m", str(trained["checkpoint"]), "--nbest", "3"], stdin)
    result, aligned = translate_cli(["-m", str(trained["checkpoint"]), "--nbest", "3", "--alignment"], stdin)
    assert result.exit_code == 0 and aligned[1] == plain[1] == ""
    for plain_line, aligned_line in zip([plain[0], *plain[2:]], [aligned[0], *aligned[2:]], strict=True):
        fields, aligned_fields = plain_line.split("\t"), aligned_line.split("\t")
        assert aligned_fields[0::2] == fields[0::2]  # the scores
        texts, links = split_alignments(aligned_fields[1::2])
        assert texts == fields[1::2]
        assert all(len(line_links) == len(text.split()) for text, line_links in zip(texts, links, strict=True))
    best = [split_alignments([line.split("\t")[1]])[1][0] for line in [aligned[0], *aligned[2:]]]
    assert diagonal_share(best) >= 0.9


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "int8"])
def test_alignment_leaves_the_search_unchanged(trained: dict, dtype: str) -> None:
    """Aligning runs after the search: beam 4's n-best texts and scores are those of a translator that does
    not align, in every numeric format, and a copy's alignment is still the diagonal."""
    model = prepare_model(copy.deepcopy(trained["model"]), torch.device("cpu"), dtype)
    decode = dataclasses.replace(COPY_DECODE, nbest=2)
    plain = Translator(model, trained["tokenizer"], decode).translate(trained["held_out"])
    aligned = Translator(model, trained["tokenizer"], decode, alignment_layer=0).translate(trained["held_out"])
    assert [[(t.text, t.score) for t in n] for n in aligned] == [[(t.text, t.score) for t in n] for n in plain]
    assert all(t.alignment is None for n in plain for t in n)
    assert diagonal_share([n[0].alignment for n in aligned]) >= 0.9


def test_jsonl_has_one_object_per_line_with_the_texts_tokens_and_log_probs_of_the_plain_output(trained: dict) -> None:
    """--format jsonl: as many lines as the input, each a JSON object whose text and score are those of the
    plain --nbest output; its tokens spell the text and end in </s>, with one log-probability each, summing
    to the score times the length penalty (the recipe's α = 0.6 in the default style, fairseq's |Y|^α, |Y|
    counting EOS); an empty line has no tokens."""
    held_out = trained["held_out"][:6]
    stdin = "".join(f"{s}\n" for s in [held_out[0], "", *held_out[1:]]).encode()
    checkpoint = str(trained["checkpoint"])
    _, plain = translate_cli(["-m", checkpoint, "--nbest", "2"], stdin)
    result, lines = translate_cli(["-m", checkpoint, "--nbest", "2", "--format", "jsonl"], stdin)
    assert result.exit_code == 0 and len(lines) == len(plain) == 7
    objects = [json.loads(line) for line in lines]
    assert objects[1] == {"text": "", "score": None, "tokens": [], "token_log_probs": [], "flags": [], "nbest": []}
    for obj, plain_line in zip(objects, plain, strict=True):
        fields = plain_line.split("\t") if plain_line else []
        assert [h["text"] for h in obj["nbest"]] == fields[1::2]
        assert [f"{h['score']:.4f}" for h in obj["nbest"]] == fields[0::2]
        for h in obj["nbest"]:
            assert h["tokens"][-1] == "</s>" and "".join(h["tokens"][:-1]).strip() == h["text"]
            assert len(h["token_log_probs"]) == len(h["tokens"]) and max(h["token_log_probs"]) <= 0
            assert sum(h["token_log_probs"]) / len(h["tokens"]) ** 0.6 == pytest.approx(h["score"], abs=1e-4)
        if obj["nbest"]:
            assert {k: obj[k] for k in ("text", "score", "tokens", "token_log_probs")} == obj["nbest"][0]


def test_jsonl_alignment_is_the_pharaoh_alignments_links(trained: dict) -> None:
    held_out = trained["held_out"][:5]
    stdin = "".join(f"{s}\n" for s in [*held_out, ""]).encode()
    _, aligned = translate_cli(["-m", str(trained["checkpoint"]), "--alignment"], stdin)
    result, lines = translate_cli(["-m", str(trained["checkpoint"]), "--alignment", "--format", "jsonl"], stdin)
    assert result.exit_code == 0
    objects = [json.loads(line) for line in lines]
    texts, links = split_alignments(aligned)
    assert [obj["text"] for obj in objects] == texts
    assert [[tuple(link) for link in obj["alignment"]] for obj in objects] == links
    assert "nbest" not in objects[0] and objects[-1]["alignment"] == []


def test_jsonl_refuses_an_unknown_format(trained: dict) -> None:
    result, _ = translate_cli(["-m", str(trained["checkpoint"]), "--format", "json"], b"a\n")
    assert result.exit_code == 1 and "--format 'json' is not one of text, jsonl" in str(result.exception)


def test_each_writer_turns_a_lines_result_into_its_output_line(trained: dict) -> None:
    """The writers `mtx translate` chooses once per run: text, n-best text and jsonl for a search's n-best lists,
    text and jsonl for the scores of given translations; an empty input line (no hypothesis) in each."""
    tokenizer = trained["tokenizer"]
    ids = tokenizer.encode("red cat")
    log_probs = [-0.125] * len(ids) + [-0.0625]
    best = Translation("red café", -0.25, ids, log_probs, [(0, 0), (1, 1)], ("loop",))
    other = Translation("cat red", -1.5, ids, log_probs, [(1, 0), (0, 1)])
    text, nbest, jsonl = (search_writer(form, tokenizer, several, True)
                          for form, several in (("text", False), ("text", True), ("jsonl", True)))
    assert text.line([best, other]) == "red café ||| 0-0 1-1" and text.line([]) == " ||| "
    assert search_writer("text", tokenizer, False, False).line([best, other]) == "red café"
    assert nbest.line([best, other]) == "-0.2500\tred café ||| 0-0 1-1\t-1.5000\tcat red ||| 1-0 0-1"
    assert nbest.line([]) == ""
    fields = {"text": "red café", "score": -0.25, "tokens": [*tokenizer.pieces(ids), "</s>"],
              "token_log_probs": log_probs, "alignment": [[0, 0], [1, 1]]}
    line = jsonl.line([best, other])
    assert "café" in line and json.loads(line) == {**fields, "flags": ["loop"], "nbest": [
        fields, {**fields, "text": "cat red", "score": -1.5, "alignment": [[1, 0], [0, 1]]}]}
    assert json.loads(search_writer("jsonl", tokenizer, False, False).line([])) == {
        "text": "", "score": None, "tokens": [], "token_log_probs": [], "flags": []}

    assert score_writer("text", tokenizer).line(best) == "-0.2500\tred café" and score_writer("text", tokenizer).line(
        None) == ""
    scored = {k: v for k, v in fields.items() if k != "alignment"}
    assert score_writer("jsonl", tokenizer).line(best) == json.dumps({**scored, "log_prob": sum(log_probs),
                                                                      "flags": []}, ensure_ascii=False)
    assert json.loads(score_writer("jsonl", tokenizer).line(None)) == {
        "text": "", "score": None, "tokens": [], "token_log_probs": [], "log_prob": None, "flags": []}


def test_a_files_windows_are_full_however_slowly_its_lines_come(tmp_path: Path) -> None:
    """A file is cut into the same windows at every run, so into the same batches, and its translation is the
    same under any load; a pipe's window holds what has arrived, so that a slow pipe's lines are not held back."""
    def slow(n: int):
        for i in range(n):
            time.sleep(0.002 * (i % 3 == 0))
            yield str(i)

    assert [len(w) for w in read_ahead(slow(10), window=4, full=True)] == [4, 4, 2]
    streamed = [len(w) for w in read_ahead(slow(10), window=4)]
    assert sum(streamed) == 10 and all(1 <= n <= 4 for n in streamed)

    (tmp_path / "in.txt").write_text("a\n")
    with open(tmp_path / "in.txt", "rb") as file:
        assert is_a_file(file)
    read, write = os.pipe()
    with os.fdopen(read, "rb") as pipe, os.fdopen(write, "wb"):
        assert not is_a_file(pipe)
    assert not is_a_file(io.BytesIO(b"a\n"))  # the test runner's standard input


def test_windows_carry_their_companion_lines_and_a_count_that_differs_is_refused() -> None:
    """Reading: each window of the input with as many lines of the --prefix (or --score-reference) file, and the
    index of its first line; a companion file that runs out first, or has lines left over, is refused."""
    companion = Companion("--prefix", Path("starts.de"))
    lines = [f"line {i}" for i in range(5)]
    windows = list(read_windows(lines, companion, iter(f"start {i}" for i in range(5))))
    assert sum((w.lines for w in windows), []) == lines
    assert all(w.given == [line.replace("line", "start") for line in w.lines] for w in windows)
    assert [w.first for w in windows] == [sum(len(v.lines) for v in windows[:i]) for i in range(len(windows))]
    assert [w.given for w in read_windows(lines, None, iter(()))] == [[] for _ in windows]
    with pytest.raises(MtxError, match=r"^--prefix starts.de has 3 lines, but the input has more: its line 4 has no "):
        list(read_windows(lines, companion, iter(lines[:3])))
    with pytest.raises(MtxError, match=r"^--prefix starts.de has more lines than the input's 5: give one line"):
        list(read_windows(lines, companion, iter([*lines, "extra"])))
