"""Every command with every vocabulary style: bytelevel BPE, metaspace BPE and metaspace unigram (data.bpe).

Each style prepares its own reverse-copy run (copy_task's words, plus a few accented ones) through the real CLI,
in this process: `mtx prepare`, `mtx train`, `mtx average`, then `mtx translate` (text, --alignment, --format
jsonl), `mtx inspect`, an ensemble of two checkpoints and `mtx export` to transformers and CTranslate2, whose
greedy output must be mtx's own tokens. Metaspace's own cases go through every command too: a character the
vocabulary lacks (spelled as byte tokens), accents (one symbol each, no bytes) and a literal "▁" in the text.
Metaspace BPE trains long enough to learn the task (a BLEU bar); the other two train a few dozen updates,
enough for outputs that are not all alike.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support import REVERSE_WORDS, base_recipe, split_alignments, words_of, write_pairs, write_recipe
from typer.testing import CliRunner

from mtx.checkpoint import load_checkpoint, load_model
from mtx.cli import app
from mtx.config.recipe import DecodeConfig
from mtx.decode.ensemble import load_models
from mtx.decode.search import Constraints, LengthPenalty, search
from mtx.decode.translator import Translator
from mtx.errors import MtxError
from mtx.score.metrics import corpus_bleu
from mtx.tokenizer import BYTE_TOKENS, EOS, PAD, SPECIAL_TOKENS, Tokenizer, normalize_text

STYLES = [("bytelevel", "bpe"), ("metaspace", "bpe"), ("metaspace", "unigram")]
LEARNER = ("metaspace", "bpe")  # the style that trains until it reverses word sequences
ACCENTED = ["café", "thé", "crème", "été", "naïve", "grüße"]  # in the training data: metaspace's symbols
# A character no training sentence holds (byte fallback), accents, literal "▁"s (metaspace normalizes them to
# U+0001 and decodes them back), special-token text, and whitespace that normalize_text collapses.
ODD = ["ba ☃ cé me", "café ▁ thé", "▁▁da fe▁bu", "crème </s> <s> ko", "  ga\tlu   mi "]
MAX_WORDS = 4  # per sentence: the longer, the more updates reversing takes
TASK_LINES = 8  # held-out task sentences that translate, inspect and the ensemble are given
CARD_NAMES = {("bytelevel", "bpe"): "byte-level BPE", ("metaspace", "bpe"): "metaspace BPE",
              ("metaspace", "unigram"): "metaspace unigram"}  # how an export's model card names each style
DECODE = DecodeConfig(beam=1, max_len_a=1.0, max_len_b=5)  # the recipe's decode: section


@dataclass(frozen=True)
class Run:
    style: str
    model: str
    root: Path  # the test's folder: text/ and recipe.yaml
    folder: Path  # the run folder: data/, checkpoints/, average.pt
    tokenizer: Tokenizer
    sources: list[str]  # held-out sentences of the task

    @property
    def learns(self) -> bool:
        return (self.style, self.model) == LEARNER

    @property
    def average(self) -> Path:
        return self.folder / "average.pt"

    def checkpoints(self) -> list[Path]:
        return sorted((self.folder / "checkpoints").glob("step_*.pt"), key=lambda p: int(p.stem.split("_")[1]))


def mtx(*args: str, stdin: str | None = None) -> str:
    """`mtx ARGS` in this process; its standard output. Fails the test on any exit but 0."""
    result = CliRunner().invoke(app, list(args), input=stdin)
    if result.exception is not None and not isinstance(result.exception, MtxError | SystemExit):
        raise result.exception
    assert result.exit_code == 0, f"mtx {' '.join(args)}: {result.exception}\n{result.stderr[-2000:]}"
    return result.stdout


def style_recipe(root: Path, style: str, model: str, learns: bool) -> Path:
    """The recipe of a reverse-copy run of 2 to MAX_WORDS words, with accented words in a tenth of the training
    pairs; the learner trains 2 layers for 300 updates, the others 1 layer for 40. Checkpoints every half run."""
    raw = base_recipe(root, train_pairs=10, valid_pairs=10)
    text = root / "text"
    train = write_pairs(text, "train", 2000, seed=1, max_words=MAX_WORDS)
    write_pairs(text, "valid", 30, seed=2, max_words=MAX_WORDS)
    write_pairs(text, "test", 100, seed=3, max_words=MAX_WORDS)
    rng, extra = random.Random(4), ([], [])
    for _ in range(200):
        words = [rng.choice(REVERSE_WORDS + ACCENTED) for _ in range(rng.randint(2, MAX_WORDS))]
        extra[0].append(" ".join(words))
        extra[1].append(" ".join(reversed(words)))
    for path, lines in zip(train, extra, strict=True):
        with path.open("a", encoding="utf-8") as file:
            file.write("".join(f"{line}\n" for line in lines))
    steps, layers = (300, 2) if learns else (40, 1)
    raw["data"]["bpe"].update(style=style, model=model, vocab_size=400)
    raw["model"].update(layers_enc=layers, layers_dec=layers, d_model=64, d_ff=128, dropout=0.0)
    raw["train"].update(max_tokens=600, lr=5e-3, warmup=30, clip_norm=1.0, max_steps=steps, save_every=steps // 2,
                        validate_every=steps, log_every=steps)
    return write_recipe(root, raw)


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One thread, as the BLEU bar was calibrated with; two would compete for a 2-core machine's cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prepared_run(root: Path, style: str, model: str) -> Run:
    """prepare → train → average through the CLI."""
    recipe = style_recipe(root, style, model, learns=(style, model) == LEARNER)
    mtx("prepare", str(recipe), "--workers", "1")
    mtx("train", str(recipe))
    folder = root / "run"
    mtx("average", "--dir", str(folder / "checkpoints"), "--last", "2", "-o", str(folder / "average.pt"))
    sources = (root / "text" / "test.src").read_text(encoding="utf-8").splitlines()
    return Run(style, model, root, folder, Tokenizer.from_file(folder / "data" / "tokenizer.json"), sources)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Callable[[tuple[str, str]], Run]:
    """Each style's run, made when a test first asks for it and kept for the module's other tests."""
    made: dict[tuple[str, str], Run] = {}

    def run_of(style: tuple[str, str]) -> Run:
        if style not in made:
            made[style] = prepared_run(tmp_path_factory.mktemp("-".join(style)), *style)
        return made[style]

    return run_of


@pytest.fixture(params=STYLES, ids=["-".join(s) for s in STYLES])
def run(request, runs: Callable[[tuple[str, str]], Run]) -> Run:
    return runs(request.param)


def lines_in(lines: list[str]) -> str:
    return "".join(f"{line}\n" for line in lines)


def inputs(run: Run) -> list[str]:
    """TASK_LINES task sentences, the odd ones and an empty line: what each command is given."""
    return [*run.sources[:TASK_LINES], *ODD, ""]


def byte_ids(text: str) -> list[int]:
    """The ids of metaspace's byte tokens for the UTF-8 bytes of `text`: they follow the specials."""
    return [len(SPECIAL_TOKENS) + byte for byte in text.encode("utf-8")]


