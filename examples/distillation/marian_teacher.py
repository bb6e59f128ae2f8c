"""An OPUS-MT-like MarianMT model, trained here: what `mtx import` takes, made without the hub and without mtx.

The distillation walkthrough's imported variant and the fine-tuning measurement start from a published MarianMT
model. None can be downloaded here, so this script makes the nearest thing these cores can train, the way the
OPUS-MT models are made and published (Tiedemann and Thottingal, 2020; their Marian configurations as
transformers' conversion writes them):

- two SentencePiece unigram models with the nmt_nfkc normalisation, source.spm trained on the sources and
  target.spm on the targets;
- one joint vocabulary, vocab.json, as Marian writes it: `</s>` 0, `<unk>` 1, then the pieces of both models,
  and `<pad>` last (the conversion's addition, which is also the decoder's start token);
- a MarianConfig as the published ones are: swish feed-forward, embeddings scaled by √d_model and shared by the
  encoder, the decoder and the output layer, static sinusoidal positions, post-norm, no BOS;
- Marian's training: label smoothing 0.1, Adam (β 0.9, 0.98, ε 1e-9), the inverse square root schedule after a
  linear warm-up, batches of similar length filled to a token budget, an exponential moving average of the weights
  (Marian's --exponential-smoothing), the output layer's bias trained;
- saved with save_pretrained: the model, its MarianTokenizer and a generation config of beam 4.

    python examples/distillation/marian_teacher.py --train runs/kd-corpus/train.{en,de} \\
        --valid runs/kd-corpus/valid.{en,de} --out runs/kd-marian --max-minutes 30

Deterministic for a seed and a number of threads, until --max-minutes stops it.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import math
import random
import tempfile
import time
from pathlib import Path

import sentencepiece as spm
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def train_sentencepiece(lines: list[str], vocab_size: int, path: Path) -> spm.SentencePieceProcessor:
    """A unigram model with OPUS-MT's normalisation; hard_vocab_limit off so that a small corpus gives what it
    has rather than an error."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model, model_type="unigram",
                                   vocab_size=vocab_size, normalization_rule_name="nmt_nfkc",
                                   character_coverage=1.0, hard_vocab_limit=False, num_threads=1,
                                   minloglevel=2)
    path.write_bytes(model.getvalue())
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def marian_vocabulary(*models: spm.SentencePieceProcessor) -> dict[str, int]:
    """Marian's joint vocabulary: `</s>`, `<unk>`, every piece of the models in their order, `<pad>` last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for model in models:
        for i in range(model.get_piece_size()):
            piece = model.id_to_piece(i)
            if not (model.is_control(i) or model.is_unknown(i)) and piece not in vocab:
                vocab[piece] = len(vocab)
    vocab["<pad>"] = len(vocab)
    return vocab


def make_tokenizer(sources: list[str], targets: list[str], args: argparse.Namespace) -> MarianTokenizer:
    """The two SentencePiece models and the joint vocabulary, as a MarianTokenizer (which holds the models in
    memory and writes them again when saved)."""
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        source_model = train_sentencepiece(sources, args.spm_size, folder / "source.spm")
        target_model = train_sentencepiece(targets, args.spm_size, folder / "target.spm")
        vocab = marian_vocabulary(source_model, target_model)
        (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        return MarianTokenizer(source_spm=str(folder / "source.spm"), target_spm=str(folder / "target.spm"),
                               vocab=str(folder / "vocab.json"), source_lang=args.source_lang,
                               target_lang=args.target_lang)


def marian_config(vocab_size: int, pad: int, args: argparse.Namespace) -> MarianConfig:
    """The keys of a published OPUS-MT config.json, at this script's size."""
    return MarianConfig(
        vocab_size=vocab_size, decoder_vocab_size=vocab_size, d_model=args.d_model,
        encoder_layers=args.layers_enc, decoder_layers=args.layers_dec,
        encoder_attention_heads=args.heads, decoder_attention_heads=args.heads,
        encoder_ffn_dim=args.d_ff, decoder_ffn_dim=args.d_ff, activation_function="swish",
        dropout=args.dropout, attention_dropout=0.0, activation_dropout=0.0, max_position_embeddings=512,
        scale_embedding=True, share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
        pad_token_id=pad, decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0, bos_token_id=0,
        static_position_embeddings=True, normalize_before=False, normalize_embedding=False,
        add_final_layer_norm=False, add_bias_logits=False, architectures=["MarianMTModel"],
    )


