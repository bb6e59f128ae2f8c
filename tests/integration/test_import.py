"""`mtx import`: MarianMT folders built here become mtx checkpoints that decode as transformers' `generate` does.

No hub is reachable, so each folder is made locally, as OPUS-MT's are published: two SentencePiece models and a
joint vocab.json from the demo corpus, a MarianConfig of one option combination, MarianMTModel's weights trained
for a few hundred steps to copy its input (random weights give near-flat distributions, whose ties any rounding
breaks differently), a random final_logits_bias, save_pretrained. Then mtx's greedy and beam-4 search must give
`generate`'s tokens on 200 sentences, the CTranslate2 export greedy too, and import → export → import the same
weights. Every refusal and every bad input is one message, exit 1, nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from support import Server, marian_tokenizer_folder, serving

pytest.importorskip("sentencepiece")
transformers = pytest.importorskip("transformers")

from typer.testing import CliRunner  # noqa: E402

from mtx.checkpoint import load_checkpoint, load_model, save_checkpoint  # noqa: E402
from mtx.cli import app  # noqa: E402
from mtx.config.decode import DecodeConfig  # noqa: E402
from mtx.data.demo import sample_pairs  # noqa: E402
from mtx.decode.search import Constraints, LengthPenalty, search  # noqa: E402
from mtx.decode.target_lang import TargetLanguages  # noqa: E402
from mtx.errors import MtxError  # noqa: E402
from mtx.export.command import export_checkpoint  # noqa: E402
from mtx.importing.command import import_checkpoint  # noqa: E402
from mtx.importing.marian import NEVER  # noqa: E402
from mtx.tokenizer import EOS, PAD, Tokenizer  # noqa: E402

SENTENCES = 200
MAX_POSITIONS = 64
LIMIT = 40  # tokens before EOS, in both searches
# The option combinations that matter: OPUS-MT's own (swish, scaled, shared), the other activations, separate
# embeddings, no embedding scale; each with its generation settings.
VARIANTS = {
    "opus-mt": dict(activation_function="swish", scale_embedding=True, share_encoder_decoder_embeddings=True),
    "relu": dict(activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True),
    "gelu-separate": dict(activation_function="gelu", scale_embedding=True, share_encoder_decoder_embeddings=False),
    "unscaled": dict(activation_function="silu", scale_embedding=False, share_encoder_decoder_embeddings=True),
}
LENGTH_PENALTY = {"opus-mt": 1.0, "relu": 0.6, "gelu-separate": 1.0, "unscaled": 0.6}


@dataclass
class Ran:
    exit_code: int
    output: str  # what the command printed, or the message `mtx` prints for its user error
    stdout: str


def run(*args: str) -> Ran:
    """`mtx` in this process; a user error (MtxError) is exit code 1 with its message, as `mtx.cli.main` makes it."""
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, MtxError):
        return Ran(1, str(result.exception), "")
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Ran(result.exit_code, result.output, result.stdout)


# ----------------------------------------------------------------------------------------- the folders


@pytest.fixture(scope="module")
def texts() -> dict[str, list[str]]:
    pairs = [pair for pair in sample_pairs(6000, seed=5) if len(pair.en.split()) <= 8][:2000 + SENTENCES]
    return {"train": [p.en for p in pairs[:2000]], "test": [p.en for p in pairs[2000:]]}


@pytest.fixture(scope="module")
def tokenizer_files(tmp_path_factory) -> Path:
    return marian_tokenizer_folder(tmp_path_factory.mktemp("spm"))


def marian_tokenizer(folder: Path, **languages: str):
    return transformers.MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                                        str(folder / "vocab.json"), **languages)


def train_to_copy(model, tokenizer, lines: list[str], steps: int) -> None:
    """Teacher-forced AdamW steps on copying the source's ids: peaked distributions, so no near-ties."""
    torch.manual_seed(0)
    encoded = tokenizer(lines, truncation=True, max_length=LIMIT)["input_ids"]
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(1)
    model.train()
    for _ in range(steps):
        batch = [encoded[i] for i in torch.randint(len(encoded), (32,), generator=generator).tolist()]
        inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt")
        labels = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, -100)
        loss = model(**inputs, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()


def build_folder(folder: Path, tokenizer_files: Path, lines: list[str], options: dict, lenpen: float,
                 steps: int = 250, **config) -> Path:
    """A MarianMT folder as save_pretrained writes it, with a tokenizer of `tokenizer_files`."""
    tokenizer = marian_tokenizer(tokenizer_files, source_lang="en", target_lang="de")
    vocab = json.loads((tokenizer_files / "vocab.json").read_text(encoding="utf-8"))
    pad = vocab["<pad>"]
    torch.manual_seed(0)
    marian_config = transformers.MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), d_model=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
        max_position_embeddings=MAX_POSITIONS, dropout=0.0, pad_token_id=pad, decoder_start_token_id=pad,
        eos_token_id=0, forced_eos_token_id=0, **{**options, **config})
    model = transformers.MarianMTModel(marian_config)
    train_to_copy(model, tokenizer, lines, steps)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=torch.Generator()
                                                  .manual_seed(2)))
    model.generation_config = transformers.GenerationConfig(
        num_beams=4, length_penalty=lenpen, max_length=MAX_POSITIONS, bad_words_ids=[[pad]], decoder_start_token_id=pad,
        eos_token_id=0, forced_eos_token_id=0, pad_token_id=pad)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory, tokenizer_files, texts) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("marian")
    return {name: build_folder(root / name, tokenizer_files, texts["train"], options, LENGTH_PENALTY[name])
            for name, options in VARIANTS.items()}


