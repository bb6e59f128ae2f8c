"""`mtx inspect`: one sentence translated, then the attention of every layer and head over it, with statistics.

The sentence is normalised and translated as `mtx translate` would translate it (the checkpoint's recipe
`decode:` settings, the best hypothesis), or a given target is taken instead (`--target`, to see why the model
did not produce it), with the score the search would have given it. Source and target are then passed once
through the model, teacher-forced, its attention sub-layers handing out every head's weights
(`AttentionWeights`). The EOS step is part of the pass, so the decoder's rows cover every token the model
predicts, </s> included.

Three kinds of attention, each a (layers, heads, rows, columns) array of weights:

    encoder  rows: source tokens                columns: source tokens
    decoder  rows: the token each step predicts  columns: the target tokens it has read, <s> first
    cross    rows: the token each step predicts  columns: source tokens

Labels are the subword tokens as the text spells them (`readable_labels`): a token that starts a word is shown
as written, one that continues a word after `CONTINUATION`, so the words of the sentence stay readable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from mtx.analysis.head_stats import HeadStats, head_statistics, is_punctuation
from mtx.config.recipe import DecodeConfig
from mtx.decode.request import Request
from mtx.decode.search import LengthPenalty
from mtx.decode.torch_engine import TorchEngine
from mtx.errors import MtxError
from mtx.model.transformer import AttentionWeights
from mtx.tokenizer import BOS, EOS, Tokenizer, normalize_text, word_of_each_piece

Kind = Literal["encoder", "decoder", "cross"]
KINDS: tuple[Kind, ...] = ("encoder", "decoder", "cross")
TITLES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "cross-attention"}
CONTINUATION = "·"  # before a token that continues the word of the token before it
SPACE = "␣"  # a whitespace character of a token (other than the space before the word it starts)
CHARACTER_REST = "…"  # a token holding only the later bytes of a character that the token before it starts


def shown(text: str) -> str:
    """`text` with whitespace shown as ␣ and characters that print nothing (controls) as escapes."""
    return "".join(SPACE if c.isspace() else c if c.isprintable() else ascii(c)[1:-1] for c in text)


def readable_labels(tokenizer: Tokenizer, ids: list[int]) -> list[str]:
    """One label per token id: special tokens by name (<s>, </s>), a token that starts a word as its text
    without the space before it, a token that continues a word as its text after `CONTINUATION`."""
    pieces = tokenizer.pieces(ids)
    owners = word_of_each_piece(pieces)
    labels, word_before, specials = [], None, tokenizer.special_tokens
    for token, piece, owner in zip(ids, pieces, owners, strict=True):
        if token in specials:
            labels.append(specials[token])
            continue
        starts_word = owner is not None and owner != word_before
        text = piece[1:] if starts_word and piece[:1].isspace() else piece
        labels.append(("" if starts_word or owner is None else CONTINUATION) + (shown(text) or CHARACTER_REST))
        word_before = owner if owner is not None else word_before
    return labels


@dataclass(frozen=True)
class Inspection:
    """A sentence, its translation and the attention of every head over the pair."""

    source: str  # the normalised sentence
    translation: str  # the model's best translation, or the target given in its stead
    score: float  # the translation's score, log P(Y|X) / lp(|Y|), as the search scores hypotheses
    forced: bool  # whether the translation is a target given, rather than the model's
    source_labels: list[str]  # source tokens, </s> last
    predicted_labels: list[str]  # the token each decoder step predicts, </s> last
    read_labels: list[str]  # the token each decoder step reads, <s> first
    maps: dict[Kind, Tensor]  # kind → (layers, heads, rows, columns) float32 weights, on the CPU
    statistics: list[HeadStats]  # every head's, and each layer's heads averaged, in KINDS order

    def labels(self, kind: Kind) -> tuple[list[str], list[str]]:
        """The (row, column) labels of a kind's maps."""
        rows = self.source_labels if kind == "encoder" else self.predicted_labels
        return rows, self.read_labels if kind == "decoder" else self.source_labels


def source_ids(tokenizer: Tokenizer, text: str, max_positions: int, what: str, target: bool = False) -> list[int]:
    """The token ids of a sentence as its vocabulary reads it (`Tokenizer.normalize`; `target`: a translation),
    refused (naming it as `what`) when `normalize_text` leaves nothing of it or, with the </s> it ends with, when
    longer than the model's positions."""
    if not normalize_text(text):
        raise MtxError(f"The {what} is empty: pass a sentence, e.g. mtx inspect -m model.pt \"The house is red.\"")
    ids = tokenizer.encode(tokenizer.normalize(text), target=target)
    if len(ids) + 1 > max_positions:
        raise MtxError(f"The {what} has {len(ids)} tokens, more than the {max_positions - 1} (and </s>) that the "
                       "model's max_positions allows: inspect a shorter sentence, or a part of it.")
    return ids


def forced_score(logits: Tensor, tgt_out: list[int], decode: DecodeConfig) -> float:
    """The score that the search would give the target `tgt_out` (EOS last), from the (T, V) logits of its
    teacher-forced pass: its log-probability over the length penalty of `decode`."""
    log_prob = logits.float().log_softmax(dim=-1).gather(1, torch.tensor(tgt_out, device=logits.device)[:, None])
    return float(log_prob.sum()) / LengthPenalty.of_config(decode)(float(len(tgt_out)))


