"""`mtx export`: the exported models decode as mtx does, the folders are complete or absent, refusals are clear.

A copy-task model trained here (test_translate's) is exported both ways; greedy decoding with transformers
(4 or 5, whichever is installed) and with CTranslate2 float32 must give mtx's own tokens, and int8 the same BLEU
within 0.5; the hf folder's model card translates with its own code. Random-weight models check the variants
the copy model does not have (pre-norm, separate source embedding) by their log-probabilities. The tests that
need the optional packages skip cleanly without them, and the translation pipeline's on transformers 5.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from support import copy_lexicon, copy_task

import mtx.export.hf
from mtx.checkpoint import make_checkpoint, save_checkpoint
from mtx.config.recipe import ModelConfig, resolve_model
from mtx.decode.ct2_folder import INT8_WEIGHT_LEVELS, token_strings
from mtx.decode.search import Constraints, LengthPenalty, search
from mtx.errors import MtxError
from mtx.export.command import export_checkpoint
from mtx.export.hf import TOKENIZER_CLASS, TRANSFORMERS_4_ONLY
from mtx.model.transformer import Transformer
from mtx.score.metrics import corpus_bleu
from mtx.tokenizer import EOS, PAD, Tokenizer, normalize_text

RECIPE = {"name": "copy", "data": {"source": {"files": {"train": ["a", "b"]}}, "src_lang": "en", "tgt_lang": "de"},
          "train": {"valid_beam": 1}, "decode": {"beam": 4, "lenpen": 0.6, "max_len_a": 1.0, "max_len_b": 5}}


@pytest.fixture(scope="module")
def copy_run(tmp_path_factory) -> dict:
    """A run folder as `mtx train` leaves it: data/manifest.json, metrics.jsonl and checkpoints/step_250.pt."""
    model, tokenizer, held_out = copy_task(40)
    run = tmp_path_factory.mktemp("run")
    (run / "data").mkdir()
    manifest = {"tokenizer_sha256": hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
                "source": {"kind": "files"}, "filter": {"read": 3100, "kept": 3000},
                "splits": {"train": {"pairs": 3000, "src_tokens": 14321, "tgt_tokens": 14321}}}
    (run / "data" / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    events = [{"event": "valid", "step": 100, "valid_bleu": 71.5}, {"event": "valid", "step": 200, "valid_bleu": 98.25},
              {"event": "valid", "step": 250, "valid_bleu": 97.0}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events), encoding="utf-8")
    checkpoint = run / "checkpoints" / "step_250.pt"
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), RECIPE, 250), checkpoint)
    return dict(model=model, tokenizer=tokenizer, held_out=held_out, checkpoint=checkpoint)


def mtx_greedy(model: Transformer, tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    outputs = []
    for text in texts:
        src = torch.tensor([[*tokenizer.encode(normalize_text(text)), EOS]])
        limit = torch.tensor([src.shape[1] + 4])
        outputs.append(search(model, src, src == PAD, Constraints(limit), LengthPenalty(0.6), beam=1)[0][0].tokens)
    return outputs


def test_hf_export_greedy_decodes_mtx_tokens(copy_run: dict, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    export_checkpoint(copy_run["checkpoint"], "hf", out)
    assert (out / "model.safetensors").is_file() and not list(tmp_path.glob(".hf.*"))
    model = transformers.AutoModelForSeq2SeqLM.from_pretrained(out)
    tokenizer = transformers.AutoTokenizer.from_pretrained(out)
    texts = [*copy_run["held_out"], "  red\tcat   dog "]  # the tokenizer normalises as mtx does
    batch = tokenizer(texts, return_tensors="pt", padding=True)
    assert tokenizer(texts[0])["input_ids"] == [*copy_run["tokenizer"].encode(texts[0]), EOS]
    generated = model.generate(**batch, num_beams=1, max_new_tokens=20)
    theirs = [[t for t in row[1:] if t not in (EOS, PAD)] for row in generated.tolist()]  # after BOS
    assert theirs == mtx_greedy(copy_run["model"], copy_run["tokenizer"], texts)
    generation = json.loads((out / "generation_config.json").read_text())
    assert (generation["num_beams"], generation["length_penalty"], generation["decoder_start_token_id"]) == (4, 0.6, 1)
    # transformers 5 would name its own class, TokenizersBackend, which version 4's AutoTokenizer cannot load.
    assert json.loads((out / "tokenizer_config.json").read_text())["tokenizer_class"] == TOKENIZER_CLASS
    assert type(tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")  # version 4's, version 5's


def card_code(folder: Path) -> str:
    """The Python block of an exported folder's model card."""
    card = (folder / "README.md").read_text(encoding="utf-8")
    return card.split("```python\n", 1)[1].split("\n```", 1)[0]