@pytest.fixture(scope="module")
def imported(tmp_path_factory, folders) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("imported")
    for name, folder in folders.items():
        import_checkpoint(str(folder), root / f"{name}.pt")
    return {name: root / f"{name}.pt" for name in folders}


# ----------------------------------------------------------------------------------------- decoding


def generated(folder: Path, sentences: list[str], beam: int) -> list[list[int]]:
    """`generate`'s tokens (Marian ids, without the start token and EOS), in batches of 50. Its beam search stops
    as fairseq's and mtx's do, once `beam` hypotheses have ended (early_stopping=True): its default heuristic goes
    on while the best open beam, divided by the current length's penalty, beats the worst ended one, and then can
    end with a longer hypothesis (one of these 200 sentences at beam 4 and α 0.6)."""
    model = transformers.MarianMTModel.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    outputs = []
    for start in range(0, len(sentences), 50):
        batch = tokenizer(sentences[start:start + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            rows = model.generate(**batch, num_beams=beam, max_length=LIMIT + 2, early_stopping=True)
        outputs += [[t for t in row[1:] if t not in (eos, pad)] for row in rows.tolist()]
    return outputs


def mtx_searched(checkpoint: Path, sentences: list[str], beam: int) -> list[list[int]]:
    """mtx's search over the imported checkpoint with its recipe's length penalty, in Marian's ids."""
    model, tokenizer, stored = load_model(checkpoint)
    decode = DecodeConfig.of_checkpoint(stored)
    marian_ids = tokenizer.marian_ids
    outputs = []
    for start in range(0, len(sentences), 50):
        rows = [torch.tensor([*ids, EOS]) for ids in tokenizer.encode_batch(sentences[start:start + 50])]
        src = torch.nn.utils.rnn.pad_sequence(rows, batch_first=True, padding_value=PAD)
        limit = torch.full((src.shape[0],), LIMIT)
        with torch.no_grad():
            found = search(model, src, src == PAD, Constraints(limit), LengthPenalty.of_config(decode), beam=beam)
        outputs += [[marian_ids[t] for t in hypotheses[0].tokens] for hypotheses in found]
    return outputs


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("beam", [1, 4])
def test_imported_models_decode_generates_tokens(folders, imported, texts, variant: str, beam: int) -> None:
    theirs = generated(folders[variant], texts["test"], beam)
    ours = mtx_searched(imported[variant], texts["test"], beam)
    assert sum(len(t) for t in theirs) > 2 * SENTENCES  # the models say something
    different = [i for i, (a, b) in enumerate(zip(ours, theirs, strict=True)) if a != b]
    assert not different, (len(different), texts["test"][different[0]], ours[different[0]], theirs[different[0]])


def test_the_import_keeps_marians_log_probabilities_and_never_pad(folders, imported, texts) -> None:
    """The first step's distribution over Marian's ids is Marian's, and mtx's PAD row has probability 0."""
    model, tokenizer, _ = load_model(imported["opus-mt"])
    marian = transformers.MarianMTModel.from_pretrained(folders["opus-mt"]).eval()
    ids = tokenizer.encode(texts["test"][0])
    src = torch.tensor([[*ids, EOS]])
    marian_src = torch.tensor([[tokenizer.marian_ids[t] for t in src[0].tolist()]])
    with torch.no_grad():
        ours = torch.log_softmax(model.output_logits(model(src, src == PAD, torch.tensor([[1]]))), -1)[0, 0]
        theirs = torch.log_softmax(marian(input_ids=marian_src, decoder_input_ids=torch.tensor(
            [[marian.config.decoder_start_token_id]])).logits, -1)[0, 0]
    assert ours[PAD] == float("-inf") or ours[PAD].exp() == 0
    torch.testing.assert_close(ours[1:], theirs[torch.tensor(tokenizer.marian_ids[1:])], atol=1e-5, rtol=0)
    assert model.output_bias[PAD] == NEVER and not model.tgt_embed.weight[PAD].any()


def test_mtx_translate_gives_generates_text(folders, imported, texts, tmp_path: Path) -> None:
    """End to end: raw text in, through the imported tokenizer, the recipe's beam and penalty, text out."""
    sentences = texts["test"][:30]
    source = tmp_path / "in.en"
    source.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    result = run("translate", "-m", str(imported["opus-mt"]), "-i", str(source), "--max-len-a", "0",
                 "--max-len-b", str(LIMIT))
    assert result.exit_code == 0, result.output
    tokenizer = transformers.AutoTokenizer.from_pretrained(folders["opus-mt"])
    marian = transformers.MarianMTModel.from_pretrained(folders["opus-mt"]).eval()
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    rows = marian.generate(**batch, max_length=LIMIT + 2, early_stopping=True)  # generation_config's beam 4, α 1
    assert result.stdout.splitlines() == tokenizer.batch_decode(rows, skip_special_tokens=True)


@serving
@pytest.mark.parametrize("engine", ["torch", "ct2"])
def test_mtx_serve_answers_as_mtx_translate(imported, texts, tmp_path: Path, engine: str) -> None:
    """The server holds an imported model as `mtx translate` does, with either engine (greedy: what CTranslate2
    decodes exactly)."""
    if engine == "ct2":
        pytest.importorskip("ctranslate2")
    sentences = texts["test"][:8]
    source = tmp_path / "in.en"
    source.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
    flags = ["--beam", "1", "--max-len-a", "0", "--max-len-b", str(LIMIT)]
    expected = run("translate", "-m", str(imported["opus-mt"]), "-i", str(source), *flags)
    assert expected.exit_code == 0, expected.output
    server = Server(imported["opus-mt"], tmp_path / "serve.log", "--engine", engine)
    try:
        status, _, answer = server.translate({"text": sentences, "beam": 1, "max_len_a": 0, "max_len_b": LIMIT})
    finally:
        server.stop()
    assert status == 200, answer
    assert [t["text"] for t in answer["translations"]] == expected.stdout.splitlines()


def test_the_ctranslate2_export_decodes_greedy_as_generate(folders, imported, texts, tmp_path: Path) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    export_checkpoint(imported["gelu-separate"], "ctranslate2", out)
    _, tokenizer, _ = load_model(imported["gelu-separate"])
    strings = tokenizer.token_strings()
    translator = ctranslate2.Translator(str(out), device="cpu")
    sources = [[strings[t] for t in [*ids, EOS]] for ids in tokenizer.encode_batch(texts["test"])]
    results = translator.translate_batch(sources, beam_size=1, max_decoding_length=LIMIT,  # no forced EOS
                                         suppress_sequences=[["<pad>"], ["<s>"]])
    index = {s: i for i, s in enumerate(strings)}
    ours = [[tokenizer.marian_ids[index[s]] for s in r.hypotheses[0]] for r in results]
    assert ours == generated(folders["gelu-separate"], texts["test"], beam=1)


def test_a_multilingual_model_takes_its_language_codes(tmp_path: Path, texts) -> None:
    """A vocabulary with >>fra<< and >>deu<< codes: the recipe's target tag spells them, and --target-lang fra puts
    >>fra<< first, as a user of MarianTokenizer writes it."""
    files = marian_tokenizer_folder(tmp_path / "spm", pairs=300, languages=("fra", "deu"))
    folder = build_folder(tmp_path / "mul", files, texts["train"], VARIANTS["opus-mt"], 1.0, steps=0)
    import_checkpoint(str(folder), tmp_path / "mul.pt")
    checkpoint = load_checkpoint(tmp_path / "mul.pt")
    assert checkpoint["recipe"]["data"]["target_tag"] == ">>{lang}<<"
    targets = TargetLanguages.of_checkpoint(checkpoint, Tokenizer.from_str(checkpoint["tokenizer"]))
    assert targets.languages == ["fra", "deu"] and targets.tagged(["a cat"], "fra") == [">>fra<< a cat"]
    source = tmp_path / "in.en"
    source.write_text("a cat\n", encoding="utf-8")
    result = run("translate", "-m", str(tmp_path / "mul.pt"), "-i", str(source), "--target-lang", "fra")
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1, result.output


# ----------------------------------------------------------------------------------------- round trip


@pytest.mark.parametrize("variant", ["opus-mt", "gelu-separate"])
def test_import_export_import_gives_the_same_weights(imported, variant: str, tmp_path: Path) -> None:
    export_checkpoint(imported[variant], "hf", tmp_path / "hf")
    for name in ("source.spm", "target.spm", "vocab.json", "tokenizer_config.json"):
        assert (tmp_path / "hf" / name).is_file(), name
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["activation_function"] == VARIANTS[variant]["activation_function"]
    import_checkpoint(str(tmp_path / "hf"), tmp_path / "again.pt")
    first, again = load_checkpoint(imported[variant]), load_checkpoint(tmp_path / "again.pt")
    assert again["tokenizer"] == first["tokenizer"]
    assert again["model_config"] == first["model_config"] and again["recipe"]["decode"] == first["recipe"]["decode"]
    assert again["model"].keys() == first["model"].keys()
    for name, tensor in first["model"].items():
        assert torch.equal(again["model"][name], tensor), name


def test_the_imported_checkpoint_records_its_origin_and_recipe(imported, folders) -> None:
    checkpoint = load_checkpoint(imported["relu"])
    assert checkpoint["imported_from"]["source"] == str(folders["relu"].resolve())
    assert checkpoint["imported_from"]["transformers"] == transformers.__version__
    recipe = checkpoint["recipe"]
    assert recipe["data"] == {"src_lang": "en", "tgt_lang": "de"}
    assert recipe["decode"] == {"beam": 4, "lenpen": 0.6, "lenpen_style": "fairseq"}
    assert recipe["model"]["activation"] == "relu" and recipe["model"]["positions"] == "halves"
    assert isinstance(Tokenizer.from_str(checkpoint["tokenizer"]), type(load_model(imported["relu"])[1]))


# ----------------------------------------------------------------------------------------- refusals


# Configurations as published, which import: an OPUS-MT model as converted in 2020-2021 (BART-era keys that
# MarianMTModel ignores: Helsinki-NLP/opus-mt-en-de, opus-mt-zh-en), and one as converted since (opus-mt-tc-big-*:
# relu, 1024 positions, no BART keys).
PUBLISHED = {
    "opus-mt-2020": dict(activation_function="swish", scale_embedding=True, normalize_before=False,
                         add_final_layer_norm=False, normalize_embedding=False, static_position_embeddings=True,
                         add_bias_logits=False, classif_dropout=0.0, extra_pos_embeddings=7, num_beams=6),
    "opus-mt-tc-big": dict(activation_function="relu", scale_embedding=True, share_encoder_decoder_embeddings=True,
                           tie_word_embeddings=True, encoder_layerdrop=0.0),
}
REFUSED = [
    ("decoder_attention_heads", 2, "encoder_attention_heads"),
    ("decoder_ffn_dim", 32, "encoder_ffn_dim"),
    ("activation_function", "gelu_new", "activations"),
    ("activation_function", "tanh", "activations"),
    ("tie_word_embeddings", False, "target embedding"),
    ("decoder_vocab_size", 7, "vocab_size"),
    ("decoder_start_token_id", 0, "pad_token_id"),
    ("eos_token_id", 1, "</s>"),
    ("vocab_size", 9, "vocab.json"),
]


def config_folder(folder: Path, tokenizer_files: Path, **changes) -> Path:
    """A MarianMT folder that only the config is read from (no weights): enough for every refusal."""
    folder.mkdir()
    for name in ("source.spm", "target.spm", "vocab.json"):
        (folder / name).write_bytes((tokenizer_files / name).read_bytes())
    vocab = json.loads((tokenizer_files / "vocab.json").read_text(encoding="utf-8"))
    config = {**dict(model_type="marian", vocab_size=len(vocab), d_model=32, encoder_layers=1, decoder_layers=1,
                     encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                     pad_token_id=vocab["<pad>"], decoder_start_token_id=vocab["<pad>"], eos_token_id=0,
                     max_position_embeddings=MAX_POSITIONS), **changes}
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder


@pytest.mark.parametrize(("key", "value", "said"), REFUSED, ids=[f"{k}={v}" for k, v, _ in REFUSED])
def test_a_configuration_mtx_cannot_hold_is_refused_naming_the_key(tokenizer_files, tmp_path: Path, key, value,
                                                                    said) -> None:
    folder = config_folder(tmp_path / "m", tokenizer_files, **{key: value})
    result = run("import", str(folder), "-o", str(tmp_path / "out.pt"))
    assert result.exit_code == 1, result.output
    assert f"{key} = {value!r}" in result.output and said in result.output
    assert not list(tmp_path.glob("*.pt")) and not list(tmp_path.glob(".out.pt*"))


@pytest.mark.parametrize("published", list(PUBLISHED))
def test_published_configurations_are_read_and_only_the_weights_are_missing(tokenizer_files, tmp_path: Path,
                                                                              published: str) -> None:
    """The configurations checked pass every config check; this folder then lacks only its weights."""
    folder = config_folder(tmp_path / published, tokenizer_files, **PUBLISHED[published])
    result = run("import", str(folder), "-o", str(tmp_path / "out.pt"))
    assert result.exit_code == 1 and "weights" in result.output and "cannot be read" in result.output, result.output


def test_another_architecture_is_refused(tokenizer_files, tmp_path: Path) -> None:
    folder = config_folder(tmp_path / "t5", tokenizer_files)
    (folder / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 32}), encoding="utf-8")
    result = run("import", str(folder), "-o", str(tmp_path / "out.pt"))
    assert result.exit_code == 1 and "model_type = 't5'" in result.output and "MarianMT" in result.output
    assert not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("missing", ["source.spm", "target.spm", "vocab.json", "config.json"])