# ----------------------------------------------------------------------------------------- prepare, train


def test_prepare_records_the_style_and_the_vocabulary_has_it(run: Run) -> None:
    """The manifest names the style and model; the run's tokenizer.json is of that style, lossless on odd text.
    Metaspace: a character absent from the corpus is its UTF-8 bytes, ids 4 + byte; an accented character of
    the corpus is a symbol of its own, no bytes."""
    manifest = json.loads((run.folder / "data" / "manifest.json").read_text(encoding="utf-8"))
    assert (manifest["bpe"]["style"], manifest["bpe"]["model"]) == (run.style, run.model)
    assert (run.tokenizer.style, run.tokenizer.model) == (run.style, run.model)
    for text in ODD:
        assert run.tokenizer.decode(run.tokenizer.encode(normalize_text(text))) == normalize_text(text)
    if run.style == "metaspace":
        assert run.tokenizer.encode("☃")[-3:] == byte_ids("☃")
        assert all(i >= len(SPECIAL_TOKENS) + len(BYTE_TOKENS) for i in run.tokenizer.encode(" ".join(ACCENTED)))
        assert run.tokenizer.encode("▁")[-1] == byte_ids("\x01")[0]  # the stand-in U+0001, which no corpus holds


def test_training_writes_checkpoints_and_the_loss_falls(run: Run) -> None:
    """Two step checkpoints, and a validation at the end whose loss is well below a uniform guess's, ln V."""
    steps = [int(p.stem.split("_")[1]) for p in run.checkpoints()]
    assert len(steps) == 2 and steps[1] == 2 * steps[0]
    events = [json.loads(line) for line in (run.folder / "metrics.jsonl").read_text().splitlines()]
    [valid] = [e for e in events if e["event"] == "valid"]
    assert valid["step"] == steps[1] and valid["valid_loss"] < 0.7 * math.log(run.tokenizer.vocab_size)