def inspect_sentence(engine: TorchEngine, decode: DecodeConfig, sentence: str, target: str | None = None
                     ) -> Inspection:
    """Translate `sentence` with `engine`, a torch engine over one model in eval mode, in this process (or take
    `target` as its translation, scored as the search would score it) and keep every head's attention over the
    pair."""
    [model], tokenizer = engine.models, engine.facts.tokenizer
    text, max_positions = normalize_text(sentence), model.cfg.max_positions
    ids = source_ids(tokenizer, sentence, max_positions, "sentence")
    if target is None:
        request = Request(**dataclasses.asdict(dataclasses.replace(decode, nbest=1)))
        [nbest] = engine.translate([ids], request, [0])
        translation, score, tokens = nbest[0].text, nbest[0].score, list(nbest[0].tokens)
    else:
        translation, score = normalize_text(target), None
        tokens = source_ids(tokenizer, target, max_positions, "target", target=True) if target.strip() else []
    device = next(model.parameters()).device
    src, tgt_in = torch.tensor([[*ids, EOS]], device=device), torch.tensor([[BOS, *tokens]], device=device)
    attention = AttentionWeights()
    with torch.inference_mode():
        states = model(src, None, tgt_in, attention=attention)
        if score is None:
            score = forced_score(model.output_logits(states[0]), [*tokens, EOS], decode)
    maps: dict[Kind, Tensor] = {kind: attention.stacked(kind)[0].cpu() for kind in KINDS}
    source_punctuation = torch.tensor([is_punctuation(p) for p in tokenizer.pieces([*ids, EOS])])
    target_punctuation = torch.tensor([is_punctuation(p) for p in tokenizer.pieces([BOS, *tokens])])
    source_end, target_start = torch.arange(len(ids) + 1) == len(ids), torch.arange(len(tokens) + 1) == 0
    statistics = [*head_statistics("encoder", maps["encoder"], source_end, source_punctuation),
                  *head_statistics("decoder", maps["decoder"], target_start, target_punctuation),
                  *head_statistics("cross", maps["cross"], source_end, source_punctuation)]
    return Inspection(text, translation, score, target is not None, readable_labels(tokenizer, [*ids, EOS]),
                      readable_labels(tokenizer, [*tokens, EOS]), readable_labels(tokenizer, [BOS, *tokens]),
                      maps, statistics)


@dataclass(frozen=True)
class View:
    """One heatmap: a kind's layer, and one head of it or (head None) its heads averaged."""

    kind: Kind
    layer: int
    head: int | None

    def title(self) -> str:
        head = "heads averaged" if self.head is None else f"head {self.head}"
        return f"{TITLES[self.kind]} · layer {self.layer} · {head}"

    def weights(self, inspection: Inspection) -> Tensor:
        """(rows, columns) weights."""
        layer = inspection.maps[self.kind][self.layer]
        return layer.mean(dim=0) if self.head is None else layer[self.head]

    def allowed(self, inspection: Inspection) -> Tensor:
        """(rows, columns) True where a row may attend the column: everywhere but the decoder's later positions."""
        rows, columns = inspection.maps[self.kind].shape[-2:]
        allowed = torch.ones(rows, columns, dtype=torch.bool)
        return allowed.tril() if self.kind == "decoder" else allowed

    def statistics(self, inspection: Inspection) -> HeadStats:
        return next(s for s in inspection.statistics
                    if (s.kind, s.layer, s.head) == (self.kind, self.layer, self.head))


def parse_head(head: str) -> int | Literal["all", "mean"]:
    """--head: "all", "mean" or a head's number."""
    if head in ("all", "mean"):
        return head
    if head.isdigit():
        return int(head)
    raise MtxError(f"--head {head!r} is not all, mean or a head's number (0, 1, ...).")


def select_views(inspection: Inspection, kind: str, layer: int | None, head: str) -> list[View]:
    """The views that --kind (encoder, decoder, cross or all), --layer (None: every layer) and --head (all:
    every head, then their average; mean: the average alone; N: head N) select, in KINDS, layer, head order."""
    if kind not in (*KINDS, "all"):
        raise MtxError(f"--kind {kind!r} is not one of {', '.join(KINDS)}, all.")
    kinds = KINDS if kind == "all" else (kind,)
    chosen_head = parse_head(head)
    selected = []
    for each in kinds:
        layers, heads = inspection.maps[each].shape[:2]
        if layer is not None and not 0 <= layer < layers:
            raise MtxError(f"--layer {layer} is not a layer of the {TITLES[each]}, whose layers are numbered 0 to "
                           f"{layers - 1}{'' if kind != 'all' else '; choose a --kind that has it'}.")
        if isinstance(chosen_head, int) and chosen_head >= heads:
            raise MtxError(f"--head {chosen_head} is not a head of this model, whose heads are numbered 0 to "
                           f"{heads - 1}.")
        shown_heads = [*range(heads), None] if chosen_head == "all" else [None] if chosen_head == "mean" else [
            chosen_head]
        selected += [View(each, n, h) for n in ([layer] if layer is not None else range(layers)) for h in shown_heads]
    return selected