def token_batches(pairs: list[tuple[list[int], list[int]]], max_tokens: int) -> list[list[int]]:
    """Indices of pairs grouped by length, each group as many pairs as fit max_tokens padded slots on the longer
    side."""
    order = sorted(range(len(pairs)), key=lambda i: (len(pairs[i][1]), len(pairs[i][0])))
    batches, batch, longest = [], [], 0
    for i in order:
        length = max(len(pairs[i][0]), len(pairs[i][1]))
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(i)
        longest = max(longest, length)
    return batches + [batch] if batch else batches


def collate(pairs: list[tuple[list[int], list[int]]], pad: int) -> dict[str, torch.Tensor]:
    """Padded sources, their mask, the decoder's inputs (the start token, then the target shifted right) and the
    labels (the target and its `</s>`, padding ignored)."""
    width_src, width_tgt = max(len(s) for s, _ in pairs), max(len(t) for _, t in pairs)
    src = torch.full((len(pairs), width_src), pad)
    labels = torch.full((len(pairs), width_tgt), -100)
    for row, (s, t) in enumerate(pairs):
        src[row, : len(s)] = torch.tensor(s)
        labels[row, : len(t)] = torch.tensor(t)
    decoder_in = torch.cat([torch.full((len(pairs), 1), pad), labels[:, :-1]], dim=1).masked_fill(
        torch.cat([torch.zeros(len(pairs), 1, dtype=torch.bool), labels[:, :-1] == -100], dim=1), pad)
    return {"input_ids": src, "attention_mask": (src != pad).long(), "decoder_input_ids": decoder_in,
            "labels": labels}


def loss_of(model: MarianMTModel, bias: torch.Tensor, batch: dict[str, torch.Tensor],
            smoothing: float) -> tuple[torch.Tensor, int]:
    """The label-smoothed cross-entropy summed over the batch's target tokens, with the trained output bias."""
    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         decoder_input_ids=batch["decoder_input_ids"]).last_hidden_state
    logits = model.lm_head(hidden) + bias
    loss = F.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100,
                           label_smoothing=smoothing, reduction="sum")
    return loss, int((batch["labels"] != -100).sum())


def encode(tokenizer: MarianTokenizer, sources: list[str], targets: list[str],
           max_len: int) -> list[tuple[list[int], list[int]]]:
    """Token ids as MarianTokenizer gives them (each side's SentencePiece model, then `</s>`), pairs with a side
    longer than max_len left out."""
    pairs = []
    for start in range(0, len(sources), 5000):
        ids = tokenizer(sources[start : start + 5000], text_target=targets[start : start + 5000])
        pairs += [(s, t) for s, t in zip(ids["input_ids"], ids["labels"], strict=True)
                  if len(s) <= max_len and len(t) <= max_len]
    return pairs