def test_metaspace_bpe_learns_to_reverse(runs: Callable[[tuple[str, str]], Run]) -> None:
    """The learner's averaged model reverses held-out word sequences through `mtx translate`: test BLEU ≥ 88.

    Calibrated on a shared 2-core CPU, one thread: 96.54 with the recipe's seed 1 (97.33 with two threads, whose
    sums round differently); seeds 2 to 8 score 96.09, 90.42, 99.68, 98.90, 100.00, 95.00 and 92.46. The bar is
    the lowest of the eight seeds less 2.4 BLEU, for rounding that differs between machines: 300 updates leave
    a model still learning, where a small difference early moves the score by a few points. A model that has
    not learned to reverse (one that copies, or stops early) scores far below it."""
    run = runs(LEARNER)
    test_src, test_tgt = run.root / "text" / "test.src", run.root / "text" / "test.tgt"
    hypotheses = run.root / "test.hyp"
    mtx("translate", "-m", str(run.average), "-i", str(test_src), "-o", str(hypotheses))
    bleu = corpus_bleu(hypotheses.read_text(encoding="utf-8").splitlines(),
                       test_tgt.read_text(encoding="utf-8").splitlines())
    assert bleu >= 88


# ------------------------------------------------------------------------------------------------ translate


def test_translate_text_alignment_and_jsonl(run: Run) -> None:
    """Text in, text out, a line per line; --alignment's texts are the plain ones, with one link per word of the
    output and source words that exist; --format jsonl's tokens spell the text and its links are the same.
    The learner's links are the anti-diagonal: target word i comes from source word n - 1 - i of n."""
    lines = inputs(run)
    plain = mtx("translate", "-m", str(run.average), stdin=lines_in(lines)).splitlines()
    assert len(plain) == len(lines) and plain[-1] == ""
    aligned = mtx("translate", "-m", str(run.average), "--alignment", stdin=lines_in(lines)).splitlines()
    texts, links = split_alignments(aligned)
    assert texts == plain
    for source, text, line_links in zip(lines, texts, links, strict=True):
        assert [target for _, target in line_links] == list(range(len(text.split())))
        assert all(0 <= s < len(normalize_text(source).split()) for s, _ in line_links)
    objects = [json.loads(line) for line in mtx("translate", "-m", str(run.average), "--alignment", "--format",
                                                 "jsonl", stdin=lines_in(lines)).splitlines()]
    assert [obj["text"] for obj in objects] == plain
    assert [[tuple(link) for link in obj["alignment"]] for obj in objects] == links
    for obj in objects[:-1]:
        assert obj["tokens"][-1] == "</s>" and normalize_text("".join(obj["tokens"][:-1])) == obj["text"]
    if run.learns:
        task = [(len(source.split()), line_links) for source, line_links in zip(lines[:TASK_LINES], links[:TASK_LINES],
                                                                                strict=True)]
        reversed_links = sum(s == n - 1 - t for n, line_links in task for s, t in line_links)
        assert reversed_links >= 0.9 * sum(n for n, _ in task)


# -------------------------------------------------------------------------------------------------- inspect


@pytest.mark.parametrize("sentence", [0, *ODD[:3]], ids=["task", "bytes", "accents", "metaspace"])
def test_inspect_labels_spell_the_sentence_and_its_translation(run: Run, sentence: int | str) -> None:
    """`mtx inspect --json`: the translation `mtx translate` gives, and labels that spell the source and the
    translation word by word, "▁" only where the text has one."""
    sentence = run.sources[sentence] if isinstance(sentence, int) else sentence
    translated = mtx("translate", "-m", str(run.average), stdin=lines_in([sentence])).splitlines()[0]
    summary = json.loads(mtx("inspect", "-m", str(run.average), sentence, "--json", "--kind", "cross"))
    assert summary["source"] == normalize_text(sentence) and summary["translation"] == translated
    rows, columns = summary["labels"]["cross"]["rows"], summary["labels"]["cross"]["columns"]
    assert columns[-1] == rows[-1] == "</s>"
    assert words_of(columns) == normalize_text(sentence) and words_of(rows) == translated
    assert sum("▁" in label for label in columns) == normalize_text(sentence).count("▁")
    printed = mtx("inspect", "-m", str(run.average), sentence, "--kind", "cross", "--head", "mean")
    assert f"translation  {translated}" in printed and "cross-attention · layer" in printed