def test_a_missing_file_is_refused_naming_it(folders, tmp_path: Path, missing: str) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for path in folders["relu"].iterdir():
        if path.name != missing:
            (folder / path.name).write_bytes(path.read_bytes())
    result = run("import", str(folder), "-o", str(tmp_path / "out.pt"))
    assert result.exit_code == 1 and missing in result.output, result.output
    assert not (tmp_path / "out.pt").exists()


def test_damaged_weights_are_refused_and_nothing_is_written(folders, tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    for path in folders["relu"].iterdir():
        (folder / path.name).write_bytes(path.read_bytes())
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    result = run("import", str(folder), "-o", str(tmp_path / "out.pt"))
    assert result.exit_code == 1 and "weights" in result.output and "cannot be read" in result.output, result.output
    assert len(result.output.strip().splitlines()) <= 3 and "Traceback" not in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["m"]


def test_an_existing_output_is_kept_unless_forced(folders, tmp_path: Path) -> None:
    out = tmp_path / "out.pt"
    out.write_bytes(b"mine")
    result = run("import", str(folders["relu"]), "-o", str(out))
    assert result.exit_code == 1 and "--force" in result.output and out.read_bytes() == b"mine"
    assert run("import", str(folders["relu"]), "-o", str(out), "--force").exit_code == 0
    assert load_checkpoint(out)["imported_from"]


def test_a_path_that_is_neither_a_folder_nor_a_hub_id_is_refused(tmp_path: Path) -> None:
    result = run("import", str(tmp_path / "nowhere"), "-o", str(tmp_path / "out.pt"))
    assert result.exit_code == 1 and "does not exist" in result.output


def test_a_hub_id_offline_and_not_cached_is_one_message(tmp_path: Path) -> None:
    """In a process of its own: huggingface_hub reads HF_HUB_OFFLINE when it is first imported."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    result = subprocess.run([sys.executable, "-m", "mtx", "import", "Helsinki-NLP/opus-mt-en-de", "-o",
                             str(tmp_path / "out.pt")], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Helsinki-NLP/opus-mt-en-de" in result.stderr and "HF_HUB_OFFLINE" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out.pt").exists()


@pytest.mark.parametrize("module", ["transformers", "sentencepiece"])
def test_without_the_extra_the_command_names_it_and_exits_1(folders, tmp_path: Path, module: str) -> None:
    program = (f"import sys; sys.modules[{module!r}] = None; from mtx.cli import main; sys.argv = ['mtx', 'import', "
               f"{str(folders['relu'])!r}, '-o', {str(tmp_path / 'out.pt')!r}]; main()")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"needs {module}" in done.stderr and "pip install 'mtx[marian]'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out.pt").exists()


def test_other_commands_take_the_imported_checkpoint(imported, tmp_path: Path) -> None:
    """average and inspect read it as any checkpoint; export writes a model card for a recipe without `data:`."""
    result = run("average", str(imported["relu"]), str(imported["relu"]), "-o", str(tmp_path / "avg.pt"))
    assert result.exit_code == 0, result.output
    averaged, original = load_checkpoint(tmp_path / "avg.pt"), load_checkpoint(imported["relu"])
    assert all(torch.equal(averaged["model"][k], v) for k, v in original["model"].items())
    result = run("inspect", "-m", str(imported["relu"]), "The dog sleeps.")
    assert result.exit_code == 0 and "layer" in result.output.lower(), result.output
    bare = {**original, "recipe": {k: v for k, v in original["recipe"].items() if k != "data"}}
    save_checkpoint(bare, tmp_path / "bare.pt")
    export_checkpoint(tmp_path / "bare.pt", "hf", tmp_path / "hf")
    card = (tmp_path / "hf" / "README.md").read_text(encoding="utf-8")
    assert "imported by `mtx import`" in card and "MarianTokenizer" in card