def run_card_code(code: str, text: str) -> str:
    """What `code` prints with the card's example sentence replaced by `text` (one the copy model knows)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(code.replace("The old friends tidy up his kitchen.", text), {})  # the card's own code, as a user runs it
    return printed.getvalue()


def test_hf_model_card_code_translates(copy_run: dict, tmp_path: Path) -> None:
    """The card's code, AutoModelForSeq2SeqLM + AutoTokenizer + generate, runs as written in transformers 4 and
    5; the translation pipeline after it is commented out, as version 5 has none."""
    pytest.importorskip("transformers")
    export_checkpoint(copy_run["checkpoint"], "hf", tmp_path / "hf")
    code = card_code(tmp_path / "hf")
    ours, theirs = code.split(f"\n{TRANSFORMERS_4_ONLY}\n")
    assert "pipeline" not in ours and all(line.startswith("# ") for line in theirs.splitlines())
    text = copy_run["held_out"][0]
    assert run_card_code(code, text) == f"{[text]}\n"  # generation_config.json's beam search copies it too


def test_hf_export_translates_in_the_translation_pipeline(copy_run: dict, tmp_path: Path) -> None:
    """The card's commented-out lines for transformers 4, uncommented, translate with its translation pipeline."""
    transformers = pytest.importorskip("transformers")
    if int(transformers.__version__.split(".")[0]) >= 5:
        pytest.skip("transformers 5 removed the translation pipeline")
    export_checkpoint(copy_run["checkpoint"], "hf", tmp_path / "hf")
    commented = card_code(tmp_path / "hf").split(f"\n{TRANSFORMERS_4_ONLY}\n")[1]
    pipeline_code = "\n".join(line.removeprefix("# ") for line in commented.splitlines())
    text = copy_run["held_out"][0]
    assert run_card_code(pipeline_code, text) == f"{[{'translation_text': text}]}\n"


def ct2_greedy(folder: Path, texts: list[str], compute_type: str, use_vmap: bool = False) -> list[list[int]]:
    ctranslate2 = pytest.importorskip("ctranslate2")
    from tokenizers import Tokenizer as HfTokenizer

    tokenizer = HfTokenizer.from_file(str(folder / "tokenizer.json"))
    translator = ctranslate2.Translator(str(folder), device="cpu", compute_type=compute_type)
    results = translator.translate_batch([tokenizer.encode(t).tokens for t in texts], beam_size=1,
                                         suppress_sequences=[["<pad>"], ["<s>"]], use_vmap=use_vmap)
    return [[tokenizer.token_to_id(t) for t in r.hypotheses[0]] for r in results]