def save(model: MarianMTModel, average: dict[str, torch.Tensor], tokenizer: MarianTokenizer, out: Path,
         beam: int) -> None:
    """The averaged weights and output bias into a copy of the model, saved with its tokenizer and a beam-4
    generation config; the folder is written beside `out` and renamed, so a reader never sees half of one."""
    saved = copy.deepcopy(model)
    with torch.no_grad():
        for name, value in saved.named_parameters():
            value.copy_(average[name])
        saved.final_logits_bias.copy_(average["bias"].unsqueeze(0))
    pad = model.config.pad_token_id
    saved.generation_config = GenerationConfig(
        num_beams=beam, max_length=512, bad_words_ids=[[pad]], bos_token_id=0, eos_token_id=0,
        forced_eos_token_id=0, pad_token_id=pad, decoder_start_token_id=pad)
    partial = out.with_name(out.name + ".partial")
    saved.save_pretrained(partial)
    tokenizer.save_pretrained(partial)
    if out.exists():
        for old in out.iterdir():
            old.unlink()
        out.rmdir()
    partial.rename(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--train", nargs=2, type=Path, required=True, metavar=("SOURCES", "TARGETS"))
    parser.add_argument("--valid", nargs=2, type=Path, required=True, metavar=("SOURCES", "TARGETS"))
    parser.add_argument("--out", type=Path, required=True, help="the MarianMT folder to write")
    parser.add_argument("--source-lang", default="en")
    parser.add_argument("--target-lang", default="de")
    parser.add_argument("--spm-size", type=int, default=8000, help="pieces of each SentencePiece model")
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--d-ff", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers-enc", type=int, default=3)
    parser.add_argument("--layers-dec", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--max-len", type=int, default=128, help="longest side of a training pair, in tokens")
    parser.add_argument("--max-tokens", type=int, default=2048, help="padded token slots a batch holds")
    parser.add_argument("--lr", type=float, default=1e-3, help="the peak learning rate, at the end of warm-up")
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--ema", type=float, default=0.999, help="the weights' moving average's decay a step, "
                        "at most: it is (1 + step) / (10 + step) until that is larger")
    parser.add_argument("--max-steps", type=int, default=100_000)
    parser.add_argument("--max-minutes", type=float, default=None, help="stop (and save) after this much time")
    parser.add_argument("--save-minutes", type=float, default=10.0, help="save the folder this often")
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--beam", type=int, default=4, help="num_beams of the generation config")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    spm.set_random_generator_seed(args.seed)
    sources, targets = read_lines(args.train[0]), read_lines(args.train[1])
    tokenizer = make_tokenizer(sources, targets, args)
    vocab, pad = tokenizer.get_vocab(), tokenizer.pad_token_id
    train = encode(tokenizer, sources, targets, args.max_len)
    valid = encode(tokenizer, read_lines(args.valid[0]), read_lines(args.valid[1]), args.max_len)
    model = MarianMTModel(marian_config(len(vocab), pad, args))
    bias = torch.nn.Parameter(torch.zeros(len(vocab)))  # transformers holds it as a buffer it never trains
    print(f"vocabulary {len(vocab)}, {len(train)} training pairs, "
          f"{sum(p.numel() for p in model.parameters())} parameters", flush=True)

    optimizer = torch.optim.Adam([*model.parameters(), bias], lr=args.lr, betas=(0.9, 0.98), eps=1e-9)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / args.warmup, math.sqrt(args.warmup / (step + 1))))
    # named_parameters names the shared embedding once, so each weight is averaged once a step
    average = {name: p.detach().clone() for name, p in [*model.named_parameters(), ("bias", bias)]}
    batches = token_batches(train, args.max_tokens)
    valid_batches = token_batches(valid, args.max_tokens)
    rng = random.Random(args.seed)
    start = last_save = time.monotonic()
    step, epoch, window_loss, window_tokens = 0, 0, 0.0, 0
    while step < args.max_steps:
        order = list(range(len(batches)))
        rng.shuffle(order)
        for index in order:
            model.train()
            loss, tokens = loss_of(model, bias, collate([train[i] for i in batches[index]], pad),
                                   args.label_smoothing)
            optimizer.zero_grad()
            (loss / tokens).backward()
            optimizer.step()
            schedule.step()
            step += 1
            window_loss, window_tokens = window_loss + loss.item(), window_tokens + tokens
            # The decay grows to --ema as steps accumulate (TensorFlow's ExponentialMovingAverage with
            # num_updates): a short run's average is of its own later steps, not still mostly the initial weights.
            decay = min(args.ema, (1 + step) / (10 + step))
            with torch.no_grad():
                for name, value in [*model.named_parameters(), ("bias", bias)]:
                    average[name].lerp_(value, 1 - decay)
            elapsed = time.monotonic() - start
            if step % args.log_every == 0:
                print(f"step {step} epoch {epoch} loss {window_loss / window_tokens:.3f} "
                      f"lr {schedule.get_last_lr()[0]:.2e} {elapsed / 60:.1f} min", flush=True)
                window_loss, window_tokens = 0.0, 0
            done = step >= args.max_steps or (args.max_minutes is not None and elapsed >= args.max_minutes * 60)
            if done or time.monotonic() - last_save >= args.save_minutes * 60:
                save(model, average, tokenizer, args.out, args.beam)
                print(f"step {step}: saved {args.out}, valid loss {valid_loss(args.out, valid_batches, valid, pad):.3f}"
                      f" (the moving average)", flush=True)
                last_save = time.monotonic()
            if done:
                return
        epoch += 1


def valid_loss(folder: Path, batches: list[list[int]], pairs: list[tuple[list[int], list[int]]], pad: int) -> float:
    """The saved model's cross-entropy a target token on the valid pairs (no smoothing, no dropout)."""
    model = MarianMTModel.from_pretrained(folder).eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            loss, tokens = loss_of(model, model.final_logits_bias[0], collate([pairs[i] for i in batch], pad), 0.0)
            total, count = total + loss.item(), count + tokens
    return total / count


if __name__ == "__main__":
    main()
