"""Issue 40: would a cheaper decoder block than self-attention make a student translate faster?

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/ssru.py [--presets student-tiny student] [--repeats 7]

Marian's and Sockeye's students replace each decoder layer's self-attention with a Simpler Simple Recurrent Unit
(SSRU; Kim et al., 2019, "From Research to Production and Back: Ludicrously Fast Neural Machine Translation"):

    f_t = σ(W_f x_t + b_f)        c_t = f_t ⊙ c_{t−1} + (1 − f_t) ⊙ W x_t        h_t = ReLU(c_t)

so a decoding step reads one (N, D) cell per layer instead of attending over every position cached so far, and
beam search reorders that cell instead of the whole self-attention cache. This measures the step alone, before
anything is trained: the preset's model with random weights as mtx decodes it, against the same model with each
decoder layer's self-attention sub-layer replaced by an SSRU (W and W_f in one product, the cell updated by one
`lerp`; the residual, LayerNorm, cross-attention and feed-forward block as they are). Both search the same
random sources to exactly `--length` tokens (min_len = max_len), greedy and beam 4, one thread, batches of 1 and
32 sentences; medians of interleaved repeats (`time_interleaved`), ms a step and the SSRU's speed-up.

What it would cost besides is not measured here: CTranslate2's and transformers' models have no SSRU, so a student
built with one could not be exported (the reason Marian's students cannot leave Marian), and its training
recurrence is sequential over target positions. bench/README.md weighs the two.
"""

from __future__ import annotations

import argparse
import copy
import functools
import statistics
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from common import build_model, emit, emit_info, set_threads, time_interleaved
from torch import Tensor, nn

from mtx.decode.search import Constraints, LengthPenalty, search
from mtx.model.decoder_state import DecoderState
from mtx.model.transformer import LayerNorm, Transformer

VOCAB = 8000  # the real-data corpus's joint vocabulary, as the distillation walkthrough's students have


class SSRUSublayer(nn.Module):
    """The SSRU in place of a decoder layer's self-attention residual block (post-norm, as mtx's presets): it
    ignores the sub-layer it is handed and updates `cell`, (N, D), which the decoder below sets before each step
    and reads after it."""

    def __init__(self, d_model: int, norm: LayerNorm) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, 2 * d_model)  # W x_t and W_f x_t + b_f in one product
        self.norm = norm
        self.cell: Tensor | None = None

    def forward(self, x: Tensor, sublayer: object) -> Tensor:  # x: (N, 1, D)
        candidate, forget = self.proj(x.squeeze(1)).chunk(2, dim=-1)
        self.cell = torch.lerp(candidate, self.cell, torch.sigmoid(forget))  # f ⊙ c + (1 − f) ⊙ W x
        return self.norm(x + F.relu(self.cell).unsqueeze(1))


@dataclass
class SSRUState:
    """The decoder state of the SSRU model: mtx's (its cross-attention cache and position; a self-attention cache
    of no layers) and one cell per decoder layer, reordered with the rows. The decoder computes its rows in the
    order of the inner state's `slots`, so the cells are kept in that order too."""

    inner: DecoderState
    cells: list[Tensor]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> SSRUState:
        held = rows if self.inner.slots is None else self.inner.slots[rows]  # each kept row's cells
        inner = self.inner.reorder(rows, sentences)
        slots = torch.arange(rows.numel()) if inner.slots is None else inner.slots  # where they go
        return SSRUState(inner, [c.new_empty((rows.numel(),) + c.shape[1:]).index_copy_(0, slots, c[held])
                                 for c in self.cells])


class SSRUDecoder:
    """`model`'s copy whose decoder layers run an SSRU instead of self-attention: an IncrementalDecoder for search."""

    def __init__(self, model: Transformer) -> None:
        self.model = copy.deepcopy(model)
        self.sublayers = []
        for layer in self.model.decoder_layers:
            sublayer = SSRUSublayer(model.cfg.d_model, layer.self_residual.norm)
            layer.self_residual = sublayer
            self.sublayers.append(sublayer)
        self.model.eval()

    def encode(self, src: Tensor, src_pad: Tensor) -> Tensor:
        return self.model.encode(src, src_pad)

    def init_state(self, memory: Tensor, src_pad: Tensor, max_len: int) -> SSRUState:
        inner = self.model.init_state(memory, src_pad, max_len)
        inner.self_kv = inner.self_kv[:0]  # no layer attends to earlier positions: nothing to cache or reorder
        rows = memory.shape[0]
        return SSRUState(inner, [memory.new_zeros(rows, self.model.cfg.d_model) for _ in self.sublayers])

    def decode_step(self, prev: Tensor, state: SSRUState) -> tuple[Tensor, SSRUState]:
        for sublayer, cell in zip(self.sublayers, state.cells, strict=True):
            sublayer.cell = cell
        log_probs, inner = self.model.decode_step(prev, state.inner)
        return log_probs, SSRUState(inner, [sublayer.cell for sublayer in self.sublayers])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--presets", nargs="+", default=["student-tiny", "student"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 32], help="sentences a search")
    parser.add_argument("--source-length", type=int, default=15)
    parser.add_argument("--length", type=int, default=30, help="target tokens of every translation")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    set_threads(1)
    penalty = LengthPenalty(1.0, "fairseq")
    for preset in args.presets:
        model = build_model(preset, VOCAB).eval()
        decoders = {"self-attention": model, "ssru": SSRUDecoder(model)}
        for sentences in args.batches:
            generator = torch.Generator().manual_seed(sentences)
            src = torch.randint(4, VOCAB, (sentences, args.source_length), generator=generator)
            src_pad = torch.zeros_like(src, dtype=torch.bool)
            length = torch.full((sentences,), args.length)
            constraints = Constraints(length, min_len=args.length)
            for beam in (1, 4):
                runs = {name: functools.partial(search, decoder, src, src_pad, constraints, penalty, beam=beam)
                        for name, decoder in decoders.items()}
                seconds = time_interleaved(runs, args.repeats)
                config = {"preset": preset, "sentences": sentences, "beam": beam, "length": args.length,
                          "threads": 1}
                for name, samples in seconds.items():
                    emit(f"ssru.{name}.ms_per_step", {**config, "decoder": name},
                         [1000 * s / (args.length + 1) for s in samples], "ms")
                base, ssru = (statistics.median(seconds[name]) for name in decoders)
                emit_info("ssru.speedup", **config, speedup=base / ssru)


if __name__ == "__main__":
    main()