def test_ctranslate2_export_float32_decodes_mtx_tokens_and_int8_its_bleu(copy_run: dict, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    export_checkpoint(copy_run["checkpoint"], "ctranslate2", tmp_path / "f32")
    export_checkpoint(copy_run["checkpoint"], "ctranslate2", tmp_path / "int8", quantization="int8")
    texts, tokenizer = copy_run["held_out"], copy_run["tokenizer"]
    ours = mtx_greedy(copy_run["model"], tokenizer, texts)
    assert ct2_greedy(tmp_path / "f32", texts, "float32") == ours
    mtx_bleu = corpus_bleu(tokenizer.decode_batch(ours), texts)
    # The issue's bar. With CTranslate2's own ±127 weights, CPUs without VNNI lose sentences here.
    int8_bleu = corpus_bleu(tokenizer.decode_batch(ct2_greedy(tmp_path / "int8", texts, "int8")), texts)
    assert int8_bleu >= mtx_bleu - 0.5
    int8_weights = saved_int8_weights(tmp_path / "int8" / "model.bin")
    linear_weights = [n for n in int8_weights if n.endswith("/weight") and "embeddings" not in n]
    # Every weight in a product is saved narrowed, the tied embedding too: loading would widen a float32 one.
    assert "decoder/embeddings/weight" in int8_weights and "decoder/projection/weight" not in int8_weights
    assert len(linear_weights) == sum(isinstance(m, torch.nn.Linear) for m in copy_run["model"].modules())
    assert all(w.abs().amax(dim=1).eq(INT8_WEIGHT_LEVELS).all() for w in int8_weights.values())
    assert "ctranslate2.Translator" in (tmp_path / "int8" / "README.md").read_text()


def test_ctranslate2_export_carries_the_shortlist_as_its_vocabulary_map(copy_run: dict, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    texts, tokenizer, model = copy_run["held_out"], copy_run["tokenizer"], copy_run["model"]
    ids = tokenizer.encode_batch(texts)
    lexicon = copy_lexicon(tokenizer, model.vocab_size, texts)
    checkpoint = tmp_path / "lexicon.pt"
    save_checkpoint({**make_checkpoint(model, tokenizer.to_str(), RECIPE, 250), "lexicon": lexicon.to_checkpoint()},
                    checkpoint)
    export_checkpoint(checkpoint, "ctranslate2", tmp_path / "plain", shortlist=0)
    assert not (tmp_path / "plain" / "vmap.txt").exists()
    export_checkpoint(checkpoint, "ctranslate2", tmp_path / "listed", shortlist=3)
    lines = (tmp_path / "listed" / "vmap.txt").read_text(encoding="utf-8").splitlines()
    strings = token_strings(tokenizer, model.vocab_size)  # as the export spells them
    assert lines[0] == "\t" + " ".join(strings[t] for t in lexicon.frequent[:100])  # the recipe's frequent tokens
    first = next(line for line in lines[1:] if line.startswith(strings[ids[0][0]] + "\t"))
    assert first.split("\t")[1].split() == [strings[t] for t in lexicon.translations[ids[0][0], :3]]
    assert "use_vmap=True" in (tmp_path / "listed" / "README.md").read_text()
    assert ct2_greedy(tmp_path / "listed", texts, "float32", use_vmap=True) == mtx_greedy(model, tokenizer, texts)
    with pytest.raises(MtxError, match="more than the 10 translations per source token"):
        export_checkpoint(checkpoint, "ctranslate2", tmp_path / "wide", shortlist=11)


def saved_int8_weights(model_bin: Path) -> dict[str, torch.Tensor]:
    """The int8 matrices of a CTranslate2 model.bin, by name (its layout: ctranslate2.specs.model_spec); the
    int8 scalars beside them are flags."""
    data, offset, found = model_bin.read_bytes(), 0, {}

    def take(fmt: str):
        nonlocal offset
        values = struct.unpack_from(fmt, data, offset)
        offset += struct.calcsize(fmt)
        return values

    def string() -> str:
        nonlocal offset
        (length,) = take("<H")
        offset += length
        return data[offset - length:offset - 1].decode()

    take("<I"), string(), take("<I")  # binary version, spec name, spec revision
    for _ in range(take("<I")[0]):
        name, (rank,) = string(), take("<B")
        shape, (dtype_id, size) = take(f"<{rank}I"), take("<BI")
        if dtype_id == 1 and rank == 2:  # int8
            found[name] = torch.frombuffer(bytearray(data[offset:offset + size]), dtype=torch.int8).reshape(shape)
        offset += size
    return found


def random_model(vocab: int, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = resolve_model(ModelConfig(preset="tiny", d_model=32, heads=4, d_ff=64, layers_enc=2, layers_dec=2,
                                    max_positions=32, **overrides))
    model = Transformer(cfg, vocab).eval()
    with torch.no_grad():  # LayerNorms away from their initial (1, 0), an output bias from 0, so a mis-mapped
        for name, p in model.named_parameters():  # one shows
            if "norm" in name or name == "output_bias":
                p.add_(0.1 * torch.randn_like(p) if "norm" in name else torch.randn_like(p))
    return model


def random_checkpoint(model: Transformer, tokenizer: Tokenizer, path: Path) -> Path:
    save_checkpoint(make_checkpoint(model, tokenizer.to_str(), RECIPE, 1), path)
    return path


def mtx_log_probs(model: Transformer, src: list[int], tgt: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        logits = model.output_logits(model(torch.tensor([src]), None, torch.tensor([[1, *tgt]])))[0]
    return torch.log_softmax(logits, -1)[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])]


@pytest.mark.parametrize("overrides", [dict(norm="pre"), dict(share_embeddings=False), dict(activation="swish"),
                                       dict(activation="gelu"), dict(output_bias=True), dict(scale_embeddings=False),
                                       dict(positions="halves")])
def test_ctranslate2_exports_pre_norm_separate_embeddings_and_each_model_option(copy_run: dict, tmp_path: Path,
                                                                                overrides) -> None:
    ctranslate2 = pytest.importorskip("ctranslate2")
    model = random_model(copy_run["tokenizer"].vocab_size, **overrides)
    export_checkpoint(random_checkpoint(model, copy_run["tokenizer"], tmp_path / "m.pt"), "ctranslate2", tmp_path / "o")
    src, tgt = [17, 42, 99, 5, EOS], [8, 250, 31]
    strings = json.loads((tmp_path / "o" / "shared_vocabulary.json").read_text())
    scored = ctranslate2.Translator(str(tmp_path / "o")).score_batch([[strings[i] for i in src]],
                                                                      [[strings[i] for i in tgt]])[0]
    assert torch.allclose(torch.tensor(scored.log_probs), mtx_log_probs(model, src, tgt), atol=1e-4)


def test_hf_exports_separate_embeddings_and_refuses_pre_norm(copy_run: dict, tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    model = random_model(copy_run["tokenizer"].vocab_size, share_embeddings=False)
    export_checkpoint(random_checkpoint(model, copy_run["tokenizer"], tmp_path / "m.pt"), "hf", tmp_path / "o")
    marian = transformers.AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "o").eval()
    src, tgt = [17, 42, 99, 5, EOS], [8, 250, 31]
    with torch.inference_mode():
        logits = marian(input_ids=torch.tensor([src]), decoder_input_ids=torch.tensor([[1, *tgt]])).logits[0]
    theirs = torch.log_softmax(logits, -1)[torch.arange(len(tgt) + 1), torch.tensor([*tgt, EOS])]
    assert torch.allclose(theirs, mtx_log_probs(model, src, tgt), atol=1e-4)
    pre_norm = random_checkpoint(random_model(copy_run["tokenizer"].vocab_size, norm="pre"), copy_run["tokenizer"],
                                 tmp_path / "pre.pt")
    with pytest.raises(MtxError, match="pre-norm.*--to ctranslate2"):
        export_checkpoint(pre_norm, "hf", tmp_path / "pre")
    assert not (tmp_path / "pre").exists()


def test_model_card_holds_recipe_data_counts_and_best_bleu(copy_run: dict, tmp_path: Path) -> None:
    pytest.importorskip("ctranslate2")
    export_checkpoint(copy_run["checkpoint"], "ctranslate2", tmp_path / "o")
    card = (tmp_path / "o" / "README.md").read_text()
    assert "# copy: en → de" in card and "step 250" in card
    assert "| train | 3,000 | 14,321 | 14,321 |" in card and "read: 3,100, kept after cleaning: 3,000" in card
    assert "**98.25** at step 200" in card and "max_len_b: 5" in card


def test_existing_folder_is_refused_unless_forced_and_a_failed_export_leaves_nothing(copy_run: dict, tmp_path: Path,
                                                                                    monkeypatch) -> None:
    pytest.importorskip("transformers")
    out = tmp_path / "out"
    out.mkdir()
    (out / "mine.txt").write_text("keep me")
    with pytest.raises(MtxError, match="not empty.*--force"):
        export_checkpoint(copy_run["checkpoint"], "hf", out)

    def half_written(model, tokenizer_json, decode, folder: Path) -> None:
        (folder / "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(mtx.export.hf, "save_hf_folder", half_written)
    with pytest.raises(OSError, match="disk full"):
        export_checkpoint(copy_run["checkpoint"], "hf", out, force=True)
    assert [p.name for p in tmp_path.iterdir()] == ["out"] and (out / "mine.txt").is_file()
    monkeypatch.undo()
    export_checkpoint(copy_run["checkpoint"], "hf", out, force=True)
    assert (out / "config.json").is_file() and not (out / "mine.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize(("to", "quantization", "message"), [
    ("onnx", None, "--to onnx is not an export format"),
    ("hf", "int8", "--quantization applies to --to ctranslate2 only"),
    ("ctranslate2", "int4", "--quantization int4 is not one of int8, int8_float16, float16, bfloat16"),
])
def test_bad_flags_are_user_errors(copy_run: dict, tmp_path: Path, to: str, quantization: str, message: str) -> None:
    with pytest.raises(MtxError, match=message):
        export_checkpoint(copy_run["checkpoint"], to, tmp_path / "o", quantization=quantization)


@pytest.mark.parametrize(("to", "module"), [("hf", "transformers"), ("ctranslate2", "ctranslate2")])
def test_without_the_extra_the_command_names_it_and_exits_1(copy_run: dict, tmp_path: Path, to: str,
                                                            module: str) -> None:
    program = (f"import sys; sys.modules[{module!r}] = None; from mtx.cli import main; sys.argv = ['mtx', 'export', "
               f"'-m', {str(copy_run['checkpoint'])!r}, '--to', {to!r}, {str(tmp_path / 'o')!r}]; main()")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"needs {module}" in done.stderr and "pip install 'mtx[export]'" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "o").exists()
