"""The decoder's state between steps during search: the cache that beam search grows, reorders and drops.

`DecoderState` holds what a decoder remembers from one step to the next: each row's self-attention keys and
values, preallocated and written at position `step` as the target grows one token at a time; each sentence's
cross-attention keys and values, projected from the encoder output once and fixed from then on; and `reorder`,
which follows beam search as it grows rows into beams, moves them among a sentence's beams and drops finished
sentences, copying as little of the cache as it can.

It lives apart from mtx.model.transformer because that bookkeeping is the search's concern, not the paper's:
transformer.py stays the model a researcher reads top to bottom (`Transformer.init_state` builds a state and
`decode_step` writes into it), while the cache's layout and its reorders, which serve the search
(mtx.decode.search) and change with it, are read here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from mtx.model import fast_paths


@dataclass
class DecoderState:
    """Everything the decoder remembers between steps, as one value that search can reorder.

    self_kv:  (L, 2, N, H, max_len, Dh) self-attention keys/values of N rows, preallocated and written at
              `step`, so each step costs one write instead of a concatenation that copies the whole cache.
    cross_kv: (L, 2, B, H, S, Dh) cross-attention keys/values of the B sentences, projected from the encoder
              output once. The rows of `self_kv` are grouped by sentence, N / B consecutive rows each (a
              sentence's beams): its b-th group holds the rows of the sentence of `cross_kv[:, :, b]`.
    memory_mask: (B, 1, 1, S) True where a source position may be attended (None: no padding), in the order of
              `cross_kv`.
    step:     how many target positions are cached, which is also the position of the next token.
    attention_layer, attention: with a layer (0-based), each step leaves that decoder layer's cross-attention
              weights of every row, heads averaged, in `attention` (N, S): what word alignment needs, computed
              by the layer's own attention as it decodes (mtx.decode.alignment).
    slots:    (N,) the row of `self_kv` that holds each row's cache (None: its own). `reorder` leaves caches
              where they are wherever it can, so the rows are decoded in the order their caches lie in, and
              handed back in the search's order.

    A state is owned by one search: `decode_step` writes into it and `reorder` moves caches within it, so after
    either call only the returned state is valid.
    """

    self_kv: Tensor
    cross_kv: Tensor
    memory_mask: Tensor | None
    step: int = 0
    attention_layer: int | None = None
    attention: Tensor | None = None
    slots: Tensor | None = None

    @property
    def max_len(self) -> int:
        return self.self_kv.shape[4]

    @property
    def filled(self) -> Tensor:
        """The positions of `self_kv` written so far: what a reorder copies."""
        return self.self_kv[:, :, :, :, : self.step]

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> DecoderState:
        """Keep the rows `rows`, in that order, and the sentences `sentences` (None: all of them, as they are).

        Beam search grows each sentence's row into its beams (`rows` repeats each row K times), moves rows
        among the beams of a sentence, and drops the sentences that are complete: `rows` must leave each kept
        sentence, once, with the same number of consecutive rows of its own, in the order of `sentences`. Only
        the rows' own cache is copied; a sentence's cross-attention cache is never duplicated for its beams.
        """
        count, kept = rows.numel(), self.cross_kv.shape[2] if sentences is None else sentences.numel()
        if count % kept:
            raise ValueError(f"{count} rows cannot be grouped evenly into {kept} sentences")
        if sentences is not None and bool((torch.bincount(sentences) > 1).any()):
            raise ValueError("a sentence cannot be kept more than once: its rows continue its caches in place")
        held = rows if self.slots is None else self.slots[rows]  # where each kept row's cache is
        before = self.self_kv.shape[2] // self.cross_kv.shape[2]  # rows a sentence
        if count // kept == before:
            return self._move_only_what_must_move(held, kept)
        # The rows grow into beams: a new cache, gathered.
        target = self.self_kv.new_empty(self.self_kv.shape[:2] + (count,) + self.self_kv.shape[3:])
        torch.index_select(self.filled, 2, held, out=target[:, :, :, :, : self.step])
        if sentences is None and self.slots is None:  # every sentence's caches in their own place
            return DecoderState(target, self.cross_kv, self.memory_mask, self.step, self.attention_layer)
        group = held.view(kept, -1)[:, 0] // before
        mask = None if self.memory_mask is None else self.memory_mask.index_select(0, group)
        return DecoderState(target, self.cross_kv.index_select(2, group), mask, self.step, self.attention_layer)

    def _move_only_what_must_move(self, held: Tensor, kept: int) -> DecoderState:
        """The `kept` sentences whose rows continue the caches at `held` (K = held / kept rows each, as before).

        Copying every row's cache into the search's new order would read and write the whole cache at every
        step. Instead caches stay where they are, and `slots` records where each row's is. Only two kinds of
        row move: a second continuation of one cache (a beam that two new beams extend), copied into the place
        of a cache that no row continues, in its own sentence's group; and, when sentences are dropped, the
        groups of the kept sentences beyond the first `kept` groups, copied into the groups the dropped ones
        leave there, with their cross-attention caches. What is copied never overwrites what is read.
        """
        count, beams = held.numel(), held.numel() // kept
        order = torch.arange(count, device=held.device)
        group = held.view(kept, beams)[:, 0] // beams  # each kept sentence's group, where its caches are
        target = group.clone()  # the group each kept sentence will have, among the first `kept`
        moved = (group >= kept).nonzero().squeeze(1)
        if moved.numel():
            free = torch.ones(kept, dtype=torch.bool, device=held.device)
            free[group[group < kept]] = False
            target[moved] = free.nonzero().squeeze(1)
        # The first row to continue each cache keeps its place in the group; a second takes an unclaimed one.
        first = torch.full((self.self_kv.shape[2],), count, device=held.device).scatter_reduce_(0, held, order, "amin")
        second = first[held] != order
        place = held % beams
        claimed = torch.zeros(kept, beams, dtype=torch.bool, device=held.device)
        claimed.view(-1)[(order // beams * beams + place)[~second]] = True
        place[second] = (~claimed).nonzero()[:, 1]  # sentence by sentence, as `second` is
        slots = target.repeat_interleave(beams) * beams + place
        copied = (slots != held).nonzero().squeeze(1)
        self_kv = self.self_kv[:, :, : count]
        cross_kv, mask = self.cross_kv[:, :, :kept], None if self.memory_mask is None else self.memory_mask[:kept]
        if copied.numel():
            # = self.filled.index_copy_(2, slots[copied], self.filled.index_select(2, held[copied]))
            fast_paths.copy_within(self.filled, 2, held[copied], slots[copied])
        if moved.numel():
            # = cross_kv.index_copy_(2, target[moved], self.cross_kv.index_select(2, group[moved]))
            fast_paths.copy_within(self.cross_kv, 2, group[moved], target[moved])
            if mask is not None:
                fast_paths.copy_within(self.memory_mask, 0, group[moved], target[moved])
        return DecoderState(self_kv, cross_kv, mask, self.step, self.attention_layer, slots=slots)