# ---------------------------------------------------------------------------------------- ensemble, average


def test_an_ensemble_of_two_checkpoints_translates_as_the_library_does(run: Run) -> None:
    first, second = map(str, run.checkpoints())
    lines = inputs(run)
    both = mtx("translate", "-m", first, "-m", second, stdin=lines_in(lines)).splitlines()
    models, tokenizer, _ = load_models([first, second])
    expected = Translator(models, tokenizer, DECODE).translate([normalize_text(line) for line in lines])
    assert both == [nbest[0].text if nbest else "" for nbest in expected]


def test_average_is_the_mean_of_the_last_two_checkpoints(run: Run) -> None:
    averaged = load_checkpoint(run.average)
    first, second = (load_checkpoint(path) for path in run.checkpoints())
    assert averaged["tokenizer"] == first["tokenizer"] == run.tokenizer.to_str()
    for name, tensor in averaged["model"].items():
        torch.testing.assert_close(tensor, (first["model"][name] + second["model"][name]) / 2, msg=name)


# --------------------------------------------------------------------------------------------------- export


def mtx_greedy(run: Run, texts: list[str]) -> tuple[list[list[int]], list[int]]:
    """mtx's greedy tokens for each text (EOS not included) and the limit each was searched with."""
    model, tokenizer, _ = load_model(run.average)
    outputs, limits = [], []
    for text in texts:
        ids = tokenizer.encode(normalize_text(text))
        src = torch.tensor([[*ids, EOS]])
        limits.append(len(ids) + 5)
        constraints = Constraints(torch.tensor([limits[-1]]))
        outputs.append(search(model, src, src == PAD, constraints, LengthPenalty(0.6), beam=1)[0][0].tokens)
    return outputs, limits


def test_hf_export_encodes_decodes_and_greedy_decodes_as_mtx(run: Run) -> None:
    transformers = pytest.importorskip("transformers")
    out = run.root / "hf"
    mtx("export", "-m", str(run.average), "--to", "hf", str(out))
    assert f"{run.tokenizer.vocab_size:,} {CARD_NAMES[run.style, run.model]} tokens" in (out / "README.md").read_text()
    generation = json.loads((out / "generation_config.json").read_text())  # the recipe's greedy search, no α
    assert generation.get("num_beams", 1) == 1 and generation.get("length_penalty", 1.0) == 1.0
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    texts = [*run.sources[:6], *ODD]
    ours, limits = mtx_greedy(run, texts)
    for text, tokens, limit in zip(texts, ours, limits, strict=True):
        ids = run.tokenizer.encode(normalize_text(text))
        assert tokenizer(text)["input_ids"] == [*ids, EOS]
        assert tokenizer.decode(ids, skip_special_tokens=True) == normalize_text(text)
        generated = model.generate(**tokenizer([text], return_tensors="pt"), num_beams=1, max_new_tokens=limit + 1)
        assert [t for t in generated[0, 1:].tolist() if t not in (EOS, PAD)] == tokens, text
        assert tokenizer.decode(generated[0], skip_special_tokens=True) == run.tokenizer.decode(tokens)


def test_ctranslate2_export_encodes_decodes_and_greedy_decodes_as_mtx(run: Run) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tokenizers import Tokenizer as HfTokenizer

    out = run.root / "ct2"
    mtx("export", "-m", str(run.average), "--to", "ctranslate2", str(out))
    tokenizer = HfTokenizer.from_file(str(out / "tokenizer.json"))
    tokenizer.encode_special_tokens = True  # as its README says
    translator = ctranslate2.Translator(str(out), device="cpu")
    texts = [*run.sources[:6], *ODD]
    ours, limits = mtx_greedy(run, texts)
    for text, tokens, limit in zip(texts, ours, limits, strict=True):
        encoded = tokenizer.encode(text)
        assert encoded.ids == [*run.tokenizer.encode(normalize_text(text)), EOS]
        assert tokenizer.decode(encoded.ids) == normalize_text(text)
        [result] = translator.translate_batch([encoded.tokens], beam_size=1, max_decoding_length=limit,
                                              min_decoding_length=0, suppress_sequences=[["<pad>"], ["<s>"]])
        assert [tokenizer.token_to_id(t) for t in result.hypotheses[0]] == tokens, text
        assert tokenizer.decode(tokens) == run.tokenizer.decode(tokens)
